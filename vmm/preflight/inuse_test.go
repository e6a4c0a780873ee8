package preflight_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// TestDriverHostUsesDevice is issue 23's defect 8 for `hpcvmm check`: a
// new user checking the host's only NIC (its default route) was told "fix:
// hpcvmm bind". Now the check fails, says what the host uses it for, and
// suggests no rebind, with or without --bind-devices.
func TestDriverHostUsesDevice(t *testing.T) {
	tr, h := goodHost(t)
	const nic = "0000:00:03.0"
	tr.AddDevice(hosttest.Device{BDF: nic, Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3})
	tr.ClassNet(nic, "virtio2/net", "eth0", 0x1003)
	tr.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
	for _, bind := range []bool{false, true} {
		req := goodRequest()
		req.GPUs = []string{nic}
		req.AllowBind = bind
		r := preflight.Run(h, req)
		x := find(t, r, "driver", nic)
		assert.Equal(t, preflight.Fail, x.Status, "bind=%v", bind)
		assert.Contains(t, x.Detail, "bound to virtio-pci, and the host uses it: network interface eth0 (up; carries the default route; 1 routes)")
		assert.NotContains(t, x.Fix, "bind", "bind=%v", bind)
		assert.NotContains(t, x.Fix, "driver_override", "bind=%v", bind)
		assert.Contains(t, x.Fix, "hpcvmm devices")
		assert.False(t, r.OK())
	}

	// A member of the GPU's group that the host uses: no rebind offered.
	tr.AddDevice(hosttest.Device{BDF: "0000:41:00.2", Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 40})
	tr.ClassNet("0000:41:00.2", "virtio3/net", "eth9", 0x1003)
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "iommu-group", gpu)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "0000:41:00.2 (virtio-pci; the host uses it: network interface eth9 (up))")
	assert.NotContains(t, x.Fix, "driver_override")
}
