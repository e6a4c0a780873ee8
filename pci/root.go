// Package pci is hpcvmm's PCI root complex: a host bridge on bus 0 with
// endpoints at slots 1-31, PCIe ports (Bridge: root ports, switch upstream
// and downstream ports, type-1 headers with bus numbers, windows, a PCIe
// capability and ACS) with the buses below them, configuration access
// through mechanism #1 (ports 0xcf8-0xcff) and ECAM (MMCONFIG), routed to
// other buses the way type-1 cycles travel through the bridges' bus number
// registers as the guest programs them, BAR sizing and decode the way
// firmware and Linux expect (behind a bridge, only inside its windows with
// decode enabled), initial bus numbering and BAR placement (there is no
// firmware, and Linux keeps consistent assignments it finds; BARs and
// bridge windows by addrspace.PlanHierarchy) and capability lists. The
// MSI-X capability is package pci/msix; interrupt delivery is package irq.
//
// The ECAM window serves the full 4 KiB extended space (the ports' ACS
// capability lives there); the VM registers Root.ECAM() at
// addrspace.ECAMBase and describes it in the ACPI MCFG table.
//
// The Root registers BAR ranges on the MMIO and port-I/O address spaces while
// the guest programs them (sizing, moving, toggling decode in the command
// register, reprogramming a bridge above). Those changes happen on a vCPU
// thread during a configuration access, so the address spaces given to
// NewRoot must tolerate Register and Unregister concurrently with dispatch
// on other vCPUs.
package pci

import (
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"github.com/hpcvmm/hpcvmm/bus"
)

// Fixed guest addresses of the configuration mechanisms.
const (
	// ConfigIOPort is the base of the mechanism #1 ports: the address dword
	// at 0xcf8 and the data window 0xcfc-0xcff.
	ConfigIOPort = 0xcf8
	// ConfigIOSize is the span Root.ConfigIO serves.
	ConfigIOSize = 8
	// ECAMBusSize is the ECAM span of one bus (32 devices x 8 functions x 4 KiB).
	ECAMBusSize = 1 << 20
	// ECAMSize covers all 256 buses, as an MCFG entry for segment 0 would.
	ECAMSize = 256 * ECAMBusSize
	// NumSlots is the number of device numbers on bus 0; slot 0 is the host bridge.
	NumSlots = 32
)

// Device is a PCI endpoint (function 0 of a slot on bus 0). *ConfigSpace
// implements all of it, so endpoints embed one and override what they need.
type Device interface {
	// ConfigRead fills data from configuration offset (0-4095; any width).
	ConfigRead(offset uint32, data []byte)
	// ConfigWrite applies a guest write at offset.
	ConfigWrite(offset uint32, data []byte)
	// BARHandler returns the bus.Device serving BAR bar's accesses, or nil
	// when the endpoint maps that BAR itself.
	BARHandler(bar int) bus.Device
	// BARMapped reports that BAR bar started (mapped) or stopped decoding at
	// addr: the endpoint moves what depends on the address, such as
	// ioeventfds or direct mappings.
	BARMapped(bar int, addr uint64, mapped bool)
}

// AddressSpace is where the Root registers decoded BARs. *bus.Bus implements
// it; the VM wraps it to make registration safe against concurrent dispatch.
type AddressSpace interface {
	Register(base, size uint64, name string, dev bus.Device) error
	Unregister(base uint64) bool
}

// RootConfig configures NewRoot.
type RootConfig struct {
	// MMIO and PIO receive memory and I/O BAR registrations. Either may be
	// nil if no device has BARs of that kind.
	MMIO, PIO AddressSpace
	// OnError, if set, hears about guest-caused problems that have no other
	// way out of a configuration write (a BAR programmed over another
	// device's range). It runs under the Root's lock.
	OnError func(error)
	// Reserved are guest-physical memory ranges no memory BAR may decode
	// over (guest RAM, the interrupt controllers): a BAR the guest moves
	// onto one stays off, reported to OnError, since its memslot or bus
	// range would shadow RAM or collide with KVM's own.
	Reserved []Reserved
}

// Reserved is a named guest-physical memory range (see RootConfig).
type Reserved struct {
	Name       string
	Base, Size uint64
}

type barState struct {
	kind     BARKind
	prefetch bool
	size     uint64
	handler  bus.Device
	mapped   bool   // decoding and registered
	base     uint64 // where it is registered
}

type slot struct {
	dev  Device
	name string
	bars [NumBARs]barState
	// bridge is dev as a *Bridge (nil for endpoints): the Root reads its
	// bus numbers and windows directly, without an interface call, so
	// routing a configuration access allocates nothing.
	bridge *Bridge
	// parent is the bridge slot whose secondary bus this slot is on, nil
	// on bus 0; children are the slots on this bridge's secondary bus.
	parent   *slot
	children [NumSlots]*slot
}

// Root is the PCI root complex: bus 0 with a host bridge at 00:00.0, and
// the buses below PCIe ports (Bridge) added to it.
type Root struct {
	mu    sync.Mutex
	cfg   RootConfig
	addr  uint32 // mechanism #1 CONFIG_ADDRESS
	slots [NumSlots]*slot
	byDev map[Device]*slot
	// lastBus is the highest bus number AssignBuses gave out (0 without
	// bridges).
	lastBus uint8
}

// HostBridgeID is the host bridge's vendor:device: Red Hat's generic PCIe
// host bridge ID, which no guest driver binds to, so no chipset quirk runs.
// Linux's conf1 sanity check accepts it by its class (0x0600, host bridge).
const (
	HostBridgeVendor = 0x1b36
	HostBridgeDevice = 0x0008
)

// NewRoot returns a root complex with its host bridge at slot 0.
func NewRoot(cfg RootConfig) *Root {
	r := &Root{cfg: cfg, byDev: map[Device]*slot{}}
	hb := NewConfigSpace(Header{VendorID: HostBridgeVendor, DeviceID: HostBridgeDevice, Class: 0x060000})
	r.slots[0] = &slot{dev: hb, name: "00:00.0 host bridge"}
	return r
}

// AddDevice places dev at bus 0, slot (1-31), function 0 and probes its BARs
// with the sizing protocol, as firmware would. name labels bus ranges. A
// *Bridge added here is a root port (or any port) with its own bus below.
func (r *Root) AddDevice(slotNum int, name string, dev Device) error {
	return r.AddDeviceBelow(nil, slotNum, name, dev)
}

// AddDeviceBelow places dev at device slotNum, function 0, of the secondary
// bus of parent, a bridge already added (nil: bus 0, as AddDevice). Below a
// root or downstream port the slot must be 0: Linux scans only device 0
// behind them (one device per link). Below an upstream port, slots 0-31
// hold its downstream ports.
func (r *Root) AddDeviceBelow(parent *Bridge, slotNum int, name string, dev Device) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if dev == nil {
		return fmt.Errorf("pci: add %s: nil device", name)
	}
	if _, dup := r.byDev[dev]; dup {
		return fmt.Errorf("pci: add %s: device already added", name)
	}
	table, prefix := &r.slots, "00:"
	var ps *slot
	if parent == nil {
		if slotNum < 1 || slotNum >= NumSlots {
			return fmt.Errorf("pci: add %s at slot %d: slot must be 1-%d (0 is the host bridge)", name, slotNum, NumSlots-1)
		}
	} else {
		ps = r.byDev[parent]
		if ps == nil {
			return fmt.Errorf("pci: add %s below a bridge that is not on this root", name)
		}
		if parent.Type().hasSlot() && slotNum != 0 {
			return fmt.Errorf("pci: add %s at slot %d below %s (%s): a root or downstream port has one device, at slot 0", name, slotNum, ps.name, parent.Type())
		}
		if slotNum < 0 || slotNum >= NumSlots {
			return fmt.Errorf("pci: add %s at slot %d below %s: slot must be 0-%d", name, slotNum, ps.name, NumSlots-1)
		}
		if parent.Type() == UpstreamPort {
			if b, ok := dev.(*Bridge); !ok || b.Type() != DownstreamPort {
				return fmt.Errorf("pci: add %s below %s: only downstream ports sit below a switch upstream port", name, ps.name)
			}
		}
		table, prefix = &ps.children, ps.loc()+"/"
	}
	if table[slotNum] != nil {
		return fmt.Errorf("pci: add %s at slot %d: slot taken by %s", name, slotNum, table[slotNum].name)
	}
	s := &slot{dev: dev, parent: ps, name: fmt.Sprintf("%s%02x.0 %s", prefix, slotNum, name)}
	if b, ok := dev.(*Bridge); ok {
		s.bridge = b
	}
	probeBARs(s)
	table[slotNum] = s
	r.byDev[dev] = s
	r.update(s)
	return nil
}

// loc returns the slot's location without its label: "00:0a.0" on bus 0,
// "00:0a.0/00.0" for device 0 below the root port at 00:0a.0. Bus numbers
// below bridges are the guest's to change, so names use the path.
func (s *slot) loc() string {
	name, _, _ := strings.Cut(s.name, " ")
	return name
}

func cfgRead32(d Device, off uint32) uint32 {
	var b [4]byte
	d.ConfigRead(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func cfgWrite32(d Device, off uint32, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	d.ConfigWrite(off, b[:])
}

func cfgRead16(d Device, off uint32) uint16 {
	var b [2]byte
	d.ConfigRead(off, b[:])
	return binary.LittleEndian.Uint16(b[:])
}

func cfgWrite16(d Device, off uint32, v uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], v)
	d.ConfigWrite(off, b[:])
}

func (r *Root) report(err error) {
	if r.cfg.OnError != nil {
		r.cfg.OnError(err)
	}
}

// Read serves CONFIG_ADDRESS (offsets 0-3, any width) and CONFIG_DATA
// (offsets 4-7, byte/word/dword inside the dword).
func (c conf1) Read(offset uint64, data []byte) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if offset < 4 {
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], r.addr)
		for i := range data {
			if offset+uint64(i) < 4 {
				data[i] = b[offset+uint64(i)]
			} else {
				data[i] = 0xff
			}
		}
		return
	}
	busNum, dev, fn, reg, ok := c.decode(offset, len(data))
	if !ok {
		for i := range data {
			data[i] = 0xff
		}
		return
	}
	r.configRead(busNum, dev, fn, reg, data)
}

// Write latches CONFIG_ADDRESS on dword writes to 0xcf8 (narrower writes
// there are not address writes on real chipsets, e.g. Linux's probe pokes
// 0xcfb with a byte) and forwards CONFIG_DATA writes.
func (c conf1) Write(offset uint64, data []byte) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	if offset < 4 {
		if offset == 0 && len(data) == 4 {
			r.addr = binary.LittleEndian.Uint32(data) &^ 0x70000003 // reserved bits read as zero
		}
		return
	}
	busNum, dev, fn, reg, ok := c.decode(offset, len(data))
	if !ok {
		return
	}
	r.configWrite(busNum, dev, fn, reg, data)
}

// decode splits CONFIG_ADDRESS; bits 27:24 extend the register number to 4
// KiB (the AMD extension Linux uses on AMD family 10h+ hosts).
func (c conf1) decode(offset uint64, n int) (busNum, dev, fn, reg uint32, ok bool) {
	a := c.r.addr
	k := uint32(offset - 4)
	if a&0x80000000 == 0 || n == 0 || k+uint32(n) > 4 {
		return 0, 0, 0, 0, false
	}
	reg = (a & 0xfc) | (a>>16)&0xf00
	return (a >> 16) & 0xff, (a >> 11) & 0x1f, (a >> 8) & 0x7, reg + k, true
}

// Read serves an ECAM read: offset = bus<<20 | dev<<15 | fn<<12 | register.
func (e ecam) Read(offset uint64, data []byte) {
	busNum, dev, fn, reg, ok := ecamDecode(offset, len(data))
	if !ok {
		for i := range data {
			data[i] = 0xff
		}
		return
	}
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	e.r.configRead(busNum, dev, fn, reg, data)
}

// Write serves an ECAM write.
func (e ecam) Write(offset uint64, data []byte) {
	busNum, dev, fn, reg, ok := ecamDecode(offset, len(data))
	if !ok {
		return
	}
	e.r.mu.Lock()
	defer e.r.mu.Unlock()
	e.r.configWrite(busNum, dev, fn, reg, data)
}

// Location returns the bus and device number where dev answers
// configuration cycles now: its parent bridge's secondary bus as the guest
// (or AssignBuses) programmed it, 0 on bus 0.
func (r *Root) Location(dev Device) (busNum, slotNum uint8, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.byDev[dev]
	if s == nil {
		return 0, 0, false
	}
	table := &r.slots
	if s.parent != nil {
		busNum = s.parent.bridge.SecondaryBus()
		table = &s.parent.children
	}
	for i, c := range table {
		if c == s {
			return busNum, uint8(i), true
		}
	}
	return 0, 0, false
}

// DeviceBAR reports where BAR bar of dev (on any bus) is programmed and
// whether it decodes there (registered: enabled, and forwarded by every
// bridge above), for diagnostics and tests.
func (r *Root) DeviceBAR(dev Device, bar int) (addr uint64, mapped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.byDev[dev]
	if s == nil || bar < 0 || bar >= NumBARs {
		return 0, false
	}
	return s.bars[bar].base, s.bars[bar].mapped
}

// BARAddress reports where BAR bar of the device at slotNum is programmed and
// whether it decodes there, for diagnostics and tests.
func (r *Root) BARAddress(slotNum, bar int) (addr uint64, mapped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if slotNum < 0 || slotNum >= NumSlots || r.slots[slotNum] == nil || bar < 0 || bar >= NumBARs {
		return 0, false
	}
	st := r.slots[slotNum].bars[bar]
	return st.base, st.mapped
}
