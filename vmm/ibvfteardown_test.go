package vmm

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	testenv.RunChild(ibvfTeardownEnv, ibvfTeardownChild)
	os.Exit(m.Run())
}

// ibvfTeardownChild runs the VM's own steps around the filter for a VF
// with identity settings, on a veth named ib0 in a network namespace of
// its own: openJournal (which opens the rtnetlink socket), the setup's
// setVFIdentities (which reads the VF through it), installProcessFilter
// in Kill mode, then netlink requests through the journal's socket under
// the filter, and restoreHost.
func ibvfTeardownChild(dir string) error {
	if !testenv.VethNamespace("ib0") {
		return nil
	}
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
	fmt.Printf("RESULT setup_read=%s\n", testenv.KernelAnswer(err))
	if err := vm.installProcessFilter(); err != nil {
		return err
	}
	fmt.Println("RESULT filter=on")
	nl := vm.dev.pt.rtnl
	_, err = nl.Identity("ib0", 2)
	fmt.Printf("RESULT getlink=%s\n", testenv.KernelAnswer(err))
	err = nl.SetPortGUID("ib0", 2, 0x02aabbccddeeff00)
	fmt.Printf("RESULT setlink=%s\n", testenv.KernelAnswer(err))
	err = vm.restoreHost()
	fmt.Printf("RESULT restore=%s closed=%v\n", testenv.KernelAnswer(err), vm.dev.pt.rtnl == nil)
	return nil
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
	child := testenv.StartSeccompChild(t, ibvfTeardownEnv, t.TempDir())
	res, out := child.Res, child.Out
	assert.Equal(t, "no_such_vf", res["setup_read"], "setup's read of the VF, before the filter")
	require.Equal(t, "on", res["filter"], "child:\n%s", out)
	assert.Contains(t, out, "seccomp: process filter on every thread")
	assert.Equal(t, "no_such_vf", res["getlink"], "RTM_GETLINK under the filter")
	assert.Equal(t, "EOPNOTSUPP", res["setlink"], "RTM_SETLINK under the filter")
	assert.Equal(t, "ok", res["restore"])
	assert.Contains(t, out, "closed=true", "restoreHost closes the socket")
}
