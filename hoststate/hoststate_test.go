package hoststate

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// kernel simulates the PCI driver core's sysfs attributes on a synthetic
// tree: driver_override, drivers/D/{bind,unbind} and drivers_probe.
type kernel struct {
	t       *testing.T
	tr      *hosttest.Tree
	natural map[string]string // the driver whose ID table matches the device
	refuse  map[string]bool   // drivers whose probe fails
	writes  []string
	before  func(path string) // runs before every write
}

func newKernel(t *testing.T) *kernel {
	tr := hosttest.New(t)
	tr.Write("sys/bus/pci/drivers_probe", "")
	return &kernel{t: t, tr: tr, natural: map[string]string{}, refuse: map[string]bool{}}
}

func (k *kernel) sys() string { return k.tr.Sys() }

func (k *kernel) loadDriver(name string) {
	require.NoError(k.t, os.MkdirAll(filepath.Join(k.sys(), "bus/pci/drivers", name), 0o755))
}

func (k *kernel) addDevice(bdf, driver, natural string) {
	k.tr.AddDevice(hosttest.Device{BDF: bdf, Vendor: 0x1b36, DeviceID: 0x10, Class: 0x010802, Driver: driver, IOMMUGroup: 5, NUMANode: -1})
	k.tr.Write("sys/bus/pci/devices/"+bdf+"/driver_override", "(null)\n")
	k.natural[bdf] = natural
	if natural != "" {
		k.loadDriver(natural)
	}
}

func (k *kernel) driver(bdf string) string {
	d, err := currentDriver(k.sys(), bdf)
	require.NoError(k.t, err)
	return d
}

func (k *kernel) override(bdf string) string {
	o, err := readOverride(filepath.Join(k.sys(), "bus/pci/devices", bdf))
	require.NoError(k.t, err)
	return o
}

func (k *kernel) link(bdf, drv string) error {
	if _, err := os.Stat(filepath.Join(k.sys(), "bus/pci/drivers", drv)); err != nil || k.refuse[drv] {
		return errors.New("ENODEV")
	}
	return os.Symlink("../../../bus/pci/drivers/"+drv, filepath.Join(k.sys(), "bus/pci/devices", bdf, "driver"))
}

func (k *kernel) write(path string, data []byte) error {
	if k.before != nil {
		k.before(path)
	}
	rel, err := filepath.Rel(k.sys(), path)
	require.NoError(k.t, err)
	s := string(data)
	k.writes = append(k.writes, rel+"="+strings.TrimSpace(s))
	parts := strings.Split(rel, "/")
	switch {
	case len(parts) == 5 && parts[2] == "devices" && parts[4] == "driver_override":
		v := strings.TrimSpace(s)
		if v == "" {
			v = "(null)"
		}
		return os.WriteFile(path, []byte(v+"\n"), 0o644)
	case len(parts) == 5 && parts[2] == "drivers" && parts[4] == "unbind":
		if k.driver(s) != parts[3] {
			return errors.New("ENODEV: not bound to " + parts[3])
		}
		return os.Remove(filepath.Join(k.sys(), "bus/pci/devices", s, "driver"))
	case len(parts) == 5 && parts[2] == "drivers" && parts[4] == "bind":
		if k.driver(s) != "" {
			return errors.New("EBUSY")
		}
		if o := k.override(s); o != "" && o != parts[3] {
			return errors.New("ENODEV: driver_override mismatch")
		}
		return k.link(s, parts[3])
	case rel == "bus/pci/drivers_probe":
		if k.driver(s) != "" {
			return nil
		}
		d := k.override(s)
		if d == "" {
			d = k.natural[s]
		}
		if d == "" {
			return nil
		}
		if err := k.link(s, d); err != nil {
			return nil // a failed probe leaves the device unbound; the write succeeds
		}
		return nil
	}
	k.t.Fatalf("unexpected sysfs write %s", rel)
	return nil
}

func (k *kernel) opts(t *testing.T, stateDir string, pid int) Options {
	// Outside Slurm whatever the environment the tests run in.
	return Options{StateDir: stateDir, SysfsRoot: k.sys(), WriteFile: k.write, PID: pid, Getenv: func(string) string { return "" }}
}

func mustBDF(t *testing.T, s string) host.BDF {
	b, err := host.ParseBDF(s)
	require.NoError(t, err)
	return b
}

func TestBindAndRestoreDeviceWithDriver(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.1", "nvme", "nvme")
	state := t.TempDir()
	j := Open(k.opts(t, state, 4242))
	journaled := false
	k.before = func(string) {
		if !journaled {
			var f file
			b, err := os.ReadFile(j.Path())
			require.NoError(t, err, "journal must exist before the first sysfs write")
			require.NoError(t, json.Unmarshal(b, &f))
			require.Len(t, f.Changes, 1)
			assert.Equal(t, Change{Kind: KindPCIBind, BDF: "0000:00:05.1", OriginalDriver: "nvme"}, f.Changes[0])
			assert.Equal(t, 4242, f.PID)
			journaled = true
		}
	}
	require.NoError(t, j.Bind(mustBDF(t, "00:05.1")))
	assert.True(t, journaled)
	assert.Equal(t, VFIODriver, k.driver("0000:00:05.1"))
	assert.Equal(t, VFIODriver, k.override("0000:00:05.1"))
	assert.Equal(t, []string{
		"bus/pci/devices/0000:00:05.1/driver_override=vfio-pci",
		"bus/pci/drivers/nvme/unbind=0000:00:05.1",
		"bus/pci/drivers_probe=0000:00:05.1",
	}, k.writes)
	assert.Equal(t, state, filepath.Dir(j.Path()))
	assert.Regexp(t, `^4242-[0-9a-f]{16}\.json$`, filepath.Base(j.Path()), "the PID, and a random part no later process with this PID repeats")
	assert.Equal(t, "0000:00:05.1 rebound from nvme to vfio-pci", j.Changes()[0].String())

	k.writes = nil
	require.NoError(t, j.Restore())
	assert.Equal(t, "nvme", k.driver("0000:00:05.1"))
	assert.Equal(t, "", k.override("0000:00:05.1"))
	assert.Equal(t, []string{
		"bus/pci/drivers/vfio-pci/unbind=0000:00:05.1",
		"bus/pci/devices/0000:00:05.1/driver_override=",
		"bus/pci/drivers_probe=0000:00:05.1",
	}, k.writes)
	assert.NoFileExists(t, j.Path(), "journal removed once everything is undone")
	assert.Empty(t, j.Changes())
	require.NoError(t, j.Restore(), "restoring twice is harmless")
}

func TestBindUnboundDeviceRestoresToNoDriver(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:04.0", "", "")
	j := Open(k.opts(t, t.TempDir(), 1))
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:04.0")))
	assert.Equal(t, VFIODriver, k.driver("0000:00:04.0"))
	require.NoError(t, j.Restore())
	assert.Equal(t, "", k.driver("0000:00:04.0"))
	assert.Equal(t, "", k.override("0000:00:04.0"))
}

func TestBindLeavesVFIODeviceAlone(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:04.0", VFIODriver, "")
	j := Open(k.opts(t, t.TempDir(), 1))
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:04.0")))
	assert.Empty(t, k.writes)
	assert.Empty(t, j.Changes())
	assert.NoFileExists(t, j.Path())
}

func TestBindErrorsLeaveNothingChanged(t *testing.T) {
	k := newKernel(t)
	k.addDevice("0000:00:05.0", "nvme", "nvme")
	j := Open(k.opts(t, t.TempDir(), 1))

	err := j.Bind(mustBDF(t, "0000:00:05.0"))
	assert.ErrorContains(t, err, "modprobe vfio-pci")
	err = j.Bind(mustBDF(t, "0000:00:1f.0"))
	assert.ErrorContains(t, err, "no such PCI device")
	assert.Empty(t, k.writes)

	// vfio-pci loaded but its probe fails: the device goes back to nvme.
	k.loadDriver(VFIODriver)
	k.refuse[VFIODriver] = true
	err = j.Bind(mustBDF(t, "0000:00:05.0"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the device is on no driver, not vfio-pci")
	assert.Equal(t, "nvme", k.driver("0000:00:05.0"))
	assert.Equal(t, "", k.override("0000:00:05.0"))
	assert.Empty(t, j.Changes())
	assert.NoFileExists(t, j.Path())
}

func TestRestoreStaleAfterKill(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.1", "nvme", "nvme")
	k.addDevice("0000:00:04.0", "e1000e", "e1000e")
	state := t.TempDir()

	// A process that has exited: its PID is dead.
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	dead := cmd.Process.Pid

	j := Open(k.opts(t, state, dead))
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:05.1")))
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:04.0")))
	// "kill -9": the journal stays behind.

	// A journal of a live hpcvmm (our parent process) is never touched.
	live := Open(Options{StateDir: state, SysfsRoot: k.sys(), WriteFile: k.write, PID: os.Getppid()})
	live.f.Changes = []Change{{Kind: KindPCIBind, BDF: "0000:00:09.0", OriginalDriver: "mlx5_core"}}
	require.NoError(t, live.save())

	me := k.opts(t, state, os.Getpid())
	rep, err := RestoreStale(me, mustBDF(t, "0000:00:04.0"))
	require.NoError(t, err)
	assert.Equal(t, []Change{{Kind: KindPCIBind, BDF: "0000:00:04.0", OriginalDriver: "e1000e"}}, rep.Restored)
	assert.Equal(t, "e1000e", k.driver("0000:00:04.0"))
	assert.Equal(t, VFIODriver, k.driver("0000:00:05.1"), "not asked for")
	require.Len(t, rep.Skipped, 1)
	assert.Contains(t, rep.Skipped[0], "still running")

	rep, err = RestoreStale(me)
	require.NoError(t, err)
	assert.Len(t, rep.Restored, 1)
	assert.Equal(t, "nvme", k.driver("0000:00:05.1"))
	assert.NoFileExists(t, j.Path())
	assert.FileExists(t, live.Path())
}

func TestRestoreKeepsWhatItCannotUndo(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.1", "nvme", "nvme")
	j := Open(k.opts(t, t.TempDir(), 7))
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:05.1")))
	j.f.Changes = append(j.f.Changes, Change{Kind: "hugepages", BDF: ""})
	err := j.Restore()
	assert.ErrorContains(t, err, `unknown kind "hugepages"`)
	assert.Equal(t, "nvme", k.driver("0000:00:05.1"))
	assert.Equal(t, []Change{{Kind: "hugepages"}}, j.Changes())
	assert.FileExists(t, j.Path())
}

func TestRestoreStaleNoDirectory(t *testing.T) {
	rep, err := RestoreStale(Options{StateDir: filepath.Join(t.TempDir(), "none"), SysfsRoot: t.TempDir()})
	require.NoError(t, err)
	assert.Empty(t, rep.Restored)
}

func TestStartTime(t *testing.T) {
	st, err := startTime("/proc", os.Getpid())
	if err != nil {
		t.Skipf("no procfs: %v", err)
	}
	assert.NotZero(t, st)
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "12"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "12/stat"), []byte("12 (a) b) S 1 12 12 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 0 0\n"), 0o644))
	st, err = startTime(dir, 12)
	require.NoError(t, err)
	assert.Equal(t, uint64(987654), st)
}
