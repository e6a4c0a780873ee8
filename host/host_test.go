package host_test

import (
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// fixture is the capture of a real H100 host (a KVM guest with the GPU
// passed through), shared by the whole project.
const fixture = "../testdata/gpu-host-sysfs"

func fixtureHost(t *testing.T) *host.Host {
	t.Helper()
	if _, err := os.Stat(fixture); err != nil {
		t.Fatalf("real-host capture missing at %s (it is part of the module): %v", fixture, err)
	}
	return host.New(fixture, "/nonexistent-proc")
}

const (
	kib = uint64(1) << 10
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

func TestParseBDF(t *testing.T) {
	b, err := host.ParseBDF("0000:82:00.0")
	require.NoError(t, err)
	assert.Equal(t, host.BDF{Domain: 0, Bus: 0x82, Device: 0, Function: 0}, b)
	assert.Equal(t, "0000:82:00.0", b.String())

	b, err = host.ParseBDF("82:1f.7")
	require.NoError(t, err)
	assert.Equal(t, "0000:82:1f.7", b.String(), "short form implies domain 0000")

	b, err = host.ParseBDF("10000:00:00.0")
	require.Error(t, err)
	_ = b
	for _, bad := range []string{"", "82", "82:00", "0000:82:00", "0000:82:20.0", "0000:82:00.8", "zz:00.0", "0000:182:00.0", "0000:82:00.0:1", "0000:82:00.-1"} {
		_, err := host.ParseBDF(bad)
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), "DDDD:BB:DD.F", "error for %q says what to type", bad)
	}
}

func TestParseCPUList(t *testing.T) {
	for in, want := range map[string][]int{
		"":         {},
		"0":        {0},
		"0-3,8-11": {0, 1, 2, 3, 8, 9, 10, 11},
		"5,1-2,2":  {1, 2, 5},
		"0-7:2":    {0, 2, 4, 6},
		" 0-1 \n":  {0, 1},
	} {
		got, err := host.ParseCPUList(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"a", "3-1", "-1", "0-", "1,,2", "0-3:0", "0-99999999"} {
		_, err := host.ParseCPUList(bad)
		assert.Error(t, err, bad)
	}
	assert.Equal(t, "0-3,8-11", host.FormatCPUList([]int{8, 9, 10, 11, 0, 1, 2, 3}))
	assert.Equal(t, "1,3,5-6", host.FormatCPUList([]int{1, 3, 5, 6, 6}))
	assert.Equal(t, "", host.FormatCPUList(nil))
}

func TestParseResource(t *testing.T) {
	bars, err := host.ParseResource("0x1000 0x1fff 0x40200\n0x0 0x0 0x0\n0xe000 0xe01f 0x40101\n")
	require.NoError(t, err)
	require.Len(t, bars, 2)
	assert.Equal(t, host.BAR{Index: 0, Start: 0x1000, End: 0x1fff, Flags: 0x40200, Size: 0x1000}, bars[0])
	assert.True(t, bars[1].IO)
	assert.Equal(t, 2, bars[1].Index)

	_, err = host.ParseResource("0x1000 0x1fff\n")
	assert.Error(t, err)
	_, err = host.ParseResource("0x1000 zz 0x200\n")
	assert.Error(t, err)
}

// The H100 capture: IDs, driver, reset, NUMA and its three 64-bit
// prefetchable BARs (NVIDIA's BAR0/BAR1/BAR3 are BAR registers 0, 2, 4).
func TestFixtureH100(t *testing.T) {
	h := fixtureHost(t)
	b, err := host.ParseBDF("0000:00:06.0")
	require.NoError(t, err)
	d, err := h.Device(b)
	require.NoError(t, err)
	assert.Equal(t, uint16(0x10de), d.Vendor)
	assert.Equal(t, uint16(0x2330), d.DeviceID)
	assert.Equal(t, uint32(0x030200), d.Class)
	assert.Equal(t, "3D controller", d.ClassName())
	assert.Equal(t, "nvidia", d.Driver, "driver read from driver.link")
	assert.Equal(t, -1, d.NUMANode, "numa_node -1 means no NUMA information")
	assert.Equal(t, []string{"flr"}, d.ResetMethods)
	assert.True(t, d.ResetKnown)
	assert.Equal(t, -1, d.IOMMUGroup, "the capture has no IOMMU groups")
	assert.Nil(t, d.PhysFn)
	assert.Empty(t, d.VirtFns)

	bars := map[int]host.BAR{}
	for _, bar := range d.BARs {
		bars[bar.Index] = bar
	}
	require.Len(t, bars, 3)
	assert.Equal(t, 16*mib, bars[0].Size, "BAR0 registers")
	assert.Equal(t, 128*gib, bars[2].Size, "BAR1 (register 2): framebuffer aperture")
	assert.Equal(t, 32*mib, bars[4].Size, "BAR3 (register 4)")
	for i, bar := range bars {
		assert.True(t, bar.Mem64, "BAR %d 64-bit", i)
		assert.True(t, bar.Prefetchable, "BAR %d prefetchable", i)
		assert.False(t, bar.IO)
	}
	assert.Equal(t, uint64(0x100000000000), bars[2].Start)

	// MSI-X parsed from the real configuration space: capability at 0xb0,
	// Message Control 0x8008 (enabled, 9 vectors), table at BAR0+0xb90000,
	// PBA at BAR0+0xba0000.
	require.NotNil(t, d.Config.MSIX)
	m := *d.Config.MSIX
	assert.Equal(t, uint16(0xb0), m.Offset)
	assert.Equal(t, 9, m.TableSize)
	assert.Equal(t, uint8(0), m.TableBIR)
	assert.Equal(t, uint32(0xb90000), m.TableOffset)
	assert.Equal(t, uint8(0), m.PBABIR)
	assert.Equal(t, uint32(0xba0000), m.PBAOffset)
	assert.True(t, m.Enabled)
	assert.Less(t, uint64(m.TableOffset)+m.TableBytes(), bars[0].Size, "table inside BAR0")

	require.NotNil(t, d.Config.MSI)
	assert.Equal(t, uint16(0x48), d.Config.MSI.Offset)
	assert.True(t, d.Config.MSI.Addr64)
	assert.False(t, d.Config.MSI.Enabled)
	assert.Equal(t, []host.Capability{{host.CapPM, 0x40}, {host.CapMSI, 0x48}, {host.CapPCIe, 0x60}, {host.CapMSIX, 0xb0}}, d.Config.Caps)
	assert.Equal(t, 4096, d.Config.Length)
	aer, ok := d.Config.ExtCap(host.ExtCapAER)
	require.True(t, ok, "AER extended capability, reached past hidden (ID 0) entries")
	assert.Equal(t, uint16(0x1b8), aer.Offset)
	_, ok = d.Config.ExtCap(host.ExtCapSRIOV)
	assert.False(t, ok)
	assert.Empty(t, d.Config.Problems)
}

func TestFixtureHost(t *testing.T) {
	h := fixtureHost(t)
	nodes, err := h.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	n := nodes[0]
	assert.Equal(t, 0, n.ID)
	assert.Len(t, n.CPUs, 16)
	assert.Equal(t, uint64(3300144)*kib, n.MemFree)
	p, ok := n.Pool(gib)
	require.True(t, ok, "1 GiB pool listed in hugepage-sizes")
	assert.Zero(t, p.Free)
	_, ok = n.Pool(2 * mib)
	assert.True(t, ok)

	bits, err := h.PhysAddrBits()
	require.NoError(t, err)
	assert.Equal(t, 46, bits, "from lscpu's Address sizes")

	groups, err := h.IOMMUGroups()
	require.NoError(t, err)
	assert.Zero(t, groups)

	ir, why, err := h.InterruptRemapping()
	require.NoError(t, err)
	assert.Equal(t, host.IRUnknown, ir)
	assert.NotEmpty(t, why)
	assert.False(t, h.KVMPresent())
	_, _, ok, err = h.MemlockLimit()
	require.NoError(t, err)
	assert.False(t, ok, "a capture has no process limits")

	all, err := h.Devices()
	require.NoError(t, err)
	assert.Len(t, all, 7)
	// The host bridge at 00:00.0 has an empty driver.link: no driver.
	d, err := h.Device(all[0])
	require.NoError(t, err)
	assert.Equal(t, "", d.Driver)
	assert.False(t, d.ResetKnown)

	pt, err := h.PassthroughDevices()
	require.NoError(t, err)
	var names []string
	for _, d := range pt {
		names = append(names, d.BDF.String())
	}
	// The GPU and the virtio-net function (class 0x0200); not the bridge,
	// storage or the 0xff "unclassified" virtio devices.
	assert.Equal(t, []string{"0000:00:03.0", "0000:00:06.0"}, names)

	_, err = h.Device(host.BDF{Bus: 0x82})
	require.Error(t, err)
	assert.True(t, errors.Is(err, fs.ErrNotExist))
}

func TestMultiNodeHugepages(t *testing.T) {
	tr := hosttest.New(t)
	tr.Node(0, "0-3,8-11", 10*gib, hosttest.Pool{Size: gib, Total: 4, Free: 2}, hosttest.Pool{Size: 2 * mib, Total: 0, Free: 0})
	tr.Node(1, "4-7,12-15", 20*gib, hosttest.Pool{Size: gib, Total: 16, Free: 16}, hosttest.Pool{Size: 2 * mib, Total: 512, Free: 100})
	h := tr.Host()
	nodes, err := h.Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 2)
	assert.Equal(t, []int{0, 1, 2, 3, 8, 9, 10, 11}, nodes[0].CPUs)
	assert.Equal(t, []int{4, 5, 6, 7, 12, 13, 14, 15}, nodes[1].CPUs)
	assert.Equal(t, []host.HugePool{{PageSize: 2 * mib}, {PageSize: gib, Total: 4, Free: 2}}, nodes[0].Hugepages)
	p, ok := nodes[1].Pool(2 * mib)
	require.True(t, ok)
	assert.Equal(t, host.HugePool{PageSize: 2 * mib, Total: 512, Free: 100}, p)
	assert.Equal(t, 20*gib, nodes[1].MemFree)
	assert.True(t, nodes[1].PerNode)

	n, err := h.Node(1)
	require.NoError(t, err)
	assert.Equal(t, 1, n.ID)
	_, err = h.Node(5)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.Equal(t, "/sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages", host.NrHugepagesPath(1, gib, true))
}

// A kernel without NUMA: no node directory, global hugepage pools.
func TestNoNUMAFallback(t *testing.T) {
	tr := hosttest.New(t)
	tr.Write("sys/devices/system/cpu/online", "0-5\n")
	tr.Write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "64\n")
	tr.Write("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "60\n")
	nodes, err := tr.Host().Nodes()
	require.NoError(t, err)
	require.Len(t, nodes, 1)
	assert.False(t, nodes[0].PerNode)
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5}, nodes[0].CPUs)
	assert.Equal(t, []host.HugePool{{PageSize: 2 * mib, Total: 64, Free: 60}}, nodes[0].Hugepages)
	assert.Equal(t, "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", host.NrHugepagesPath(0, 2*mib, false))
}

func TestSRIOVAndIOMMUGroups(t *testing.T) {
	tr := hosttest.New(t)
	tr.Node(0, "0-3", gib)
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.0", Vendor: 0x15b3, DeviceID: 0x101d, Class: 0x020700, Driver: "mlx5_core", NUMANode: 0, IOMMUGroup: 30, ResetMethod: "flr bus",
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x3800_0000_0000, 32*mib, true, true), 7: hosttest.ResourceLine(0x3800_0200_0000, 2*mib, true, true)})})
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.1", Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020700, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 31, ResetMethod: "flr"})
	tr.AddDevice(hosttest.Device{BDF: "0000:82:00.2", Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020700, NUMANode: 0, IOMMUGroup: 32})
	tr.LinkVF("0000:82:00.0", "0000:82:00.1", 0)
	tr.LinkVF("0000:82:00.0", "0000:82:00.2", 1)
	// A GPU sharing group 40 with an audio function.
	tr.AddDevice(hosttest.Device{BDF: "0000:41:00.0", Vendor: 0x10de, DeviceID: 0x2204, Class: 0x030000, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 40})
	tr.AddDevice(hosttest.Device{BDF: "0000:41:00.1", Vendor: 0x10de, DeviceID: 0x1aef, Class: 0x040300, Driver: "snd_hda_intel", NUMANode: 0, IOMMUGroup: 40})
	h := tr.Host()

	pf, err := h.Device(host.BDF{Bus: 0x82})
	require.NoError(t, err)
	assert.Equal(t, "InfiniBand", pf.ClassName())
	assert.Equal(t, []host.BDF{{Bus: 0x82, Function: 1}, {Bus: 0x82, Function: 2}}, pf.VirtFns)
	assert.Equal(t, 2, pf.NumVFs)
	assert.Equal(t, 8, pf.TotalVFs)
	assert.Equal(t, []string{"flr", "bus"}, pf.ResetMethods)
	assert.Equal(t, 30, pf.IOMMUGroup)
	require.Len(t, pf.BARs, 2)
	assert.Equal(t, host.VFBARIndex, pf.BARs[1].Index, "VF BAR0 is resource line 7")

	vf, err := h.Device(host.BDF{Bus: 0x82, Function: 1})
	require.NoError(t, err)
	require.NotNil(t, vf.PhysFn)
	assert.Equal(t, "0000:82:00.0", vf.PhysFn.String())
	assert.Equal(t, "vfio-pci", vf.Driver)
	vf2, err := h.Device(host.BDF{Bus: 0x82, Function: 2})
	require.NoError(t, err)
	assert.Equal(t, "", vf2.Driver)

	members, err := h.IOMMUGroupMembers(40)
	require.NoError(t, err)
	assert.Equal(t, []host.BDF{{Bus: 0x41}, {Bus: 0x41, Function: 1}}, members)
	n, err := h.IOMMUGroups()
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	_, err = h.IOMMUGroupMembers(99)
	assert.Error(t, err)

	pt, err := h.PassthroughDevices()
	require.NoError(t, err)
	var names []string
	for _, d := range pt {
		names = append(names, d.BDF.String())
	}
	assert.Equal(t, []string{"0000:41:00.0", "0000:82:00.0"}, names, "VFs under their PF, audio function not a candidate")
}

func TestInterruptRemappingAndPhysBits(t *testing.T) {
	tr := hosttest.New(t)
	tr.Interrupts(true)
	tr.CPUInfo(39)
	tr.KVM()
	h := tr.Host()
	ir, why, err := h.InterruptRemapping()
	require.NoError(t, err)
	assert.Equal(t, host.IREnabled, ir)
	assert.Contains(t, why, "IR-IO-APIC")
	bits, err := h.PhysAddrBits()
	require.NoError(t, err)
	assert.Equal(t, 39, bits)
	assert.True(t, h.KVMPresent())

	tr.Interrupts(false)
	ir, _, err = h.InterruptRemapping()
	require.NoError(t, err)
	assert.Equal(t, host.IRDisabled, ir)
	assert.False(t, h.UnsafeInterruptsAllowed())
	tr.Write("sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts", "Y\n")
	assert.True(t, h.UnsafeInterruptsAllowed())

	tr.Write("proc/cpuinfo", "processor : 0\n")
	_, err = h.PhysAddrBits()
	assert.ErrorContains(t, err, "address sizes")
	tr.Write("proc/cpuinfo", "address sizes : many bits physical\n")
	_, err = h.PhysAddrBits()
	assert.Error(t, err)
}

func TestMemlockInjected(t *testing.T) {
	h := hosttest.New(t).Host()
	h.Memlock = func() (uint64, error) { return 64 * kib, nil }
	h.Euid = func() int { return 1000 }
	lim, exempt, ok, err := h.MemlockLimit()
	require.NoError(t, err)
	assert.True(t, ok)
	assert.False(t, exempt)
	assert.Equal(t, 64*kib, lim)
}

func TestLiveHostSmoke(t *testing.T) {
	if _, err := os.Stat("/sys/bus/pci/devices"); err != nil {
		t.Skipf("no live sysfs: %v", err)
	}
	h := host.New("/sys", "/proc")
	_, err := h.Nodes()
	require.NoError(t, err)
	_, err = h.PassthroughDevices()
	require.NoError(t, err)
	_, _, ok, err := h.MemlockLimit()
	require.NoError(t, err)
	assert.True(t, ok, "the live host reports RLIMIT_MEMLOCK")
}

// configWith builds a 4 KiB config space with a capability chain.
func configWith(caps ...[2]byte) []byte {
	c := make([]byte, 4096)
	binary.LittleEndian.PutUint16(c[6:], 0x10)
	if len(caps) > 0 {
		c[0x34] = caps[0][1]
	}
	return c
}

func TestParseConfigMalformed(t *testing.T) {
	// Loop: 0x40 -> 0x50 -> 0x40.
	c := configWith([2]byte{host.CapPM, 0x40})
	c[0x40], c[0x41] = host.CapPM, 0x50
	c[0x50], c[0x51] = host.CapMSIX, 0x40
	cfg := host.ParseConfig(c)
	assert.Len(t, cfg.Caps, 2)
	require.NotEmpty(t, cfg.Problems)
	assert.Contains(t, cfg.Problems[0], "loops")

	// Pointer into the header.
	c = configWith([2]byte{0, 0x10})
	cfg = host.ParseConfig(c)
	assert.Empty(t, cfg.Caps)
	assert.NotEmpty(t, cfg.Problems)

	// Extended list looping on itself.
	c = configWith()
	binary.LittleEndian.PutUint32(c[0x100:], 0x1<<20|0x10001)
	binary.LittleEndian.PutUint32(c[0x100:], 0x100<<20|0x10001)
	cfg = host.ParseConfig(c)
	assert.Len(t, cfg.ExtCaps, 1)
	assert.NotEmpty(t, cfg.Problems)

	// Short reads (unprivileged sysfs gives 64 bytes) and garbage lengths.
	for _, n := range []int{0, 1, 63, 64, 65, 255, 256, 257, 4095} {
		c := make([]byte, n)
		for i := range c {
			c[i] = 0xff
		}
		assert.NotPanics(t, func() { host.ParseConfig(c) }, "len %d", n)
	}
}

func FuzzParseConfig(f *testing.F) {
	if raw, err := os.ReadFile(fixture + "/0000:00:06.0/config"); err == nil {
		f.Add(raw)
	}
	f.Add(make([]byte, 256))
	f.Fuzz(func(t *testing.T, raw []byte) {
		c := host.ParseConfig(raw)
		if c.MSIX != nil && (c.MSIX.TableSize < 1 || c.MSIX.TableSize > 2048) {
			t.Fatalf("MSI-X table size %d out of range", c.MSIX.TableSize)
		}
	})
}

func TestKVMBackend(t *testing.T) {
	root := t.TempDir()
	h := host.New(filepath.Join(root, "sys"), filepath.Join(root, "proc"))
	assert.Equal(t, "", h.KVMBackend())
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/module/kvm_pvm"), 0o755))
	assert.Equal(t, "kvm_pvm", h.KVMBackend())
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/module/kvm_amd"), 0o755))
	assert.Equal(t, "kvm_amd", h.KVMBackend(), "a hardware backend wins")
}

func TestNUMABalancing(t *testing.T) {
	root := t.TempDir()
	h := host.New(filepath.Join(root, "sys"), filepath.Join(root, "proc"))
	_, ok := h.NUMABalancing()
	assert.False(t, ok, "unknown without the file")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc/sys/kernel"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/sys/kernel/numa_balancing"), []byte("1\n"), 0o644))
	on, ok := h.NUMABalancing()
	assert.True(t, ok)
	assert.True(t, on)
}
