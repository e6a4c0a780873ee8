package pci_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
	"github.com/hpcvmm/hpcvmm/pci/pcitest"
)

type recorder struct{ reads, writes int }

func (r *recorder) Read(off uint64, data []byte) {
	r.reads++
	for i := range data {
		data[i] = 0xab
	}
}
func (r *recorder) Write(off uint64, data []byte) { r.writes++ }

// msixSink records MSIXTarget calls.
type msixSink struct {
	vectors  map[int]irq.MSIMessage
	signals  []int
	enabled  bool
	fmasked  bool
	controls int
}

func (s *msixSink) VectorChanged(v int, m irq.MSIMessage) {
	if s.vectors == nil {
		s.vectors = map[int]irq.MSIMessage{}
	}
	s.vectors[v] = m
}
func (s *msixSink) ControlChanged(en, fm bool) { s.enabled, s.fmasked = en, fm; s.controls++ }
func (s *msixSink) Signal(v int)               { s.signals = append(s.signals, v) }

type testDev struct {
	*pci.ConfigSpace
	msix   *msix.Capability
	sink   *msixSink
	mem32  *recorder
	io     *recorder
	mem64  *recorder
	mapped map[int]uint64
}

// newTestDev has every BAR kind: BAR0 mem32 4 KiB, BAR1 I/O 32 B, BAR2/3
// mem64 prefetchable 1 MiB, BAR4/5 mem64 8 KiB holding the MSI-X table and PBA.
func newTestDev(t testing.TB) *testDev {
	d := &testDev{mem32: &recorder{}, io: &recorder{}, mem64: &recorder{}, sink: &msixSink{}, mapped: map[int]uint64{}}
	cs := pci.NewConfigSpace(pci.Header{VendorID: 0x1234, DeviceID: 0x5678, Class: 0x020000, Revision: 3})
	require.NoError(t, cs.SetBAR(0, pci.BARSpec{Size: 4096, Kind: pci.BARMem32, Handler: d.mem32}))
	require.NoError(t, cs.SetBAR(1, pci.BARSpec{Size: 32, Kind: pci.BARIO, Handler: d.io}))
	require.NoError(t, cs.SetBAR(2, pci.BARSpec{Size: 1 << 20, Kind: pci.BARMem64, Prefetchable: true, Handler: d.mem64}))
	require.NoError(t, cs.SetBAR(4, pci.BARSpec{Size: 8192, Kind: pci.BARMem64}))
	_, err := cs.AddCapability(0x09, []byte{4, 0xaa}) // a vendor capability before MSI-X
	require.NoError(t, err)
	d.msix, err = msix.New(cs, 5, 4, 0, 0x1000, d.sink)
	require.NoError(t, err)
	_, err = cs.AddExtendedCapability(0x0b, 1, []byte{1, 2, 3, 4})
	require.NoError(t, err)
	_, err = cs.AddExtendedCapability(0x0d, 1, []byte{5, 6, 7, 8})
	require.NoError(t, err)
	cs.SetBARListener(func(bar int, addr uint64, on bool) {
		if on {
			d.mapped[bar] = addr
		} else {
			delete(d.mapped, bar)
		}
	})
	d.ConfigSpace = cs
	return d
}

func (d *testDev) BARHandler(bar int) bus.Device {
	if bar == 4 {
		return d.msix
	}
	return d.ConfigSpace.BARHandler(bar)
}

type rig struct {
	root      *pci.Root
	pio, mmio *bus.Bus
	cfg       pcitest.Conf1
	dev       *testDev
	errs      []error
}

func newRig(t testing.TB) *rig {
	r := &rig{pio: &bus.Bus{}, mmio: &bus.Bus{}}
	r.root = pci.NewRoot(pci.RootConfig{MMIO: r.mmio, PIO: r.pio, OnError: func(err error) { r.errs = append(r.errs, err) }})
	require.NoError(t, r.pio.Register(pci.ConfigIOPort, pci.ConfigIOSize, "pci-conf1", r.root.ConfigIO()))
	require.NoError(t, r.mmio.Register(addrspace.ECAMBase, pci.ECAMSize, "pci-ecam", r.root.ECAM()))
	r.cfg = pcitest.Conf1{PIO: r.pio}
	r.dev = newTestDev(t)
	require.NoError(t, r.root.AddDevice(3, "test", r.dev))
	return r
}

func (r *rig) ecamRead(dev, reg, n int) uint32 {
	var b [4]byte
	r.mmio.Read(addrspace.ECAMBase+uint64(dev)<<15+uint64(reg), b[:n])
	return binary.LittleEndian.Uint32(b[:])
}

func (r *rig) ecamWrite(dev, reg, n int, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	r.mmio.Write(addrspace.ECAMBase+uint64(dev)<<15+uint64(reg), b[:n])
}

func TestLinuxConf1Probe(t *testing.T) {
	r := newRig(t)
	// pci_check_type1: outb(0x01, 0xcfb); save; outl(0x80000000); inl == 0x80000000.
	r.pio.Write(0xcfb, []byte{1})
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], 0x80000000)
	r.pio.Write(0xcf8, b[:])
	r.pio.Read(0xcf8, b[:])
	assert.Equal(t, uint32(0x80000000), binary.LittleEndian.Uint32(b[:]))
	// pci_sanity_check: a host bridge on bus 0.
	assert.Equal(t, uint32(0x0600), r.cfg.Read(0, 0, 0x0a, 2))
	assert.Equal(t, uint32(pci.HostBridgeVendor|pci.HostBridgeDevice<<16), r.cfg.Read(0, 0, 0, 4))
	// Absent devices and functions read all ones.
	assert.Equal(t, uint32(0xffffffff), r.cfg.Read(7, 0, 0, 4))
	assert.Equal(t, uint32(0xffffffff), r.cfg.Read(3, 1, 0, 4))
	// Data port with the enable bit clear reads all ones.
	binary.LittleEndian.PutUint32(b[:], 3<<11)
	r.pio.Write(0xcf8, b[:])
	r.pio.Read(0xcfc, b[:])
	assert.Equal(t, uint32(0xffffffff), binary.LittleEndian.Uint32(b[:]))
}

func TestConf1AndECAMAgree(t *testing.T) {
	r := newRig(t)
	for _, dev := range []int{0, 3, 9} {
		for reg := 0; reg < pci.LegacyConfigSize; reg += 4 {
			require.Equal(t, r.cfg.Read(dev, 0, reg, 4), r.ecamRead(dev, reg, 4), "dev %d reg %#x", dev, reg)
			require.Equal(t, r.cfg.Read(dev, 0, reg+1, 1), r.ecamRead(dev, reg+1, 1), "dev %d reg %#x byte", dev, reg+1)
			require.Equal(t, r.cfg.Read(dev, 0, reg+2, 2), r.ecamRead(dev, reg+2, 2), "dev %d reg %#x word", dev, reg+2)
		}
	}
	// Extended space: conf1 reaches it only with the AMD extension bits,
	// ECAM directly; both see the same extended capability chain.
	assert.Equal(t, r.ecamRead(3, 0x100, 4), r.cfg.Read(3, 0, 0x100, 4))
	hdr := r.ecamRead(3, 0x100, 4)
	assert.Equal(t, uint32(0x0b), hdr&0xffff)
	next := int(hdr >> 20)
	require.Equal(t, 0x108, next)
	assert.Equal(t, uint32(0x0d), r.ecamRead(3, next, 4)&0xffff)
	assert.Equal(t, uint32(0), r.ecamRead(3, next, 4)>>20, "end of chain")
	// A write through one mechanism is seen by the other.
	r.ecamWrite(3, pci.RegInterruptLine, 1, 11)
	assert.Equal(t, uint32(11), r.cfg.Read(3, 0, pci.RegInterruptLine, 1))
	// ECAM accesses crossing the 4 KiB function boundary read all ones.
	var b [4]byte
	r.mmio.Read(addrspace.ECAMBase+3<<15+0xffe, b[:])
	assert.Equal(t, uint32(0xffffffff), binary.LittleEndian.Uint32(b[:]))
}

func TestHeaderRegisters(t *testing.T) {
	r := newRig(t)
	assert.Equal(t, uint32(0x56781234), r.cfg.Read(3, 0, 0, 4))
	assert.Equal(t, uint32(0x02000003), r.cfg.Read(3, 0, 8, 4), "class and revision")
	// Vendor/device are read-only; command takes only its defined bits.
	r.cfg.Write(3, 0, 0, 4, 0)
	assert.Equal(t, uint32(0x56781234), r.cfg.Read(3, 0, 0, 4))
	r.cfg.Write(3, 0, pci.RegCommand, 2, 0xffff)
	assert.Equal(t, uint32(0x0547), r.cfg.Read(3, 0, pci.RegCommand, 2))
	// Header type 0, single function; expansion ROM absent.
	assert.Equal(t, uint32(0), r.cfg.Read(3, 0, pci.RegHeaderType, 1))
	r.cfg.Write(3, 0, pci.RegROM, 4, 0xffffffff)
	assert.Equal(t, uint32(0), r.cfg.Read(3, 0, pci.RegROM, 4))
}

func TestBARSizing(t *testing.T) {
	r := newRig(t)
	size := func(bar int) uint32 {
		off := pci.RegBAR0 + 4*bar
		orig := r.cfg.Read(3, 0, off, 4)
		r.cfg.Write(3, 0, off, 4, 0xffffffff)
		v := r.cfg.Read(3, 0, off, 4)
		r.cfg.Write(3, 0, off, 4, orig)
		return v
	}
	assert.Equal(t, uint32(0xfffff000), size(0), "32-bit memory, 4 KiB, type bits 0")
	assert.Equal(t, uint32(0xffffffe1), size(1), "I/O, 32 bytes, bit 0 set")
	assert.Equal(t, uint32(0xfff0000c), size(2), "64-bit prefetchable 1 MiB: type 10b, prefetch bit")
	assert.Equal(t, uint32(0xffffffff), size(3), "upper half of a 1 MiB 64-bit BAR")
	assert.Equal(t, uint32(0xffffe004), size(4), "64-bit non-prefetchable 8 KiB")
	// Unimplemented BAR registers are hard-wired to zero.
	r2 := pci.NewConfigSpace(pci.Header{})
	var b [4]byte
	r2.ConfigWrite(pci.RegBAR0+20, []byte{0xff, 0xff, 0xff, 0xff})
	r2.ConfigRead(pci.RegBAR0+20, b[:])
	assert.Equal(t, uint32(0), binary.LittleEndian.Uint32(b[:]))

	// A 64-bit BAR larger than 4 GiB sizes through the upper half.
	big := pci.NewConfigSpace(pci.Header{})
	require.NoError(t, big.SetBAR(0, pci.BARSpec{Size: 128 << 30, Kind: pci.BARMem64, Prefetchable: true}))
	big.ConfigWrite(pci.RegBAR0, []byte{0xff, 0xff, 0xff, 0xff})
	big.ConfigWrite(pci.RegBAR0+4, []byte{0xff, 0xff, 0xff, 0xff})
	assert.Equal(t, uint32(0x0000000c), big.Uint32(pci.RegBAR0))
	assert.Equal(t, uint32(0xffffffe0), big.Uint32(pci.RegBAR0+4))
}

func TestSetBARRejectsBadSpecs(t *testing.T) {
	cs := pci.NewConfigSpace(pci.Header{})
	assert.ErrorContains(t, cs.SetBAR(0, pci.BARSpec{Size: 3000, Kind: pci.BARMem32}), "power of two")
	assert.ErrorContains(t, cs.SetBAR(5, pci.BARSpec{Size: 4096, Kind: pci.BARMem64}), "two registers")
	assert.ErrorContains(t, cs.SetBAR(6, pci.BARSpec{Size: 4096, Kind: pci.BARMem32}), "out of range")
	require.NoError(t, cs.SetBAR(0, pci.BARSpec{Size: 4096, Kind: pci.BARMem64}))
	assert.ErrorContains(t, cs.SetBAR(1, pci.BARSpec{Size: 4096, Kind: pci.BARMem32}), "already defined")
}

func TestAssignBARsAndDecode(t *testing.T) {
	r := newRig(t)
	w := addrspace.Windows{
		Mem32: addrspace.Range{GPA: addrspace.Window32Base, Size: addrspace.Window32Size},
		Mem64: addrspace.Range{GPA: 1 << 36, Size: 1 << 36},
		IO:    addrspace.Range{GPA: addrspace.IOWindowBase, Size: addrspace.IOWindowSize},
	}
	require.NoError(t, r.root.AssignBARs(w))

	a0, on := r.root.BARAddress(3, 0)
	require.True(t, on)
	assert.Equal(t, uint64(addrspace.Window32Base), a0)
	a1, on := r.root.BARAddress(3, 1)
	require.True(t, on)
	assert.Equal(t, uint64(addrspace.IOWindowBase), a1)
	a2, on := r.root.BARAddress(3, 2)
	require.True(t, on)
	assert.Equal(t, uint64(1<<36), a2, "largest 64-bit BAR first")
	a4, on := r.root.BARAddress(3, 4)
	require.True(t, on)
	assert.Equal(t, uint64(1<<36+1<<20), a4)
	assert.Zero(t, a4%8192, "naturally aligned")
	assert.Equal(t, map[int]uint64{0: a0, 1: a1, 2: a2, 4: a4}, r.dev.mapped)
	assert.Equal(t, uint32(pci.CommandIO|pci.CommandMemory), r.cfg.Read(3, 0, pci.RegCommand, 2))

	// The registered ranges dispatch to the BAR handlers.
	var b [4]byte
	require.True(t, r.mmio.Read(a0+8, b[:]))
	require.True(t, r.pio.Write(a1+4, b[:1]))
	require.True(t, r.mmio.Read(a2+0xffffc, b[:]))
	assert.Equal(t, 1, r.dev.mem32.reads)
	assert.Equal(t, 1, r.dev.io.writes)
	assert.Equal(t, 1, r.dev.mem64.reads)

	// Clearing memory decode unregisters the memory BARs but not I/O.
	r.cfg.Write(3, 0, pci.RegCommand, 2, pci.CommandIO)
	assert.False(t, r.mmio.Read(a0, b[:]))
	assert.True(t, r.pio.Read(a1, b[:1]))
	assert.NotContains(t, r.dev.mapped, 0)
	r.cfg.Write(3, 0, pci.RegCommand, 2, pci.CommandIO|pci.CommandMemory)
	assert.True(t, r.mmio.Read(a0, b[:]))

	// Reprogramming moves the registration (Linux disables decode around
	// a 64-bit BAR update; do the same).
	r.cfg.Write(3, 0, pci.RegCommand, 2, pci.CommandIO)
	r.cfg.Write(3, 0, pci.RegBAR0+8, 4, 0x40000000|0xc)
	r.cfg.Write(3, 0, pci.RegBAR0+12, 4, 0x2)
	r.cfg.Write(3, 0, pci.RegCommand, 2, pci.CommandIO|pci.CommandMemory)
	moved, on := r.root.BARAddress(3, 2)
	require.True(t, on)
	assert.Equal(t, uint64(0x2_4000_0000), moved)
	assert.False(t, r.mmio.Read(a2, b[:]), "old range released")
	assert.True(t, r.mmio.Read(moved+16, b[:]), "new range registered")
	assert.Equal(t, moved, r.dev.mapped[2])

	// A 32-bit BAR moved with decode on moves immediately.
	r.cfg.Write(3, 0, pci.RegBAR0, 4, 0xd0000000)
	assert.True(t, r.mmio.Read(0xd0000000, b[:]))
	assert.False(t, r.mmio.Read(a0, b[:]))

	// A BAR programmed over another range (here ECAM) is reported and
	// left unmapped until a later write makes it valid again.
	r.cfg.Write(3, 0, pci.RegBAR0, 4, 0xe0000000+0x1000)
	_, on = r.root.BARAddress(3, 0)
	assert.False(t, on)
	require.NotEmpty(t, r.errs)
	assert.ErrorContains(t, r.errs[len(r.errs)-1], "overlaps")
	r.cfg.Write(3, 0, pci.RegBAR0, 4, 0xd0000000)
	got, on := r.root.BARAddress(3, 0)
	assert.True(t, on)
	assert.Equal(t, uint64(0xd0000000), got)
}

func TestCapabilityWalkAsLinux(t *testing.T) {
	r := newRig(t)
	assert.Equal(t, []int{0x40}, r.cfg.FindCapabilities(3, 0x09))
	msix := r.cfg.FindCapabilities(3, pci.CapIDMSIX)
	require.Equal(t, []int{r.dev.msix.Offset()}, msix)
	// Table size N-1, table in BAR4 at 0, PBA in BAR4 at 0x1000.
	assert.Equal(t, uint32(4), r.cfg.Read(3, 0, msix[0]+2, 2)&0x7ff)
	assert.Equal(t, uint32(4), r.cfg.Read(3, 0, msix[0]+4, 4))
	assert.Equal(t, uint32(0x1004), r.cfg.Read(3, 0, msix[0]+8, 4))
	// The capability is read-only apart from enable and function mask.
	r.cfg.Write(3, 0, msix[0], 4, 0xffffffff)
	assert.Equal(t, uint32(0xc004<<16|uint32(pci.CapIDMSIX)), r.cfg.Read(3, 0, msix[0], 4)&0xffff00ff)
	assert.Nil(t, r.cfg.FindCapabilities(0, pci.CapIDMSIX), "host bridge has none")
}

func TestConfigStatusWriteOneToClear(t *testing.T) {
	cs := pci.NewConfigSpace(pci.Header{})
	cs.SetUint16(pci.RegStatus, 0x2000|pci.StatusCapList) // received master abort
	cs.ConfigWrite(pci.RegStatus, []byte{0xff, 0xff})
	assert.Equal(t, uint16(pci.StatusCapList), cs.Uint16(pci.RegStatus), "error bit cleared, cap bit kept")
}
