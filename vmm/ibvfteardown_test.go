package vmm

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/vfio"
)

// ibvfTeardownEnv makes the test binary run ibvfTeardownChild in the
// directory it names instead of the tests: the seccomp filter is for the
// life of the process.
const ibvfTeardownEnv = "HPCVMM_VMM_IBVF_TEARDOWN_CHILD"

func TestMain(m *testing.M) {
	if dir := os.Getenv(ibvfTeardownEnv); dir != "" {
		if err := ibvfTeardownChild(dir); err != nil {
			fmt.Println("RESULT child_error=" + strings.ReplaceAll(err.Error(), " ", "_"))
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// ibvfTeardownChild runs the VM's own steps around the filter for a VF
// with identity settings, on a veth named ib0 in a network namespace of
// its own: openJournal (which opens the rtnetlink socket), the setup's
// setVFIdentities (which reads the VF through it), installProcessFilter
// in Kill mode, then netlink requests through the journal's socket under
// the filter, and restoreHost.
func ibvfTeardownChild(dir string) error {
	runtime.LockOSThread() // the namespace is this thread's; never unlocked
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		fmt.Printf("RESULT setup=unshare_%v\n", err)
		return nil
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ib0"}, PeerName: "ib0p"}); err != nil {
		fmt.Printf("RESULT setup=veth_%v\n", err)
		return nil
	}
	fmt.Println("RESULT setup=ok")
	vf := host.BDF{Bus: 0x41, Function: 3}
	var s ibvf.Settings
	if _, err := s.Set("port-guid", "02:aa:bb:cc:dd:ee:ff:00"); err != nil {
		return err
	}
	vm := &VM{
		cfg: Config{Seccomp: SeccompOn},
		log: slog.New(slog.NewTextHandler(os.Stdout, nil)),
		dev: devices{pt: &passthrough{ib: []*ibvf.Target{{VF: vf, PF: host.BDF{Bus: 0x41}, Netdev: "ib0", Index: 2}}}},
	}
	vm.dev.pt.specs = make([]vfio.Spec, 1)
	vm.dev.pt.specs[0].BDF, vm.dev.pt.specs[0].IB = vf, s
	if err := vm.dev.pt.openJournal(filepath.Join(dir, "state"), filepath.Join(dir, "sys"), "/proc"); err != nil {
		return err
	}
	// Setup reads the VF before changing it: the veth reports none, so
	// nothing changes and nothing is journaled.
	err := vm.setVFIdentities(filepath.Join(dir, "sys"), "/proc")
	fmt.Printf("RESULT setup_read=%s\n", kernelAnswer(err))
	if err := vm.installProcessFilter(); err != nil {
		return err
	}
	fmt.Println("RESULT filter=on")
	nl := vm.dev.pt.rtnl
	_, err = nl.Identity("ib0", 2)
	fmt.Printf("RESULT getlink=%s\n", kernelAnswer(err))
	err = nl.SetPortGUID("ib0", 2, 0x02aabbccddeeff00)
	fmt.Printf("RESULT setlink=%s\n", kernelAnswer(err))
	err = vm.restoreHost()
	fmt.Printf("RESULT restore=%s closed=%v\n", kernelAnswer(err), vm.dev.pt.rtnl == nil)
	return nil
}

// kernelAnswer names err for the parent: ok, EOPNOTSUPP, EINVAL,
// no_such_vf, or the error's text.
func kernelAnswer(err error) string {
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

// TestIBVFRestoreSocketUnderSeccomp: a VM with an InfiniBand VF whose
// identity it sets opens its rtnetlink socket with the journal, before the
// filter, and names it to the filter: under the process filter in Kill
// mode, an RTM_GETLINK and an RTM_SETLINK through it reach the kernel (a
// veth has no VFs: it answers the GETLINK without a VF list and the
// SETLINK with EOPNOTSUPP, where a malformed message would get EINVAL),
// and restoreHost closes it; no SIGSYS. hoststate's
// TestTeardownRestoreOfVFIdentityUnderSeccomp drives the journal's restore
// itself the same way. Needs root (a network namespace and a veth pair).
func TestIBVFRestoreSocketUnderSeccomp(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root for a network namespace and a veth pair")
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, 0); e == unix.ENOSYS {
		testenv.SkipOrFail(t, "this kernel has no seccomp filter mode")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), ibvfTeardownEnv+"="+t.TempDir())
	out, _ := cmd.CombinedOutput()
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.True(t, ok)
	require.False(t, ws.Signaled(), "the child was killed by %v (SIGSYS: a syscall outside the filter):\n%s", ws.Signal(), out)
	require.Equal(t, 0, ws.ExitStatus(), "child:\n%s", out)
	res := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^RESULT (\w+)=(\S*)`).FindAllStringSubmatch(string(out), -1) {
		res[m[1]] = m[2]
	}
	if res["setup"] != "ok" {
		testenv.SkipOrFail(t, "cannot make a veth pair in a new network namespace here: %s", out)
	}
	assert.Equal(t, "no_such_vf", res["setup_read"], "setup's read of the VF, before the filter")
	require.Equal(t, "on", res["filter"], "child:\n%s", out)
	assert.Contains(t, string(out), "seccomp: process filter on every thread")
	assert.Equal(t, "no_such_vf", res["getlink"], "RTM_GETLINK under the filter")
	assert.Equal(t, "EOPNOTSUPP", res["setlink"], "RTM_SETLINK under the filter")
	assert.Equal(t, "ok", res["restore"])
	assert.Contains(t, string(out), "closed=true", "restoreHost closes the socket")
}
