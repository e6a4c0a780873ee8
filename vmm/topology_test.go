package vmm

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vfio"
)

// switchTree: a GPU and a VF behind one host PCIe switch, a second GPU on
// its own root port.
func switchTree(t *testing.T) *host.Host {
	tr := hosttest.New(t)
	d := func(b string, class uint32) hosttest.Device {
		return hosttest.Device{BDF: b, Vendor: 0x10de, DeviceID: 0x2330, Class: class, NUMANode: 0, IOMMUGroup: -1}
	}
	tr.AddDeviceUnder(d("0000:00:01.0", 0x060400))
	tr.AddDeviceUnder(d("0000:01:00.0", 0x060400), "0000:00:01.0")
	tr.AddDeviceUnder(d("0000:02:08.0", 0x060400), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(d("0000:02:10.0", 0x060400), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(d("0000:04:00.0", 0x030200), "0000:00:01.0", "0000:01:00.0", "0000:02:08.0")
	tr.AddDeviceUnder(d("0000:05:00.1", 0x020700), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(d("0000:00:03.0", 0x060400))
	tr.AddDeviceUnder(d("0000:06:00.0", 0x030200), "0000:00:03.0")
	for _, b := range []string{"0000:00:01.0", "0000:01:00.0", "0000:02:08.0", "0000:02:10.0", "0000:04:00.0"} {
		tr.Link(b, "16.0 GT/s PCIe", 16)
	}
	return tr.Host()
}

func topologyVM(t *testing.T, h *host.Host, kind TopologyKind) *VM {
	pt := &passthrough{}
	for _, s := range []string{"0000:04:00.0", "0000:05:00.1", "0000:06:00.0"} {
		b, err := host.ParseBDF(s)
		require.NoError(t, err)
		dev, err := h.Device(b)
		require.NoError(t, err)
		pt.devs = append(pt.devs, dev)
		pt.specs = append(pt.specs, vfio.Spec{BDF: b, VF: s == "0000:05:00.1", Clique: -1})
	}
	vm := &VM{log: slog.New(slog.NewTextHandler(io.Discard, nil)), dev: devices{pt: pt}, cfg: Config{Topology: kind, CPUs: 4}}
	require.NoError(t, vm.planPCITopology(h))
	vm.dev.pci = pci.NewRoot(pci.RootConfig{MMIO: &bus.Bus{}, PIO: &bus.Bus{}})
	return vm
}

// TestPassthroughTopologyHost: with --topology host the GPU and the VF go
// behind one emulated switch (at guest 03:00.0 and 04:00.0), the second
// GPU behind a root port of its own; INTx of each routes through its root
// port's bus-0 slot.
func TestPassthroughTopologyHost(t *testing.T) {
	vm := topologyVM(t, switchTree(t), TopologyHost)
	require.NoError(t, vm.addPorts())
	eps := make([]pci.Device, 3)
	for i := range eps {
		eps[i] = pci.NewConfigSpace(pci.Header{VendorID: 0x10de, DeviceID: uint16(i)})
		require.NoError(t, vm.attachPassthrough(i, "d", eps[i]))
	}
	require.NoError(t, vm.dev.pci.AssignBuses())
	for i, want := range [][2]uint8{{3, 0}, {4, 0}, {5, 0}} {
		b, s, ok := vm.dev.pci.Location(eps[i])
		require.True(t, ok)
		assert.Equal(t, want, [2]uint8{b, s}, "device %d", i)
		assert.Equal(t, vm.dev.pt.topo.plan.Endpoint(i).GuestBDF(), host.BDF{Bus: b, Device: s})
	}
	assert.Equal(t, []int{firstPassthroughSlot, firstPassthroughSlot, firstPassthroughSlot + 1}, vm.dev.pt.topo.rootSlot)
	mp := vm.mpOptions()
	require.Len(t, mp.Interrupts, 3)
	assert.Equal(t, intxPin(firstPassthroughSlot), mp.Interrupts[1].DstPin, "the VF interrupts through the switch's root port")

	file := filepath.Join(t.TempDir(), "topo.xml")
	vm.cfg.NCCLTopoFile = file
	require.NoError(t, vm.writeNCCLTopology([]uapi.CPUIDEntry{
		{Function: 0, EBX: 0x756e6547, EDX: 0x49656e69, ECX: 0x6c65746e}, // GenuineIntel
		{Function: 1, EAX: 0x000806f8},                                   // family 6 model 0x8f
	}))
	x, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Contains(t, string(x), `<cpu numaid="0" affinity="0000000f" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">`)
	assert.Contains(t, string(x), `<pci busid="0000:01:00.0" class="0x060400"`)
	assert.Equal(t, 2, strings.Count(string(x), "\n      <pci "), "GPU and VF below the switch node")
}

func TestPassthroughTopologyFlat(t *testing.T) {
	for _, kind := range []TopologyKind{TopologyFlat} {
		vm := topologyVM(t, switchTree(t), kind)
		require.NoError(t, vm.addPorts())
		assert.Equal(t, []int{firstPassthroughSlot, firstPassthroughSlot + 1, firstPassthroughSlot + 2}, vm.dev.pt.topo.rootSlot)
		for i := range 3 {
			dev := pci.NewConfigSpace(pci.Header{VendorID: 0x10de})
			require.NoError(t, vm.attachPassthrough(i, "d", dev))
			b, s, ok := vm.dev.pci.Location(dev)
			require.True(t, ok)
			assert.Equal(t, [2]uint8{0, uint8(firstPassthroughSlot + i)}, [2]uint8{b, s})
		}
	}
	// A host tree whose devices sit in no pciDDDD:BB directory (a flat
	// synthetic tree) falls back to flat with --topology host.
	tr := hosttest.New(t)
	for _, b := range []string{"0000:04:00.0", "0000:05:00.1", "0000:06:00.0"} {
		tr.AddDevice(hosttest.Device{BDF: b, Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, IOMMUGroup: -1})
	}
	vm := topologyVM(t, tr.Host(), TopologyHost)
	assert.Len(t, vm.dev.pt.topo.plan.Top, 3)
	assert.Equal(t, "flat", vm.dev.pt.topo.plan.Mode.String())
}
