package pci

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
)

// Type-1 (PCI-to-PCI bridge) configuration header registers.
const (
	RegPrimaryBus      = 0x18
	RegSecondaryBus    = 0x19
	RegSubordinateBus  = 0x1a
	RegSecLatency      = 0x1b
	RegIOBase          = 0x1c
	RegIOLimit         = 0x1d
	RegSecStatus       = 0x1e
	RegMemBase         = 0x20
	RegMemLimit        = 0x22
	RegPrefBase        = 0x24
	RegPrefLimit       = 0x26
	RegPrefBaseUpper   = 0x28
	RegPrefLimitUpper  = 0x2c
	RegIOBaseUpper     = 0x30
	RegIOLimitUpper    = 0x32
	RegBridgeROM       = 0x38
	RegBridgeControl   = 0x3e
	HeaderTypeBridge   = 0x01
	ClassPCIBridge     = 0x060400
	BridgeCtlISA       = 1 << 2 // do not forward the ISA aliases (top 768 bytes of each 1 KiB) of the I/O window
	BridgeCtlBusReset  = 1 << 6 // secondary bus reset
	bridgeCtlWriteMask = 0x007f // parity, SERR, ISA, VGA, VGA16, master abort mode, bus reset
	prefRange64        = 0x1    // low nibble of the prefetchable base/limit: 64-bit window
)

// PCI Express capability (ID 0x10) register offsets, relative to the
// capability, and the fields hpcvmm's ports fill.
const (
	PCIeCapFlags   = 0x02
	PCIeDevCap     = 0x04
	PCIeDevCtl     = 0x08
	PCIeDevSta     = 0x0a
	PCIeLinkCap    = 0x0c
	PCIeLinkCtl    = 0x10
	PCIeLinkSta    = 0x12
	PCIeSlotCap    = 0x14
	PCIeSlotCtl    = 0x18
	PCIeSlotSta    = 0x1a
	PCIeRootCtl    = 0x1c
	PCIeRootCap    = 0x1e
	PCIeRootSta    = 0x20
	PCIeDevCap2    = 0x24
	PCIeDevCtl2    = 0x28
	PCIeLinkCap2   = 0x2c
	PCIeLinkCtl2   = 0x30
	PCIeLinkSta2   = 0x32
	pcieCapSize    = 0x3c
	pcieFlagsSlot  = 1 << 8  // slot implemented
	linkCapDLLLARC = 1 << 20 // data link layer link active reporting capable
	linkStaSlotClk = 1 << 12 // slot clock configuration
	linkStaDLLLA   = 1 << 13 // data link layer link active
	slotCapNoCmdCC = 1 << 18 // no command completed support
	slotStaPresent = 1 << 6  // presence detect state
)

// ACS extended capability: capability and control register bits. Control
// bits are writable only for the features the capability register reports.
const (
	ACSSourceValidation    = 1 << 0
	ACSTranslationBlocking = 1 << 1
	ACSRequestRedirect     = 1 << 2
	ACSCompletionRedirect  = 1 << 3
	ACSUpstreamForwarding  = 1 << 4
	ACSEgressControl       = 1 << 5
	ACSDirectTranslated    = 1 << 6
	// acsSupported is what hpcvmm's ports report: everything Linux's
	// pci_std_enable_acs turns on, plus P2P egress control.
	acsSupported = ACSSourceValidation | ACSRequestRedirect | ACSCompletionRedirect | ACSUpstreamForwarding | ACSEgressControl
	// acsEgressBits is the egress control vector size: one dword of it.
	acsEgressBits = 32
)

// PortType is the PCI Express device/port type field of the PCIe
// capability, which Linux reads (pci_pcie_type) to tell a root port from
// switch ports and to decide what to scan below.
type PortType uint8

// The port types hpcvmm emulates.
const (
	RootPort       PortType = 4
	UpstreamPort   PortType = 5
	DownstreamPort PortType = 6
)

func (t PortType) String() string {
	switch t {
	case RootPort:
		return "root port"
	case UpstreamPort:
		return "switch upstream port"
	case DownstreamPort:
		return "switch downstream port"
	}
	return fmt.Sprintf("PortType(%d)", uint8(t))
}

// hasSlot reports whether the port type connects to a slot (and so below
// it Linux scans only device 0).
func (t PortType) hasSlot() bool { return t == RootPort || t == DownstreamPort }

// LinkSpeed is a PCIe link speed as its generation: 1 = 2.5 GT/s, 2 = 5,
// 3 = 8, 4 = 16, 5 = 32, 6 = 64 GT/s. The value is the Link Capabilities
// "max link speed" encoding, an index into the Link Capabilities 2
// supported speeds vector.
type LinkSpeed uint8

// Link speeds by generation.
const (
	Speed2_5GT LinkSpeed = 1 + iota
	Speed5GT
	Speed8GT
	Speed16GT
	Speed32GT
	Speed64GT
)

// String formats the speed as Linux's sysfs max_link_speed does ("16.0
// GT/s PCIe"), the form NCCL parses.
func (s LinkSpeed) String() string {
	switch s {
	case Speed2_5GT:
		return "2.5 GT/s PCIe"
	case Speed5GT:
		return "5.0 GT/s PCIe"
	case Speed8GT:
		return "8.0 GT/s PCIe"
	case Speed16GT:
		return "16.0 GT/s PCIe"
	case Speed32GT:
		return "32.0 GT/s PCIe"
	case Speed64GT:
		return "64.0 GT/s PCIe"
	}
	return "Unknown"
}

// Link is a PCIe link's speed and width (lanes).
type Link struct {
	Speed LinkSpeed
	Width uint8
}

// Validate checks that the link is one a PCIe port can report.
func (l Link) Validate() error {
	if l.Speed < Speed2_5GT || l.Speed > Speed64GT {
		return fmt.Errorf("pci: link speed %d: want a PCIe generation 1-6", l.Speed)
	}
	switch l.Width {
	case 1, 2, 4, 8, 12, 16, 32:
		return nil
	}
	return fmt.Errorf("pci: link width x%d: want x1, x2, x4, x8, x12, x16 or x32", l.Width)
}

// BridgeConfig configures NewBridge.
type BridgeConfig struct {
	// Type is the port type.
	Type PortType
	// VendorID and DeviceID default (zero) to Red Hat's generic PCIe root
	// port (1b36:000c) for a root port and to the TI XIO3130 switch ports
	// QEMU emulates (104c:8232 upstream, 104c:8233 downstream): IDs Linux
	// has run on for years with no quirk attached.
	VendorID, DeviceID uint16
	// Link is the maximum link (Link Capabilities, Link Capabilities 2),
	// e.g. the host port's 16 GT/s x16.
	Link Link
	// Current is the negotiated link (Link Status); zero means Link.
	Current Link
	// PortNumber is the Link Capabilities port number.
	PortNumber uint8
	// PhysicalSlot is the Slot Capabilities physical slot number of a root
	// or downstream port (the slot is always "implemented", with a card
	// present and no hot-plug).
	PhysicalSlot uint16
	// OnSecondaryBusReset, if set, runs when the guest sets the bridge
	// control's secondary bus reset bit (a 0 to 1 transition), under the
	// Root's lock: the place to reset a passed-through device below, as
	// the guest expects of a bus reset.
	OnSecondaryBusReset func()
}

// Bridge is an emulated PCIe port: a type-1 configuration header (bus
// numbers, I/O, 32-bit memory and 64-bit prefetchable windows, bridge
// control), a PCI Express capability with the port type, link
// capabilities/status/capabilities 2 and, for root and downstream ports,
// slot registers, and for those ports an ACS extended capability.
// Everything in it is guest-programmable as on hardware; the Root reads
// the bus numbers to route configuration cycles and the windows and
// command register to decide which BARs below decode.
//
// Bridge implements Device; add it with Root.AddDevice or AddDeviceBelow.
type Bridge struct {
	*ConfigSpace
	typ      PortType
	pcie     int // offset of the PCIe capability
	acs      int // offset of the ACS capability, 0 when absent
	onReset  func()
	resetBit bool
}

// NewBridge returns a port with closed windows and zero bus numbers
// (unconfigured, as after reset).
func NewBridge(cfg BridgeConfig) (*Bridge, error) {
	if cfg.Type != RootPort && cfg.Type != UpstreamPort && cfg.Type != DownstreamPort {
		return nil, fmt.Errorf("pci: new bridge: port type %d is not a root (4), upstream (5) or downstream (6) port", cfg.Type)
	}
	if err := cfg.Link.Validate(); err != nil {
		return nil, fmt.Errorf("pci: new %s: %w", cfg.Type, err)
	}
	cur := cfg.Current
	if cur == (Link{}) {
		cur = cfg.Link
	}
	if err := cur.Validate(); err != nil {
		return nil, fmt.Errorf("pci: new %s: current link: %w", cfg.Type, err)
	}
	if cur.Speed > cfg.Link.Speed || cur.Width > cfg.Link.Width {
		return nil, fmt.Errorf("pci: new %s: current link %s x%d exceeds the maximum %s x%d", cfg.Type, cur.Speed, cur.Width, cfg.Link.Speed, cfg.Link.Width)
	}
	vendor, device := cfg.VendorID, cfg.DeviceID
	if vendor == 0 {
		switch cfg.Type {
		case RootPort:
			vendor, device = 0x1b36, 0x000c
		case UpstreamPort:
			vendor, device = 0x104c, 0x8232
		case DownstreamPort:
			vendor, device = 0x104c, 0x8233
		}
	}
	cs := NewConfigSpace(Header{VendorID: vendor, DeviceID: device, Class: ClassPCIBridge})
	b := &Bridge{ConfigSpace: cs, typ: cfg.Type, onReset: cfg.OnSecondaryBusReset}
	cs.SetUint8(RegHeaderType, HeaderTypeBridge)
	// The type-0 subsystem ID registers are the prefetchable upper limit
	// here; NewConfigSpace left them zero and read-only.
	cs.SetWriteMask(RegPrimaryBus, []byte{0xff, 0xff, 0xff})
	cs.SetWriteMask(RegIOBase, []byte{0xf0, 0xf0})
	cs.SetW1CMask(RegSecStatus, []byte{0x00, 0xf9})
	cs.SetWriteMask(RegMemBase, []byte{0xf0, 0xff, 0xf0, 0xff})
	cs.SetWriteMask(RegPrefBase, []byte{0xf0, 0xff, 0xf0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	cs.SetUint16(RegPrefBase, prefRange64)
	cs.SetUint16(RegPrefLimit, prefRange64)
	cs.SetWriteMask(RegBridgeControl, []byte{bridgeCtlWriteMask, 0})
	b.SetWindows(addrspace.BridgeWindows{})
	cs.OnWrite(RegBridgeControl, 1, b.bridgeControlWritten)

	if err := b.addPCIeCap(cfg, cur); err != nil {
		return nil, err
	}
	if cfg.Type.hasSlot() {
		// ACS belongs to the ports that forward peer-to-peer traffic
		// between their own link and others: root and downstream ports.
		// A switch upstream port implements it only as part of a
		// multi-function device (PCIe base spec, ACS), as QEMU's do not.
		body := make([]byte, 4+acsEgressBits/8)
		binary.LittleEndian.PutUint16(body[0:], acsSupported|uint16(acsEgressBits)<<8)
		off, err := cs.AddExtendedCapability(ExtCapIDACS, 1, body)
		if err != nil {
			return nil, err
		}
		b.acs = off
		cs.SetWriteMask(off+6, []byte{acsSupported, 0})
		cs.SetWriteMask(off+8, []byte{0xff, 0xff, 0xff, 0xff})
	}
	return b, nil
}

func (b *Bridge) addPCIeCap(cfg BridgeConfig, cur Link) error {
	var c [pcieCapSize]byte
	put16 := func(off int, v uint16) { binary.LittleEndian.PutUint16(c[off:], v) }
	put32 := func(off int, v uint32) { binary.LittleEndian.PutUint32(c[off:], v) }
	flags := uint16(2) | uint16(cfg.Type)<<4 // capability version 2
	if cfg.Type.hasSlot() {
		flags |= pcieFlagsSlot
	}
	put16(PCIeCapFlags, flags)
	// Max payload 256 bytes supported; role-based error reporting (bit 15,
	// mandatory since PCIe 1.1).
	put32(PCIeDevCap, 1|1<<15)
	// Max read request 512 bytes after reset, as the spec sets it.
	put16(PCIeDevCtl, 2<<12)
	linkCap := uint32(cfg.Link.Speed) | uint32(cfg.Link.Width)<<4 | uint32(cfg.PortNumber)<<24
	linkSta := uint16(cur.Speed) | uint16(cur.Width)<<4 | linkStaSlotClk
	if cfg.Type.hasSlot() {
		// A downstream-facing port reports its link as up, so Linux's
		// waits for the link after a reset (pcie_wait_for_link) end at once.
		linkCap |= linkCapDLLLARC
		linkSta |= linkStaDLLLA
	}
	put32(PCIeLinkCap, linkCap)
	put16(PCIeLinkSta, linkSta)
	if cfg.Type.hasSlot() {
		// No hot-plug: pciehp never binds, the device below is always there.
		put32(PCIeSlotCap, uint32(cfg.PhysicalSlot&0x1fff)<<19|slotCapNoCmdCC)
		put16(PCIeSlotSta, slotStaPresent)
	}
	// Supported link speeds vector: every generation up to the maximum
	// (Linux's pcie_get_speed_cap prefers it to Link Capabilities).
	put32(PCIeLinkCap2, uint32((1<<cfg.Link.Speed)-1)<<1)
	// Target link speed: the maximum.
	put16(PCIeLinkCtl2, uint16(cfg.Link.Speed))
	off, err := b.AddCapability(CapIDPCIe, c[2:])
	if err != nil {
		return err
	}
	b.pcie = off
	// Guest-writable controls: device control (error reporting, relaxed
	// ordering, payload, extended tags, no snoop, read request size), link
	// control (ASPM, RCB, retrain, common clock, extended sync; the link
	// never goes down, so "link disable" and retraining change nothing
	// visible), slot and root control, device/link control 2; status bits
	// the device would set are write-1-to-clear.
	b.SetWriteMask(off+PCIeDevCtl, []byte{0xff, 0x7f})
	b.SetW1CMask(off+PCIeDevSta, []byte{0x0f, 0x00})
	b.SetWriteMask(off+PCIeLinkCtl, []byte{0xfb, 0x0f})
	b.SetW1CMask(off+PCIeLinkSta, []byte{0x00, 0xc0})
	if cfg.Type.hasSlot() {
		b.SetWriteMask(off+PCIeSlotCtl, []byte{0xff, 0x1f})
		b.SetW1CMask(off+PCIeSlotSta, []byte{0x1f, 0x01})
	}
	if cfg.Type == RootPort {
		b.SetWriteMask(off+PCIeRootCtl, []byte{0x1f, 0x00})
		b.SetW1CMask(off+PCIeRootSta+2, []byte{0x01, 0x00})
	}
	b.SetWriteMask(off+PCIeDevCtl2, []byte{0x1f, 0x00})
	b.SetWriteMask(off+PCIeLinkCtl2, []byte{0x7f, 0x0f})
	return nil
}

// bridgeControlWritten calls OnSecondaryBusReset on the rising edge of the
// secondary bus reset bit.
func (b *Bridge) bridgeControlWritten(off, n int) {
	set := b.Uint16(RegBridgeControl)&BridgeCtlBusReset != 0
	if set && !b.resetBit && b.onReset != nil {
		b.onReset()
	}
	b.resetBit = set
}

// Type returns the port type.
func (b *Bridge) Type() PortType { return b.typ }

// PCIeCapOffset returns the PCI Express capability's offset.
func (b *Bridge) PCIeCapOffset() int { return b.pcie }

// ACSCapOffset returns the ACS extended capability's offset, 0 for an
// upstream port, which has none.
func (b *Bridge) ACSCapOffset() int { return b.acs }

// PrimaryBus, SecondaryBus and SubordinateBus return the bus number
// registers as the guest (or AssignBuses) last wrote them.
func (b *Bridge) PrimaryBus() uint8 { return b.Uint8(RegPrimaryBus) }

// SecondaryBus returns the bus directly below the bridge.
func (b *Bridge) SecondaryBus() uint8 { return b.Uint8(RegSecondaryBus) }

// SubordinateBus returns the highest bus number below the bridge.
func (b *Bridge) SubordinateBus() uint8 { return b.Uint8(RegSubordinateBus) }

// routes reports whether the bridge claims type-1 configuration cycles for
// busNum: those in [secondary, subordinate]. A bridge whose secondary bus
// is 0 (unconfigured: bus 0 is the root bus, never below a bridge) or whose
// range is empty or inverted forwards nothing, whatever the guest wrote.
func (b *Bridge) routes(busNum uint8) bool {
	sec, sub := b.SecondaryBus(), b.SubordinateBus()
	return sec != 0 && sec <= sub && busNum >= sec && busNum <= sub
}

// SetBusNumbers programs the bus number registers, as firmware does
// before the guest runs (device side: no write masks, no hooks).
func (b *Bridge) SetBusNumbers(primary, secondary, subordinate uint8) {
	b.SetUint8(RegPrimaryBus, primary)
	b.SetUint8(RegSecondaryBus, secondary)
	b.SetUint8(RegSubordinateBus, subordinate)
}

// SetWindows programs the three windows, as firmware does; a window with
// Size 0 is closed the way Linux closes one (base above limit). Windows
// must be on their granularity (addrspace.PlanHierarchy's output is).
func (b *Bridge) SetWindows(w addrspace.BridgeWindows) {
	if r := w.IO; r.Size != 0 {
		b.SetUint8(RegIOBase, uint8(r.GPA>>8)&0xf0)
		b.SetUint8(RegIOLimit, uint8((r.End()-1)>>8)&0xf0)
	} else {
		b.SetUint8(RegIOBase, 0xf0)
		b.SetUint8(RegIOLimit, 0)
	}
	if r := w.Mem; r.Size != 0 {
		b.SetUint16(RegMemBase, uint16(r.GPA>>16)&0xfff0)
		b.SetUint16(RegMemLimit, uint16((r.End()-1)>>16)&0xfff0)
	} else {
		b.SetUint16(RegMemBase, 0xfff0)
		b.SetUint16(RegMemLimit, 0)
	}
	if r := w.Pref; r.Size != 0 {
		b.SetUint16(RegPrefBase, uint16(r.GPA>>16)&0xfff0|prefRange64)
		b.SetUint16(RegPrefLimit, uint16((r.End()-1)>>16)&0xfff0|prefRange64)
		b.SetUint32(RegPrefBaseUpper, uint32(r.GPA>>32))
		b.SetUint32(RegPrefLimitUpper, uint32((r.End()-1)>>32))
	} else {
		b.SetUint16(RegPrefBase, 0xfff0|prefRange64)
		b.SetUint16(RegPrefLimit, prefRange64)
		b.SetUint32(RegPrefBaseUpper, 0)
		b.SetUint32(RegPrefLimitUpper, 0)
	}
}

// IOWindow returns the I/O window [base, limit] as programmed; ok is false
// when it is closed (base above limit).
func (b *Bridge) IOWindow() (base, limit uint64, ok bool) {
	base = uint64(b.Uint8(RegIOBase)&0xf0) << 8
	limit = uint64(b.Uint8(RegIOLimit)&0xf0)<<8 | 0xfff
	return base, limit, base <= limit
}

// MemWindow returns the 32-bit memory window [base, limit]; ok is false
// when it is closed.
func (b *Bridge) MemWindow() (base, limit uint64, ok bool) {
	base = uint64(b.Uint16(RegMemBase)&0xfff0) << 16
	limit = uint64(b.Uint16(RegMemLimit)&0xfff0)<<16 | 0xfffff
	return base, limit, base <= limit
}

// PrefWindow returns the 64-bit prefetchable window [base, limit]; ok is
// false when it is closed.
func (b *Bridge) PrefWindow() (base, limit uint64, ok bool) {
	base = uint64(b.Uint32(RegPrefBaseUpper))<<32 | uint64(b.Uint16(RegPrefBase)&0xfff0)<<16
	limit = uint64(b.Uint32(RegPrefLimitUpper))<<32 | uint64(b.Uint16(RegPrefLimit)&0xfff0)<<16 | 0xfffff
	return base, limit, base <= limit
}

func within(addr, size, base, limit uint64) bool {
	return size != 0 && addr >= base && addr+size-1 >= addr && addr+size-1 <= limit
}

// forwards reports whether the bridge passes a downstream access to the
// whole range [addr, addr+size) of the given space on to its secondary
// side: its command register enables the space and a window holds the
// range (memory: the 32-bit or the prefetchable window, whichever, as
// hardware decodes by address alone). With the bridge control's ISA enable
// set, the ISA alias ranges of each 1 KiB I/O block stay upstream.
func (b *Bridge) forwards(io bool, addr, size uint64) bool {
	cmd := b.Uint16(RegCommand)
	if io {
		if cmd&CommandIO == 0 {
			return false
		}
		base, limit, ok := b.IOWindow()
		if !ok || !within(addr, size, base, limit) {
			return false
		}
		if b.Uint16(RegBridgeControl)&BridgeCtlISA != 0 {
			// Forwarded only if every byte is in the first 256 of its 1 KiB block.
			if size > 0x100 || (addr&0x3ff)+size > 0x100 {
				return false
			}
		}
		return true
	}
	if cmd&CommandMemory == 0 {
		return false
	}
	if base, limit, ok := b.MemWindow(); ok && within(addr, size, base, limit) {
		return true
	}
	base, limit, ok := b.PrefWindow()
	return ok && within(addr, size, base, limit)
}
