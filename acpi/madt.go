package acpi

import "encoding/binary"

// MADT (§5.2.12), revision 5 (ACPI 6.4-6.5 layout of the entries used).
const (
	madtRevision = 5
	// LocalAPICAddr is where every local APIC is mapped (the x86 default).
	LocalAPICAddr  = 0xfee00000
	madtPCATCompat = 1 << 0 // dual 8259s present; Linux masks them

	madtLocalAPIC      = 0 // §5.2.12.2
	madtIOAPIC         = 1 // §5.2.12.3
	madtIntOverride    = 2 // §5.2.12.5
	madtLocalAPICNMI   = 4 // §5.2.12.7
	madtLocalX2APIC    = 9 // §5.2.12.12
	madtLocalX2APICNMI = 10

	// MPS INTI flags (§5.2.12.5, Table 5.26): 0 means "conforms to the
	// bus", for ISA edge triggered and active high.
	intiConforms = 0

	lapicEnabled = 1 << 0
	// allProcessors8/32 address an NMI entry to every processor.
	allProcessors8  = 0xff
	allProcessors32 = 0xffffffff
	lint1           = 1 // LINT1 is wired to NMI on a PC
)

// MaxXAPICID is the largest APIC ID a Processor Local APIC entry (type 0)
// carries. 0xff is the xAPIC broadcast ID, so, as the spec's compatibility
// note in §5.2.12.12 asks and Linux enforces (acpi_parse_x2apic ignores
// x2APIC entries with IDs below 255 when Local APIC entries exist, since
// v6.9), IDs 0-254 get type 0 entries and 255 and up type 9 entries.
const MaxXAPICID = 0xfe

// madtConfig is what the MADT describes.
type madtConfig struct {
	oemTableID string
	cpus       []CPU
	ioapic     IOAPIC
	irq0ToGSI2 bool
}

// allX2APIC reports whether every CPU must be described by x2APIC entries
// (MADT type 9, SRAT type 2): when a CPU with an APIC ID up to MaxXAPICID
// comes at index 255 or later, its Processor Local APIC entry could not
// carry its UID (8 bits). That happens past 255 CPUs whenever APIC IDs are
// not in index order, e.g. a mirrored SMT topology that numbers every
// core's first thread before the second threads, as firmware does. With no
// type 0 entry in the table, Linux takes x2APIC entries of any ID (it
// ignores those below 255 only beside Local APIC entries), and the guest
// starts in x2APIC mode, as it must for IDs above 254 anyway.
func allX2APIC(cpus []CPU) bool {
	for i, cpu := range cpus {
		if i >= allProcessors8 && cpu.APICID <= MaxXAPICID {
			return true
		}
	}
	return false
}

// madt builds the interrupt controller table: one entry per CPU (UID = its
// index in cpus), the IOAPIC, ISA overrides and LINT1 NMI entries. There is
// no SCI override: a hardware-reduced platform has no SCI (§4.1).
func madt(c madtConfig) ([]byte, error) {
	body := binary.LittleEndian.AppendUint32(nil, LocalAPICAddr)
	body = binary.LittleEndian.AppendUint32(body, madtPCATCompat)
	x2, xapic := false, false
	onlyX2 := allX2APIC(c.cpus)
	for i, cpu := range c.cpus {
		if cpu.APICID <= MaxXAPICID && !onlyX2 {
			xapic = true
			body = append(body, madtLocalAPIC, 8, byte(i), byte(cpu.APICID))
			body = binary.LittleEndian.AppendUint32(body, lapicEnabled)
			continue
		}
		x2 = true
		body = append(body, madtLocalX2APIC, 16, 0, 0)
		body = binary.LittleEndian.AppendUint32(body, cpu.APICID)
		body = binary.LittleEndian.AppendUint32(body, lapicEnabled)
		body = binary.LittleEndian.AppendUint32(body, uint32(i))
	}
	body = append(body, madtIOAPIC, 12, c.ioapic.ID, 0)
	body = binary.LittleEndian.AppendUint32(body, c.ioapic.Addr)
	body = binary.LittleEndian.AppendUint32(body, c.ioapic.GSIBase)
	if c.irq0ToGSI2 {
		// ISA IRQ 0 (the PIT) arrives on IOAPIC pin 2, as on a PC.
		body = append(body, madtIntOverride, 10, 0, 0)
		body = binary.LittleEndian.AppendUint32(body, 2)
		body = binary.LittleEndian.AppendUint16(body, intiConforms)
	}
	if xapic {
		body = append(body, madtLocalAPICNMI, 6, allProcessors8)
		body = binary.LittleEndian.AppendUint16(body, intiConforms)
		body = append(body, lint1)
	}
	if x2 {
		body = append(body, madtLocalX2APICNMI, 12)
		body = binary.LittleEndian.AppendUint16(body, intiConforms)
		body = binary.LittleEndian.AppendUint32(body, allProcessors32)
		body = append(body, lint1, 0, 0, 0)
	}
	return table(header{Signature: "APIC", Revision: madtRevision}, c.oemTableID, body)
}
