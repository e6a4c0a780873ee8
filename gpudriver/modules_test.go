package gpudriver_test

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/kmodules"
)

// The H100's modalias from testdata/gpu-host-sysfs (a real host), and
// ConnectX VFs' as their PCI IDs make them (15b3:101e ConnectX-6 Dx VF,
// Ethernet; 15b3:1021 ConnectX-7, InfiniBand).
const (
	h100Alias   = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"
	cx6vfAlias  = "pci:v000015B3d0000101Esv000015B3sd00000000bc02sc00i00"
	cx7ibAlias  = "pci:v000015B3d00001021sv000015B3sd00000000bc02sc07i00"
	nvmeAlias   = "pci:v00001B36d00000010sv00001AF4sd00001100bc01sc08i02"
	testRelease = "6.18.44-fc-v657-gpu"
)

// resolve feeds m to kmodules as the job's initramfs build would, with the
// devices' modaliases, from testdata's module tree.
func resolve(t *testing.T, m gpudriver.Modules, aliases ...string) *kmodules.Set {
	t.Helper()
	dir, err := filepath.Abs("testdata/host/lib/modules")
	require.NoError(t, err)
	set, err := kmodules.Resolve(kmodules.Config{Release: testRelease, HostDir: dir, Modules: m.Load,
		Optional: m.Optional, Exclude: m.Exclude, Modaliases: aliases})
	require.NoError(t, err)
	return set
}

func TestModulesForAGPU(t *testing.T) {
	m := gpudriver.ForModaliases([]string{h100Alias, nvmeAlias})
	require.Equal(t, gpudriver.Modules{Load: []string{"nvidia", "nvidia_uvm"}, Optional: []string{"nvidia_modeset"}, Exclude: []string{"nouveau"},
		RequireFirmware: []string{gpudriver.GSPFirmware}}, m)
	set := resolve(t, m, h100Alias)
	require.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_modeset"}, set.Names())
	require.Empty(t, set.Absent)
	require.Empty(t, set.Unmatched)

	// The module names its GSP firmware, which GSPFirmware matches and the
	// fixture host has; without it, the required file's absence is refused.
	refs := set.Firmware()
	require.Equal(t, []kmodules.FirmwareRef{
		{Module: "nvidia", Name: "nvidia/580.159.04/gsp_tu10x.bin", Version: "580.159.04"},
		{Module: "nvidia", Name: "nvidia/580.159.04/gsp_ga10x.bin", Version: "580.159.04"},
	}, refs)
	// Where the H200 host keeps it: the directory its kernel's
	// firmware_class.path names.
	files, err := kmodules.FindFirmware(kmodules.FirmwareDirs("testdata/host", testRelease), refs, m.RequireFirmware)
	require.NoError(t, err)
	require.Len(t, files.Found, 2)
	require.Equal(t, filepath.Join("testdata/host/usr/local/nvidia/firmware"), files.Found[0].Dir)
	_, err = kmodules.FindFirmware(kmodules.FirmwareDirs(t.TempDir(), testRelease), refs, m.RequireFirmware)
	var missing *kmodules.MissingFirmwareError
	require.ErrorAs(t, err, &missing)
	require.ErrorContains(t, err, "nvidia-firmware-580.159.04")

	// What the modalias alone brings: nouveau beside nvidia, no nvidia_uvm.
	plain := resolve(t, gpudriver.Modules{Load: []string{}}, h100Alias)
	require.Equal(t, []string{"nvidia", "drm", "drm_kms_helper", "nouveau"}, plain.Names())
}

func TestModulesForConnectX(t *testing.T) {
	m := gpudriver.ForModaliases([]string{cx6vfAlias})
	require.Equal(t, gpudriver.Modules{Load: []string{"mlx5_ib", "ib_uverbs", "ib_umad", "rdma_ucm"}}, m)
	set := resolve(t, m, cx6vfAlias)
	require.Equal(t, []string{"ib_core", "ib_uverbs", "mlxfw", "mlx5_core", "mlx5_ib", "ib_umad", "iw_cm", "ib_cm", "rdma_cm", "rdma_ucm"}, set.Names())

	// A GPU and an InfiniBand function: GPUDirect RDMA's nvidia_peermem too,
	// after ib_core and nvidia.
	m = gpudriver.ForModaliases([]string{cx7ibAlias, h100Alias})
	require.Equal(t, []string{"nvidia_modeset", "nvidia_peermem"}, m.Optional)
	set = resolve(t, m, cx7ibAlias, h100Alias)
	names := set.Names()
	require.NotContains(t, names, "nouveau")
	for _, want := range []string{"nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_peermem", "mlx5_core", "mlx5_ib", "ib_uverbs", "ib_umad", "rdma_ucm"} {
		require.Contains(t, names, want)
	}
	require.Less(t, slices.Index(names, "ib_core"), slices.Index(names, "nvidia_peermem"))

	require.Equal(t, gpudriver.Modules{}, gpudriver.ForModaliases([]string{nvmeAlias, "pci:v000010DEd000022A3sv*", "garbage"}),
		"an NVMe drive, an NVIDIA function without a class (an NVSwitch is class 0680) and junk bring nothing")
}

func TestGPUs(t *testing.T) {
	require.Equal(t, 2, gpudriver.GPUs([]string{h100Alias, cx7ibAlias, h100Alias, nvmeAlias, "pci:v000010DEd000022A3sv000010DEsd00001796bc06sc80i00", "junk"}),
		"two H100s; a ConnectX, an NVMe drive, an NVSwitch (class 0680) and junk are no GPUs")
	require.Zero(t, gpudriver.GPUs(nil))
}
