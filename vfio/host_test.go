package vfio

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/uapi"
)

func TestParseSpec(t *testing.T) {
	s, err := ParseSpec("82:00.0,clique=3", false)
	require.NoError(t, err)
	assert.Equal(t, Spec{BDF: host.BDF{Bus: 0x82}, Clique: 3}, s)
	s, err = ParseSpec("0000:83:00.1", true)
	require.NoError(t, err)
	assert.Equal(t, Spec{BDF: host.BDF{Bus: 0x83, Function: 1}, VF: true, Clique: -1}, s)
	for in, msg := range map[string]string{
		"82:00":               "missing '.'",
		"82:00.0,clique=16":   "must be a number 0-15",
		"82:00.0,clique=x":    "must be a number 0-15",
		"82:00.0,rombar=0":    `unknown option "rombar=0"`,
		"zz:00.0":             "not hexadecimal",
		"0000:82:00.0,clique": "must be a number 0-15",
	} {
		_, err := ParseSpec(in, false)
		assert.ErrorContains(t, err, msg, in)
		assert.ErrorContains(t, err, "--gpu", in)
	}
	_, err = ParseSpec("83:00.1,clique=1", true)
	assert.ErrorContains(t, err, "--vf")
}

// gpuHost builds a host with an NVIDIA GPU and its audio function in group
// 7, an NVMe PF and VF in groups 8 and 9, and a bridge in group 7.
func gpuHost(t *testing.T, audioDriver string) *hosttest.Tree {
	tr := hosttest.New(t)
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.0", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", IOMMUGroup: 7, NUMANode: 1, ResetMethod: "flr"})
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.1", Vendor: 0x10de, DeviceID: 0x22a3, Class: 0x040300, Driver: audioDriver, IOMMUGroup: 7, NUMANode: 1})
	tr.AddDevice(hosttest.Device{BDF: "0000:80:01.0", Vendor: 0x1022, DeviceID: 0x1483, Class: 0x060400, Driver: "pcieport", IOMMUGroup: 7, NUMANode: 1})
	tr.AddDevice(hosttest.Device{BDF: "0000:83:00.0", Vendor: 0x15b3, DeviceID: 0x101b, Class: 0x020700, Driver: "mlx5_core", IOMMUGroup: 8, NUMANode: 1})
	tr.AddDevice(hosttest.Device{BDF: "0000:83:00.1", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "mlx5_core", IOMMUGroup: 9, NUMANode: 1})
	tr.LinkVF("0000:83:00.0", "0000:83:00.1", 0)
	return tr
}

func spec(t *testing.T, s string, vf bool) Spec {
	sp, err := ParseSpec(s, vf)
	require.NoError(t, err)
	return sp
}

func TestCheckDevice(t *testing.T) {
	h := gpuHost(t, "").Host()
	d, bound, err := CheckDevice(h, spec(t, "82:00.0,clique=2", false), false)
	require.NoError(t, err, "audio function without driver and a bridge on pcieport are fine")
	assert.True(t, bound)
	assert.Equal(t, 7, d.IOMMUGroup)

	d, bound, err = CheckDevice(h, spec(t, "83:00.1", true), true)
	require.NoError(t, err)
	assert.False(t, bound, "on mlx5_core: the caller binds it")
	require.NotNil(t, d.PhysFn)
	assert.Equal(t, "0000:83:00.0", d.PhysFn.String(), "the VF's PF is reported")

	_, _, err = CheckDevice(h, spec(t, "83:00.1", true), false)
	assert.ErrorContains(t, err, "in use by the host driver mlx5_core; let hpcvmm rebind it")

	_, _, err = CheckDevice(h, spec(t, "83:00.0", true), true)
	assert.ErrorContains(t, err, "VF 0000:83:00.0: 15b3:101b is not an SR-IOV virtual function")

	_, _, err = CheckDevice(h, spec(t, "83:00.0,clique=1", false), true)
	assert.ErrorContains(t, err, "P2P clique capability is for NVIDIA GPUs")

	_, _, err = CheckDevice(h, spec(t, "99:00.0", false), false)
	assert.ErrorContains(t, err, "no such PCI device")
}

func TestCheckDeviceGroupNotViable(t *testing.T) {
	h := gpuHost(t, "snd_hda_intel").Host()
	_, _, err := CheckDevice(h, spec(t, "82:00.0", false), false)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "IOMMU group 7 is not viable: 0000:82:00.1 (driver snd_hda_intel)")
	assert.Contains(t, err.Error(), "hpcvmm bind 0000:82:00.1")
	assert.NotContains(t, err.Error(), "80:01.0", "bridges are tolerated")
}

func TestCheckDeviceIOMMUOff(t *testing.T) {
	tr := hosttest.New(t)
	tr.AddDevice(hosttest.Device{BDF: "0000:04:00.0", Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, IOMMUGroup: -1, NUMANode: -1})
	_, _, err := CheckDevice(tr.Host(), spec(t, "04:00.0", false), true)
	assert.ErrorContains(t, err, "IOMMU is disabled")
	assert.ErrorContains(t, err, "intel_iommu=on")

	// The real H100 capture has no IOMMU groups either.
	h := host.New("../testdata/gpu-host-sysfs", "/nonexistent")
	_, _, err = CheckDevice(h, spec(t, "00:06.0", false), true)
	assert.ErrorContains(t, err, "IOMMU is disabled")
}

type fakeKVM struct {
	log  []string
	fail error
}

func (k *fakeKVM) CreateDevice(typ uint32) (int, error) {
	k.log = append(k.log, "create")
	if typ != uapi.DeviceVFIO {
		return -1, errors.New("bad type")
	}
	return 99, k.fail
}

func (k *fakeKVM) SetDeviceAttrInt32(fd int, group uint32, attr uint64, v int32) error {
	if fd != 99 || group != uapi.DeviceAttrVFIOGroup {
		return errors.New("bad attr")
	}
	op := "add"
	if attr == uapi.VFIOGroupDel {
		op = "del"
	}
	k.log = append(k.log, op)
	return nil
}

func TestKVMVFIO(t *testing.T) {
	k := &fakeKVM{}
	kv, err := NewKVMVFIO(k)
	require.NoError(t, err)
	closed := -1
	kv.closer = func(fd int) error { closed = fd; return nil }
	g := &uapi.VFIOGroup{Group: 7}
	require.NoError(t, kv.AddGroup(g))
	require.NoError(t, kv.AddGroup(g))
	require.NoError(t, kv.Close())
	assert.Equal(t, []string{"create", "add", "del"}, k.log)
	assert.Equal(t, 99, closed)

	_, err = NewKVMVFIO(&fakeKVM{fail: errors.New("ENODEV")})
	assert.ErrorContains(t, err, "KVM-VFIO device")
}
