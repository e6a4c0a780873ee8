package vfio

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

func TestH100ConfigSpaceVirtualised(t *testing.T) {
	f := h100(t, true)
	r := newRig(t, f, func(c *Config) { c.HasClique, c.Clique = true, 3 })
	defer r.dev.Close()

	assert.Equal(t, uint32(0x233010de), r.cfgRead(pci.RegVendorID, 4))
	assert.Equal(t, uint32(0x030200), r.cfgRead(pci.RegRevision, 4)>>8, "class")
	assert.Zero(t, r.cfgRead(pci.RegHeaderType, 1)&0x80, "single function")
	assert.Equal(t, []string{"reset"}, f.takeLog()[:1], "reset before the guest sees the device")
	f.cfgW = nil // the root complex's own probe toggles the command register

	// BAR sizing as Linux does it, decode off: sizes from VFIO regions,
	// type bits from the device (64-bit prefetchable).
	for _, c := range []struct {
		off      int
		lo, hi   uint32
		describe string
	}{
		{pci.RegBAR0, 0xff00000c, 0xffffffff, "BAR0 16 MiB"},
		{pci.RegBAR0 + 8, 0x0000000c, 0xffffffe0, "BAR2 128 GiB"},
		{pci.RegBAR0 + 16, 0xfe00000c, 0xffffffff, "BAR4 32 MiB"},
	} {
		r.cfgWrite(c.off, 4, 0xffffffff)
		r.cfgWrite(c.off+4, 4, 0xffffffff)
		assert.Equal(t, c.lo, r.cfgRead(c.off, 4), c.describe)
		assert.Equal(t, c.hi, r.cfgRead(c.off+4, 4), c.describe)
		r.cfgWrite(c.off, 4, 0)
		r.cfgWrite(c.off+4, 4, 0)
	}
	r.cfgWrite(pci.RegROM, 4, 0xfffff801)
	assert.Zero(t, r.cfgRead(pci.RegROM, 4), "ROM BAR disabled")
	assert.Empty(t, f.cfgW, "BAR and ROM writes never reach the device")

	// Capability chain: the device's own, then the clique capability.
	assert.Equal(t, []int{0x40}, r.conf.FindCapabilities(testSlot, host.CapPM))
	assert.Equal(t, []int{0x48}, r.conf.FindCapabilities(testSlot, host.CapMSI))
	assert.Equal(t, []int{0x60}, r.conf.FindCapabilities(testSlot, host.CapPCIe))
	assert.Equal(t, []int{0xb0}, r.conf.FindCapabilities(testSlot, host.CapMSIX))
	assert.Equal(t, []int{0xd4}, r.conf.FindCapabilities(testSlot, host.CapVendor))
	var clique [8]byte
	for i := range clique {
		clique[i] = byte(r.cfgRead(0xd4+i, 1))
	}
	assert.Equal(t, [8]byte{0x09, 0x00, 0x08, 'P', '2', 'P', 3 << 3, 0}, clique)

	// MSI-X: table size 9 from the device, enable bit (set on the host)
	// cleared; table and PBA offsets as the device has them.
	assert.Equal(t, uint32(0x0008), r.cfgRead(0xb2, 2))
	assert.Equal(t, uint32(0x00b90000), r.cfgRead(0xb4, 4))
	assert.Equal(t, uint32(0x00ba0000), r.cfgRead(0xb8, 4))
	// MSI: 64-bit, per-vector mask, 16 vectors advertised, disabled.
	assert.Equal(t, uint32(0x0188), r.cfgRead(0x4a, 2))

	// INTx pin from the device, line = the GSI it is wired to.
	assert.Equal(t, uint32(0x010b), r.cfgRead(pci.RegInterruptLine, 2))

	// Registers that are not virtualised go to the device.
	assert.Equal(t, uint32(0x513e), r.cfgRead(0x68, 2), "PCIe Device Control from the device")
	f.cfg[0x68] = 0x2e
	assert.Equal(t, uint32(0x512e), r.cfgRead(0x68, 2))
	r.cfgWrite(0x68, 2, 0x5130)
	assert.Equal(t, []string{"0x68=3051"}, f.cfgW)

	// Command register: decode bits mirrored for the root, written through.
	f.cfgW = nil
	r.cfgWrite(pci.RegCommand, 2, pci.CommandMemory|pci.CommandBusMaster)
	assert.Equal(t, []string{"0x4=0600"}, f.cfgW)
	assert.Equal(t, uint32(pci.CommandMemory|pci.CommandBusMaster), r.cfgRead(pci.RegCommand, 2)&0x7)
	r.cfgWrite(pci.RegCommand, 2, 0)
	assert.Empty(t, r.errs)
}

func TestH100BARsBecomeMemslots(t *testing.T) {
	f := h100(t, true)
	r := newRig(t, f, nil)
	r.assign(t)
	bar0, bar2, bar4 := r.barAddr(t, 0), r.barAddr(t, 2), r.barAddr(t, 4)
	assert.Zero(t, bar2%(128<<30), "128 GiB BAR naturally aligned")
	assert.GreaterOrEqual(t, bar2, uint64(8<<30), "64-bit BARs above RAM")

	// BAR0: everything but the MSI-X table page and the PBA page.
	want := [][2]uint64{
		{bar0, bar0 + 0xb90000}, {bar0 + 0xb91000, bar0 + 0xba0000}, {bar0 + 0xba1000, bar0 + 16<<20},
		{bar4, bar4 + 32<<20}, {bar2, bar2 + 128<<30},
	}
	assert.ElementsMatch(t, want, r.slots.ranges())
	assert.Len(t, r.p2p.maps, 5, "every direct piece DMA-mapped for peer-to-peer")
	assert.Equal(t, uint64(128<<30), r.p2p.maps[bar2])

	infos := r.dev.BARs()
	require.Len(t, infos, 3)
	assert.Equal(t, BARInfo{Index: 0, Kind: pci.BARMem64, Prefetchable: true, Size: 16 << 20, Direct: 16<<20 - 0x2000, Trapped: true}, infos[0])
	assert.Equal(t, BARInfo{Index: 2, Kind: pci.BARMem64, Prefetchable: true, Size: 128 << 30, Direct: 128 << 30}, infos[1])
	assert.Nil(t, r.dev.BARHandler(2), "fully mapped BAR needs no handler")
	assert.NotNil(t, r.dev.BARHandler(0))

	// Decode off (as Linux does while sizing): memslots go, the DMA
	// mapping stays; decode on: memslots return, no second DMA mapping.
	calls := r.p2p.calls
	cmd := r.cfgRead(pci.RegCommand, 2)
	r.cfgWrite(pci.RegCommand, 2, cmd&^pci.CommandMemory)
	assert.Empty(t, r.slots.ranges())
	assert.Len(t, r.p2p.maps, 5)
	r.cfgWrite(pci.RegCommand, 2, cmd)
	assert.ElementsMatch(t, want, r.slots.ranges())
	assert.Equal(t, calls, r.p2p.calls)

	// Moving a BAR moves its memslots and its DMA mapping.
	r.cfgWrite(pci.RegCommand, 2, cmd&^pci.CommandMemory)
	newAddr := bar4 + 64<<20
	r.cfgWrite(pci.RegBAR0+16, 4, uint32(newAddr)|0xc)
	r.cfgWrite(pci.RegBAR0+20, 4, uint32(newAddr>>32))
	r.cfgWrite(pci.RegCommand, 2, cmd)
	assert.Contains(t, r.slots.ranges(), [2]uint64{newAddr, newAddr + 32<<20})
	assert.NotContains(t, r.p2p.maps, bar4)
	assert.Equal(t, uint64(32<<20), r.p2p.maps[newAddr])

	require.NoError(t, r.dev.Close())
	assert.Empty(t, r.slots.ranges())
	assert.Empty(t, r.p2p.maps)
	assert.True(t, f.closed)
	log := f.takeLog()
	assert.Equal(t, "reset", log[len(log)-1], "reset after the guest is gone")
	require.NoError(t, r.dev.Close(), "second Close is a no-op")
}

func TestSparseMmapAreasHonoured(t *testing.T) {
	f := h100(t, false)
	r := newRig(t, f, nil)
	r.assign(t)
	bar0 := r.barAddr(t, 0)
	var got [][2]uint64
	for _, s := range r.slots.ranges() {
		if s[0] >= bar0 && s[0] < bar0+16<<20 {
			got = append(got, s)
		}
	}
	assert.Equal(t, [][2]uint64{{bar0, bar0 + 0xb90000}, {bar0 + 0xb91000, bar0 + 0xba0000}, {bar0 + 0xba1000, bar0 + 16<<20}}, got)
	require.NoError(t, r.dev.Close())
}

func TestMSIXVectorsThroughIRQFDs(t *testing.T) {
	f := h100(t, true)
	r := newRig(t, f, nil)
	defer r.dev.Close()
	r.assign(t)
	assert.Equal(t, []string{"assign gsi 11 resample"}, r.intx.log)
	f.takeLog()
	r.router.TakeLog()
	table := r.barAddr(t, 0) + 0xb90000

	r.cfgWrite(0xb2, 2, msixCtrlEnable)
	assert.Equal(t, []string{"disable intx", "set msix 0+9 trigger"}, f.takeLog(), "INTx off before MSI-X on")
	assert.Equal(t, []string{"assign gsi 11 resample", "deassign gsi 11"}, r.intx.log, "INTx's resampling irqfd goes with INTx")
	assert.Empty(t, r.router.TakeLog(), "all vectors still masked")

	// Program vector 1 and unmask it: route first, then the irqfd.
	r.mmioWrite32(table+16, 0xfee01000)
	r.mmioWrite32(table+20, 0)
	r.mmioWrite32(table+24, 0x4031)
	assert.Empty(t, r.router.TakeLog(), "masked vector: nothing routed")
	r.mmioWrite32(table+28, 0)
	assert.Equal(t, []string{"alloc 24", "route 24 0xfee01000 0x4031", "assign 24"}, r.router.TakeLog())
	route, ok := r.router.Assigned(int(f.trigger["msix"][1]))
	require.True(t, ok, "the eventfd given to VFIO for vector 1 is the irqfd KVM listens on")
	assert.Equal(t, uint32(0x4031), route.Data)
	assert.Equal(t, uint32(0xfee01000), r.mmioRead32(table+16))
	assert.Equal(t, uint32(0x4031), r.mmioRead32(table+24))

	// Mask: the irqfd goes before anything else changes.
	r.mmioWrite32(table+28, 1)
	assert.Equal(t, []string{"deassign 24"}, r.router.TakeLog())
	r.mmioWrite32(table+24, 0x4032)
	r.mmioWrite32(table+28, 0)
	assert.Equal(t, []string{"route 24 0xfee01000 0x4032", "assign 24"}, r.router.TakeLog())

	// Function mask masks every vector; clearing it restores them, with
	// the routes KVM already has.
	r.cfgWrite(0xb2, 2, msixCtrlEnable|msixCtrlMaskAll)
	assert.Equal(t, []string{"deassign 24"}, r.router.TakeLog())
	r.cfgWrite(0xb2, 2, msixCtrlEnable)
	assert.Equal(t, []string{"assign 24"}, r.router.TakeLog(), "unchanged route: only the irqfd")

	// Validation: an address outside the MSI window is never routed.
	r.mmioWrite32(table+32, 0x12345678)
	r.mmioWrite32(table+44, 0)
	assert.Empty(t, r.router.TakeLog())
	require.Len(t, r.errs, 1)
	assert.Contains(t, r.errs[0].Error(), "MSI-X vector 2 with address 0x12345678")
	// Unaligned and odd-sized accesses are dropped; reserved bits too.
	r.mmio.Write(table+17, []byte{1, 2})
	assert.Equal(t, uint32(0xfee01000), r.mmioRead32(table+16))
	r.mmioWrite32(table+12, 0xfffffffe)
	assert.Equal(t, uint32(0), r.mmioRead32(table+12))

	// The rest of the table page goes to the device; the PBA is emulated
	// (the device's says nothing of the guest's masks) and read-only.
	binary.LittleEndian.PutUint32(f.bars[0][0xb90800:], 0xabcd)
	assert.Equal(t, uint32(0xabcd), r.mmioRead32(table+0x800))
	r.mmioWrite32(table+0x804, 0x77)
	assert.Equal(t, uint32(0x77), binary.LittleEndian.Uint32(f.bars[0][0xb90804:]))
	binary.LittleEndian.PutUint32(f.bars[0][0xba0000:], 0x2)
	assert.Equal(t, uint32(0), r.mmioRead32(r.barAddr(t, 0)+0xba0000), "nothing pending")
	r.mmioWrite32(r.barAddr(t, 0)+0xba0000, 0xff)
	assert.Equal(t, uint32(0), r.mmioRead32(r.barAddr(t, 0)+0xba0000), "PBA is read-only")
	assert.Equal(t, uint32(0x2), binary.LittleEndian.Uint32(f.bars[0][0xba0000:]), "PBA writes never reach the device")

	// Disable: routes torn down, VFIO off, INTx back with its irqfd.
	r.intx.log = nil
	r.cfgWrite(0xb2, 2, 0)
	assert.Equal(t, []string{"deassign 24"}, r.router.TakeLog())
	assert.Equal(t, []string{"disable msix", "set intx 0+1 trigger", "set intx 0+1 unmask"}, f.takeLog())
	assert.Equal(t, []string{"assign gsi 11 resample"}, r.intx.log)
}

// TestMSIXPendingWhileMasked: a vector the device fires while the guest
// has it masked shows in the PBA (its signal waited in the eventfd VFIO
// writes, with no irqfd on it), and unmasking delivers it once.
func TestMSIXPendingWhileMasked(t *testing.T) {
	f := h100(t, true)
	r := newRig(t, f, nil)
	defer r.dev.Close()
	r.assign(t)
	table := r.barAddr(t, 0) + 0xb90000
	pba := r.barAddr(t, 0) + 0xba0000
	r.cfgWrite(0xb2, 2, msixCtrlEnable)
	r.mmioWrite32(table+16*5, 0xfee00000)
	r.mmioWrite32(table+16*5+8, 0x4041)
	r.mmioWrite32(table+16*5+12, 0) // unmask vector 5
	r.mmioWrite32(table+16*5+12, 1) // and mask it again
	r.router.TakeLog()
	fd := int(f.trigger["msix"][5])

	require.NoError(t, irq.SignalEventFD(fd)) // the device fires vector 5
	assert.Equal(t, uint32(1<<5), r.mmioRead32(pba), "masked vector that fired is pending")
	var b [8]byte
	assert.False(t, irq.DrainEventFD(fd, b[:]), "the PBA read took the signal from the eventfd")
	assert.Equal(t, uint32(1<<5), r.mmioRead32(pba), "pending until delivered")
	var q [8]byte
	r.mmio.Read(pba, q[:])
	assert.Equal(t, uint64(1<<5), binary.LittleEndian.Uint64(q[:]), "qword read")

	r.mmioWrite32(table+16*5+12, 0)
	assert.Equal(t, []string{"assign 24"}, r.router.TakeLog())
	assert.Equal(t, uint32(0), r.mmioRead32(pba), "unmask clears the pending bit")
	require.True(t, irq.DrainEventFD(fd, b[:]), "and delivers the message through the irqfd's eventfd")
	assert.Equal(t, uint64(1), binary.LittleEndian.Uint64(b[:]), "once")

	// An unmasked vector never reads pending: KVM consumes its signals.
	require.NoError(t, irq.SignalEventFD(fd))
	assert.Equal(t, uint32(0), r.mmioRead32(pba))
	require.True(t, irq.DrainEventFD(fd, b[:]))

	// Pending bits do not survive MSI-X being disabled.
	r.mmioWrite32(table+16*5+12, 1)
	require.NoError(t, irq.SignalEventFD(fd))
	assert.Equal(t, uint32(1<<5), r.mmioRead32(pba))
	r.cfgWrite(0xb2, 2, 0)
	r.cfgWrite(0xb2, 2, msixCtrlEnable)
	assert.Equal(t, uint32(0), r.mmioRead32(pba))
	// Misaligned and odd-sized PBA reads see zero, never panic.
	require.NoError(t, irq.SignalEventFD(fd))
	r.mmio.Read(pba+2, b[:4])
	assert.Equal(t, []byte{0, 0, 0, 0}, b[:4])
	r.mmio.Read(pba-4, b[:8])
	assert.Equal(t, make([]byte, 8), b[:8])
}

// eduConfig is a small device like QEMU's edu: BAR0 1 MiB (32-bit), an MSI
// capability (64-bit, one vector) at 0x40, INTA.
func eduConfig() []byte {
	c := make([]byte, 256)
	binary.LittleEndian.PutUint16(c[0:], 0x1234)
	binary.LittleEndian.PutUint16(c[2:], 0x11e8)
	c[0x06] = pci.StatusCapList
	c[0x0b] = 0x00
	c[0x34] = 0x40
	c[0x3d] = 1
	c[0x40], c[0x41] = host.CapMSI, 0
	binary.LittleEndian.PutUint16(c[0x42:], msiCtrl64)
	return c
}

func newEdu() *fakeDev {
	f := newFakeDev(eduConfig())
	f.addBAR(0, 1<<20, true, true)
	f.irqs = [5]uint32{1, 1, 0, 1, 1}
	return f
}

func TestMSIThroughIRQFDs(t *testing.T) {
	f := newEdu()
	f.flags &^= uapi.VFIODeviceFlagsReset
	r := newRig(t, f, nil)
	r.assign(t)
	assert.Contains(t, joined(r.dev.Warnings()), "no reset method")
	assert.False(t, r.dev.CanReset())
	assert.Equal(t, []string{"set intx 0+1 trigger", "set intx 0+1 unmask"}, f.takeLog(), "no reset attempted; INTx on")
	assert.Equal(t, []int{0x40}, r.conf.FindCapabilities(testSlot, host.CapMSI))
	assert.Equal(t, uint32(msiCtrl64), r.cfgRead(0x42, 2), "1 vector, 64-bit, disabled")

	f.cfgW = nil
	r.cfgWrite(0x44, 4, 0xfee00000)
	r.cfgWrite(0x48, 4, 0)
	r.cfgWrite(0x4c, 2, 0x4025)
	assert.Empty(t, f.takeLog())
	r.cfgWrite(0x42, 2, msiCtrl64|msiCtrlEnable|0x70) // asks for 128 vectors: gets 1
	assert.Equal(t, []string{"disable intx", "set msi 0+1 trigger"}, f.takeLog())
	assert.Equal(t, []string{"alloc 24", "route 24 0xfee00000 0x4025", "assign 24"}, r.router.TakeLog())
	assert.Equal(t, uint32(msiCtrl64|msiCtrlEnable|0x70), r.cfgRead(0x42, 2))
	assert.Empty(t, f.cfgW, "MSI capability writes stay in hpcvmm")

	r.cfgWrite(0x4c, 2, 0x4026)
	assert.Equal(t, []string{"route 24 0xfee00000 0x4026"}, r.router.TakeLog(), "data change of a live vector: the route is replaced in place")

	// Linux's free_irq writes a zeroed message while MSI is still enabled:
	// the vector is masked (irqfd deassigned) without a warning; a
	// non-zero address outside the MSI window is warned about.
	r.cfgWrite(0x44, 4, 0)
	assert.Equal(t, []string{"deassign 24"}, r.router.TakeLog())
	assert.Empty(t, r.errs, "no warning for a parked (zero) MSI address")
	r.cfgWrite(0x44, 4, 0x1000)
	assert.Len(t, r.errs, 1)
	r.cfgWrite(0x44, 4, 0xfee00000)
	assert.Equal(t, []string{"assign 24"}, r.router.TakeLog(), "the route KVM has is unchanged: only the irqfd")
	r.cfgWrite(0x42, 2, msiCtrl64)
	assert.Equal(t, []string{"disable msi", "set intx 0+1 trigger", "set intx 0+1 unmask"}, f.takeLog())
	require.NoError(t, r.dev.Close())
	assert.Equal(t, []string{"disable intx"}, f.takeLog(), "no reset after use either")
	assert.Equal(t, []string{"assign gsi 11 resample", "deassign gsi 11", "assign gsi 11 resample", "deassign gsi 11"}, r.intx.log,
		"the resampling irqfd is deassigned while MSI is on and at close")
}

func TestNoMemslotsTrapsEveryBAR(t *testing.T) {
	f := newEdu()
	r := newRig(t, f, func(c *Config) { c.Memslots, c.P2P, c.INTx = nil, nil, nil })
	defer r.dev.Close()
	r.assign(t)
	assert.Zero(t, r.cfgRead(pci.RegInterruptPin, 1), "INTx not wired: no pin")
	binary.LittleEndian.PutUint32(f.bars[0][0:], 0x010000ed)
	assert.Equal(t, uint32(0x010000ed), r.mmioRead32(r.barAddr(t, 0)), "BAR read forwarded with pread")
	r.mmioWrite32(r.barAddr(t, 0)+4, 0x12)
	assert.Equal(t, uint32(0x12), binary.LittleEndian.Uint32(f.bars[0][4:]))
	assert.Zero(t, f.mmaps)
	assert.Equal(t, []TrapStats{{Index: 0, Other: 2}}, r.dev.TrapStats(), "both accesses exited to hpcvmm")
}

func TestNewPCIDeviceErrors(t *testing.T) {
	f := newEdu()
	f.flags = 0
	_, err := NewPCIDevice(f, Config{Name: "x"})
	assert.ErrorContains(t, err, "not a vfio-pci device")
	assert.True(t, f.closed, "the device is closed on failure")

	f = newEdu()
	_, err = NewPCIDevice(f, Config{Name: "edu"})
	assert.ErrorContains(t, err, "no interrupt router")

	f = h100(t, true)
	f.regions[0].Size = 0x1000 // MSI-X table at 0xb90000 no longer fits
	_, err = NewPCIDevice(f, Config{Name: "gpu", Router: nil})
	assert.ErrorContains(t, err, "MSI-X table [0xb90000, 0xb90090) does not fit BAR0")

	f = h100(t, true)
	f.cfg = append([]byte(nil), f.cfg...)
	copy(f.cfg[0xc8:], []byte{host.CapVendor, 0, 0x20}) // a vendor capability over both clique slots
	f.cfg[0xb1] = 0xc8
	_, err = NewPCIDevice(f, Config{Name: "gpu", HasClique: true, Clique: 1})
	assert.ErrorContains(t, err, "no room for the NVIDIA P2P clique capability")
}
