package vfio

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// netHost is gpuHost with a NIC that carries the host's default route
// (0000:00:03.0, virtio-net eth0), an NVMe drive holding / and an idle
// NIC whose interface is down (0000:00:04.0).
func netHost(t *testing.T) *hosttest.Tree {
	tr := gpuHost(t, "")
	tr.AddDevice(hosttest.Device{BDF: "0000:00:03.0", Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3})
	tr.AddDevice(hosttest.Device{BDF: "0000:00:04.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 4})
	tr.AddDevice(hosttest.Device{BDF: "0000:3d:00.0", Vendor: 0x144d, DeviceID: 0xa80a, Class: 0x010802, Driver: "nvme", IOMMUGroup: 30})
	tr.ClassNet("0000:00:03.0", "virtio2/net", "eth0", 0x1003)
	tr.ClassNet("0000:00:04.0", "net", "eth1", 0x1002)
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0", "nvme0n1", "259:0")
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0/nvme0n1", "nvme0n1p2", "259:2")
	tr.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
	tr.Write("proc/self/mountinfo", "27 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n")
	return tr
}

// TestCheckDeviceRefusesWhatTheHostUses is issue 23's defect 8 for `hpcvmm
// run`: --bind-devices must not take the host's network or root disk, and the
// error without --bind-devices must not suggest rebinding them.
func TestCheckDeviceRefusesWhatTheHostUses(t *testing.T) {
	h := netHost(t).Host()
	for _, allowBind := range []bool{true, false} {
		_, _, err := CheckDevice(h, spec(t, "00:03.0", false), allowBind)
		require.Error(t, err, "bind=%v", allowBind)
		assert.ErrorContains(t, err, "GPU 0000:00:03.0: the host uses it: network interface eth0 (up; carries the default route; 1 routes)")
		assert.NotContains(t, err.Error(), "hpcvmm bind", "bind=%v", allowBind)
		assert.NotContains(t, err.Error(), "add --bind-devices", "bind=%v", allowBind)

		_, _, err = CheckDevice(h, spec(t, "3d:00.0", false), allowBind)
		assert.ErrorContains(t, err, "block device nvme0n1p2 (mounted at /)")
	}
	_, bound, err := CheckDevice(h, spec(t, "00:04.0", false), true)
	require.NoError(t, err, "an interface that is down and unused does not stop --bind-devices")
	assert.False(t, bound)
}

// TestCheckGroupViableHostUsedMember: a group member the host uses is not
// offered to `hpcvmm bind`.
func TestCheckGroupViableHostUsedMember(t *testing.T) {
	tr := netHost(t)
	tr.AddDevice(hosttest.Device{BDF: "0000:00:03.1", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", IOMMUGroup: 3})
	_, _, err := CheckDevice(tr.Host(), spec(t, "00:03.1", false), true)
	require.Error(t, err)
	assert.ErrorContains(t, err, "IOMMU group 3 is not viable and cannot be made so: 0000:00:03.0 (driver virtio-pci: the host uses it: network interface eth0")
	assert.NotContains(t, err.Error(), "hpcvmm bind")
}
