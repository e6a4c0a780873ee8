package pcitopo_test

import (
	"bytes"
	"encoding/xml"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pcitopo"
)

// switchHost: a GPU and a NIC VF behind one PCIe switch (the GPU's
// downstream port at 32 GT/s, the NIC's at 16 GT/s), a second GPU on a
// root port that trained at x8, and an NVMe drive on the root bus.
func switchHost(t *testing.T) *host.Host {
	tr := hosttest.New(t)
	dev := func(b string, class uint32, vendor, device uint16) hosttest.Device {
		return hosttest.Device{BDF: b, Vendor: vendor, DeviceID: device, Class: class, NUMANode: 0, IOMMUGroup: -1}
	}
	br := func(b string) hosttest.Device { return dev(b, 0x060400, 0x1000, 0xc030) }
	tr.AddDeviceUnder(br("0000:00:01.0"))
	tr.AddDeviceUnder(br("0000:01:00.0"), "0000:00:01.0")
	tr.AddDeviceUnder(br("0000:02:08.0"), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(br("0000:02:10.0"), "0000:00:01.0", "0000:01:00.0")
	tr.AddDeviceUnder(dev("0000:04:00.0", 0x030200, 0x10de, 0x2330), "0000:00:01.0", "0000:01:00.0", "0000:02:08.0")
	tr.AddDeviceUnder(dev("0000:05:00.0", 0x020700, 0x15b3, 0x1021), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(dev("0000:05:00.1", 0x020700, 0x15b3, 0x101e), "0000:00:01.0", "0000:01:00.0", "0000:02:10.0")
	tr.AddDeviceUnder(br("0000:00:03.0"))
	tr.AddDeviceUnder(dev("0000:06:00.0", 0x030200, 0x10de, 0x2330), "0000:00:03.0")
	tr.AddDeviceUnder(dev("0000:00:04.0", 0x010802, 0x8086, 0x0a54))
	tr.Link("0000:00:01.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:01:00.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:02:08.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:02:10.0", "16.0 GT/s PCIe", 16)
	tr.Link("0000:04:00.0", "32.0 GT/s PCIe", 16)
	tr.Link("0000:05:00.0", "16.0 GT/s PCIe", 16)
	tr.Link("0000:00:03.0", "16.0 GT/s PCIe", 8)
	tr.Link("0000:06:00.0", "32.0 GT/s PCIe", 16)
	return tr.Host()
}

func bdfs(t *testing.T, ss ...string) []host.BDF {
	var out []host.BDF
	for _, s := range ss {
		b, err := host.ParseBDF(s)
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}

var passthroughSlots = []int{10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}

func hostPlan(t *testing.T) *pcitopo.Plan {
	devs, links, err := pcitopo.FromHost(switchHost(t), []string{"gpu", "vf", "gpu", "nvme"}, bdfs(t, "0000:04:00.0", "0000:05:00.1", "0000:06:00.0", "0000:00:04.0"))
	require.NoError(t, err)
	p, err := pcitopo.New(pcitopo.Host, devs, links, passthroughSlots)
	require.NoError(t, err)
	return p
}

func TestHostPlanMirrorsSwitch(t *testing.T) {
	p := hostPlan(t)
	want := `[0000:00] host bridge (--topology host)
 +-00:0a.0 root port [01-04] 32.0 GT/s PCIe x16 mirrors host 0000:00:01.0
 | \-01:00.0 switch upstream port [02-04] 32.0 GT/s PCIe x16 mirrors host 0000:01:00.0
 |   +-02:00.0 switch downstream port [03] 32.0 GT/s PCIe x16 mirrors host 0000:02:08.0
 |   | \-03:00.0 gpu host 0000:04:00.0 [10de:2330] class 030200 32.0 GT/s PCIe x16
 |   \-02:01.0 switch downstream port [04] 16.0 GT/s PCIe x16 mirrors host 0000:02:10.0
 |     \-04:00.0 vf host 0000:05:00.1 [15b3:101e] class 020700
 +-00:0b.0 root port [05] 16.0 GT/s PCIe x8 mirrors host 0000:00:03.0
 | \-05:00.0 gpu host 0000:06:00.0 [10de:2330] class 030200 32.0 GT/s PCIe x16
 \-00:0c.0 root port [06] 16.0 GT/s PCIe x16
   \-06:00.0 nvme host 0000:00:04.0 [8086:0a54] class 010802
`
	assert.Equal(t, want, p.String())
	assert.Equal(t, "0000:03:00.0", p.Endpoint(0).GuestBDF().String())
	assert.Equal(t, "0000:04:00.0", p.Endpoint(1).GuestBDF().String())
	assert.Equal(t, pcitopo.DefaultLink, p.Top[2].Link, "no link known for a root-bus NVMe: the default")
}

func TestFlatPlan(t *testing.T) {
	devs, links, err := pcitopo.FromHost(switchHost(t), nil, bdfs(t, "0000:04:00.0", "0000:05:00.1"))
	require.NoError(t, err)
	p, err := pcitopo.New(pcitopo.Flat, devs, links, passthroughSlots)
	require.NoError(t, err)
	assert.Equal(t, "[0000:00] host bridge (--topology flat)\n +-00:0a.0 device host 0000:04:00.0 [10de:2330] class 030200 32.0 GT/s PCIe x16\n \\-00:0b.0 device host 0000:05:00.1 [15b3:101e] class 020700\n", p.String())
	bridges, behind, order := p.Placement()
	assert.Empty(t, bridges)
	assert.Equal(t, []*addrspace.Bridge{nil, nil}, behind)
	assert.Equal(t, []int{0, 1}, order)
}

func TestPlanFromCapture(t *testing.T) {
	h := host.New("../testdata/gpu-host-sysfs", "/nonexistent")
	devs, links, err := pcitopo.FromHost(h, []string{"gpu"}, bdfs(t, "0000:00:06.0"))
	require.NoError(t, err)
	p, err := pcitopo.New(pcitopo.Host, devs, links, passthroughSlots)
	require.NoError(t, err)
	// The H100 sits on its host's root bus: its own root port, reporting
	// the GPU's 32 GT/s x16.
	require.Len(t, p.Top, 1)
	assert.Equal(t, pcitopo.RootPort, p.Top[0].Kind)
	assert.Equal(t, host.PCILink{MaxSpeed: 5, MaxWidth: 16, CurSpeed: 5, CurWidth: 16}, p.Top[0].Link)
	assert.False(t, p.Top[0].HasMirror)
	assert.Equal(t, "0000:01:00.0", p.Endpoint(0).GuestBDF().String())
}

func TestPlanErrors(t *testing.T) {
	devs, links, err := pcitopo.FromHost(switchHost(t), nil, bdfs(t, "0000:04:00.0", "0000:06:00.0"))
	require.NoError(t, err)
	_, err = pcitopo.New(pcitopo.Host, devs, links, []int{10})
	assert.ErrorContains(t, err, "no bus-0 slot left")
	_, err = pcitopo.New(pcitopo.Flat, devs, links, []int{11, 10})
	assert.ErrorContains(t, err, "ascending")
	_, err = pcitopo.New(pcitopo.Flat, append(devs, devs[0]), links, passthroughSlots)
	assert.ErrorContains(t, err, "twice")
	_, err = pcitopo.ParseMode("mesh")
	assert.ErrorContains(t, err, "want host or flat")
}

// TestPlanMatchesRoot builds the guest tree from the plan with pci
// bridges, as the VM will, and checks that the Root numbers the buses as
// the plan says and places BARs exactly where PlanHierarchy over the
// plan's Placement predicts (what preflight will call), with the 128 GiB
// GPU BAR inside the switch's prefetchable window.
func TestPlanMatchesRoot(t *testing.T) {
	p := hostPlan(t)
	root := pci.NewRoot(pci.RootConfig{MMIO: &bus.Bus{}, PIO: &bus.Bus{}})
	type bar struct {
		index int
		spec  pci.BARSpec
	}
	barsOf := [][]bar{
		{{0, pci.BARSpec{Size: 16 << 20, Kind: pci.BARMem32}}, {1, pci.BARSpec{Size: 128 << 30, Kind: pci.BARMem64, Prefetchable: true}}, {3, pci.BARSpec{Size: 32 << 20, Kind: pci.BARMem64, Prefetchable: true}}},
		{{0, pci.BARSpec{Size: 32 << 20, Kind: pci.BARMem64, Prefetchable: true}}},
		{{0, pci.BARSpec{Size: 16 << 20, Kind: pci.BARMem32}}, {1, pci.BARSpec{Size: 64 << 30, Kind: pci.BARMem64, Prefetchable: true}}},
		{{0, pci.BARSpec{Size: 16 << 10, Kind: pci.BARMem64}}},
	}
	eps := make([]*pci.ConfigSpace, len(p.Devices))
	ports := map[*pcitopo.Node]*pci.Bridge{}
	p.Walk(func(n, parent *pcitopo.Node) {
		var dev pci.Device
		if n.Kind == pcitopo.Endpoint {
			cs := pci.NewConfigSpace(pci.Header{VendorID: 0x10de, DeviceID: 0x2330, Class: 0x030200})
			for _, b := range barsOf[n.Device] {
				require.NoError(t, cs.SetBAR(b.index, b.spec))
			}
			eps[n.Device] = cs
			dev = cs
		} else {
			b, err := pci.NewBridge(pci.BridgeConfig{Type: map[pcitopo.Kind]pci.PortType{pcitopo.RootPort: pci.RootPort, pcitopo.UpstreamPort: pci.UpstreamPort, pcitopo.DownstreamPort: pci.DownstreamPort}[n.Kind],
				Link: pci.Link{Speed: pci.LinkSpeed(n.Link.MaxSpeed), Width: uint8(n.Link.MaxWidth)}})
			require.NoError(t, err)
			ports[n] = b
			dev = b
		}
		if parent == nil {
			require.NoError(t, root.AddDevice(int(n.Slot), n.Kind.String(), dev))
		} else {
			require.NoError(t, root.AddDeviceBelow(ports[parent], int(n.Slot), n.Kind.String(), dev))
		}
	})
	require.NoError(t, root.AssignBuses())
	p.Walk(func(n, _ *pcitopo.Node) {
		var dev pci.Device = ports[n]
		if n.Kind == pcitopo.Endpoint {
			dev = eps[n.Device]
		}
		b, s, ok := root.Location(dev)
		require.True(t, ok)
		assert.Equal(t, [2]uint8{n.Bus, n.Slot}, [2]uint8{b, s}, "%s", n.GuestBDF())
		if br := ports[n]; br != nil {
			assert.Equal(t, [2]uint8{n.Secondary, n.Subordinate}, [2]uint8{br.SecondaryBus(), br.SubordinateBus()})
		}
	})

	w, err := addrspace.NewWindows(64<<30, 46)
	require.NoError(t, err)
	require.NoError(t, root.AssignBARs(w))

	bridges, behind, order := p.Placement()
	var reqs []addrspace.BAR
	type ref struct{ dev, bar int }
	var refs []ref
	for _, i := range order {
		for _, b := range barsOf[i] {
			kind := addrspace.Mem32
			if b.spec.Kind == pci.BARMem64 {
				kind = addrspace.Mem64
			}
			reqs = append(reqs, addrspace.BAR{Owner: "d", Index: b.index, Kind: kind, Size: b.spec.Size, Prefetchable: b.spec.Prefetchable, Behind: behind[i]})
			refs = append(refs, ref{i, b.index})
		}
	}
	layout, err := addrspace.PlanHierarchy(w, bridges, reqs)
	require.NoError(t, err)
	for k, r := range refs {
		got, mapped := root.DeviceBAR(eps[r.dev], r.bar)
		assert.True(t, mapped, "device %d BAR%d decodes", r.dev, r.bar)
		assert.Equal(t, layout.BARs[k], got, "device %d BAR%d: preflight's prediction", r.dev, r.bar)
	}
	usp := ports[p.Top[0].Children[0]]
	lo, hi, ok := usp.PrefWindow()
	require.True(t, ok)
	gpuBAR, _ := root.DeviceBAR(eps[0], 1)
	assert.True(t, gpuBAR >= lo && gpuBAR+128<<30-1 <= hi, "128 GiB BAR inside the switch's window [%#x, %#x]", lo, hi)
}

func TestNCCLTopology(t *testing.T) {
	p := hostPlan(t)
	var b bytes.Buffer
	require.NoError(t, p.WriteNCCLTopology(&b, pcitopo.CPU{NUMAID: 0, Affinity: pcitopo.AffinityMask(40), Arch: "x86_64", Vendor: "GenuineIntel", FamilyID: 6, ModelID: 143}))
	want := `<system version="1">
  <cpu numaid="0" affinity="000000ff,ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:01:00.0" class="0x060400" vendor="0x104c" device="0x8232" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:03:00.0" class="0x030200" vendor="0x10de" device="0x2330" link_speed="32.0 GT/s PCIe" link_width="16"/>
      <pci busid="0000:04:00.0" class="0x020700" vendor="0x15b3" device="0x101e" link_speed="16.0 GT/s PCIe" link_width="16"/>
    </pci>
    <pci busid="0000:05:00.0" class="0x030200" vendor="0x10de" device="0x2330" link_speed="16.0 GT/s PCIe" link_width="8"/>
    <pci busid="0000:06:00.0" class="0x010802" vendor="0x8086" device="0x0a54" link_speed="16.0 GT/s PCIe" link_width="16"/>
  </cpu>
</system>
`
	assert.Equal(t, want, b.String())
	// Well-formed XML whose switch node holds both devices.
	var sys struct {
		CPU struct {
			PCI []struct {
				BusID string `xml:"busid,attr"`
				Sub   []struct {
					BusID string `xml:"busid,attr"`
				} `xml:"pci"`
			} `xml:"pci"`
		} `xml:"cpu"`
	}
	require.NoError(t, xml.Unmarshal(b.Bytes(), &sys))
	require.Len(t, sys.CPU.PCI, 3)
	assert.Len(t, sys.CPU.PCI[0].Sub, 2)
	assert.Equal(t, "00000003", pcitopo.AffinityMask(2))
	assert.Equal(t, "ffffffff", pcitopo.AffinityMask(32))
}
