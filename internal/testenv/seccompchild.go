package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A seccomp filter lasts for the life of the process, so a test of code
// under hpcvmm's process filter runs it in a child: the test binary run
// again with an environment variable naming a directory. The child prints
// "RESULT key=value" lines (values without white space) that the parent
// reads back. hoststate's and vmm's InfiniBand teardown tests do this, in
// a network namespace of the child's own with a veth standing in for an
// IPoIB netdev.

// RunChild, called first in a TestMain, runs child(dir) instead of the
// tests when the environment variable env names dir, and exits: 0 when
// child returns nil, else 1 after a "RESULT child_error=..." line.
func RunChild(env string, child func(dir string) error) {
	dir := os.Getenv(env)
	if dir == "" {
		return
	}
	if err := child(dir); err != nil {
		fmt.Println("RESULT child_error=" + strings.ReplaceAll(err.Error(), " ", "_"))
		os.Exit(1)
	}
	os.Exit(0)
}

// VethNamespace, in the child, moves the calling thread (locked to it for
// good: the namespace is the thread's) into a new network namespace and
// adds a veth named name (peer name+"p"; dummy may not be built). It
// prints "RESULT setup=ok", or the step that failed, which makes
// StartChild skip; false then, and the child should return nil.
func VethNamespace(name string) bool {
	runtime.LockOSThread()
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		fmt.Printf("RESULT setup=unshare_%v\n", err)
		return false
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}); err != nil {
		fmt.Printf("RESULT setup=veth_%v\n", err)
		return false
	}
	fmt.Println("RESULT setup=ok")
	return true
}

// Child is a finished child run: its output, its RESULT lines by key and
// its process ID.
type Child struct {
	Out string
	Res map[string]string
	PID int
}

var resultLine = regexp.MustCompile(`(?m)^RESULT (\w+)=(\S*)`)

// StartSeccompChild runs the test binary as a child with env=dir (see
// RunChild) and returns what it reported. It skips (or fails, see
// SkipOrFail) where the child cannot run (not root, no seccomp filter
// mode, no veth in a new namespace: RESULT setup other than ok) and fails
// the test when the child was killed (SIGSYS: a syscall outside the
// filter) or exited non-zero.
func StartSeccompChild(t *testing.T, env, dir string) Child {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root for a network namespace and a veth pair")
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, 0); e == unix.ENOSYS {
		SkipOrFail(t, "this kernel has no seccomp filter mode")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, _ := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok {
		t.Fatalf("child: no wait status:\n%s", out)
	}
	if ws.Signaled() {
		t.Fatalf("the child was killed by %v (SIGSYS: a syscall outside the filter):\n%s", ws.Signal(), out)
	}
	if ws.ExitStatus() != 0 {
		t.Fatalf("child exited %d:\n%s", ws.ExitStatus(), out)
	}
	c := Child{Out: string(out), Res: map[string]string{}, PID: cmd.Process.Pid}
	for _, m := range resultLine.FindAllStringSubmatch(c.Out, -1) {
		c.Res[m[1]] = m[2]
	}
	if c.Res["setup"] != "ok" {
		SkipOrFail(t, "cannot make a veth pair in a new network namespace here: %s", out)
	}
	return c
}

// KernelAnswer names err for a RESULT line: ok, EOPNOTSUPP, EINVAL,
// no_such_vf (package ibvf's "reports no such VF"), or the error's text
// with its spaces replaced.
func KernelAnswer(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, unix.EOPNOTSUPP):
		return "EOPNOTSUPP"
	case errors.Is(err, unix.EINVAL):
		return "EINVAL"
	case strings.Contains(err.Error(), "reports no such VF"):
		return "no_such_vf"
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}
