package host_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

func bdf(t *testing.T, s string) host.BDF {
	t.Helper()
	b, err := host.ParseBDF(s)
	require.NoError(t, err)
	return b
}

func TestParsePCIPath(t *testing.T) {
	p, err := host.ParsePCIPath("/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0")
	require.NoError(t, err)
	assert.Equal(t, "pci0000:00", p.RootComplex)
	assert.Equal(t, bdf(t, "0000:04:00.0"), p.Device())
	port, ok := p.Port()
	require.True(t, ok)
	assert.Equal(t, bdf(t, "0000:02:08.0"), port)
	assert.Equal(t, []host.BDF{bdf(t, "0000:01:00.0")}, p.Switches(), "the upstream port; the root port is skipped")
	assert.Equal(t, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0", p.String())

	// Two switches deep: both upstream ports, nearest first.
	p, err = host.ParsePCIPath("/x/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0/0000:84:01.0/0000:85:00.0")
	require.NoError(t, err)
	assert.Equal(t, []host.BDF{bdf(t, "0000:83:00.0"), bdf(t, "0000:81:00.0")}, p.Switches())

	// Directly on a root port, or on the root bus: no switch.
	p, err = host.ParsePCIPath("/sys/devices/pci0000:00/0000:00:03.0/0000:03:00.0")
	require.NoError(t, err)
	assert.Empty(t, p.Switches())
	p, err = host.ParsePCIPath("/sys/devices/pci0000:00/0000:00:06.0")
	require.NoError(t, err)
	assert.Empty(t, p.Switches())
	_, ok = p.Port()
	assert.False(t, ok)

	for _, bad := range []string{"/sys/devices/platform/serial8250", "/sys/devices/pci0000:00", "/sys/devices/pci0000:00/0000:00:01.0/usb1"} {
		_, err := host.ParsePCIPath(bad)
		assert.Error(t, err, bad)
	}
}

func TestParseLinkSpeed(t *testing.T) {
	for s, want := range map[string]host.LinkSpeed{"2.5 GT/s PCIe": 1, "5.0 GT/s PCIe": 2, "8 GT/s": 3, "16.0 GT/s PCIe": 4, "32.0 GT/s PCIe": 5, "64.0 GT/s PCIe": 6, "Unknown": 0, "Unknown speed": 0} {
		got, err := host.ParseLinkSpeed(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	_, err := host.ParseLinkSpeed("7 GT/s")
	assert.ErrorContains(t, err, "not a PCIe rate")
	_, err = host.ParseLinkSpeed("fast")
	assert.Error(t, err)
	assert.Equal(t, "16.0 GT/s PCIe", host.LinkSpeed(4).String())
	assert.Equal(t, "2.5 GT/s PCIe", host.LinkSpeed(1).String())
}

func TestTopologyFromCapture(t *testing.T) {
	h := host.New(fixture, "/nonexistent")
	p, err := h.PCIPath(bdf(t, "0000:00:06.0"))
	require.NoError(t, err)
	assert.Equal(t, host.PCIPath{RootComplex: "pci0000:00", Chain: []host.BDF{bdf(t, "0000:00:06.0")}}, p, "the H100 sits on the root bus of its (virtual) host")
	l, err := h.PCILink(bdf(t, "0000:00:06.0"))
	require.NoError(t, err)
	assert.Equal(t, host.PCILink{MaxSpeed: 5, MaxWidth: 16, CurSpeed: 5, CurWidth: 16}, l, "32 GT/s x16")
	l, err = h.PCILink(bdf(t, "0000:00:01.0"))
	require.NoError(t, err)
	assert.False(t, l.Known(), "virtio functions have no link attributes")
}

// switchHost builds a host with a GPU and a NIC (PF and a VF) behind one
// PCIe switch, a second GPU on its own root port and an NVMe drive on the
// root bus.
func switchHost(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	dev := func(b string, class uint32) hosttest.Device {
		return hosttest.Device{BDF: b, Vendor: 0x10de, DeviceID: 0x2330, Class: class, NUMANode: 0, IOMMUGroup: -1}
	}
	tr.AddDeviceUnder(dev("0000:00:01.0", 0x060400))
	tr.AddDeviceUnder(dev("0000:01:00.0", 0x060400), "0000:00:01.0")
	tr.AddDeviceUnder(dev("0000:02:08.0", 0x060400), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(dev("0000:02:10.0", 0x060400), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(dev("0000:04:00.0", 0x030200), "0000:00:01.0", "0000:01:00.0", "0000:02:08.0")
	tr.AddDeviceUnder(dev("0000:05:00.0", 0x020700), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(dev("0000:05:00.1", 0x020700), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(dev("0000:00:03.0", 0x060400))
	tr.AddDeviceUnder(dev("0000:06:00.0", 0x030200), "0000:00:03.0")
	tr.AddDeviceUnder(dev("0000:00:04.0", 0x010802))
	tr.Link("0000:00:01.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:01:00.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:02:08.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:02:10.0", "16.0 GT/s PCIe", 16)
	tr.Link("0000:04:00.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:05:00.0", "16.0 GT/s PCIe", 16)
	tr.Link("0000:00:03.0", "16.0 GT/s PCIe", 8)
	tr.Link("0000:06:00.0", "32.0 GT/s PCIe", 16)
	return tr
}

func TestTopologyFromSyntheticTree(t *testing.T) {
	tr := switchHost(t)
	h := tr.Host()
	gpu, err := h.PCIPath(bdf(t, "0000:04:00.0"))
	require.NoError(t, err)
	nic, err := h.PCIPath(bdf(t, "0000:05:00.1"))
	require.NoError(t, err)
	assert.Equal(t, gpu.Switches(), nic.Switches(), "same switch upstream port")
	assert.Equal(t, []host.BDF{bdf(t, "0000:01:00.0")}, gpu.Switches())
	other, err := h.PCIPath(bdf(t, "0000:06:00.0"))
	require.NoError(t, err)
	assert.Empty(t, other.Switches())
	port, _ := other.Port()
	l, err := h.PCILink(port)
	require.NoError(t, err)
	assert.Equal(t, host.PCILink{MaxSpeed: 4, MaxWidth: 8, CurSpeed: 4, CurWidth: 8}, l, "the root port's x8 limits the GPU")
	// The existing device reader still works through the symlinked layout.
	d, err := h.Device(bdf(t, "0000:04:00.0"))
	require.NoError(t, err)
	assert.Equal(t, uint32(0x030200), d.Class)
}
