package hoststate

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// jobEnv is a Prolog's or Epilog's environment for job 42.
func jobEnv(k string) string {
	if k == "SLURM_JOB_ID" {
		return "42"
	}
	return ""
}

// fakeDev makes DIR/vfio/<group> character devices (root:root 0600, as
// udev leaves them) for the groups given.
func fakeDev(t *testing.T, groups ...int) string {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes and changing their owner needs root (as the Prolog runs)")
	}
	dev := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dev, "vfio"), 0o755))
	for _, g := range groups {
		p := filepath.Join(dev, "vfio", itoa(g))
		require.NoError(t, unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(511, uint32(g)))))
		require.NoError(t, os.Chown(p, 0, 0))
		require.NoError(t, os.Chmod(p, 0o600))
	}
	return dev
}

func itoa(i int) string { return strconv.Itoa(i) }

func ownerOf(t *testing.T, path string) (uid, gid, mode uint32) {
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(path, &st))
	return st.Uid, st.Gid, st.Mode & 0o7777
}

// TestGiveVFIOGroupRoundTrip: the Prolog hands exactly the groups it is
// given to the job's user, the journal on disk records what they were, and
// the Epilog's RestoreStale (a new process reading the journal back) puts
// them back to root:root 0600.
func TestGiveVFIOGroupRoundTrip(t *testing.T) {
	dev := fakeDev(t, 12, 13, 40)
	state := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Join(dev, "vfio", "40"), 0o660), "a group file whose mode was not udev's default")
	opts := Options{StateDir: state, SysfsRoot: t.TempDir(), DevRoot: dev, Getenv: jobEnv, PID: os.Getpid()}
	j := Open(opts)
	require.NoError(t, j.GiveVFIOGroup(12, 65534))
	require.NoError(t, j.GiveVFIOGroup(40, 65534))
	uid, gid, mode := ownerOf(t, filepath.Join(dev, "vfio/12"))
	assert.Equal(t, []uint32{65534, 0, 0o600}, []uint32{uid, gid, mode}, "group 12 is the job user's")
	uid, _, mode = ownerOf(t, filepath.Join(dev, "vfio/13"))
	assert.Equal(t, []uint32{0, 0o600}, []uint32{uid, mode}, "group 13 is not this job's and stays root's")

	// The journal on disk, read back as the Epilog reads it.
	f, err := readJournal(j.Path())
	require.NoError(t, err)
	assert.Equal(t, "42", f.SlurmJob)
	assert.Equal(t, []Change{
		{Kind: KindVFIOOwner, VFIOOwner: &VFIOOwnerChange{Group: 12, UID: 65534, OriginalUID: 0, OriginalGID: 0, OriginalMode: 0o600}},
		{Kind: KindVFIOOwner, VFIOOwner: &VFIOOwnerChange{Group: 40, UID: 65534, OriginalUID: 0, OriginalGID: 0, OriginalMode: 0o660}},
	}, f.Changes)

	// Already the user's: nothing more journaled.
	require.NoError(t, j.GiveVFIOGroup(12, 65534))
	assert.Len(t, j.Changes(), 2)

	rep, err := RestoreStale(opts)
	require.NoError(t, err)
	assert.Len(t, rep.Restored, 2)
	uid, gid, mode = ownerOf(t, filepath.Join(dev, "vfio/12"))
	assert.Equal(t, []uint32{0, 0, 0o600}, []uint32{uid, gid, mode}, "group 12 back to root:root 0600")
	_, _, mode = ownerOf(t, filepath.Join(dev, "vfio/40"))
	assert.Equal(t, uint32(0o660), mode, "group 40 back to what it was")
	_, err = os.Stat(j.Path())
	assert.True(t, os.IsNotExist(err), "the journal is gone once everything is undone")
}

// TestGiveVFIOGroupRefusals: a group file that is missing (devices not on
// vfio-pci) or a symbolic link is refused before anything is journaled; a
// journal naming a group that is no number is refused whole.
func TestGiveVFIOGroupRefusals(t *testing.T) {
	dev := fakeDev(t, 12)
	state := t.TempDir()
	j := Open(Options{StateDir: state, SysfsRoot: t.TempDir(), DevRoot: dev, Getenv: jobEnv})
	assert.ErrorContains(t, j.GiveVFIOGroup(77, 65534), "vfio/77: no such file or directory (are its devices on vfio-pci?)")
	target := filepath.Join(t.TempDir(), "shadow")
	require.NoError(t, os.WriteFile(target, nil, 0o600))
	require.NoError(t, os.Symlink(target, filepath.Join(dev, "vfio", "14")))
	assert.ErrorContains(t, j.GiveVFIOGroup(14, 65534), "is not a character device")
	uid, _, _ := ownerOf(t, target)
	assert.Equal(t, uint32(0), uid, "the link's target is untouched")
	assert.Error(t, j.GiveVFIOGroup(-1, 65534))
	assert.Empty(t, j.Changes())

	bad := Change{Kind: KindVFIOOwner, VFIOOwner: &VFIOOwnerChange{Group: -3}}
	assert.ErrorContains(t, bad.validate(), "is not a VFIO group file's")
	bad = Change{Kind: KindTAP, TAP: &TAPChange{Name: "../x"}}
	assert.ErrorContains(t, bad.validate(), "is not a network interface name")
}

// inNetns runs f on a thread in a new network namespace (the thread is
// never given back to the scheduler: the namespace is its own).
func inNetns(t *testing.T, f func()) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a network namespace, a bridge and TAPs")
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		t.Skipf("no TUN/TAP driver: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			t.Errorf("unshare(CLONE_NEWNET): %v", err)
			return
		}
		f()
	}()
	<-done
}

// TestCreateTAPRoundTrip: the Prolog's TAP is persistent, owned by the
// job's user, up and on the bridge; the journal records it; an interface
// that exists is refused and left alone; the Epilog deletes the TAP.
func TestCreateTAPRoundTrip(t *testing.T) {
	inNetns(t, func() {
		opts := Options{StateDir: t.TempDir(), SysfsRoot: t.TempDir(), Getenv: jobEnv, PID: os.Getpid()}
		j := Open(opts)
		assert.ErrorContains(t, j.CreateTAP("hpjt0", "hpjbr0", 65534, 65534), "bridge hpjbr0 does not exist")
		assert.ErrorContains(t, j.CreateTAP("hpjt0", "lo", 65534, 65534), "bridge lo is a device interface, not a bridge")
		assert.Empty(t, j.Changes(), "refused before anything is journaled")
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "hpjbr0"}}
		require.NoError(t, netlink.LinkAdd(br))
		brl, err := netlink.LinkByName("hpjbr0")
		require.NoError(t, err)

		require.NoError(t, j.CreateTAP("hpjt0", "hpjbr0", 65534, 65533))
		l, err := netlink.LinkByName("hpjt0")
		require.NoError(t, err)
		tap, ok := l.(*netlink.Tuntap)
		require.True(t, ok, "a tuntap, got %s", l.Type())
		assert.False(t, tap.NonPersist, "persistent")
		assert.Equal(t, netlink.TUNTAP_MODE_TAP, tap.Mode)
		assert.Equal(t, uint32(65534), tap.Owner)
		assert.Equal(t, uint32(65533), tap.Group)
		assert.Equal(t, brl.Attrs().Index, l.Attrs().MasterIndex, "on the bridge")
		assert.NotZero(t, l.Attrs().RawFlags&unix.IFF_UP, "up")

		// Someone else's interface of the name: refused, left alone.
		require.NoError(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "hpjd0"}, PeerName: "hpjd0p"}))
		assert.ErrorContains(t, j.CreateTAP("hpjd0", "", 65534, 65534), "an interface of that name exists")

		f, err := readJournal(j.Path())
		require.NoError(t, err)
		assert.Equal(t, []Change{{Kind: KindTAP, TAP: &TAPChange{Name: "hpjt0", Bridge: "hpjbr0", UID: 65534, GID: 65533}}}, f.Changes)

		rep, err := RestoreStale(opts)
		require.NoError(t, err)
		assert.Len(t, rep.Restored, 1)
		_, err = netlink.LinkByName("hpjt0")
		assert.Error(t, err, "the Epilog deleted the TAP")
		_, err = netlink.LinkByName("hpjd0")
		assert.NoError(t, err, "the other interface stays")

		// A TAP a VM created under the journaled name (not persistent) is
		// not deleted.
		require.NoError(t, exec.Command("ip", "tuntap", "add", "dev", "hpjt1", "mode", "tun").Run())
		err = undoTAP(Change{Kind: KindTAP, TAP: &TAPChange{Name: "hpjt1"}})
		assert.ErrorContains(t, err, "no longer the persistent TAP hpcvmm bind created")
	})
}
