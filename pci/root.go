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

	"github.com/hpcvmm/hpcvmm/addrspace"
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

// probeBARs sizes every BAR through the device's own configuration space
// (decode off, write all ones, read back, restore), so endpoints that
// emulate BARs differently (passthrough) are handled alike.
func probeBARs(s *slot) {
	d := s.dev
	cmd := cfgRead16(d, RegCommand)
	cfgWrite16(d, RegCommand, cmd&^(CommandIO|CommandMemory))
	for i := 0; i < numBARs(s); i++ {
		off := uint32(RegBAR0 + 4*i)
		orig := cfgRead32(d, off)
		cfgWrite32(d, off, 0xffffffff)
		v := cfgRead32(d, off)
		cfgWrite32(d, off, orig)
		if v == 0 || v == 0xffffffff {
			continue
		}
		st := &s.bars[i]
		st.handler = d.BARHandler(i)
		if v&1 != 0 {
			st.kind = BARIO
			st.size = uint64(^(v &^ 3) + 1)
			if v&0xffff0000 == 0 { // 16-bit I/O decoder
				st.size = uint64((^(v &^ 3) + 1) & 0xffff)
			}
			continue
		}
		if v&0x6 == 0x4 && i+1 < NumBARs {
			hiOff := off + 4
			hiOrig := cfgRead32(d, hiOff)
			cfgWrite32(d, hiOff, 0xffffffff)
			hi := cfgRead32(d, hiOff)
			cfgWrite32(d, hiOff, hiOrig)
			mask := uint64(hi)<<32 | uint64(v&^0xf)
			st.kind = BARMem64
			st.size = ^mask + 1
			st.prefetch = v&0x8 != 0
			s.bars[i+1].kind = barMem64Upper
			i++
			continue
		}
		st.kind = BARMem32
		st.size = uint64(^(v &^ 0xf) + 1)
		st.prefetch = v&0x8 != 0
	}
	cfgWrite16(d, RegCommand, cmd)
}

// numBARs is 2 for a bridge, whose registers from 0x18 on are bus numbers
// and windows, 6 for an endpoint.
func numBARs(s *slot) int {
	if s.bridge != nil {
		return 2
	}
	return NumBARs
}

// barAddr returns the address BAR i of s is programmed to.
func barAddr(s *slot, i int) uint64 {
	off := uint32(RegBAR0 + 4*i)
	v := cfgRead32(s.dev, off)
	switch s.bars[i].kind {
	case BARIO:
		return uint64(v &^ 3)
	case BARMem64:
		return uint64(cfgRead32(s.dev, off+4))<<32 | uint64(v&^0xf)
	}
	return uint64(v &^ 0xf)
}

// update brings the bus registrations of s in line with its BAR registers and
// command register. A BAR decodes when its space is enabled and it holds a
// non-zero address (zero is "unassigned"; a BAR never legitimately sits on
// the bottom of RAM).
func (r *Root) update(s *slot) {
	cmd := cfgRead16(s.dev, RegCommand)
	for i := 0; i < NumBARs; i++ {
		st := &s.bars[i]
		if st.kind == BARNone || st.kind == barMem64Upper {
			continue
		}
		as := r.cfg.MMIO
		enabled := cmd&CommandMemory != 0
		if st.kind == BARIO {
			as = r.cfg.PIO
			enabled = cmd&CommandIO != 0
		}
		addr := barAddr(s, i)
		want := enabled && addr != 0 && addr+st.size > addr && r.forwarded(s, st.kind == BARIO, addr, st.size)
		if want == st.mapped && (!want || addr == st.base) {
			continue
		}
		if st.mapped {
			if st.handler != nil && as != nil {
				as.Unregister(st.base)
			}
			st.mapped = false
			s.dev.BARMapped(i, st.base, false)
		}
		if !want {
			continue
		}
		// Refused placements leave the BAR off until the guest moves it
		// somewhere valid, as a bus registration conflict does.
		if st.kind != BARIO {
			if what, bad := r.overReserved(addr, st.size); bad {
				r.report(fmt.Errorf("pci: %s BAR%d at %#x (%#x bytes) over %s: refused, BAR left off", s.name, i, addr, st.size, what))
				continue
			}
		}
		if other, bad := r.overMappedBAR(s, i, st.kind == BARIO, addr, st.size); bad {
			r.report(fmt.Errorf("pci: %s BAR%d at %#x (%#x bytes) over %s: refused, BAR left off", s.name, i, addr, st.size, other))
			continue
		}
		if st.handler != nil {
			if as == nil {
				r.report(fmt.Errorf("pci: %s BAR%d (%s): no address space for this BAR kind", s.name, i, st.kind))
				continue
			}
			// Guests do program BARs on top of other ranges transiently (the
			// sizing all-ones value with decode still on); the BAR then stays
			// unmapped until the next configuration write makes it valid.
			if err := as.Register(addr, st.size, fmt.Sprintf("%s BAR%d", s.name, i), st.handler); err != nil {
				r.report(fmt.Errorf("pci: %s BAR%d at %#x: %w", s.name, i, addr, err))
				continue
			}
		}
		st.mapped = true
		st.base = addr
		s.dev.BARMapped(i, addr, true)
	}
}

// overReserved reports which reserved range [addr, addr+size) overlaps.
func (r *Root) overReserved(addr, size uint64) (string, bool) {
	for _, res := range r.cfg.Reserved {
		if addr < res.Base+res.Size && res.Base < addr+size {
			return fmt.Sprintf("%s [%#x, %#x)", res.Name, res.Base, res.Base+res.Size), true
		}
	}
	return "", false
}

// overMappedBAR reports which decoding BAR of the same space (other than
// BAR bar of s) overlaps [addr, addr+size). The bus registration catches
// this for BARs with a handler; BARs that are only memslots (passthrough
// BARs mapped onto the device) need it here, or two memslots would overlap.
func (r *Root) overMappedBAR(s *slot, bar int, io bool, addr, size uint64) (string, bool) {
	var found string
	var walk func(table *[NumSlots]*slot) bool
	walk = func(table *[NumSlots]*slot) bool {
		for _, o := range table {
			if o == nil {
				continue
			}
			for j := range o.bars {
				st := &o.bars[j]
				if !st.mapped || (o == s && j == bar) || (st.kind == BARIO) != io {
					continue
				}
				if addr < st.base+st.size && st.base < addr+size {
					found = fmt.Sprintf("%s BAR%d [%#x, %#x)", o.name, j, st.base, st.base+st.size)
					return true
				}
			}
			if walk(&o.children) {
				return true
			}
		}
		return false
	}
	return found, walk(&r.slots)
}

// forwarded reports whether every bridge above s passes accesses to [addr,
// addr+size) down to it: real hardware forwards only inside the windows of
// a bridge with the space enabled, so a BAR outside them does not decode
// (the guest sees all ones), and this Root does the same.
func (r *Root) forwarded(s *slot, io bool, addr, size uint64) bool {
	for p := s.parent; p != nil; p = p.parent {
		if !p.bridge.forwards(io, addr, size) {
			return false
		}
	}
	return true
}

// updateBelow re-evaluates the BAR decode of everything below bridge slot
// s, after the guest changed its windows or command register.
func (r *Root) updateBelow(s *slot) {
	for _, c := range s.children {
		if c == nil {
			continue
		}
		r.update(c)
		if c.bridge != nil {
			r.updateBelow(c)
		}
	}
}

func (r *Root) report(err error) {
	if r.cfg.OnError != nil {
		r.cfg.OnError(err)
	}
}

// lookup returns the slot for bus/device/function, or nil when nothing is
// there (reads as all ones, as an absent function does on real hardware).
// Buses other than 0 are found the way type-1 cycles travel: from bus 0
// into the bridge whose [secondary, subordinate] range holds the bus, down
// until a bridge's secondary bus is the target, where the cycle becomes a
// type-0 access to device dev. Siblings with overlapping ranges (a guest
// programming error) resolve to the lowest device number. Each step goes
// one level down a finite tree, so the walk ends.
func (r *Root) lookup(busNum, dev, fn uint32) *slot {
	if fn != 0 || dev >= NumSlots || busNum > 0xff {
		return nil
	}
	if busNum == 0 {
		return r.slots[dev]
	}
	b := uint8(busNum)
	table := &r.slots
	for {
		var next *slot
		for _, s := range table {
			if s != nil && s.bridge != nil && s.bridge.routes(b) {
				next = s
				break
			}
		}
		if next == nil {
			return nil
		}
		if next.bridge.SecondaryBus() == b {
			return next.children[dev]
		}
		table = &next.children
	}
}

func (r *Root) configRead(busNum, dev, fn, reg uint32, data []byte) {
	s := r.lookup(busNum, dev, fn)
	if s == nil {
		for i := range data {
			data[i] = 0xff
		}
		return
	}
	s.dev.ConfigRead(reg, data)
}

func (r *Root) configWrite(busNum, dev, fn, reg uint32, data []byte) {
	s := r.lookup(busNum, dev, fn)
	if s == nil {
		return
	}
	s.dev.ConfigWrite(reg, data)
	r.update(s)
	if s.bridge != nil {
		r.updateBelow(s)
	}
}

// ConfigIO returns the mechanism #1 device for the port-I/O bus at
// ConfigIOPort, size ConfigIOSize.
func (r *Root) ConfigIO() bus.Device { return conf1{r} }

// ECAM returns the memory-mapped configuration device for an MMIO window of
// ECAMSize bytes (or a multiple of ECAMBusSize for fewer buses) at ECAMBase.
func (r *Root) ECAM() bus.Device { return ecam{r} }

type conf1 struct{ r *Root }

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

type ecam struct{ r *Root }

func ecamDecode(offset uint64, n int) (busNum, dev, fn, reg uint32, ok bool) {
	reg = uint32(offset & 0xfff)
	if n == 0 || n > 4 || reg+uint32(n) > ConfigSize || offset >= ECAMSize {
		return 0, 0, 0, 0, false
	}
	return uint32(offset>>20) & 0xff, uint32(offset>>15) & 0x1f, uint32(offset>>12) & 0x7, reg, true
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

// AssignBuses numbers the buses below every bridge depth-first in slot
// order, as firmware does (each bridge's secondary bus is the next free
// number, its subordinate the highest number below it), so Linux finds a
// consistent hierarchy and keeps it. Call it once after adding devices,
// before AssignBARs and before the guest runs.
func (r *Root) AssignBuses() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := 1
	var walk func(table *[NumSlots]*slot, busNum int) error
	walk = func(table *[NumSlots]*slot, busNum int) error {
		for _, s := range table {
			if s == nil || s.bridge == nil {
				continue
			}
			if next > 0xff {
				return fmt.Errorf("pci: assign buses: %s needs bus %d, beyond 255", s.name, next)
			}
			sec := next
			next++
			// Open the range while numbering below, as firmware does, so the
			// bridge routes to its subtree's buses from the start.
			s.bridge.SetBusNumbers(uint8(busNum), uint8(sec), 0xff)
			if err := walk(&s.children, sec); err != nil {
				return err
			}
			s.bridge.SetBusNumbers(uint8(busNum), uint8(sec), uint8(next-1))
		}
		return nil
	}
	if err := walk(&r.slots, 0); err != nil {
		return err
	}
	r.lastBus = uint8(next - 1)
	return nil
}

// LastBus returns the highest bus number in use after AssignBuses: the end
// of the bus range the firmware tables (MCFG, the host bridge's _CRS)
// declare. Declaring only the buses that exist matters: Linux sets its
// last PCI bus from MCFG's end bus and probes all 32 slots of every bus up
// to it that it has not found (pcibios_fixup_peer_bridges), which for
// 0-255 costs over 16,000 configuration accesses, each a VM exit.
func (r *Root) LastBus() uint8 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastBus
}

// AssignBARs places BARs in the guest's windows by addrspace.PlanHierarchy
// and enables decode, as firmware does; Linux keeps these assignments. On
// bus 0, every unassigned BAR is placed as addrspace.Plan places it
// (largest first, each at the lowest free naturally aligned address: the
// rule preflight predicts with). Below bridges every BAR is placed, inside
// windows sized to hold them (64-bit prefetchable BARs in the 64-bit
// prefetchable window, other memory BARs in the 32-bit window), and every
// bridge's windows are programmed and its memory/I/O decode and bus
// mastering enabled, so a guest kernel never needs pci=realloc. Call it once
// after adding devices and AssignBuses, before the guest runs.
func (r *Root) AssignBARs(w addrspace.Windows) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	type ref struct {
		s   *slot
		bar int
	}
	var refs []ref
	var reqs []addrspace.BAR
	var bridges []*addrspace.Bridge
	var bslots []*slot
	var walk func(table *[NumSlots]*slot, behind *addrspace.Bridge)
	walk = func(table *[NumSlots]*slot, behind *addrspace.Bridge) {
		for n, s := range table {
			if s == nil || (behind == nil && n == 0) { // the host bridge
				continue
			}
			for i, st := range s.bars {
				if st.kind == BARNone || st.kind == barMem64Upper || (behind == nil && barAddr(s, i) != 0) {
					continue
				}
				kind := addrspace.Mem32
				switch st.kind {
				case BARMem64:
					kind = addrspace.Mem64
				case BARIO:
					kind = addrspace.IO
				}
				refs = append(refs, ref{s, i})
				reqs = append(reqs, addrspace.BAR{Owner: s.name, Index: i, Kind: kind, Size: st.size, Prefetchable: st.prefetch, Behind: behind})
			}
			if s.bridge != nil {
				ab := &addrspace.Bridge{Name: s.name, Parent: behind}
				bridges = append(bridges, ab)
				bslots = append(bslots, s)
				walk(&s.children, ab)
			}
		}
	}
	walk(&r.slots, nil)
	layout, err := addrspace.PlanHierarchy(w, bridges, reqs)
	if err != nil {
		return fmt.Errorf("pci: assign BARs: %w", err)
	}
	for i, ab := range bridges {
		bw := layout.Windows[ab]
		b := bslots[i].bridge
		b.SetWindows(bw)
		cmd := b.Uint16(RegCommand) | CommandBusMaster
		if bw.Mem.Size != 0 || bw.Pref.Size != 0 {
			cmd |= CommandMemory
		}
		if bw.IO.Size != 0 {
			cmd |= CommandIO
		}
		b.SetUint16(RegCommand, cmd)
	}
	touched := map[*slot]uint16{}
	for i, q := range refs {
		off := uint32(RegBAR0 + 4*q.bar)
		cfgWrite32(q.s.dev, off, uint32(layout.BARs[i]))
		bit := uint16(CommandMemory)
		switch reqs[i].Kind {
		case addrspace.Mem64:
			cfgWrite32(q.s.dev, off+4, uint32(layout.BARs[i]>>32))
		case addrspace.IO:
			bit = CommandIO
		}
		touched[q.s] |= bit
	}
	for s, bits := range touched {
		cmd := cfgRead16(s.dev, RegCommand)
		cfgWrite16(s.dev, RegCommand, cmd|bits)
	}
	for _, s := range r.slots {
		if s != nil {
			r.update(s)
			if s.bridge != nil {
				r.updateBelow(s)
			}
		}
	}
	return nil
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
