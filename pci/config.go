package pci

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/hpcvmm/hpcvmm/bus"
)

// Configuration space geometry and standard type-0 header registers.
const (
	ConfigSize       = 4096 // PCIe extended configuration space per function
	LegacyConfigSize = 256  // conventional PCI configuration space
	NumBARs          = 6

	RegVendorID      = 0x00
	RegDeviceID      = 0x02
	RegCommand       = 0x04
	RegStatus        = 0x06
	RegRevision      = 0x08
	RegClass         = 0x09 // 3 bytes: prog-if, subclass, base class
	RegCacheLine     = 0x0c
	RegLatency       = 0x0d
	RegHeaderType    = 0x0e
	RegBAR0          = 0x10
	RegSubsysVendor  = 0x2c
	RegSubsysID      = 0x2e
	RegROM           = 0x30
	RegCapPtr        = 0x34
	RegInterruptLine = 0x3c
	RegInterruptPin  = 0x3d

	CommandIO          = 1 << 0 // I/O space decode enable
	CommandMemory      = 1 << 1 // memory space decode enable
	CommandBusMaster   = 1 << 2
	CommandParity      = 1 << 6
	CommandSERR        = 1 << 8
	CommandINTxDisable = 1 << 10

	StatusCapList = 1 << 4

	// Capability IDs used by this package and its users.
	CapIDMSIX   = 0x11
	CapIDVendor = 0x09
	CapIDPCIe   = 0x10

	// ExtCapIDACS is the Access Control Services extended capability.
	ExtCapIDACS = 0x000d

	firstCapOffset    = 0x40
	firstExtCapOffset = 0x100
)

// BARKind is the address space and width of a base address register.
type BARKind uint8

// BAR kinds. A 64-bit memory BAR occupies two consecutive BAR registers.
const (
	BARNone BARKind = iota
	BARMem32
	BARMem64
	BARIO
	barMem64Upper // internal: the upper half of the preceding BARMem64
)

func (k BARKind) String() string {
	switch k {
	case BARMem32:
		return "mem32"
	case BARMem64:
		return "mem64"
	case BARIO:
		return "io"
	case barMem64Upper:
		return "mem64-upper"
	}
	return "none"
}

// BARSpec defines one BAR of an endpoint.
type BARSpec struct {
	// Size in bytes: a power of two, at least 16 for memory and 4 for I/O.
	Size uint64
	Kind BARKind
	// Prefetchable sets bit 3 of a memory BAR (reads have no side effects).
	Prefetchable bool
	// Handler serves guest accesses to the BAR once the guest enables decode;
	// offsets are relative to the BAR base. Nil means the device maps the
	// BAR itself (e.g. VFIO mmap into guest memory) using BARMapped.
	Handler bus.Device
}

// Header is the identity part of a type-0 configuration header.
type Header struct {
	VendorID, DeviceID           uint16
	SubsystemVendorID, Subsystem uint16
	Revision                     uint8
	// Class is the 24-bit class code: base class << 16 | subclass << 8 | prog-if.
	Class uint32
	// InterruptPin is 0 (no INTx) or 1-4 for INTA-INTD.
	InterruptPin uint8
}

type cfgHook struct {
	off, end int
	fn       func(off, n int)
}

// ConfigSpace is a reusable, emulated 4 KiB configuration space for a type-0
// endpoint: it implements the write masks of the standard header, the BAR
// sizing protocol (writing all ones reads back the size mask; type bits are
// read-only; 64-bit BARs are register pairs), write-1-to-clear status bits and
// capability lists. Endpoints embed it (or hold it) and add hooks for the
// registers with side effects.
//
// ConfigSpace has no lock: the Root serializes every configuration access.
// Devices that read it from other goroutines must copy what they need in a
// write hook.
type ConfigSpace struct {
	data  [ConfigSize]byte
	wmask [ConfigSize]byte // bits the guest may change
	w1c   [ConfigSize]byte // bits the guest clears by writing 1

	bars [NumBARs]BARSpec

	capTail    int // offset of the byte that links the next capability (0x34, then a cap's next field)
	capNext    int // next free offset for a standard capability
	extTail    int // offset of the last extended capability header, or 0
	extNext    int // next free offset for an extended capability
	readHooks  []cfgHook
	writeHooks []cfgHook

	barListener func(bar int, addr uint64, mapped bool)
}

// NewConfigSpace returns a type-0 header with the given identity, command and
// status registers at reset values and no BARs or capabilities.
func NewConfigSpace(h Header) *ConfigSpace {
	c := &ConfigSpace{capTail: RegCapPtr, capNext: firstCapOffset, extNext: firstExtCapOffset}
	c.SetUint16(RegVendorID, h.VendorID)
	c.SetUint16(RegDeviceID, h.DeviceID)
	c.SetUint8(RegRevision, h.Revision)
	c.SetUint8(RegClass, uint8(h.Class))
	c.SetUint8(RegClass+1, uint8(h.Class>>8))
	c.SetUint8(RegClass+2, uint8(h.Class>>16))
	c.SetUint16(RegSubsysVendor, h.SubsystemVendorID)
	c.SetUint16(RegSubsysID, h.Subsystem)
	c.SetUint8(RegInterruptPin, h.InterruptPin)

	cmdMask := uint16(CommandIO | CommandMemory | CommandBusMaster | CommandParity | CommandSERR | CommandINTxDisable)
	binary.LittleEndian.PutUint16(c.wmask[RegCommand:], cmdMask)
	// Status error bits (8, 11-15) are write-1-to-clear.
	binary.LittleEndian.PutUint16(c.w1c[RegStatus:], 0xf900)
	c.wmask[RegCacheLine] = 0xff
	c.wmask[RegLatency] = 0xff
	c.wmask[RegInterruptLine] = 0xff
	return c
}

// SetBAR defines BAR i. A BARMem64 also claims register i+1. Must be called
// before the device is added to a Root.
func (c *ConfigSpace) SetBAR(i int, spec BARSpec) error {
	if i < 0 || i >= NumBARs {
		return fmt.Errorf("pci: define BAR %d: index out of range 0-5", i)
	}
	if c.bars[i].Kind != BARNone {
		return fmt.Errorf("pci: define BAR %d: already defined as %s", i, c.bars[i].Kind)
	}
	if bits.OnesCount64(spec.Size) != 1 {
		return fmt.Errorf("pci: define BAR %d: size %#x is not a power of two", i, spec.Size)
	}
	off := RegBAR0 + 4*i
	switch spec.Kind {
	case BARIO:
		if spec.Size < 4 || spec.Size > 1<<16 {
			return fmt.Errorf("pci: define BAR %d: I/O size %#x outside 4 B-64 KiB", i, spec.Size)
		}
		c.SetUint32(off, 0x1)
		binary.LittleEndian.PutUint32(c.wmask[off:], uint32(^(spec.Size-1))&^3)
	case BARMem32:
		if spec.Size < 16 || spec.Size > 1<<31 {
			return fmt.Errorf("pci: define BAR %d: 32-bit memory size %#x outside 16 B-2 GiB", i, spec.Size)
		}
		c.SetUint32(off, prefetchBit(spec.Prefetchable))
		binary.LittleEndian.PutUint32(c.wmask[off:], uint32(^(spec.Size-1))&^0xf)
	case BARMem64:
		if i == NumBARs-1 {
			return fmt.Errorf("pci: define BAR %d: a 64-bit BAR needs two registers", i)
		}
		if c.bars[i+1].Kind != BARNone {
			return fmt.Errorf("pci: define BAR %d: 64-bit BAR's upper register %d already defined", i, i+1)
		}
		if spec.Size < 16 || spec.Size > 1<<62 {
			return fmt.Errorf("pci: define BAR %d: 64-bit memory size %#x outside 16 B-4 EiB", i, spec.Size)
		}
		c.SetUint32(off, 0x4|prefetchBit(spec.Prefetchable))
		mask := ^(spec.Size - 1)
		binary.LittleEndian.PutUint32(c.wmask[off:], uint32(mask)&^0xf)
		binary.LittleEndian.PutUint32(c.wmask[off+4:], uint32(mask>>32))
		c.bars[i+1] = BARSpec{Kind: barMem64Upper}
	default:
		return fmt.Errorf("pci: define BAR %d: unknown kind %d", i, spec.Kind)
	}
	c.bars[i] = spec
	return nil
}

func prefetchBit(p bool) uint32 {
	if p {
		return 0x8
	}
	return 0
}

// BAR returns BAR i's definition (Kind BARNone when unimplemented or when i
// is the upper half of a 64-bit BAR).
func (c *ConfigSpace) BAR(i int) BARSpec {
	if i < 0 || i >= NumBARs || c.bars[i].Kind == barMem64Upper {
		return BARSpec{}
	}
	return c.bars[i]
}

// AddCapability appends a standard capability with the given ID. body is the
// capability after its ID and next-pointer bytes. It returns the capability's
// offset; body bytes are read-only until SetWriteMask opens them.
func (c *ConfigSpace) AddCapability(id uint8, body []byte) (int, error) {
	n := (2 + len(body) + 3) &^ 3 // keep capabilities dword aligned, as Linux masks the low two bits
	if c.capNext+n > LegacyConfigSize {
		return 0, fmt.Errorf("pci: add capability %#x: %d bytes do not fit at %#x", id, 2+len(body), c.capNext)
	}
	off := c.capNext
	c.data[off] = id
	c.data[off+1] = 0
	copy(c.data[off+2:], body)
	c.data[c.capTail] = byte(off)
	c.capTail = off + 1
	c.capNext += n
	c.data[RegStatus] |= StatusCapList
	return off, nil
}

// AddExtendedCapability appends a PCIe extended capability (offset >= 0x100,
// reachable only through ECAM). body follows the 4-byte header.
func (c *ConfigSpace) AddExtendedCapability(id uint16, version uint8, body []byte) (int, error) {
	n := (4 + len(body) + 3) &^ 3
	if c.extNext+n > ConfigSize {
		return 0, fmt.Errorf("pci: add extended capability %#x: %d bytes do not fit at %#x", id, 4+len(body), c.extNext)
	}
	off := c.extNext
	binary.LittleEndian.PutUint32(c.data[off:], uint32(id)|uint32(version&0xf)<<16)
	copy(c.data[off+4:], body)
	if c.extTail != 0 {
		h := binary.LittleEndian.Uint32(c.data[c.extTail:])
		binary.LittleEndian.PutUint32(c.data[c.extTail:], h&0x000fffff|uint32(off)<<20)
	}
	c.extTail = off
	c.extNext += n
	return off, nil
}

// SetWriteMask makes the bits set in mask guest-writable at off.
func (c *ConfigSpace) SetWriteMask(off int, mask []byte) {
	copy(c.wmask[off:], mask)
}

// SetW1CMask makes the bits set in mask write-1-to-clear at off (status
// registers: the device sets them, the guest acknowledges by writing 1).
func (c *ConfigSpace) SetW1CMask(off int, mask []byte) {
	copy(c.w1c[off:], mask)
}

// OnWrite runs fn after every guest write that touches [off, off+n), with the
// overlapping part of the write. Hooks run under the Root's lock.
func (c *ConfigSpace) OnWrite(off, n int, fn func(off, n int)) {
	c.writeHooks = append(c.writeHooks, cfgHook{off: off, end: off + n, fn: fn})
}

// OnRead runs fn before every guest read that touches [off, off+n), so the
// device can refresh registers computed on demand.
func (c *ConfigSpace) OnRead(off, n int, fn func(off, n int)) {
	c.readHooks = append(c.readHooks, cfgHook{off: off, end: off + n, fn: fn})
}

// SetBARListener sets the function told when the Root starts or stops
// decoding BAR bar at addr (the guest moved it or toggled decode).
func (c *ConfigSpace) SetBARListener(fn func(bar int, addr uint64, mapped bool)) {
	c.barListener = fn
}

// Uint8 returns the byte at off (no hooks).
func (c *ConfigSpace) Uint8(off int) uint8 { return c.data[off] }

// Uint16 returns the little-endian word at off (no hooks).
func (c *ConfigSpace) Uint16(off int) uint16 { return binary.LittleEndian.Uint16(c.data[off:]) }

// Uint32 returns the little-endian dword at off (no hooks).
func (c *ConfigSpace) Uint32(off int) uint32 { return binary.LittleEndian.Uint32(c.data[off:]) }

// SetUint8 stores v at off, bypassing write masks (device-side update).
func (c *ConfigSpace) SetUint8(off int, v uint8) { c.data[off] = v }

// SetUint16 stores v at off, bypassing write masks (device-side update).
func (c *ConfigSpace) SetUint16(off int, v uint16) { binary.LittleEndian.PutUint16(c.data[off:], v) }

// SetUint32 stores v at off, bypassing write masks (device-side update).
func (c *ConfigSpace) SetUint32(off int, v uint32) { binary.LittleEndian.PutUint32(c.data[off:], v) }

// clip limits an access at off to the configuration space; ok is false when
// nothing of it is inside.
func clip(off uint32, n int) (int, int, bool) {
	if off >= ConfigSize || n <= 0 {
		return 0, 0, false
	}
	if uint32(n) > ConfigSize-off {
		n = int(ConfigSize - off)
	}
	return int(off), n, true
}

func runHooks(hooks []cfgHook, off, n int) {
	end := off + n
	for _, h := range hooks {
		if off < h.end && h.off < end {
			lo, hi := max(off, h.off), min(end, h.end)
			h.fn(lo, hi-lo)
		}
	}
}

// ConfigRead implements Device: guest read of len(data) bytes at offset.
// Bytes beyond the 4 KiB space read as all ones.
func (c *ConfigSpace) ConfigRead(offset uint32, data []byte) {
	for i := range data {
		data[i] = 0xff
	}
	off, n, ok := clip(offset, len(data))
	if !ok {
		return
	}
	runHooks(c.readHooks, off, n)
	copy(data, c.data[off:off+n])
}

// ConfigWrite implements Device: guest write at offset. Only bits open in
// the write mask change; write-1-to-clear bits clear. BAR registers are plain
// masked registers whose mask is the size mask, which is exactly the sizing
// protocol: all ones reads back as ~(size-1) | type bits.
func (c *ConfigSpace) ConfigWrite(offset uint32, data []byte) {
	off, n, ok := clip(offset, len(data))
	if !ok {
		return
	}
	for i := 0; i < n; i++ {
		o := off + i
		v := data[i]
		c.data[o] = (c.data[o] &^ c.wmask[o]) | (v & c.wmask[o])
		c.data[o] &^= v & c.w1c[o]
	}
	runHooks(c.writeHooks, off, n)
}

// BARHandler implements Device.
func (c *ConfigSpace) BARHandler(bar int) bus.Device {
	if bar < 0 || bar >= NumBARs {
		return nil
	}
	return c.bars[bar].Handler
}

// BARMapped implements Device by forwarding to the listener, if any.
func (c *ConfigSpace) BARMapped(bar int, addr uint64, mapped bool) {
	if c.barListener != nil {
		c.barListener(bar, addr, mapped)
	}
}
