package vmm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/hoststate"
)

// TestSysfsWritesUseFilesOpenedBeforeTheFilter: prepare opens every
// attribute hoststate's restore writes for a rebound device (vfio-pci's
// unbind, driver_override, drivers_probe, the original driver's bind), and
// write goes through those files, not through a new open (which the
// seccomp filter refuses): an attribute replaced after prepare is not the
// one written.
func TestSysfsWritesUseFilesOpenedBeforeTheFilter(t *testing.T) {
	root := t.TempDir()
	pci := filepath.Join(root, "bus/pci")
	const bdf = "0000:00:04.0"
	for _, f := range []string{"devices/" + bdf + "/driver_override", "drivers/vfio-pci/unbind", "drivers/nvme/bind", "drivers_probe"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(pci, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pci, f), nil, 0o644))
	}
	require.NoError(t, os.Symlink("../../drivers/vfio-pci", filepath.Join(pci, "devices", bdf, "driver")))

	var w sysfsWrites
	defer w.close()
	changes := []hoststate.Change{
		{Kind: hoststate.KindPCIBind, BDF: bdf, OriginalDriver: "nvme"},
		{Kind: hoststate.KindPCIBind, BDF: "../../etc", OriginalDriver: "nvme"}, // not a BDF: nothing opened for it
		{Kind: hoststate.KindPCIBind, BDF: bdf, OriginalDriver: "../x"},
	}
	require.NoError(t, w.prepare(root, changes))
	var opened []string
	for p := range w.files {
		rel, err := filepath.Rel(pci, p)
		require.NoError(t, err)
		opened = append(opened, rel)
	}
	assert.ElementsMatch(t, []string{"devices/" + bdf + "/driver_override", "drivers/vfio-pci/unbind", "drivers/nvme/bind", "drivers_probe"}, opened)

	// Replace an attribute after prepare: the write reaches the file
	// opened before, at offset 0 each time.
	unbind := filepath.Join(pci, "drivers/vfio-pci/unbind")
	require.NoError(t, os.Rename(unbind, unbind+".old"))
	require.NoError(t, os.WriteFile(unbind, nil, 0o644))
	require.NoError(t, w.write(unbind, []byte(bdf)))
	require.NoError(t, w.write(unbind, []byte(bdf)))
	b, err := os.ReadFile(unbind + ".old")
	require.NoError(t, err)
	assert.Equal(t, bdf, string(b))
	b, err = os.ReadFile(unbind)
	require.NoError(t, err)
	assert.Empty(t, b, "written through a new open")

	// A path prepare did not foresee is opened for the write (no filter here).
	other := filepath.Join(root, "other")
	require.NoError(t, os.WriteFile(other, nil, 0o644))
	require.NoError(t, w.write(other, []byte("1")))
	b, err = os.ReadFile(other)
	require.NoError(t, err)
	assert.Equal(t, "1", string(b))
}

// TestSysfsWritesRefuseSymlinks: like hoststate's own writes, neither the
// files opened before the filter nor a later open follow a symbolic link
// in an attribute's place.
func TestSysfsWritesRefuseSymlinks(t *testing.T) {
	root := t.TempDir()
	pci := filepath.Join(root, "bus/pci")
	const bdf = "0000:00:04.0"
	victim := filepath.Join(root, "victim")
	require.NoError(t, os.WriteFile(victim, nil, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(pci, "devices", bdf), 0o755))
	require.NoError(t, os.Symlink(victim, filepath.Join(pci, "devices", bdf, "driver_override")))
	var w sysfsWrites
	defer w.close()
	assert.Error(t, w.prepare(root, []hoststate.Change{{Kind: hoststate.KindPCIBind, BDF: bdf}}))
	assert.Error(t, w.write(filepath.Join(pci, "devices", bdf, "driver_override"), []byte("x")))
	b, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Empty(t, b)
}

// TestSysfsWritesKeepOnlyWhatTheTeardownNeeds is issue 30's finding on
// the descriptors a --bind-devices run keeps open under the seccomp
// filter: for a device that had no driver, only its own driver_override
// and vfio-pci's unbind (no drivers_probe, no driver's bind); never another
// device's driver_override, a driver's new_id or remove_id, a device's
// remove or the bus's rescan.
func TestSysfsWritesKeepOnlyWhatTheTeardownNeeds(t *testing.T) {
	root := t.TempDir()
	pci := filepath.Join(root, "bus/pci")
	const mine, other = "0000:00:04.0", "0000:00:05.0"
	for _, f := range []string{"devices/" + mine + "/driver_override", "devices/" + mine + "/remove", "devices/" + other + "/driver_override",
		"drivers/vfio-pci/unbind", "drivers/vfio-pci/new_id", "drivers/vfio-pci/remove_id", "drivers/nvme/bind", "drivers_probe", "rescan"} {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(pci, f)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(pci, f), nil, 0o644))
	}
	require.NoError(t, os.Symlink("../../drivers/vfio-pci", filepath.Join(pci, "devices", mine, "driver")))
	var w sysfsWrites
	defer w.close()
	require.NoError(t, w.prepare(root, []hoststate.Change{{Kind: hoststate.KindPCIBind, BDF: mine}}))
	var opened []string
	for p := range w.files {
		rel, err := filepath.Rel(pci, p)
		require.NoError(t, err)
		opened = append(opened, rel)
	}
	assert.ElementsMatch(t, []string{"devices/" + mine + "/driver_override", "drivers/vfio-pci/unbind"}, opened)
}
