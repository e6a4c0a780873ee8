package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pcitopo"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// barLayout is one device with BARs of the given sizes, as a host sysfs
// resource file and as a PCI endpoint for the guest's root complex.
type barLayout struct {
	mem64 bool
	sizes []uint64
}

// TestBARSpaceVerdictsAgree puts layouts through preflight (what `hpcvmm
// check` and the start of `hpcvmm run` report) and through the VM's own BAR
// placement, and requires the same verdict. The first two are the layouts
// preflight approved and the VM rejected before both used addrspace.Plan.
func TestBARSpaceVerdictsAgree(t *testing.T) {
	const mib, gib = uint64(1) << 20, uint64(1) << 30
	cases := []struct {
		name     string
		physBits int
		memory   uint64
		bars     barLayout
		fits     bool
		image    uint64 // a read-only image between RAM and the 64-bit window
	}{
		{"32-bit 512M+256M", 46, 16 * gib, barLayout{false, []uint64{512 * mib, 256 * mib}}, false, 0},
		{"64-bit 256G+128G+64M, 39 bits", 39, 16 * gib, barLayout{true, []uint64{256 * gib, 128 * gib, 64 * mib}}, true, 0},
		{"64-bit 256G+256G, 39 bits", 39, 1 * gib, barLayout{true, []uint64{256 * gib, 256 * gib}}, false, 0},
		{"64-bit 128G with 380G RAM, 39 bits", 39, 380 * gib, barLayout{true, []uint64{128 * gib, 32 * mib}}, true, 0},
		{"64-bit 128G with 390G RAM, 39 bits", 39, 390 * gib, barLayout{true, []uint64{128 * gib, 32 * mib}}, false, 0},
		{"32-bit 256M+128M+64M", 46, 2 * gib, barLayout{false, []uint64{256 * mib, 128 * mib, 64 * mib}}, true, 0},
		// The image takes [17G, 147G): the 128G BAR finds no 128G-aligned
		// place between it and the 256G BAR.
		{"64-bit 256G+128G above a 130G image, 39 bits", 39, 16 * gib, barLayout{true, []uint64{256 * gib, 128 * gib}}, false, 130 * gib},
		{"64-bit 256G+128G above a 100G image, 39 bits", 39, 16 * gib, barLayout{true, []uint64{256 * gib, 128 * gib}}, true, 100 * gib},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			check := preflightFits(t, c.physBits, c.memory, c.image, c.bars)
			_, vmErr := assignBARs(rootWith(t, c.bars), c.memory, c.image, c.physBits)
			assert.Equal(t, c.fits, check, "preflight verdict")
			assert.Equal(t, c.fits, vmErr == nil, "VM verdict: %v", vmErr)
		})
	}
}

// preflightFits runs the preflight checks on a host with one device holding
// the layout's BARs and reports whether its bar-space checks pass.
func preflightFits(t *testing.T, physBits int, memory, image uint64, l barLayout) bool {
	const bdf = "0000:17:00.0"
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 1<<40)
	tr.CPUInfo(physBits)
	lines := map[int]string{}
	addr := uint64(1) << 44
	for i, s := range l.sizes {
		idx := i
		if l.mem64 {
			idx = 2 * i
		}
		lines[idx] = hosttest.ResourceLine(addr, s, l.mem64, l.mem64)
		addr += s
	}
	tr.AddDevice(hosttest.Device{BDF: bdf, Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci",
		NUMANode: 0, IOMMUGroup: 1, Resource: hosttest.Resource(lines)})
	rep := preflight.Run(tr.Host(), preflight.Request{GPUs: []string{bdf}, Memory: memory, PMEMSize: image, PageSize: preflight.Page4K, CPUs: 1, NUMANode: -1})
	seen := false
	for _, r := range rep.Results {
		if r.Name == "bar-space" || r.Name == "bar-space-32bit" {
			if l.mem64 != (r.Name == "bar-space") {
				continue
			}
			seen = true
			if r.Status == preflight.Fail {
				t.Logf("preflight: %s: %s (fix: %s)", r.Name, r.Detail, r.Fix)
				return false
			}
		}
	}
	require.True(t, seen, "preflight ran no bar-space check: %+v", rep.Results)
	return true
}

// rootWith builds the guest's root complex with one endpoint holding the
// layout's BARs, as the VM would for a passed-through device.
func rootWith(t *testing.T, l barLayout) *pci.Root {
	root := pci.NewRoot(pci.RootConfig{MMIO: &bus.Bus{}, PIO: &bus.Bus{}})
	cs := pci.NewConfigSpace(pci.Header{VendorID: 0x10de, DeviceID: 0x2330, Class: 0x030200})
	for i, s := range l.sizes {
		spec := pci.BARSpec{Size: s, Kind: pci.BARMem32}
		idx := i
		if l.mem64 {
			spec.Kind, spec.Prefetchable, idx = pci.BARMem64, true, 2*i
		}
		require.NoError(t, cs.SetBAR(idx, spec))
	}
	require.NoError(t, root.AddDevice(1, "gpu", cs))
	return root
}

// TestBARSpaceVerdictsAgreeBehindPorts is TestBARSpaceVerdictsAgree for
// --topology host: two root-bus host devices, each behind its own emulated
// root port in the guest. On the root bus their BARs (a 512 MiB
// non-prefetchable 64-bit BAR and a 4 KiB 32-bit one) fit; behind ports
// both need the 32-bit window (512 MiB + 1 MiB of 512 MiB), so the VM's
// placement and preflight both refuse it.
func TestBARSpaceVerdictsAgreeBehindPorts(t *testing.T) {
	const mib, gib = uint64(1) << 20, uint64(1) << 30
	a, b := "0000:00:04.0", "0000:00:05.0"
	tr := hosttest.New(t)
	tr.Node(0, "0-3", 1<<40)
	tr.CPUInfo(46)
	tr.AddDeviceUnder(hosttest.Device{BDF: a, Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 4,
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x10_0000_0000, 512*mib, true, false)})})
	tr.AddDeviceUnder(hosttest.Device{BDF: b, Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 5,
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0xe000_0000, 4096, false, false)})})
	h := tr.Host()

	rep := preflight.Run(h, preflight.Request{GPUs: []string{a, b}, Memory: 2 * gib, PageSize: preflight.Page4K, CPUs: 1, NUMANode: -1,
		PortSlots: PassthroughSlots()})
	var ports *preflight.Result
	for i, r := range rep.Results {
		if r.Name == "bar-space-ports" {
			ports = &rep.Results[i]
		}
	}
	require.NotNil(t, ports, "preflight checked the ports")
	assert.Equal(t, preflight.Fail, ports.Status, ports.Detail)

	bdfA, err := host.ParseBDF(a)
	require.NoError(t, err)
	bdfB, err := host.ParseBDF(b)
	require.NoError(t, err)
	devs, links, err := pcitopo.FromHost(h, []string{"gpu", "gpu"}, []host.BDF{bdfA, bdfB})
	require.NoError(t, err)
	plan, err := pcitopo.New(pcitopo.Host, devs, links, PassthroughSlots())
	require.NoError(t, err)
	root := pci.NewRoot(pci.RootConfig{MMIO: &bus.Bus{}, PIO: &bus.Bus{}})
	parents, err := buildPorts(root, plan)
	require.NoError(t, err)
	specs := []pci.BARSpec{{Size: 512 * mib, Kind: pci.BARMem64}, {Size: 4096, Kind: pci.BARMem32}}
	for i, spec := range specs {
		cs := pci.NewConfigSpace(pci.Header{VendorID: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00})
		require.NoError(t, cs.SetBAR(0, spec))
		require.NotNil(t, parents[i], "device %d behind a root port", i)
		require.NoError(t, root.AddDeviceBelow(parents[i], 0, "dev", cs))
	}
	_, vmErr := assignBARs(root, 2*gib, 0, 46)
	assert.Error(t, vmErr, "the VM refuses the layout behind ports")
}
