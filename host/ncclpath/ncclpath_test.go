package ncclpath_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/host/ncclpath"
)

func fn(bdf string, class uint32, numa int) hosttest.Device {
	return hosttest.Device{BDF: bdf, Vendor: 0x10de, DeviceID: 0x1, Class: class, NUMANode: numa, IOMMUGroup: -1}
}

const bridge = 0x060400

// host builds a two-socket host:
//
//	pci0000:00 (node 0)
//	  00:01.0 root port - 01:00.0 switch USP - 02:08.0 DSP - 04:00.0 GPU0
//	                                         - 02:10.0 DSP - 05:00.0 NIC PF, 05:00.1 VF
//	                                         - 02:18.0 DSP - 07:00.0 USP - 08:00.0 DSP - 09:00.0 GPU1
//	  00:03.0 root port - 06:00.0 GPU2
//	pci0000:80 (node 1)
//	  80:01.0 root port - 81:00.0 GPU3
func twoSocketHost(t *testing.T) string {
	tr := hosttest.New(t)
	tr.AddDeviceUnder(fn("0000:00:01.0", bridge, 0))
	tr.AddDeviceUnder(fn("0000:01:00.0", bridge, 0), "0000:00:01.0")
	for _, dsp := range []string{"0000:02:08.0", "0000:02:10.0", "0000:02:18.0"} {
		tr.AddDeviceUnder(fn(dsp, bridge, 0), "0000:00:01.0", "0000:01:00.0")
	}
	tr.AddDeviceUnder(fn("0000:04:00.0", 0x030200, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:08.0")
	tr.AddDeviceUnder(fn("0000:05:00.0", 0x020700, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(fn("0000:05:00.1", 0x020700, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(fn("0000:07:00.0", bridge, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:18.0")
	tr.AddDeviceUnder(fn("0000:08:00.0", bridge, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:18.0", "0000:07:00.0")
	tr.AddDeviceUnder(fn("0000:09:00.0", 0x030200, 0), "0000:00:01.0", "0000:01:00.0", "0000:02:18.0", "0000:07:00.0", "0000:08:00.0")
	tr.AddDeviceUnder(fn("0000:00:03.0", bridge, 0))
	tr.AddDeviceUnder(fn("0000:06:00.0", 0x030200, 0), "0000:00:03.0")
	tr.AddDeviceUnder(fn("0000:80:01.0", bridge, 1))
	tr.AddDeviceUnder(fn("0000:81:00.0", 0x030200, 1), "0000:80:01.0")
	return tr.Sys()
}

func TestClassifyHost(t *testing.T) {
	sys := twoSocketHost(t)
	opt := ncclpath.DefaultOptions()
	gpu0 := ncclpath.Device{BDF: "0000:04:00.0"}
	vf := ncclpath.Device{BDF: "0000:05:00.1", NIC: true}
	for _, c := range []struct {
		a, b ncclpath.Device
		want ncclpath.Type
	}{
		{gpu0, vf, ncclpath.PIX},
		{gpu0, ncclpath.Device{BDF: "0000:05:00.0", NIC: true}, ncclpath.PIX},
		{gpu0, ncclpath.Device{BDF: "0000:09:00.0"}, ncclpath.PXB},
		{vf, ncclpath.Device{BDF: "0000:09:00.0"}, ncclpath.PXB},
		{gpu0, ncclpath.Device{BDF: "0000:06:00.0"}, ncclpath.PHB},
		{vf, ncclpath.Device{BDF: "0000:06:00.0"}, ncclpath.PHB},
		{gpu0, ncclpath.Device{BDF: "0000:81:00.0"}, ncclpath.SYS},
		{vf, ncclpath.Device{BDF: "0000:05:00.0", NIC: true}, ncclpath.LOC},
		{gpu0, gpu0, ncclpath.LOC},
	} {
		got, err := ncclpath.Classify(sys, c.a, c.b, opt)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%s - %s", c.a.BDF, c.b.BDF)
		back, err := ncclpath.Classify(sys, c.b, c.a, opt)
		require.NoError(t, err)
		assert.Equal(t, got, back, "symmetric")
	}
	n, err := ncclpath.Locate(sys, vf, opt)
	require.NoError(t, err)
	assert.Equal(t, ncclpath.Node{BusID: "0000:05:00.0", Switches: []string{"0000:01:00.0"}, CPU: "0"}, n)
	n, err = ncclpath.Locate(sys, ncclpath.Device{BDF: "0000:09:00.0"}, opt)
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:07:00.0", "0000:01:00.0"}, n.Switches, "root ports and downstream ports skipped")

	_, err = ncclpath.Classify(sys, ncclpath.Device{BDF: "0000:0a:00.0"}, gpu0, opt)
	assert.Error(t, err, "absent device")
	_, err = ncclpath.Classify(sys, ncclpath.Device{BDF: "04:00.0"}, gpu0, opt)
	assert.ErrorContains(t, err, "not a PCI bus ID")
}

// TestClassifyGuestLayouts: the two guest trees hpcvmm builds for a GPU
// and an InfiniBand VF. With --topology host (a root port, a switch, a
// downstream port each) NCCL sees PIX; with --topology flat (both on bus
// 0) PHB. Guests have no NUMA information (numa_node -1).
func TestClassifyGuestLayouts(t *testing.T) {
	opt := ncclpath.DefaultOptions()
	tr := hosttest.New(t)
	tr.AddDeviceUnder(fn("0000:00:00.0", 0x060000, -1))
	tr.AddDeviceUnder(fn("0000:00:0a.0", bridge, -1))
	tr.AddDeviceUnder(fn("0000:01:00.0", bridge, -1), "0000:00:0a.0")
	tr.AddDeviceUnder(fn("0000:02:00.0", bridge, -1), "0000:00:0a.0", "0000:01:00.0")
	tr.AddDeviceUnder(fn("0000:02:01.0", bridge, -1), "0000:00:0a.0", "0000:01:00.0")
	tr.AddDeviceUnder(fn("0000:03:00.0", 0x030200, -1), "0000:00:0a.0", "0000:01:00.0", "0000:02:00.0")
	tr.AddDeviceUnder(fn("0000:04:00.0", 0x020700, -1), "0000:00:0a.0", "0000:01:00.0", "0000:02:01.0")
	got, err := ncclpath.Classify(tr.Sys(), ncclpath.Device{BDF: "0000:03:00.0"}, ncclpath.Device{BDF: "0000:04:00.0", NIC: true}, opt)
	require.NoError(t, err)
	assert.Equal(t, ncclpath.PIX, got)

	flat := hosttest.New(t)
	flat.AddDeviceUnder(fn("0000:00:00.0", 0x060000, -1))
	flat.AddDeviceUnder(fn("0000:00:0a.0", 0x030200, -1))
	flat.AddDeviceUnder(fn("0000:00:0b.0", 0x020700, -1))
	got, err = ncclpath.Classify(flat.Sys(), ncclpath.Device{BDF: "0000:00:0a.0"}, ncclpath.Device{BDF: "0000:00:0b.0", NIC: true}, opt)
	require.NoError(t, err)
	assert.Equal(t, ncclpath.PHB, got)
	// NCCL_IB_MERGE_VFS=1 makes the VF at 00:0b.0 the function 00:00.0.
	n, err := ncclpath.Locate(flat.Sys(), ncclpath.Device{BDF: "0000:00:0b.0", NIC: true}, opt)
	require.NoError(t, err)
	assert.Equal(t, "0000:00:00.0", n.BusID)
	n, err = ncclpath.Locate(flat.Sys(), ncclpath.Device{BDF: "0000:00:0b.0", NIC: true}, ncclpath.Options{})
	require.NoError(t, err)
	assert.Equal(t, "0000:00:0b.0", n.BusID, "without merging, only the function is rewritten")
}

// TestRewriteToMissingFunction: a VF whose merged ID names no function
// (its PF is not in the guest) gets NCCL's unknown CPU, "-1".
func TestRewriteToMissingFunction(t *testing.T) {
	tr := hosttest.New(t)
	tr.AddDeviceUnder(fn("0000:00:0a.0", bridge, 0))
	tr.AddDeviceUnder(fn("0000:01:00.3", 0x020700, 0), "0000:00:0a.0")
	n, err := ncclpath.Locate(tr.Sys(), ncclpath.Device{BDF: "0000:01:00.3", NIC: true}, ncclpath.DefaultOptions())
	require.NoError(t, err)
	assert.Equal(t, ncclpath.Node{BusID: "0000:01:00.0", CPU: "-1"}, n)
	assert.Equal(t, "PXB", ncclpath.PXB.String())
}
