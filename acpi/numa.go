package acpi

import "encoding/binary"

// SRAT (§5.2.16), revision 3.
const (
	sratRevision      = 3
	sratLocalAPIC     = 0 // §5.2.16.1, for APIC IDs up to MaxXAPICID
	sratMemory        = 1 // §5.2.16.2
	sratLocalX2APIC   = 2 // §5.2.16.3
	sratEnabled       = 1 << 0
	sratHotpluggable  = 1 << 1
	sratReservedOne   = 1 // first reserved field, "must be 1" for compatibility
	slitLocalDistance = 10
)

// srat builds the resource affinity table: the proximity domain of every
// CPU and memory range. CPUs get the same entry type split as the MADT
// (type 0 up to MaxXAPICID, type 2 above; type 2 for all when allX2APIC) so
// both tables describe each CPU the same way.
func srat(oemTableID string, cpus []CPU, mem []MemoryRange) ([]byte, error) {
	body := binary.LittleEndian.AppendUint32(nil, sratReservedOne)
	body = binary.LittleEndian.AppendUint64(body, 0)
	onlyX2 := allX2APIC(cpus)
	for _, cpu := range cpus {
		d := cpu.Node
		if cpu.APICID <= MaxXAPICID && !onlyX2 {
			body = append(body, sratLocalAPIC, 16, byte(d), byte(cpu.APICID))
			body = binary.LittleEndian.AppendUint32(body, sratEnabled)
			body = append(body, 0, byte(d>>8), byte(d>>16), byte(d>>24)) // SAPIC EID, domain[31:8]
			body = binary.LittleEndian.AppendUint32(body, 0)             // clock domain
			continue
		}
		body = append(body, sratLocalX2APIC, 24, 0, 0)
		body = binary.LittleEndian.AppendUint32(body, d)
		body = binary.LittleEndian.AppendUint32(body, cpu.APICID)
		body = binary.LittleEndian.AppendUint32(body, sratEnabled)
		body = binary.LittleEndian.AppendUint32(body, 0) // clock domain
		body = binary.LittleEndian.AppendUint32(body, 0)
	}
	for _, m := range mem {
		body = append(body, sratMemory, 40)
		body = binary.LittleEndian.AppendUint32(body, m.Node)
		body = binary.LittleEndian.AppendUint16(body, 0)
		body = binary.LittleEndian.AppendUint64(body, m.Base) // low and high dwords
		body = binary.LittleEndian.AppendUint64(body, m.Size)
		body = binary.LittleEndian.AppendUint32(body, 0)
		flags := uint32(sratEnabled)
		if m.Hotpluggable {
			flags |= sratHotpluggable
		}
		body = binary.LittleEndian.AppendUint32(body, flags)
		body = binary.LittleEndian.AppendUint64(body, 0)
	}
	return table(header{Signature: "SRAT", Revision: sratRevision}, oemTableID, body)
}

// slit builds the System Locality Information Table (§5.2.17): the N×N
// relative distance matrix, row i holding the distances from domain i.
func slit(oemTableID string, dist [][]uint8) ([]byte, error) {
	body := binary.LittleEndian.AppendUint64(nil, uint64(len(dist)))
	for _, row := range dist {
		body = append(body, row...)
	}
	return table(header{Signature: "SLIT", Revision: 1}, oemTableID, body)
}
