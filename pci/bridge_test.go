package pci_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/pci"
)

// switchRig is the rig's root with the hierarchy Linux meets behind a
// PCIe switch: a root port at 00:05.0, a switch upstream port below it,
// two downstream ports with an endpoint each, and a second root port at
// 00:06.0 with an endpoint of its own.
type switchRig struct {
	*rig
	rp, usp, dsp0, dsp1, rp2 *pci.Bridge
	a, b, c                  *testDev
	resets                   int
}

func newBridge(t testing.TB, typ pci.PortType, port uint8, onReset func()) *pci.Bridge {
	b, err := pci.NewBridge(pci.BridgeConfig{Type: typ, Link: pci.Link{Speed: pci.Speed16GT, Width: 16},
		Current: pci.Link{Speed: pci.Speed8GT, Width: 8}, PortNumber: port, PhysicalSlot: uint16(port) + 1, OnSecondaryBusReset: onReset})
	require.NoError(t, err)
	return b
}

func newSwitchRig(t testing.TB) *switchRig {
	r := &switchRig{rig: newRig(t)}
	r.rp = newBridge(t, pci.RootPort, 1, nil)
	r.usp = newBridge(t, pci.UpstreamPort, 0, nil)
	r.dsp0 = newBridge(t, pci.DownstreamPort, 0, func() { r.resets++ })
	r.dsp1 = newBridge(t, pci.DownstreamPort, 1, nil)
	r.rp2 = newBridge(t, pci.RootPort, 2, nil)
	r.a, r.b, r.c = newTestDev(t), newTestDev(t), newTestDev(t)
	require.NoError(t, r.root.AddDevice(5, "rp", r.rp))
	require.NoError(t, r.root.AddDeviceBelow(r.rp, 0, "usp", r.usp))
	require.NoError(t, r.root.AddDeviceBelow(r.usp, 0, "dsp0", r.dsp0))
	require.NoError(t, r.root.AddDeviceBelow(r.usp, 1, "dsp1", r.dsp1))
	require.NoError(t, r.root.AddDeviceBelow(r.dsp0, 0, "a", r.a))
	require.NoError(t, r.root.AddDeviceBelow(r.dsp1, 0, "b", r.b))
	require.NoError(t, r.root.AddDevice(6, "rp2", r.rp2))
	require.NoError(t, r.root.AddDeviceBelow(r.rp2, 0, "c", r.c))
	return r
}

func TestBridgeHeaderAndPCIeCapability(t *testing.T) {
	r := newSwitchRig(t)
	c := r.cfg
	assert.Equal(t, uint32(0x000c1b36), c.Read(5, 0, 0, 4), "Red Hat generic root port")
	assert.Equal(t, uint32(0x060400), c.Read(5, 0, pci.RegRevision, 4)>>8, "class PCI-to-PCI bridge")
	assert.Equal(t, uint32(1), c.Read(5, 0, pci.RegHeaderType, 1), "type-1 header")
	assert.Equal(t, uint32(0), c.Read(5, 0, pci.RegBAR0, 4), "no BARs")
	assert.Equal(t, uint32(0), c.Read(5, 0, pci.RegInterruptPin, 1))

	caps := c.FindCapabilities(5, pci.CapIDPCIe)
	require.Len(t, caps, 1)
	p := caps[0]
	assert.Equal(t, r.rp.PCIeCapOffset(), p)
	flags := c.Read(5, 0, p+pci.PCIeCapFlags, 2)
	assert.Equal(t, uint32(4), flags>>4&0xf, "root port")
	assert.Equal(t, uint32(2), flags&0xf, "capability version 2")
	assert.NotZero(t, flags&(1<<8), "slot implemented")
	lnkcap := c.Read(5, 0, p+pci.PCIeLinkCap, 4)
	assert.Equal(t, uint32(4), lnkcap&0xf, "16 GT/s")
	assert.Equal(t, uint32(16), lnkcap>>4&0x3f, "x16")
	assert.Equal(t, uint32(1), lnkcap>>24, "port number")
	lnksta := c.Read(5, 0, p+pci.PCIeLinkSta, 2)
	assert.Equal(t, uint32(3), lnksta&0xf, "negotiated 8 GT/s")
	assert.Equal(t, uint32(8), lnksta>>4&0x3f, "negotiated x8")
	assert.NotZero(t, lnksta&(1<<13), "data link layer active")
	assert.Equal(t, uint32(0x1e), c.Read(5, 0, p+pci.PCIeLinkCap2, 4), "2.5, 5, 8, 16 GT/s supported")
	assert.Equal(t, uint32(2), c.Read(5, 0, p+pci.PCIeSlotCap, 4)>>19, "physical slot")
	assert.Zero(t, c.Read(5, 0, p+pci.PCIeSlotCap, 4)&(1<<6), "not hot-plug capable")
	assert.NotZero(t, c.Read(5, 0, p+pci.PCIeSlotSta, 2)&(1<<6), "card present")

	// The link registers are read-only to the guest.
	c.Write(5, 0, p+pci.PCIeLinkCap, 4, 0)
	assert.Equal(t, lnkcap, c.Read(5, 0, p+pci.PCIeLinkCap, 4))

	require.NoError(t, r.root.AssignBuses())
	// The upstream port: type 5, no slot; downstream ports: type 6 with a slot.
	up := r.usp.PCIeCapOffset()
	assert.Equal(t, uint32(5), c.ReadBus(1, 0, 0, up+pci.PCIeCapFlags, 2)>>4&0xf)
	assert.Zero(t, c.ReadBus(1, 0, 0, up+pci.PCIeCapFlags, 2)&(1<<8))
	assert.Equal(t, uint32(0x8232104c), c.ReadBus(1, 0, 0, 0, 4))
	dp := r.dsp1.PCIeCapOffset()
	assert.Equal(t, uint32(6), c.ReadBus(2, 1, 0, dp+pci.PCIeCapFlags, 2)>>4&0xf)
	assert.NotZero(t, c.ReadBus(2, 1, 0, dp+pci.PCIeCapFlags, 2)&(1<<8))
}

func TestBridgeACSCapability(t *testing.T) {
	r := newSwitchRig(t)
	require.NoError(t, r.root.AssignBuses())
	// Through ECAM, as Linux reads extended capabilities.
	hdr := r.ecamRead(5, 0x100, 4)
	assert.Equal(t, uint32(pci.ExtCapIDACS), hdr&0xffff)
	assert.Equal(t, uint32(1), hdr>>16&0xf)
	assert.Equal(t, 0x100, r.rp.ACSCapOffset())
	capReg := r.ecamRead(5, 0x104, 2)
	want := uint32(pci.ACSSourceValidation | pci.ACSRequestRedirect | pci.ACSCompletionRedirect | pci.ACSUpstreamForwarding | pci.ACSEgressControl)
	assert.Equal(t, want, capReg&0xff)
	// Control: only the supported bits stick (translation blocking and
	// direct translated P2P are not offered).
	r.ecamWrite(5, 0x106, 2, 0xffff)
	assert.Equal(t, want, r.ecamRead(5, 0x106, 2))
	r.ecamWrite(5, 0x106, 2, 0)
	assert.Zero(t, r.ecamRead(5, 0x106, 2))
	// The upstream port has none.
	assert.Zero(t, r.usp.ACSCapOffset())
	var b [4]byte
	r.mmio.Read(addrspace.ECAMBase+1<<20+0x100, b[:])
	assert.Equal(t, []byte{0, 0, 0, 0}, b[:], "no extended capability on the upstream port")
}

func TestBridgeBusNumbersAndRouting(t *testing.T) {
	r := newSwitchRig(t)
	c := r.cfg
	// Before numbering, nothing below the ports answers.
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(1, 0, 0, 0, 4))

	require.NoError(t, r.root.AssignBuses())
	bus := func(dev int, b int) [3]uint32 {
		return [3]uint32{c.ReadBus(b, dev, 0, pci.RegPrimaryBus, 1), c.ReadBus(b, dev, 0, pci.RegSecondaryBus, 1), c.ReadBus(b, dev, 0, pci.RegSubordinateBus, 1)}
	}
	assert.Equal(t, [3]uint32{0, 1, 4}, bus(5, 0), "root port")
	assert.Equal(t, [3]uint32{1, 2, 4}, bus(0, 1), "upstream port")
	assert.Equal(t, [3]uint32{2, 3, 3}, bus(0, 2), "downstream port 0")
	assert.Equal(t, [3]uint32{2, 4, 4}, bus(1, 2), "downstream port 1")
	assert.Equal(t, [3]uint32{0, 5, 5}, bus(6, 0), "second root port")
	assert.Equal(t, uint8(5), r.root.LastBus(), "the highest bus given out, what MCFG declares")
	for _, x := range []struct {
		bus  int
		dev  *testDev
		name string
	}{{3, r.a, "a"}, {4, r.b, "b"}, {5, r.c, "c"}} {
		assert.Equal(t, uint32(0x56781234), c.ReadBus(x.bus, 0, 0, 0, 4), x.name)
		b, d, ok := r.root.Location(x.dev)
		require.True(t, ok)
		assert.Equal(t, [2]uint8{uint8(x.bus), 0}, [2]uint8{b, d}, x.name)
	}
	// Only device 0 exists below a port; nothing beyond the subordinate bus.
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(3, 1, 0, 0, 4))
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(6, 0, 0, 0, 4))
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(2, 2, 0, 0, 4), "no third downstream port")

	// The guest renumbers, as Linux does with pci=assign-busses: routing
	// follows the registers.
	c.WriteBus(0, 5, 0, pci.RegPrimaryBus, 4, 0x00201000)
	c.WriteBus(0x10, 0, 0, pci.RegPrimaryBus, 4, 0x00201110)
	c.WriteBus(0x11, 0, 0, pci.RegPrimaryBus, 4, 0x00181811)
	c.WriteBus(0x11, 1, 0, pci.RegPrimaryBus, 4, 0x00202011)
	assert.Equal(t, uint32(0x56781234), c.ReadBus(0x18, 0, 0, 0, 4))
	assert.Equal(t, uint32(0x56781234), c.ReadBus(0x20, 0, 0, 0, 4))
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(3, 0, 0, 0, 4), "old numbers no longer route")
	b, _, _ := r.root.Location(r.b)
	assert.Equal(t, uint8(0x20), b)
	// ECAM routes the same way.
	assert.Equal(t, uint32(0x56781234), r.ecamRead(0x18<<5, 0, 4))

	// Inverted or zero ranges forward nothing (and never loop).
	c.WriteBus(0, 5, 0, pci.RegPrimaryBus, 4, 0x00051000)
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(0x18, 0, 0, 0, 4))
	c.WriteBus(0, 5, 0, pci.RegPrimaryBus, 4, 0x00ff0000)
	assert.Equal(t, uint32(0xffffffff), c.ReadBus(0x18, 0, 0, 0, 4))
}

func TestAddDeviceBelowRules(t *testing.T) {
	r := newSwitchRig(t)
	assert.ErrorContains(t, r.root.AddDeviceBelow(r.rp2, 1, "x", newTestDev(t)), "one device, at slot 0")
	assert.ErrorContains(t, r.root.AddDeviceBelow(r.rp2, 0, "x", newTestDev(t)), "slot taken")
	assert.ErrorContains(t, r.root.AddDeviceBelow(r.usp, 2, "x", newTestDev(t)), "only downstream ports")
	stray := newBridge(t, pci.RootPort, 9, nil)
	assert.ErrorContains(t, r.root.AddDeviceBelow(stray, 0, "x", newTestDev(t)), "not on this root")
	assert.ErrorContains(t, r.root.AddDevice(7, "again", r.a), "already added")
	_, err := pci.NewBridge(pci.BridgeConfig{Type: 3, Link: pci.Link{Speed: 1, Width: 1}})
	assert.ErrorContains(t, err, "port type 3")
	_, err = pci.NewBridge(pci.BridgeConfig{Type: pci.RootPort, Link: pci.Link{Speed: 7, Width: 16}})
	assert.ErrorContains(t, err, "generation 1-6")
	_, err = pci.NewBridge(pci.BridgeConfig{Type: pci.RootPort, Link: pci.Link{Speed: 4, Width: 3}})
	assert.ErrorContains(t, err, "x3")
	_, err = pci.NewBridge(pci.BridgeConfig{Type: pci.RootPort, Link: pci.Link{Speed: 3, Width: 8}, Current: pci.Link{Speed: 4, Width: 8}})
	assert.ErrorContains(t, err, "exceeds")
}

// bridgeWindow reads a window back through configuration space, as the
// guest kernel does in pci_read_bridge_bases.
func memWindow(c interface {
	ReadBus(bus, dev, fn, reg, n int) uint32
}, bus, dev int) (uint64, uint64) {
	base := uint64(c.ReadBus(bus, dev, 0, pci.RegMemBase, 2)&0xfff0) << 16
	limit := uint64(c.ReadBus(bus, dev, 0, pci.RegMemLimit, 2)&0xfff0)<<16 | 0xfffff
	return base, limit
}

func prefWindow(c interface {
	ReadBus(bus, dev, fn, reg, n int) uint32
}, bus, dev int) (uint64, uint64) {
	base := uint64(c.ReadBus(bus, dev, 0, pci.RegPrefBaseUpper, 4))<<32 | uint64(c.ReadBus(bus, dev, 0, pci.RegPrefBase, 2)&0xfff0)<<16
	limit := uint64(c.ReadBus(bus, dev, 0, pci.RegPrefLimitUpper, 4))<<32 | uint64(c.ReadBus(bus, dev, 0, pci.RegPrefLimit, 2)&0xfff0)<<16 | 0xfffff
	return base, limit
}

func TestAssignBARsBehindBridges(t *testing.T) {
	r := newSwitchRig(t)
	c := r.cfg
	require.NoError(t, r.root.AssignBuses())
	w, err := addrspace.NewWindows(addrspace.PCIHoleStart, 46)
	require.NoError(t, err)
	require.NoError(t, r.root.AssignBARs(w))
	assert.Empty(t, r.errs)

	// Root port and upstream port windows hold both downstream ports'.
	rpMem, rpMemEnd := memWindow(c, 0, 5)
	rpPref, rpPrefEnd := prefWindow(c, 0, 5)
	assert.Equal(t, uint32(1), c.ReadBus(0, 5, 0, pci.RegPrefBase, 2)&0xf, "64-bit prefetchable window")
	assert.GreaterOrEqual(t, rpPref, w.Mem64.GPA, "prefetchable window above RAM")
	for _, x := range []struct {
		dev      *testDev
		bus, dsp int
	}{{r.a, 2, 0}, {r.b, 2, 1}} {
		dMem, dMemEnd := memWindow(c, x.bus, x.dsp)
		dPref, dPrefEnd := prefWindow(c, x.bus, x.dsp)
		assert.True(t, dMem >= rpMem && dMemEnd <= rpMemEnd)
		assert.True(t, dPref >= rpPref && dPrefEnd <= rpPrefEnd)
		a0, ok := r.root.DeviceBAR(x.dev, 0)
		require.True(t, ok, "mem32 BAR decodes")
		assert.True(t, a0 >= dMem && a0+4096-1 <= dMemEnd, "32-bit BAR in the memory window")
		a2, ok := r.root.DeviceBAR(x.dev, 2)
		require.True(t, ok, "prefetchable BAR decodes")
		assert.True(t, a2 >= dPref && a2+(1<<20)-1 <= dPrefEnd, "64-bit prefetchable BAR in the prefetchable window")
		a4, ok := r.root.DeviceBAR(x.dev, 4)
		require.True(t, ok, "64-bit non-prefetchable BAR decodes")
		assert.Less(t, a4, uint64(1)<<32, "64-bit non-prefetchable BAR below a bridge lives in the 32-bit window")
		_, ok = r.root.DeviceBAR(x.dev, 1)
		assert.True(t, ok, "I/O BAR decodes")
	}
	assert.Equal(t, uint32(pci.CommandMemory|pci.CommandIO|pci.CommandBusMaster), c.ReadBus(0, 5, 0, pci.RegCommand, 2))

	// The endpoint's BAR serves accesses; switching off memory decode on
	// the root port above it stops that (no registration).
	a0, _ := r.root.DeviceBAR(r.a, 0)
	var buf [4]byte
	r.mmio.Read(a0, buf[:])
	assert.Equal(t, 1, r.a.mem32.reads)
	c.WriteBus(0, 5, 0, pci.RegCommand, 2, pci.CommandIO|pci.CommandBusMaster)
	_, ok := r.root.DeviceBAR(r.a, 0)
	assert.False(t, ok, "root port memory decode off")
	_, ok = r.root.DeviceBAR(r.a, 1)
	assert.True(t, ok, "I/O still forwarded")
	r.mmio.Read(a0, buf[:])
	assert.Equal(t, 1, r.a.mem32.reads, "the access no longer reaches the device")
	c.WriteBus(0, 5, 0, pci.RegCommand, 2, pci.CommandIO|pci.CommandMemory|pci.CommandBusMaster)
	_, ok = r.root.DeviceBAR(r.a, 0)
	assert.True(t, ok)

	// Closing the downstream port's memory window (base above limit)
	// stops the 32-bit BARs below it, not the prefetchable one.
	base := c.ReadBus(2, 0, 0, pci.RegMemBase, 4)
	c.WriteBus(2, 0, 0, pci.RegMemBase, 4, 0x0000fff0)
	_, ok = r.root.DeviceBAR(r.a, 0)
	assert.False(t, ok)
	_, ok = r.root.DeviceBAR(r.a, 2)
	assert.True(t, ok)
	c.WriteBus(2, 0, 0, pci.RegMemBase, 4, base)
	_, ok = r.root.DeviceBAR(r.a, 0)
	assert.True(t, ok)

	// A BAR the guest moves outside the windows does not decode.
	c.WriteBus(3, 0, 0, pci.RegBAR0, 4, uint32(w.Mem32.GPA))
	got, ok := r.root.DeviceBAR(r.a, 0)
	assert.False(t, ok, "BAR at %#x outside the window", got)

	// The ISA enable bit hides the ISA aliases of the I/O window.
	io1, ok := r.root.DeviceBAR(r.c, 1)
	require.True(t, ok)
	c.WriteBus(0, 6, 0, pci.RegBridgeControl, 2, pci.BridgeCtlISA)
	_, ok = r.root.DeviceBAR(r.c, 1)
	assert.Equal(t, io1&0x3ff+32 <= 0x100, ok)
	c.WriteBus(0, 6, 0, pci.RegBridgeControl, 2, 0)
	_, ok = r.root.DeviceBAR(r.c, 1)
	assert.True(t, ok)
}

func TestBridgeSecondaryBusResetAndStatus(t *testing.T) {
	r := newSwitchRig(t)
	c := r.cfg
	require.NoError(t, r.root.AssignBuses())
	c.WriteBus(2, 0, 0, pci.RegBridgeControl, 2, pci.BridgeCtlBusReset)
	c.WriteBus(2, 0, 0, pci.RegBridgeControl, 2, pci.BridgeCtlBusReset) // still set: no new edge
	c.WriteBus(2, 0, 0, pci.RegBridgeControl, 2, 0)
	c.WriteBus(2, 0, 0, pci.RegBridgeControl, 2, pci.BridgeCtlBusReset)
	assert.Equal(t, 2, r.resets)
	assert.Equal(t, uint32(pci.BridgeCtlBusReset), c.ReadBus(2, 0, 0, pci.RegBridgeControl, 2))
	// Reserved bridge control bits and the ROM register stay zero.
	c.WriteBus(2, 0, 0, pci.RegBridgeControl, 2, 0xff00)
	assert.Zero(t, c.ReadBus(2, 0, 0, pci.RegBridgeControl, 2))
	c.WriteBus(2, 0, 0, pci.RegBridgeROM, 4, 0xffffffff)
	assert.Zero(t, c.ReadBus(2, 0, 0, pci.RegBridgeROM, 4))
	// Windows read back what the guest wrote, masked to their granularity.
	c.WriteBus(2, 0, 0, pci.RegIOBase, 2, 0xffff)
	assert.Equal(t, uint32(0xf0f0), c.ReadBus(2, 0, 0, pci.RegIOBase, 2), "16-bit I/O decode")
	c.WriteBus(2, 0, 0, pci.RegPrefBase, 4, 0xffffffff)
	assert.Equal(t, uint32(0xfff1fff1), c.ReadBus(2, 0, 0, pci.RegPrefBase, 4), "type nibble 64-bit stays")
}

// TestRoutingAllocatesNothing: a configuration access to a device behind a
// switch (an exit on the vCPU path) walks the bridges without allocating.
func TestRoutingAllocatesNothing(t *testing.T) {
	r := newSwitchRig(t)
	require.NoError(t, r.root.AssignBuses())
	ecam := r.root.ECAM()
	buf := make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		ecam.Read(4<<20, buf)                // endpoint b behind the switch
		ecam.Read(2<<20|1<<15|0x19, buf[:1]) // downstream port's secondary bus
		ecam.Read(9<<20, buf)                // absent bus
	})
	assert.Zero(t, allocs)
	assert.Equal(t, []byte{0xff, 0xff, 0xff, 0xff}, buf)
}
