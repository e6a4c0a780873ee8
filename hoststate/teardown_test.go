package hoststate

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/seccomp"
)

// teardownChildEnv makes the test binary run teardownChild in the
// directory it names instead of the tests: a seccomp filter is for the
// life of the process, so the teardown under it runs in a child.
const teardownChildEnv = "HPCVMM_HOSTSTATE_TEARDOWN_CHILD"

func TestMain(m *testing.M) {
	testenv.RunChild(teardownChildEnv, teardownChild)
	os.Exit(m.Run())
}

// The teardown's VF and its PF, whose IPoIB netdev is a veth
// named ib0 (a veth) in the child's own network namespace.
const (
	tdVF     = "0000:41:00.3"
	tdPF     = "0000:41:00.0"
	tdNetdev = "ib0"
	tdIndex  = 2
)

// tdOriginal is the identity the VF had before the VM (what the journal
// restores).
var tdOriginal = ibvf.Identity{NodeGUID: 0x0211223344556677, PortGUID: 0x02aabbccddeeff00, Link: ibvf.LinkAuto}

// teardownChild does what a VM with a rebound InfiniBand VF whose
// identity it set does, in hpcvmm's order: the changes journaled during
// setup (as Bind and SetVFIdentity journal them), the rtnetlink socket
// and the journal file opened, then the process filter in Kill mode, then
// the teardown's Restore. The PF's netdev is a veth: the kernel
// parses the RTM_SETLINK and answers EOPNOTSUPP (no ndo_set_vf_guid), so
// the restore of the VF fails there as it would on a PF gone bad, while
// the device's rebinding is undone (through the sysfs writer, which in
// hpcvmm writes files opened before the filter too). The process must
// survive it all, and leave a journal with only the VF's change.
func teardownChild(dir string) error {
	// The socket stays in the namespace it was opened in.
	if !testenv.VethNamespace(tdNetdev) {
		return nil
	}

	conn, err := ibvf.Open()
	if err != nil {
		return err
	}
	var mu sync.Mutex
	var writes []string
	j := Open(Options{
		StateDir: filepath.Join(dir, "state"), SysfsRoot: filepath.Join(dir, "sys"), ProcRoot: "/proc",
		WriteFile: func(path string, data []byte) error {
			mu.Lock()
			defer mu.Unlock()
			rel, _ := filepath.Rel(filepath.Join(dir, "sys"), path)
			writes = append(writes, fmt.Sprintf("%s=%q", rel, data))
			return nil
		},
		Netlink: conn,
		Getenv:  func(string) string { return "" },
	})
	j.f.Changes = []Change{
		{Kind: KindPCIBind, BDF: tdVF},
		{Kind: KindIBVF, BDF: tdVF, IBVF: &IBVFChange{PF: tdPF, Netdev: tdNetdev, VFIndex: tdIndex,
			SetNode: true, SetPort: true, SetLink: true,
			NodeGUID: tdOriginal.NodeGUID, PortGUID: tdOriginal.PortGUID, Link: tdOriginal.Link}},
	}
	if err := j.save(); err != nil {
		return err
	}
	fmt.Println("RESULT journal=" + filepath.Base(j.Path()))
	if err := j.PrepareRestore(); err != nil {
		return err
	}
	if err := seccomp.InstallProcess(seccomp.Kill, conn.FD()); err != nil {
		return err
	}
	fmt.Println("RESULT filter=on")

	// RTM_GETLINK after the filter: the kernel answers with the veth's
	// link, which has no VFs.
	_, err = conn.Identity(tdNetdev, tdIndex)
	fmt.Printf("RESULT getlink=%s\n", testenv.KernelAnswer(err))

	// The teardown.
	rerr := j.Restore()
	fmt.Printf("RESULT restore=%s\n", testenv.KernelAnswer(rerr))
	fmt.Printf("RESULT restore_says_journal=%v\n", rerr != nil && strings.Contains(rerr.Error(), "stay in journal "+j.Path()))
	mu.Lock()
	fmt.Printf("RESULT writes=%s\n", strings.Join(writes, ","))
	mu.Unlock()
	return conn.Close()
}

// TestTeardownRestoreOfVFIdentityUnderSeccomp (issue 23's follow-up): the
// teardown of a VM that set an InfiniBand VF's identity runs under
// hpcvmm's process filter in Kill mode without a syscall outside it. The
// VF's restore goes through the rtnetlink socket opened before the filter
// (socket(2) is not on the list): an RTM_GETLINK and an RTM_SETLINK sent
// after the filter reach the kernel, which answers them (the SETLINK with
// EOPNOTSUPP: a veth has no VFs; EINVAL would mean a malformed
// message). The failed restore leaves the journal consistent without a
// write-open: it is rewritten in place through the file opened before the
// filter, naming only the VF's change (the device's rebinding was undone),
// and `hpcvmm unbind` (RestoreStale) then restores the VF from it. Needs
// root (a network namespace and a veth pair).
func TestTeardownRestoreOfVFIdentityUnderSeccomp(t *testing.T) {
	dir := t.TempDir()
	sys := filepath.Join(dir, "sys")
	pci := filepath.Join(sys, "bus/pci")
	require.NoError(t, os.MkdirAll(filepath.Join(pci, "devices", tdPF, "net", tdNetdev), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(pci, "devices", tdVF), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(pci, "drivers", VFIODriver), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(pci, "devices", tdVF, "driver_override"), []byte("vfio-pci\n"), 0o644))
	require.NoError(t, os.Symlink("../../drivers/"+VFIODriver, filepath.Join(pci, "devices", tdVF, "driver")))

	child := testenv.StartSeccompChild(t, teardownChildEnv, dir)
	res, out := child.Res, child.Out
	require.Equal(t, "on", res["filter"], "child:\n%s", out)
	assert.Equal(t, "no_such_vf", res["getlink"], "RTM_GETLINK under the filter: the kernel's answer, decoded")
	assert.Equal(t, "EOPNOTSUPP", res["restore"], "the RTM_SETLINK of the restore under the filter: the kernel's answer")
	assert.Equal(t, "true", res["restore_says_journal"], "the failed restore names the journal left for hpcvmm unbind")
	assert.Equal(t, `bus/pci/drivers/vfio-pci/unbind="`+tdVF+`",bus/pci/devices/`+tdVF+`/driver_override="\n"`, res["writes"],
		"the rebinding was undone")

	// The journal: the child's file, in place, with only the VF's change;
	// no temporary file beside it.
	state := filepath.Join(dir, "state")
	ents, err := os.ReadDir(state)
	require.NoError(t, err)
	require.Len(t, ents, 1, "only the journal in %s", state)
	require.Equal(t, res["journal"], ents[0].Name())
	f, err := readJournal(filepath.Join(state, ents[0].Name()))
	require.NoError(t, err, "the journal rewritten in place is one hpcvmm unbind reads")
	require.Len(t, f.Changes, 1)
	assert.Equal(t, KindIBVF, f.Changes[0].Kind)
	assert.Equal(t, tdOriginal.PortGUID, f.Changes[0].IBVF.PortGUID)
	assert.Equal(t, child.PID, f.PID)

	// hpcvmm unbind restores the VF from it.
	pf := &fakePF{vfs: map[int]ibvf.Identity{tdIndex: {NodeGUID: 0x02ff, PortGUID: 0x02fe, Link: ibvf.LinkEnable}}}
	rep, err := RestoreStale(Options{StateDir: state, SysfsRoot: sys, Netlink: pf, PID: 1, Getenv: func(string) string { return "" }})
	require.NoError(t, err)
	require.Len(t, rep.Restored, 1)
	assert.Equal(t, tdOriginal, pf.vfs[tdIndex])
	ents, err = os.ReadDir(state)
	require.NoError(t, err)
	assert.Empty(t, ents, "the journal is removed once everything is undone")
}

// TestRestoreRewritesInPlaceAfterPrepare: after PrepareRestore, a restore
// that leaves changes rewrites the journal file opened then (same inode,
// padded to its length) instead of writing a new one, and the result
// reads back; a restore that undoes everything removes it.
func TestRestoreRewritesInPlaceAfterPrepare(t *testing.T) {
	state := t.TempDir() + "/state"
	pf := &fakePF{vfs: map[int]ibvf.Identity{2: {}}}
	j := Open(Options{StateDir: state, SysfsRoot: t.TempDir(), Netlink: pf, PID: 4243, Getenv: func(string) string { return "" }})
	tg := ibTarget()
	require.NoError(t, j.SetVFIdentity(tg, ibvf.Settings{NodeGUID: 0x0211, PortGUID: 0x0222}))
	tg2 := tg
	tg2.Index, tg2.VF.Function = 3, 4
	pf.vfs[3] = ibvf.Identity{Link: ibvf.LinkDisable}
	require.NoError(t, j.SetVFIdentity(tg2, ibvf.Settings{Link: ibvf.LinkEnable, SetLink: true}))
	before, err := os.Stat(j.Path())
	require.NoError(t, err)
	require.NoError(t, j.PrepareRestore())

	pf.failAt = pf.sets + 1 // the first restore message (VF 3's link) fails
	err = j.Restore()
	require.ErrorContains(t, err, "EIO")
	require.ErrorContains(t, err, "1 change(s) not undone stay in journal "+j.Path())
	after, err := os.Stat(j.Path())
	require.NoError(t, err)
	assert.True(t, os.SameFile(before, after), "rewritten in place, not replaced")
	assert.Equal(t, before.Size(), after.Size(), "padded to the old length")
	f, err := readJournal(j.Path())
	require.NoError(t, err)
	require.Len(t, f.Changes, 1)
	assert.Equal(t, 3, f.Changes[0].IBVF.VFIndex)
	assert.Equal(t, ibvf.Identity{}, pf.vfs[2], "VF 2 restored")

	// A second restore (no PrepareRestore) undoes the rest and removes it.
	pf.failAt = 0
	require.NoError(t, j.Restore())
	assert.Equal(t, ibvf.Identity{Link: ibvf.LinkDisable}, pf.vfs[3])
	assert.NoFileExists(t, j.Path())
}
