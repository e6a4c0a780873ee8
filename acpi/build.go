package acpi

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
)

// Table is one built table and the guest-physical address it is laid out
// at.
type Table struct {
	Signature string // "RSD PTR " for the RSDP
	Addr      uint64
	Data      []byte
}

// Tables is the table set of a VM.
//
// The caller copies Blob to guest memory at Base and RSDP.Data to
// RSDP.Addr, reserves [Base, Base+len(Blob)) in the e820 map (type 3, ACPI
// reclaimable, or reserved), and hands RSDP.Addr to the kernel in
// boot_params.acpi_rsdp_addr and/or places it in the BIOS scan area. When
// Platform.RSDPAddr is zero the RSDP is the first table of the blob
// (RSDP.Addr == Base) and copying it again is harmless.
type Tables struct {
	RSDP Table
	Base uint64
	Blob []byte
	// Tables lists the tables in the blob in address order: DSDT, FACP,
	// APIC, MCFG, SRAT, SLIT (without NoNUMATables), XSDT; and the RSDP
	// first when it lives in the blob.
	Tables []Table
}

// Find returns the table with signature sig ("DSDT", "APIC", ...).
func (t *Tables) Find(sig string) (Table, bool) {
	if sig == t.RSDP.Signature {
		return t.RSDP, true
	}
	for _, tb := range t.Tables {
		if tb.Signature == sig {
			return tb, true
		}
	}
	return Table{}, false
}

// tableAlign aligns every table in the blob; 16 keeps an in-blob RSDP on
// the boundary the BIOS-area scan uses (§5.2.5.1).
const tableAlign = 16

// Build lays out the ACPI tables of p contiguously from guest-physical
// base. It reports an error for an inconsistent Platform: no CPUs,
// duplicate APIC IDs, overlapping memory, an empty bus range, windows out of
// range, GSIs off the IOAPIC, a bad distance matrix, an RSDP overlapping the
// blob. It is long on purpose: one table after another in the blob's order,
// each placed where the FADT and XSDT (written last) point.
func Build(p Platform, base uint64) (Tables, error) {
	if err := p.validate(); err != nil {
		return Tables{}, fmt.Errorf("acpi: %w", err)
	}
	if base%tableAlign != 0 {
		return Tables{}, fmt.Errorf("acpi: table base %#x is not %d-byte aligned", base, tableAlign)
	}
	oem := p.OEMTableID
	if oem == "" {
		oem = defaultOEMTable
	}

	aml, err := Encode(dsdtTerms(&p)...)
	if err != nil {
		return Tables{}, err
	}
	dsdt, err := table(header{Signature: "DSDT", Revision: 2}, oem, aml)
	if err != nil {
		return Tables{}, err
	}
	listed, err := listedTables(&p, oem)
	if err != nil {
		return Tables{}, err
	}

	// Lay out: [RSDP] DSDT FACP <listed> XSDT, sizes first since the FADT
	// and XSDT hold addresses.
	next := base
	place := func(size int) uint64 {
		at := next
		next = addrspace.AlignUp(next+uint64(size), tableAlign)
		return at
	}
	rsdpAddr := p.RSDPAddr
	inBlob := rsdpAddr == 0
	if inBlob {
		rsdpAddr = place(RSDPLen)
	}
	dsdtAddr := place(len(dsdt))
	fadtAddr := place(fadtLen)
	for i := range listed {
		listed[i].Addr = place(len(listed[i].Data))
	}
	xsdtAddr := place(HeaderLen + 8*(1+len(listed)))
	end := next
	if end < base {
		return Tables{}, fmt.Errorf("acpi: tables at %#x wrap the address space", base)
	}
	if !inBlob && rsdpAddr < end && rsdpAddr+RSDPLen > base {
		return Tables{}, fmt.Errorf("acpi: RSDP at %#x overlaps the tables at [%#x, %#x)", rsdpAddr, base, end)
	}

	fc := fadtConfig{
		oemTableID: oem, dsdt: dsdtAddr,
		i8042: p.Legacy.I8042, cmosRTC: p.Legacy.CMOSRTC,
	}
	if p.Reset.Port != 0 {
		g := ioByteRegister(p.Reset.Port)
		fc.reset, fc.resetValue = &g, p.Reset.Value
	}
	if p.Sleep.ControlPort != 0 {
		ctl, st := ioByteRegister(p.Sleep.ControlPort), ioByteRegister(p.Sleep.StatusPort)
		fc.sleepCtl, fc.sleepStatus = &ctl, &st
	}
	facp, err := fadt(fc)
	if err != nil {
		return Tables{}, err
	}
	addrs := []uint64{fadtAddr}
	for _, t := range listed {
		addrs = append(addrs, t.Addr)
	}
	x, err := xsdt(oem, addrs)
	if err != nil {
		return Tables{}, err
	}

	out := Tables{Base: base, RSDP: Table{Signature: "RSD PTR ", Addr: rsdpAddr, Data: rsdp(xsdtAddr)}}
	if inBlob {
		out.Tables = append(out.Tables, out.RSDP)
	}
	out.Tables = append(out.Tables,
		Table{Signature: "DSDT", Addr: dsdtAddr, Data: dsdt},
		Table{Signature: "FACP", Addr: fadtAddr, Data: facp})
	out.Tables = append(out.Tables, listed...)
	out.Tables = append(out.Tables, Table{Signature: "XSDT", Addr: xsdtAddr, Data: x})
	out.Blob = make([]byte, end-base)
	for _, t := range out.Tables {
		copy(out.Blob[t.Addr-base:], t.Data)
	}
	return out, nil
}

// listedTables builds the tables the XSDT lists after the FADT, in the
// blob's order and not yet placed: APIC and MCFG, then SRAT and SLIT unless
// p.NoNUMATables.
func listedTables(p *Platform, oem string) ([]Table, error) {
	apic, err := madt(madtConfig{oemTableID: oem, cpus: p.CPUs, ioapic: p.IOAPIC, irq0ToGSI2: p.ISAIRQ0ToGSI2})
	if err != nil {
		return nil, err
	}
	mcfgT, err := mcfg(oem, p.PCI.ECAMBase, p.PCI.BusStart, p.PCI.BusEnd)
	if err != nil {
		return nil, err
	}
	listed := []Table{{Signature: "APIC", Data: apic}, {Signature: "MCFG", Data: mcfgT}}
	if !p.NoNUMATables {
		sratT, err := srat(oem, p.CPUs, p.Memory)
		if err != nil {
			return nil, err
		}
		slitT, err := slit(oem, p.distances())
		if err != nil {
			return nil, err
		}
		listed = append(listed, Table{Signature: "SRAT", Data: sratT}, Table{Signature: "SLIT", Data: slitT})
	}
	return listed, nil
}
