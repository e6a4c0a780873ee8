package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Resource is one resource data descriptor of a _CRS buffer (ACPI 6.5
// §6.4). AppendResource appends its encoding to dst.
type Resource interface {
	AppendResource(dst []byte) ([]byte, error)
}

// Resource descriptor tags (§6.4.2 small, §6.4.3 large items).
const (
	tagIRQ          = 0x04 << 3 // small item 0x04, length in bits 0-2
	tagIO           = 0x08 << 3
	tagEnd          = 0x0f << 3
	tagMemory32Fix  = 0x86
	tagDWordAddress = 0x87
	tagWordAddress  = 0x88
	tagExtInterrupt = 0x89
	tagQWordAddress = 0x8a
)

// resourceTemplate is ASL's ResourceTemplate: a Buffer of descriptors closed
// by an End Tag.
type resourceTemplate []Resource

// ResourceTemplate is a Buffer holding res and an End Tag (§6.4.2.9) whose
// checksum byte is 0, meaning "treat as summing to zero": what iasl emits
// and what OSPM accepts without computing it.
func ResourceTemplate(res ...Resource) Term { return resourceTemplate(res) }

// AppendAML implements Term.
func (rt resourceTemplate) AppendAML(dst []byte) ([]byte, error) {
	var b []byte
	var err error
	for _, r := range rt {
		if r == nil {
			return nil, errors.New("acpi: nil resource descriptor")
		}
		if b, err = r.AppendResource(b); err != nil {
			return nil, err
		}
	}
	b = append(b, tagEnd|1, 0)
	return Buffer(b).AppendAML(dst)
}

// IRQNoFlags is the 2-byte IRQ descriptor (§6.4.2.1) for ISA IRQs 0-15,
// edge triggered and active high, as ASL's IRQNoFlags: the legacy devices'
// interrupts, which the MADT's Interrupt Source Overrides route to GSIs.
type IRQNoFlags struct {
	IRQs []uint8
}

// AppendResource implements Resource.
func (r IRQNoFlags) AppendResource(dst []byte) ([]byte, error) {
	var mask uint16
	for _, irq := range r.IRQs {
		if irq > 15 {
			return nil, fmt.Errorf("acpi: IRQNoFlags: IRQ %d is not an ISA IRQ 0-15", irq)
		}
		mask |= 1 << irq
	}
	return binary.LittleEndian.AppendUint16(append(dst, tagIRQ|2), mask), nil
}

// IO is the I/O port descriptor (§6.4.2.5): ports Min..Max+Length-1 may be
// assigned at Alignment steps; Min == Max fixes them. Decode16 says the
// device decodes all 16 address bits (ASL Decode16) rather than 10.
type IO struct {
	Decode16  bool
	Min, Max  uint16
	Alignment uint8
	Length    uint8
}

// AppendResource implements Resource.
func (r IO) AppendResource(dst []byte) ([]byte, error) {
	if r.Min > r.Max {
		return nil, fmt.Errorf("acpi: IO descriptor: min %#x above max %#x", r.Min, r.Max)
	}
	info := byte(0)
	if r.Decode16 {
		info = 1
	}
	dst = append(dst, tagIO|7, info)
	dst = binary.LittleEndian.AppendUint16(dst, r.Min)
	dst = binary.LittleEndian.AppendUint16(dst, r.Max)
	return append(dst, r.Alignment, r.Length), nil
}

// Memory32Fixed is the 32-bit fixed memory range descriptor (§6.4.3.4).
type Memory32Fixed struct {
	Writable bool
	Base     uint32
	Length   uint32
}

// AppendResource implements Resource.
func (r Memory32Fixed) AppendResource(dst []byte) ([]byte, error) {
	if uint64(r.Base)+uint64(r.Length) > 1<<32 {
		return nil, fmt.Errorf("acpi: Memory32Fixed %#x+%#x crosses 4 GiB", r.Base, r.Length)
	}
	info := byte(0)
	if r.Writable {
		info = 1
	}
	dst = binary.LittleEndian.AppendUint16(append(dst, tagMemory32Fix), 9)
	dst = append(dst, info)
	dst = binary.LittleEndian.AppendUint32(dst, r.Base)
	return binary.LittleEndian.AppendUint32(dst, r.Length), nil
}

// Interrupt is the Extended Interrupt descriptor (§6.4.3.6), ASL's
// Interrupt(): GSIs with their trigger mode and polarity. Consumer is set
// for a device that takes the interrupt (ResourceConsumer).
type Interrupt struct {
	Consumer      bool
	EdgeTriggered bool // false: level
	ActiveLow     bool // false: active high
	Shared        bool // false: exclusive
	WakeCapable   bool
	GSIs          []uint32
}

// AppendResource implements Resource.
func (r Interrupt) AppendResource(dst []byte) ([]byte, error) {
	if len(r.GSIs) == 0 || len(r.GSIs) > 255 {
		return nil, fmt.Errorf("acpi: Interrupt descriptor with %d interrupts, want 1-255", len(r.GSIs))
	}
	var flags byte
	for i, set := range []bool{r.Consumer, r.EdgeTriggered, r.ActiveLow, r.Shared, r.WakeCapable} {
		if set {
			flags |= 1 << i
		}
	}
	dst = binary.LittleEndian.AppendUint16(append(dst, tagExtInterrupt), uint16(2+4*len(r.GSIs)))
	dst = append(dst, flags, byte(len(r.GSIs)))
	for _, g := range r.GSIs {
		dst = binary.LittleEndian.AppendUint32(dst, g)
	}
	return dst, nil
}

// AddressType is an address space descriptor's Resource Type (§6.4.3.5).
type AddressType uint8

// Address space resource types.
const (
	AddressMemory    AddressType = 0
	AddressIO        AddressType = 1
	AddressBusNumber AddressType = 2
)

// Cacheability is a memory range's _MEM field, type-specific flags bits 1-2
// (§6.4.3.5.4). Linux marks a Prefetchable window IORESOURCE_PREFETCH.
type Cacheability uint8

// Memory cacheability.
const (
	NonCacheable   Cacheability = 0
	Cacheable      Cacheability = 1
	WriteCombining Cacheability = 2
	Prefetchable   Cacheability = 3
)

// ioEntireRange is an I/O range's _RNG = 3: both ISA and non-ISA ports
// (§6.4.3.5.4, ASL EntireRange).
const ioEntireRange = 3

// AddressSpace is a Word (16-bit), DWord (32-bit) or QWord (64-bit)
// Address Space descriptor (§6.4.3.5.1-3). The WordBusNumber, WordIO,
// DWordIO, DWordMemory and QWordMemory constructors fill it as iasl's
// macros of the same names do with ResourceProducer, MinFixed, MaxFixed and
// PosDecode; set Consumer for a range the device itself decodes.
type AddressSpace struct {
	Bits        int // 16, 32 or 64
	Type        AddressType
	Consumer    bool // general flag bit 0: ResourceConsumer
	Subtractive bool // bit 1: SubDecode
	MinFixed    bool // bit 2
	MaxFixed    bool // bit 3
	// TypeFlags are the type-specific flags: for memory, bit 0 read-write
	// and bits 1-2 Cacheability; for I/O, bits 0-1 the ISA range.
	TypeFlags   uint8
	Granularity uint64
	Min, Max    uint64
	Translation uint64
	Length      uint64
}

// WordBusNumber describes bus numbers min..max (ASL WordBusNumber).
func WordBusNumber(min, max uint16) AddressSpace {
	return producerRange(16, AddressBusNumber, 0, uint64(min), uint64(max))
}

// WordIO describes I/O ports min..max (ASL WordIO, EntireRange).
func WordIO(min, max uint16) AddressSpace {
	return producerRange(16, AddressIO, ioEntireRange, uint64(min), uint64(max))
}

// DWordIO describes I/O ports min..max (ASL DWordIO, EntireRange).
func DWordIO(min, max uint32) AddressSpace {
	return producerRange(32, AddressIO, ioEntireRange, uint64(min), uint64(max))
}

// DWordMemory describes memory min..max below 4 GiB (ASL DWordMemory).
func DWordMemory(min, max uint32, cache Cacheability, writable bool) AddressSpace {
	return producerRange(32, AddressMemory, memoryFlags(cache, writable), uint64(min), uint64(max))
}

// QWordMemory describes memory min..max (ASL QWordMemory).
func QWordMemory(min, max uint64, cache Cacheability, writable bool) AddressSpace {
	return producerRange(64, AddressMemory, memoryFlags(cache, writable), min, max)
}

func memoryFlags(cache Cacheability, writable bool) uint8 {
	f := uint8(cache&3) << 1
	if writable {
		f |= 1
	}
	return f
}

func producerRange(bits int, t AddressType, typeFlags uint8, min, max uint64) AddressSpace {
	return AddressSpace{
		Bits: bits, Type: t, MinFixed: true, MaxFixed: true, TypeFlags: typeFlags,
		Min: min, Max: max, Length: max - min + 1,
	}
}

// AppendResource implements Resource.
func (r AddressSpace) AppendResource(dst []byte) ([]byte, error) {
	var tag byte
	switch r.Bits {
	case 16:
		tag = tagWordAddress
	case 32:
		tag = tagDWordAddress
	case 64:
		tag = tagQWordAddress
	default:
		return nil, fmt.Errorf("acpi: address space descriptor of %d bits, want 16, 32 or 64", r.Bits)
	}
	if r.Type > AddressBusNumber {
		return nil, fmt.Errorf("acpi: address space resource type %d", r.Type)
	}
	if r.Min > r.Max {
		return nil, fmt.Errorf("acpi: address space min %#x above max %#x", r.Min, r.Max)
	}
	vals := []uint64{r.Granularity, r.Min, r.Max, r.Translation, r.Length}
	if r.Bits < 64 {
		for _, v := range vals {
			if v>>r.Bits != 0 {
				return nil, fmt.Errorf("acpi: address space value %#x does not fit %d bits", v, r.Bits)
			}
		}
	}
	var general byte
	for i, set := range []bool{r.Consumer, r.Subtractive, r.MinFixed, r.MaxFixed} {
		if set {
			general |= 1 << i
		}
	}
	size := r.Bits / 8
	dst = binary.LittleEndian.AppendUint16(append(dst, tag), uint16(3+5*size))
	dst = append(dst, byte(r.Type), general, r.TypeFlags)
	for _, v := range vals {
		switch size {
		case 2:
			dst = binary.LittleEndian.AppendUint16(dst, uint16(v))
		case 4:
			dst = binary.LittleEndian.AppendUint32(dst, uint32(v))
		default:
			dst = binary.LittleEndian.AppendUint64(dst, v)
		}
	}
	return dst, nil
}
