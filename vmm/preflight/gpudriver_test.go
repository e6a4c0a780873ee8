package preflight_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/kmodules/kmodtest"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// driverHost is gpudriver's fake H200 host (module 580.159.04, laid out
// from the real host's capture; testdata/mkroot.sh) and its loader cache.
const driverHost = "../../gpudriver/testdata/host"

func driverCache(t testing.TB) []gpudriver.CacheEntry {
	b, err := os.ReadFile("../../gpudriver/testdata/ldconfig-p.txt")
	require.NoError(t, err)
	c, err := gpudriver.ParseLdconfig(b)
	require.NoError(t, err)
	return c
}

// driverRequest is goodRequest with the driver checks on root.
func driverRequest(t testing.TB, root string) preflight.Request {
	req := goodRequest()
	req.GPUDriver, req.DriverRoot, req.DriverCache = true, root, driverCache(t)
	return req
}

// TestGPUDriverPass: on the fixture host, an NVIDIA GPU's driver and
// firmware checks pass, each once per GPU, naming the version, what jobs
// get and the firmware found; the whole report still passes as before.
func TestGPUDriverPass(t *testing.T) {
	_, h := goodHost(t)
	r := preflight.Run(h, driverRequest(t, driverHost))
	require.True(t, r.OK(), "%+v", r.Failures())
	x := find(t, r, "gpu-driver", gpu)
	assert.Equal(t, preflight.Pass, x.Status)
	assert.Equal(t, "NVIDIA driver 580.159.04: 26 libraries, 5 programs for jobs' guests", x.Detail)
	assert.Empty(t, x.Fix)
	x = find(t, r, "gpu-firmware", gpu)
	assert.Equal(t, preflight.Pass, x.Status)
	assert.Equal(t, "kernel 6.18.44-fc-v657-gpu's nvidia module (580.159.04): GSP firmware /usr/local/nvidia/firmware/nvidia/580.159.04/gsp_tu10x.bin, /usr/local/nvidia/firmware/nvidia/580.159.04/gsp_ga10x.bin, for jobs' guests", x.Detail,
		"where the H200 host keeps it: the directory its kernel's firmware_class.path names")
	assert.False(t, has(preflight.Run(h, goodRequest()), "gpu-driver"), "only when asked")
	for _, res := range r.Results {
		if res.Name == "gpu-driver" || res.Name == "gpu-firmware" {
			assert.Equal(t, gpu, res.Subject, "the ConnectX VF is no GPU")
		}
	}
	// A request without an NVIDIA GPU reads nothing of the driver.
	req := driverRequest(t, "/nonexistent")
	req.GPUs = nil
	r = preflight.Run(h, req)
	assert.False(t, has(r, "gpu-driver"))
	assert.False(t, has(r, "gpu-firmware"))
}

// TestGPUDriverMismatch: a library of another version than the module is
// a warning (a VM still starts) that says jobs exit 3 and both ways out.
func TestGPUDriverMismatch(t *testing.T) {
	root := testenv.CopyTree(t, driverHost)
	lib := filepath.Join(root, "usr/local/nvidia/lib64")
	require.NoError(t, os.WriteFile(filepath.Join(lib, "libnvidia-ml.so.580.95.05"), []byte("older"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(lib, "libnvidia-ml.so.1")))
	require.NoError(t, os.Symlink("libnvidia-ml.so.580.95.05", filepath.Join(lib, "libnvidia-ml.so.1")))
	_, h := goodHost(t)
	r := preflight.Run(h, driverRequest(t, root))
	require.True(t, r.OK(), "a warning: a VM boots without the libraries")
	x := find(t, r, "gpu-driver", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "the NVIDIA kernel module is version 580.159.04, its libraries version 580.95.05")
	assert.Contains(t, x.Detail, "every job (hpcvmm run --rootfs) with this GPU exits 3 before boot unless run with --gpu-libs=off")
	assert.Contains(t, x.Fix, "install the NVIDIA driver's user space of version 580.159.04")
	assert.Contains(t, x.Fix, "--gpu-libs=off")
	assert.Equal(t, preflight.Pass, find(t, r, "gpu-firmware", gpu).Status)
}

// TestGPUDriverNoModule: no NVIDIA module loaded is a warning of the same
// kind; so is a guest kernel without the nvidia module, or with one of
// another version than the host's libraries.
func TestGPUDriverNoModule(t *testing.T) {
	root := testenv.CopyTree(t, driverHost)
	require.NoError(t, os.Remove(filepath.Join(root, "proc/driver/nvidia/version")))
	require.NoError(t, os.Remove(filepath.Join(root, "sys/module/nvidia/version")))
	_, h := goodHost(t)
	r := preflight.Run(h, driverRequest(t, root))
	require.True(t, r.OK())
	x := find(t, r, "gpu-driver", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "the NVIDIA kernel module is not loaded on the host")
	assert.Contains(t, x.Detail, "exits 3 before boot unless run with --gpu-libs=off")
	assert.Contains(t, x.Fix, "modprobe nvidia")
	assert.Contains(t, x.Fix, "--gpu-libs=off")

	// Kernel 6.1.0-other: nvidia 575.57.08, not the host driver's version.
	dir := filepath.Join(root, "usr/lib/modules/6.1.0-other")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "updates/dkms"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "modules.dep"), []byte("updates/dkms/nvidia.ko:\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "updates/dkms/nvidia.ko"),
		kmodtest.Object("version=575.57.08", "firmware=nvidia/575.57.08/gsp_ga10x.bin"), 0o644))
	req := driverRequest(t, driverHost)
	req.DriverRoot, req.GuestRelease = copyWithModules(t, root), "6.1.0-other"
	r = preflight.Run(h, req)
	x = find(t, r, "gpu-driver", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "NVIDIA driver 580.159.04 on the host, but kernel 6.1.0-other's nvidia module, which jobs' guests load, is version 575.57.08")
	assert.Contains(t, x.Fix, "dkms install nvidia/580.159.04 -k 6.1.0-other")
	x = find(t, r, "gpu-firmware", gpu)
	assert.Equal(t, preflight.Warn, x.Status, "575's GSP firmware is not on the host")
	assert.Contains(t, x.Fix, "nvidia-firmware-575.57.08")

	// Kernel 6.1.0-nonvidia: a module tree without nvidia.
	dir = filepath.Join(req.DriverRoot, "usr/lib/modules/6.1.0-nonvidia")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "modules.dep"), []byte("kernel/x.ko:\n"), 0o644))
	req.GuestRelease = "6.1.0-nonvidia"
	x = find(t, preflight.Run(h, req), "gpu-firmware", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "kernel 6.1.0-nonvidia (which jobs boot unless given --kernel) has no nvidia module in /lib/modules/6.1.0-nonvidia/modules.dep")
	assert.Equal(t, "install the NVIDIA driver's kernel modules for 6.1.0-nonvidia (its DKMS package) and run depmod 6.1.0-nonvidia", x.Fix)

	// Kernel 6.1.0-absent: no module tree at all.
	req.GuestRelease = "6.1.0-absent"
	x = find(t, preflight.Run(h, req), "gpu-firmware", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "kernel 6.1.0-absent (which jobs boot unless given --kernel) has no module tree (/lib/modules/6.1.0-absent/modules.dep)")
	assert.Contains(t, x.Fix, "install kernel 6.1.0-absent's modules")
}

// copyWithModules is the fixture host with the driver loaded again and
// root's module trees: a loaded 580.159.04 beside root's kernels.
func copyWithModules(t *testing.T, root string) string {
	dst := testenv.CopyTree(t, driverHost)
	src := filepath.Join(root, "usr/lib/modules/6.1.0-other")
	require.NoError(t, os.CopyFS(filepath.Join(dst, "usr/lib/modules/6.1.0-other"), os.DirFS(src)))
	return dst
}

// TestGPUFirmwareMissing: the GSP firmware the guest kernel's nvidia
// module names, missing on the host, is a warning naming the files and
// the package that brings them.
func TestGPUFirmwareMissing(t *testing.T) {
	root := testenv.CopyTree(t, driverHost)
	require.NoError(t, os.RemoveAll(filepath.Join(root, "usr/local/nvidia/firmware")))
	_, h := goodHost(t)
	r := preflight.Run(h, driverRequest(t, root))
	require.True(t, r.OK())
	assert.Equal(t, preflight.Pass, find(t, r, "gpu-driver", gpu).Status)
	x := find(t, r, "gpu-firmware", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "kernel 6.18.44-fc-v657-gpu's nvidia module (580.159.04) names GSP firmware nvidia/580.159.04/gsp_tu10x.bin, nvidia/580.159.04/gsp_ga10x.bin, which none of ")
	assert.Contains(t, x.Detail, "none of /usr/local/nvidia/firmware, /lib/firmware/updates/6.18.44-fc-v657-gpu, /lib/firmware/updates, /lib/firmware/6.18.44-fc-v657-gpu, /lib/firmware holds")
	assert.Contains(t, x.Detail, "the guest's driver cannot bring the GPU up without it")
	assert.Equal(t, "install the driver's firmware package (e.g. nvidia-firmware-580.159.04), which puts it under /lib/firmware/nvidia/580.159.04", x.Fix)

	// In /lib/firmware, where a distribution's firmware package puts it.
	fw := filepath.Join(root, "usr/lib/firmware/nvidia/580.159.04")
	require.NoError(t, os.MkdirAll(fw, 0o755))
	for _, f := range []string{"gsp_ga10x.bin", "gsp_tu10x.bin"} {
		require.NoError(t, os.WriteFile(filepath.Join(fw, f), []byte("gsp"), 0o644))
	}
	x = find(t, preflight.Run(h, driverRequest(t, root)), "gpu-firmware", gpu)
	assert.Equal(t, preflight.Pass, x.Status)
	assert.Contains(t, x.Detail, "GSP firmware /lib/firmware/nvidia/580.159.04/gsp_tu10x.bin, /lib/firmware/nvidia/580.159.04/gsp_ga10x.bin")
}

// BenchmarkGPUDriverChecks: what the driver checks add to a report on the
// fixture host (gpudriver.Find, modules.dep, nvidia.ko's .modinfo, the
// firmware lookups).
func BenchmarkGPUDriverChecks(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "off", true: "on"}[on], func(b *testing.B) {
			req := driverRequest(b, driverHost)
			req.GPUDriver = on
			_, h := goodHost(b)
			b.ReportAllocs()
			for b.Loop() {
				preflight.Run(h, req)
			}
		})
	}
}
