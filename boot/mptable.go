package boot

import (
	"encoding/binary"
	"fmt"
)

// Intel MultiProcessor Specification 1.4 structures (chapter 4). Linux finds
// the floating pointer by scanning, among others, the last KiB of base
// memory (0x9fc00), and reads CPUs, the IOAPIC and ISA IRQ routing from the
// configuration table when there is no ACPI.
const (
	mpfSize         = 16 // floating pointer structure
	mpcHeaderSize   = 44 // configuration table header
	mpcCPUSize      = 20
	mpcBusSize      = 8
	mpcIOAPICSize   = 8
	mpcIntSrcSize   = 8
	mpcLIntSrcSize  = 8
	mpSpecRev       = 4 // MP spec 1.4
	mpEntryCPU      = 0
	mpEntryBus      = 1
	mpEntryIOAPIC   = 2
	mpEntryIntSrc   = 3
	mpEntryLIntSrc  = 4
	mpCPUEnabled    = 1 << 0
	mpCPUBSP        = 1 << 1
	mpIOAPICEnabled = 1 << 0
	// lapicVersion is what KVM's in-kernel local APIC reports in its version
	// register (an integrated xAPIC).
	lapicVersion = 0x14
	// cpuSignature/cpuFeatures describe a generic family-6 CPU with an FPU
	// and a local APIC; Linux takes the real values from CPUID.
	cpuSignature = 6 << 8
	cpuFeatures  = 1<<0 | 1<<9
	// lapicAllDest addresses a local interrupt entry to every local APIC.
	lapicAllDest = 0xff
	// ISABusID is the bus ID of the ISA bus in the MP table.
	ISABusID = 0
	// IOAPICVersion is the version the MP table reports for the IOAPIC (the
	// 82093AA-compatible IOAPIC KVM emulates).
	IOAPICVersion = 0x11
	// IOAPICPins is the number of redirection entries of KVM's IOAPIC.
	IOAPICPins = 24
	// MaxCPUs is the largest vCPU count the MP table can describe: APIC IDs
	// are 8 bits, 0xff is the broadcast ID, and the IOAPIC takes the ID
	// after the last CPU.
	MaxCPUs = 254
	// ISAIRQs is the number of legacy ISA IRQ lines routed to the IOAPIC.
	ISAIRQs = 16
)

// MP interrupt types (the "interrupt type" byte of I/O and local interrupt
// assignment entries).
const (
	// MPIntINT is a vectored interrupt whose vector comes from the APIC
	// redirection table.
	MPIntINT = 0
	// MPIntNMI is a non-maskable interrupt.
	MPIntNMI = 1
	// MPIntSMI is a system management interrupt.
	MPIntSMI = 2
	// MPIntExtINT is a vectored interrupt whose vector comes from the 8259.
	MPIntExtINT = 3
)

// MP interrupt flags: polarity in bits 0-1, trigger mode in bits 2-3. Zero
// means "conforms to the bus" (ISA: active high, edge).
const (
	MPPolarityActiveHigh = 0x1
	MPPolarityActiveLow  = 0x3
	MPTriggerEdge        = 0x1 << 2
	MPTriggerLevel       = 0x3 << 2
)

var (
	mpfSignature = []byte("_MP_")
	mpcSignature = []byte("PCMP")
	mpOEMID      = []byte("HPCVMM  ")     // 8 bytes, space padded
	mpProductID  = []byte("HPCVMM      ") // 12 bytes
)

// MPBus is an extra bus entry, e.g. {ID: 0, Type: "PCI"} once there is a PCI
// root complex (with MPOptions.ISABus moved off 0). Type is at most 6 characters (MP spec table 4-8 bus type
// strings) and is padded with spaces.
type MPBus struct {
	ID   uint8
	Type string
}

// MPInterrupt is an extra I/O interrupt assignment entry routing a bus
// interrupt to a pin of the (single) IOAPIC.
type MPInterrupt struct {
	// Type is one of MPIntINT, MPIntNMI, MPIntSMI, MPIntExtINT.
	Type uint8
	// Flags combine an MPPolarity* and an MPTrigger* value; 0 conforms to
	// the bus (PCI wants MPPolarityActiveLow|MPTriggerLevel).
	Flags uint16
	// SrcBus is the ID of the source bus (MPOptions.ISABus or one of
	// MPOptions.Buses).
	SrcBus uint8
	// SrcIRQ is the ISA IRQ or, on PCI, (device<<2)|(INTx pin - 1).
	SrcIRQ uint8
	// DstPin is the IOAPIC input (INTIN#), below IOAPICPins.
	DstPin uint8
}

// MPOptions extends the default MP table. The zero value gives the table
// WriteMPTable writes.
type MPOptions struct {
	// IRQ0Pin is the IOAPIC pin ISA IRQ 0 (the PIT) arrives on: 0 (the
	// default) matches KVM's default GSI routing, where the in-kernel PIT
	// raises GSI 0 and GSI n goes to IOAPIC pin n (as Firecracker and
	// crosvm describe it). Use 2 only if the VMM installs QEMU-style routing
	// (GSI 0 -> pin 2); IRQ 2, the 8259 cascade, then gets no entry, like the
	// MP spec's default configurations.
	IRQ0Pin uint8
	// ISABus is the ISA bus's ID (default ISABusID, 0). A table with PCI
	// buses must give PCI bus 0 the ID 0 and move ISA (e.g. to 1, where
	// SeaBIOS puts it after the PCI buses): Linux looks a PCI device's
	// INTx entry up by comparing the device's bus number with the MP bus
	// ID (IO_APIC_get_PCI_irq_vector), so a PCI bus with another ID
	// leaves every PCI INTx without an IRQ.
	ISABus uint8
	// Buses are added after the ISA bus.
	Buses []MPBus
	// Interrupts are added after the ISA IRQ 0-15 entries.
	Interrupts []MPInterrupt
}

// MPTableSize returns the number of bytes WriteMPTableWithOptions writes for
// cpus processors: the floating pointer plus the configuration table.
func MPTableSize(cpus int, opts MPOptions) int {
	isa := ISAIRQs
	if opts.IRQ0Pin == 2 {
		isa-- // no entry for the cascade IRQ 2
	}
	return mpfSize + mpcHeaderSize + cpus*mpcCPUSize + (1+len(opts.Buses))*mpcBusSize +
		mpcIOAPICSize + (isa+len(opts.Interrupts))*mpcIntSrcSize + 2*mpcLIntSrcSize
}

// WriteMPTable writes an MP spec 1.4 floating pointer at addr, followed
// directly by the configuration table: one enabled processor per vCPU (APIC
// ID i, the bootstrap flag on CPU 0), the ISA bus, one IOAPIC (ID cpus at
// 0xfec00000), ISA IRQs 0-15 on IOAPIC pins 0-15, and LINT0 as ExtINT /
// LINT1 as NMI on every local APIC (virtual wire mode).
func WriteMPTable(mem Memory, addr uint64, cpus int) error {
	return WriteMPTableWithOptions(mem, addr, cpus, MPOptions{})
}

// WriteMPTableWithOptions is WriteMPTable with extra buses and interrupt
// entries (see MPOptions). It is over 100 lines because it writes the MP
// table's entries in the order the specification fixes (processors, buses,
// I/O APIC, interrupts), so it reads as the table does.
func WriteMPTableWithOptions(mem Memory, addr uint64, cpus int, opts MPOptions) error {
	if err := validateMP(addr, cpus, opts); err != nil {
		return err
	}
	size := MPTableSize(cpus, opts)
	buf := make([]byte, size)
	le := binary.LittleEndian
	cfgAddr := addr + mpfSize

	// Floating pointer: length in 16-byte units, feature byte 1 = 0 (a
	// configuration table is present), feature byte 2 bit 7 clear (no IMCR:
	// virtual wire mode).
	mpf := buf[:mpfSize]
	copy(mpf, mpfSignature)
	le.PutUint32(mpf[4:], uint32(cfgAddr))
	mpf[8] = 1
	mpf[9] = mpSpecRev

	cfg := buf[mpfSize:]
	off := mpcHeaderSize
	entries := 0
	put := func(n int) []byte {
		e := cfg[off : off+n]
		off += n
		entries++
		return e
	}
	// Entries must appear sorted by type (MP spec 4.3).
	for i := range cpus {
		e := put(mpcCPUSize)
		e[0] = mpEntryCPU
		e[1] = byte(i)
		e[2] = lapicVersion
		e[3] = mpCPUEnabled
		if i == 0 {
			e[3] |= mpCPUBSP
		}
		le.PutUint32(e[4:], cpuSignature)
		le.PutUint32(e[8:], cpuFeatures)
	}
	buses := append([]MPBus{{ID: opts.ISABus, Type: "ISA"}}, opts.Buses...)
	for _, b := range buses {
		e := put(mpcBusSize)
		e[0] = mpEntryBus
		e[1] = b.ID
		copy(e[2:8], "      ")
		copy(e[2:8], b.Type)
	}
	ioapicID := byte(cpus)
	e := put(mpcIOAPICSize)
	e[0] = mpEntryIOAPIC
	e[1] = ioapicID
	e[2] = IOAPICVersion
	e[3] = mpIOAPICEnabled
	le.PutUint32(e[4:], IOAPICAddr)

	intSrc := func(in MPInterrupt) {
		e := put(mpcIntSrcSize)
		e[0] = mpEntryIntSrc
		e[1] = in.Type
		le.PutUint16(e[2:], in.Flags)
		e[4] = in.SrcBus
		e[5] = in.SrcIRQ
		e[6] = ioapicID
		e[7] = in.DstPin
	}
	for irq := range uint8(ISAIRQs) {
		pin := irq
		if opts.IRQ0Pin == 2 {
			if irq == 2 {
				continue
			}
			if irq == 0 {
				pin = 2
			}
		}
		intSrc(MPInterrupt{Type: MPIntINT, SrcBus: opts.ISABus, SrcIRQ: irq, DstPin: pin})
	}
	for _, in := range opts.Interrupts {
		intSrc(in)
	}
	for lint, typ := range []byte{MPIntExtINT, MPIntNMI} {
		e := put(mpcLIntSrcSize)
		e[0] = mpEntryLIntSrc
		e[1] = typ
		e[4] = opts.ISABus
		e[5] = 0
		e[6] = lapicAllDest
		e[7] = byte(lint)
	}
	if off != len(cfg) {
		// MPTableSize and the writer above disagree: a programming error,
		// reported instead of writing a table with a wrong length.
		return fmt.Errorf("boot: MP table: wrote %d bytes, expected %d", off, len(cfg))
	}

	copy(cfg, mpcSignature)
	le.PutUint16(cfg[4:], uint16(len(cfg)))
	cfg[6] = mpSpecRev
	copy(cfg[8:16], mpOEMID)
	copy(cfg[16:28], mpProductID)
	le.PutUint16(cfg[34:], uint16(entries))
	le.PutUint32(cfg[36:], LAPICAddr)
	cfg[7] = checksum(cfg)
	mpf[10] = checksum(mpf)

	return writeGuest(mem, addr, buf, "MP table")
}

func validateMP(addr uint64, cpus int, opts MPOptions) error {
	if cpus < 1 || cpus > MaxCPUs {
		return fmt.Errorf("boot: MP table: %d vCPUs is outside 1..%d (8-bit APIC IDs, one left for the IOAPIC): choose fewer --cpus", cpus, MaxCPUs)
	}
	if addr%16 != 0 {
		return fmt.Errorf("boot: MP table: address 0x%x is not 16-byte aligned, so Linux's scan would miss the floating pointer", addr)
	}
	if end := addr + uint64(MPTableSize(cpus, opts)); end > 1<<32 || end < addr {
		return fmt.Errorf("boot: MP table at 0x%x does not fit below 4 GiB (the floating pointer holds a 32-bit address)", addr)
	}
	if MPTableSize(cpus, opts)-mpfSize > 0xffff {
		return fmt.Errorf("boot: MP table for %d vCPUs with %d buses and %d extra interrupts exceeds the 64 KiB base table", cpus, len(opts.Buses), len(opts.Interrupts))
	}
	if opts.IRQ0Pin != 0 && opts.IRQ0Pin != 2 {
		return fmt.Errorf("boot: MP table: IRQ0Pin %d: ISA IRQ 0 can only go to IOAPIC pin 0 or 2", opts.IRQ0Pin)
	}
	known := map[uint8]bool{opts.ISABus: true}
	for _, b := range opts.Buses {
		if known[b.ID] {
			return fmt.Errorf("boot: MP table: bus ID %d (%q) is used twice", b.ID, b.Type)
		}
		if len(b.Type) == 0 || len(b.Type) > 6 {
			return fmt.Errorf("boot: MP table: bus %d type %q must be 1 to 6 characters (e.g. \"PCI\")", b.ID, b.Type)
		}
		known[b.ID] = true
	}
	for i, in := range opts.Interrupts {
		if !known[in.SrcBus] {
			return fmt.Errorf("boot: MP table: interrupt %d names source bus %d, which is not in the table", i, in.SrcBus)
		}
		if in.DstPin >= IOAPICPins {
			return fmt.Errorf("boot: MP table: interrupt %d targets IOAPIC pin %d, but the IOAPIC has %d pins", i, in.DstPin, IOAPICPins)
		}
		if in.Type > MPIntExtINT {
			return fmt.Errorf("boot: MP table: interrupt %d has type %d, not one of INT/NMI/SMI/ExtINT (0-3)", i, in.Type)
		}
	}
	return nil
}

// checksum returns the byte that makes b (with its checksum byte still 0)
// sum to zero modulo 256.
func checksum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return -s
}
