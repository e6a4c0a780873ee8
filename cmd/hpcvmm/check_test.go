package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

const checkFixture = "../../testdata/gpu-host-sysfs"

func needFixture(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(checkFixture); err != nil {
		t.Fatalf("real-host capture missing at %s (it is part of the module): %v", checkFixture, err)
	}
}

func runCLI(f func([]string, *bytes.Buffer, *bytes.Buffer) int, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	rc := f(args, &out, &errb)
	return rc, out.String(), errb.String()
}

func check(args []string, o, e *bytes.Buffer) int   { return runCheck(args, o, e) }
func devices(args []string, o, e *bytes.Buffer) int { return runDevices(args, o, e) }

// readyTree is a host where a GPU on vfio-pci can be passed through with
// 1 GiB of 1G hugepages.
func readyTree(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 8<<30, hosttest.Pool{Size: 1 << 30, Total: 2, Free: 2})
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.KVM()
	tr.AddDevice(hosttest.Device{BDF: "0000:00:04.0", Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, Driver: "vfio-pci", NUMANode: -1, IOMMUGroup: 3, ResetMethod: "bus",
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0xfe000000, 1<<20, false, false)})})
	return tr
}

func TestCheckFixture(t *testing.T) {
	needFixture(t)
	rc, out, _ := runCLI(check, "--sysfs", checkFixture, "--procfs", "/nonexistent", "--gpu", "0000:00:06.0", "--memory", "4G")
	assert.Equal(t, exitHost, rc, "the capture cannot run the VM")
	assert.Regexp(t, `FAIL\s+iommu\s+host\s+no IOMMU groups`, out)
	assert.Contains(t, out, "fix: enable VT-d in the firmware setup, add intel_iommu=on iommu=pt")
	assert.Regexp(t, `FAIL\s+driver\s+0000:00:06.0\s+bound to nvidia`, out)
	assert.Contains(t, out, "MSI-X at 0xb0: 9 vectors, table BAR0+0xb90000, PBA BAR0+0xba0000")
	assert.Contains(t, out, "no NUMA information (numa_node -1)")
	assert.Contains(t, out, "3 64-bit BARs (128.0G)")
	assert.Contains(t, out, "fix: echo 4 > /sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages")
	// The capture's node has 4.3 GiB: 16G can never fit it, which is bad
	// input (exit 2), not a hugepage pool to grow.
	rc, _, errs := runCLI(check, "--sysfs", checkFixture, "--procfs", "/nonexistent", "--gpu", "0000:00:06.0", "--memory", "16G")
	assert.Equal(t, 2, rc)
	assert.Equal(t, "hpcvmm check: --memory: 16G is more than this host's RAM (4.3G): no 1G hugepage pool there can ever hold it (see hpcvmm check --help)\n", errs)
	// The guest tree run builds: the H100, on its host's root bus, behind a
	// root port of its own that reports the GPU's 32 GT/s x16.
	assert.Contains(t, out, "guest PCI tree (hpcvmm run --topology host):\n[0000:00] host bridge (--topology host)\n \\-00:0a.0 root port [01] 32.0 GT/s PCIe x16\n   \\-01:00.0 gpu host 0000:00:06.0 [10de:2330] class 030200 32.0 GT/s PCIe x16\n")

	rc, out, _ = runCLI(check, "--sysfs", checkFixture, "--procfs", "/nonexistent", "--gpu", "00:06.0", "--json")
	assert.Equal(t, exitHost, rc)
	var rep struct {
		OK      bool               `json:"ok"`
		Results []preflight.Result `json:"results"`
		Tree    []string           `json:"guest_pci_tree"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep), out)
	assert.False(t, rep.OK)
	assert.Equal(t, []string{"[0000:00] host bridge (--topology host)", " \\-00:0a.0 root port [01] 32.0 GT/s PCIe x16",
		"   \\-01:00.0 gpu host 0000:00:06.0 [10de:2330] class 030200 32.0 GT/s PCIe x16"}, rep.Tree, "the JSON has the tree too")
	var sawIOMMU bool
	for _, r := range rep.Results {
		if r.Name == "iommu" {
			sawIOMMU = true
			assert.Equal(t, preflight.Fail, r.Status)
			assert.NotEmpty(t, r.Fix)
		}
	}
	assert.True(t, sawIOMMU)
}

func TestCheckPassesOnReadyHost(t *testing.T) {
	tr := readyTree(t)
	rc, out, errs := runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--gpu", "00:04.0", "--memory", "1G", "--cpus", "2")
	assert.Equal(t, 0, rc, out+errs)
	assert.Contains(t, out, "0 failed: the VM can start")

	// Hugepages short: exit 3 with the sysfs write that fixes it.
	rc, out, _ = runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--gpu", "00:04.0", "--memory", "4G")
	assert.Equal(t, exitHost, rc)
	assert.Contains(t, out, "fix: echo 4 > /sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages")

	// Device back on its host driver.
	tr.Symlink("sys/bus/pci/devices/0000:00:04.0/driver", "../../../bus/pci/drivers/edu")
	rc, out, _ = runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--gpu", "00:04.0")
	assert.Equal(t, exitHost, rc)
	assert.Contains(t, out, "bound to edu")
	assert.Contains(t, out, "echo vfio-pci > /sys/bus/pci/devices/0000:00:04.0/driver_override")

	// A device that is not on this host: the report says so, and no
	// stray "guest PCI tree: unknown" line follows it (issue 35).
	rc, out, _ = runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--gpu", "00:09.0")
	assert.Equal(t, exitHost, rc)
	assert.Contains(t, out, "0000:00:09.0")
	assert.NotContains(t, out, "guest PCI tree")

	// Explicit node that does not exist: bad input, as in hpcvmm run.
	rc, _, errs = runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--numa-node", "3")
	assert.Equal(t, 2, rc)
	assert.Contains(t, errs, "--numa-node: node 3 is not online; pick one of 0")
}

func TestCheckUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--memory", "lots"}, "--memory: size \"lots\""},
		{[]string{"--hugepages", "16M"}, "--hugepages \"16M\": want 1G, 2M or none"},
		{[]string{"--numa-node", "x"}, "--numa-node \"x\": want a node number or auto"},
		{[]string{"--cpus", "0"}, "--cpus 0: want 1 or more"},
		{[]string{"--cpu-mode", "fast"}, "--cpu-mode \"fast\": want dedicated, shared or auto"},
		{[]string{"--memory", "0"}, "--memory: no guest memory"},
		{[]string{"--memory", "1536M"}, "--memory: 1536M is not a multiple of the 1G page size: use 2G"},
		{[]string{"0000:00:04.0"}, "unexpected argument"},
		{[]string{"--bogus"}, "unknown flag --bogus (see hpcvmm check --help)"},
	} {
		rc, _, errs := runCLI(check, tc.args...)
		assert.Equal(t, 2, rc, tc.args)
		assert.Contains(t, errs, tc.want, tc.args)
	}
	rc, out, _ := runCLI(check, "-h")
	assert.Equal(t, 0, rc)
	assert.Contains(t, out, "--gpu BDF")
	assert.NotContains(t, out, "sysfs", "test-only flags stay hidden")
}

func TestDevicesFixture(t *testing.T) {
	needFixture(t)
	rc, out, errs := runCLI(devices, "--sysfs", checkFixture, "--procfs", "/nonexistent")
	require.Equal(t, 0, rc, errs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^BDF\s+ID\s+CLASS\s+NODE\s+GROUP\s+DRIVER\s+RESET\s+VFS$`, lines[0])
	assert.Regexp(t, `^0000:00:06.0\s+10de:2330\s+3D controller\s+-\s+-\s+nvidia\s+flr\s+-$`, lines[2])

	rc, out, _ = runCLI(devices, "--sysfs", checkFixture, "--json")
	require.Equal(t, 0, rc)
	var rows []deviceRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 2)
	assert.Equal(t, deviceRow{BDF: "0000:00:06.0", Vendor: "10de", Device: "2330", Class: "0x030200", ClassName: "3D controller",
		Driver: "nvidia", NUMANode: -1, IOMMUGroup: -1, ResetMethods: []string{"flr"}}, rows[1])
}

func TestDevicesSRIOV(t *testing.T) {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 1<<30)
	tr.Node(1, "4-7", 1<<30)
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.0", Vendor: 0x15b3, DeviceID: 0x101d, Class: 0x020700, Driver: "mlx5_core", NUMANode: 1, IOMMUGroup: 30, ResetMethod: "flr"})
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.1", Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020700, Driver: "vfio-pci", NUMANode: 1, IOMMUGroup: 31, ResetMethod: "flr"})
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.2", Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020700, NUMANode: 1, IOMMUGroup: 32})
	tr.LinkVF("0000:82:00.0", "0000:82:00.1", 0)
	tr.LinkVF("0000:82:00.0", "0000:82:00.2", 1)
	rc, out, errs := runCLI(devices, "--sysfs", tr.Sys(), "--procfs", tr.Proc())
	require.Equal(t, 0, rc, errs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	assert.Regexp(t, `^0000:82:00.0\s+15b3:101d\s+InfiniBand\s+1\s+30\s+mlx5_core\s+flr\s+2$`, lines[1])
	assert.Regexp(t, `^  vf 0000:82:00.1\s+15b3:101e\s+InfiniBand\s+1\s+31\s+vfio-pci\s+flr\s*$`, lines[2])
	assert.Regexp(t, `^  vf 0000:82:00.2\s+15b3:101e\s+InfiniBand\s+1\s+32\s+-\s+-\s*$`, lines[3])

	empty := hosttest.New(t)
	rc, out, _ = runCLI(devices, "--sysfs", empty.Sys(), "--procfs", empty.Proc())
	assert.Equal(t, 0, rc)
	assert.Contains(t, out, "no passthrough-capable devices")
}

// TestCheckAndRunRefuseTheSameInput: hpcvmm check and hpcvmm run validate
// through one function (preflight.CheckInput), so the same sizes are bad
// input (exit 2) in both, with the same words naming the same flag. The
// host tree's node has 16 GiB (8 free): 32G or 100T can never fit it,
// whatever the hugepage pool is set to.
func TestCheckAndRunRefuseTheSameInput(t *testing.T) {
	tr := readyTree(t)
	kernel := synthKernel(t)
	cache := t.TempDir()
	for _, args := range [][]string{
		{"--memory", "100T", "--hugepages", "2M"},
		{"--memory", "32G", "--hugepages", "1G"},
		{"--memory", "100T", "--hugepages", "none"},
		{"--memory", "32G", "--hugepages", "2M", "--numa-node", "0"},
		{"--memory", "1G", "--numa-node", "3"},
		{"--memory", "1536M", "--hugepages", "1G"},
		{"--memory", "16M", "--hugepages", "none"},
	} {
		host := []string{"--sysfs", tr.Sys(), "--procfs", tr.Proc()}
		rcCheck, _, errCheck := runCLI(check, append(append([]string{}, host...), args...)...)
		rcRun, _, errRun := hpcvmm(append(append([]string{"run", "--kernel", kernel, "--kernel-cache", cache}, host...), args...)...)
		assert.Equal(t, 2, rcCheck, "check %q: %s", args, errCheck)
		assert.Equal(t, 2, rcRun, "run %q: %s", args, errRun)
		msgCheck := strings.TrimSuffix(strings.TrimPrefix(errCheck, "hpcvmm check: "), " (see hpcvmm check --help)\n")
		msgRun := strings.TrimSuffix(strings.TrimPrefix(errRun, "hpcvmm run: "), "\n")
		assert.Equal(t, msgCheck, msgRun, "%q: check and run say the same", args)
		assert.True(t, strings.HasPrefix(msgRun, "--"), "%q names the flag: %s", args, msgRun)
	}
	// A size that fits the node but not today's pool is host state, with a
	// fix (exit 3), not an input error.
	rc, out, _ := runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--memory", "4G")
	assert.Equal(t, exitHost, rc)
	assert.Contains(t, out, "2 of the pool's 2 1G hugepages free; the VM needs 4 (4G)")
	assert.Contains(t, out, "fix: echo 4 > ")
}

// withDriverHost points check and jobs at root with the loader cache
// entries of cache (ldconfig -p's text) for the test.
func withDriverHost(t *testing.T, root string, cache []gpudriver.CacheEntry) {
	oldRoot, oldCache := gpuDriverRoot, gpuDriverCache
	gpuDriverRoot, gpuDriverCache = root, cache
	t.Cleanup(func() { gpuDriverRoot, gpuDriverCache = oldRoot, oldCache })
}

// fixtureDriverHost is gpudriver's fake H200 host (module 580.159.04) and
// its ldconfig -p.
func fixtureDriverHost(t *testing.T) {
	root, err := filepath.Abs("../../gpudriver/testdata/host")
	require.NoError(t, err)
	b, err := os.ReadFile("../../gpudriver/testdata/ldconfig-p.txt")
	require.NoError(t, err)
	cache, err := gpudriver.ParseLdconfig(b)
	require.NoError(t, err)
	withDriverHost(t, root, cache)
}

// copyDriverHost copies gpudriver's fake H200 host (symbolic links as
// links) for a test to change, and points check at it.
func copyDriverHost(t *testing.T) string {
	fixtureDriverHost(t)
	dst := testenv.CopyTree(t, gpuDriverRoot)
	withDriverHost(t, dst, gpuDriverCache)
	return dst
}

// TestCheckGPUDriver: check --gpu of an NVIDIA GPU reports the host
// driver jobs get and the GSP firmware, in the table and in --json; a
// library of another version and a missing firmware are warnings (the VM
// could start: exit as before) with both ways out; no module loaded too.
func TestCheckGPUDriver(t *testing.T) {
	needFixture(t)
	fixtureDriverHost(t)
	args := []string{"--sysfs", checkFixture, "--procfs", "/nonexistent", "--gpu", "0000:00:06.0", "--memory", "4G"}
	_, out, _ := runCLI(check, args...)
	assert.Regexp(t, `PASS\s+gpu-driver\s+0000:00:06.0\s+NVIDIA driver 580.159.04: 26 libraries, 5 programs for jobs' guests\n`, out)
	assert.Regexp(t, `PASS\s+gpu-firmware\s+0000:00:06.0\s+kernel 6.18.44-fc-v657-gpu's nvidia module \(580.159.04\): GSP firmware /usr/local/nvidia/firmware/nvidia/580.159.04/gsp_tu10x.bin`, out)
	_, out, _ = runCLI(check, append(args, "--json")...)
	var rep struct{ Results []preflight.Result }
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	got := map[string]preflight.Status{}
	for _, r := range rep.Results {
		if r.Subject == "0000:00:06.0" {
			got[r.Name] = r.Status
		}
	}
	assert.Equal(t, preflight.Pass, got["gpu-driver"])
	assert.Equal(t, preflight.Pass, got["gpu-firmware"])

	root := copyDriverHost(t)
	lib := filepath.Join(root, "usr/local/nvidia/lib64")
	require.NoError(t, os.WriteFile(filepath.Join(lib, "libcuda.so.575.57.08"), []byte("older"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(lib, "libcuda.so.1")))
	require.NoError(t, os.Symlink("libcuda.so.575.57.08", filepath.Join(lib, "libcuda.so.1")))
	require.NoError(t, os.RemoveAll(filepath.Join(root, "usr/local/nvidia/firmware")))
	_, out, _ = runCLI(check, args...)
	assert.Regexp(t, `WARN\s+gpu-driver\s+0000:00:06.0\s+the NVIDIA kernel module is version 580.159.04, its libraries version 575.57.08 \(/usr/local/nvidia/lib64/libcuda.so.1 is libcuda.so.575.57.08\)`, out)
	assert.Contains(t, out, "every job (hpcvmm run --rootfs) with this GPU exits 3 before boot unless run with --gpu-libs=off")
	assert.Contains(t, out, "fix: install the NVIDIA driver's user space of version 580.159.04, or load the 575.57.08 module (reboot after the driver's update); or run jobs with --gpu-libs=off")
	assert.Regexp(t, `WARN\s+gpu-firmware\s+0000:00:06.0\s+kernel 6.18.44-fc-v657-gpu's nvidia module \(580.159.04\) names GSP firmware nvidia/580.159.04/gsp_tu10x.bin`, out)
	assert.Contains(t, out, "fix: install the driver's firmware package (e.g. nvidia-firmware-580.159.04)")
	_, out, _ = runCLI(check, append(args, "--json")...)
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	for _, r := range rep.Results {
		if r.Name == "gpu-driver" || r.Name == "gpu-firmware" {
			assert.Equal(t, preflight.Warn, r.Status, r.Name)
			assert.Contains(t, r.Fix, "install", r.Name)
		}
	}

	root = copyDriverHost(t)
	require.NoError(t, os.Remove(filepath.Join(root, "proc/driver/nvidia/version")))
	require.NoError(t, os.Remove(filepath.Join(root, "sys/module/nvidia/version")))
	_, out, _ = runCLI(check, args...)
	assert.Regexp(t, `WARN\s+gpu-driver\s+0000:00:06.0\s+the NVIDIA kernel module is not loaded on the host`, out)
	assert.Contains(t, out, "fix: modprobe nvidia")

	// A device of another vendor gets neither check.
	tr := readyTree(t)
	_, out, _ = runCLI(check, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--gpu", "00:04.0")
	assert.NotContains(t, out, "gpu-driver")
}
