package jobrun

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/agent"
	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/ninep"
)

// AgentName is the argv[0] under which a program is a job's guest agent:
// the initramfs holds it at initramfs.AgentPath, which the kernel starts
// as init (rdinit=).
const AgentName = "hpcvmm-agent"

// probeArg is the one argument CheckAgent starts an agent with: Dispatch
// answers it with ProbeAnswer where agent.Main would set a guest up. Never
// as PID 1: a kernel command line's stray word reaches init's argv.
const probeArg = "--hpcvmm-agent-probe"

// probeTimeout bounds the probe: an agent answers in milliseconds (a
// static binary's start), a program that is none may not end at all.
const probeTimeout = 10 * time.Second

// ProbeAnswer is the line an agent prints for CheckAgent's probe: that it
// is one, and the job protocol it speaks (jobproto.Version), which must be
// this hpcvmm's.
func ProbeAnswer() string {
	return fmt.Sprintf("hpcvmm-agent jobproto %d\n", jobproto.Version)
}

// Dispatch makes the program hpcvmm's guest agent (agent.Main) when it is
// started as AgentName, or the binds' 9P file server (ninep.ChildMain)
// when started as ninep.ChildName, and then never returns; otherwise it
// returns at once. A program that is its own jobs' agent (Request.Agent's
// default is os.Executable()) calls it first thing in main, and must be
// built static (CGO_ENABLED=0): the guest has IMAGE's libraries, not the
// host's.
func Dispatch() {
	switch filepath.Base(os.Args[0]) {
	case AgentName:
		if len(os.Args) == 2 && os.Args[1] == probeArg && os.Getpid() != 1 {
			_, err := io.WriteString(os.Stdout, ProbeAnswer())
			if err != nil {
				os.Exit(1)
			}
			os.Exit(0)
		}
		agent.Main()
	case ninep.ChildName:
		os.Exit(ninep.ChildMain())
	}
}

// CheckAgent refuses a file that is not an hpcvmm agent, before it is
// packed into an initramfs: without the check, any program passes the
// initramfs's own (a static ELF executable, initramfs.CheckAgent) and on a
// real host runs as the guest's PID 1, which never speaks to hpcvmm. It
// starts the file as AgentName with probeArg, an empty environment,
// stdin, stderr /dev/null, in / and as acting (nil: hpcvmm itself): an
// agent prints ProbeAnswer and exits 0 (Dispatch). The error is one line
// naming the file and what to do.
func CheckAgent(path string, acting *asuser.User) error {
	if err := initramfs.CheckAgent(path); err != nil {
		return err
	}
	return probeAgent(path, acting, probeTimeout)
}

// probeAgent runs the probe of CheckAgent with timeout.
func probeAgent(path string, acting *asuser.User, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, probeArg)
	cmd.Args[0] = AgentName
	cmd.Env = []string{}
	cmd.Dir = "/"
	out := &headBuffer{max: 256}
	cmd.Stdout = out
	// Its own process group, killed whole on the timeout; pipes a child
	// left open are not waited for long.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if acting != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: acting.UID, Gid: acting.GID, Groups: append([]uint32{}, acting.Groups...)}
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	answer := out.String()
	fix := "pass the hpcvmm binary, or call jobrun.Dispatch first thing in your program's main (and build it with CGO_ENABLED=0)"
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("agent %s: not an hpcvmm agent (started as %s it did not answer within %v: a program that does not dispatch on argv[0] %s): %s",
			path, AgentName, timeout, AgentName, fix)
	case err != nil && !errors.As(err, &ee):
		return fmt.Errorf("agent %s: cannot start it as %s: %v", path, AgentName, err)
	case answer == ProbeAnswer() && err == nil:
		return nil
	}
	if v, ok := strings.CutPrefix(answer, "hpcvmm-agent jobproto "); ok && err == nil {
		if v, rest, _ := strings.Cut(v, "\n"); rest == "" && v != "" && strings.Trim(v, "0123456789") == "" {
			return fmt.Errorf("agent %s speaks job protocol %s, this hpcvmm %d: pass the hpcvmm binary of this version, or rebuild your program with this module's version",
				path, v, jobproto.Version)
		}
	}
	what := "exit status 0"
	if ee != nil {
		what = ee.ProcessState.String()
	}
	return fmt.Errorf("agent %s: not an hpcvmm agent (started as %s %s it answered %q, %s: a program that does not dispatch on argv[0] %s): %s",
		path, AgentName, probeArg, firstLine(answer), what, AgentName, fix)
}

// firstLine is s's first line, at most 80 bytes of it.
func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

// headBuffer keeps the first max bytes written to it and takes the rest
// without keeping it: a program's answer is read whatever it prints.
type headBuffer struct {
	bytes.Buffer
	max int
}

func (b *headBuffer) Write(p []byte) (int, error) {
	if n := b.max - b.Len(); n > 0 {
		b.Buffer.Write(p[:min(n, len(p))])
	}
	return len(p), nil
}
