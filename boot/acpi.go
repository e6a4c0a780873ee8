package boot

import (
	"fmt"
	"slices"
)

// ACPI table placement: the legacy BIOS area [ACPIAreaStart, HighMemStart),
// inside the range E820Map already reports as reserved. The RSDP must lie
// on a 16-byte boundary there for kernels that scan for it instead of
// reading boot_params.acpi_rsdp_addr.
const (
	ACPIAreaStart = 0xe0000
	ACPIAreaSize  = HighMemStart - ACPIAreaStart
)

// ACPI is the table set Load writes instead of the MP table.
type ACPI struct {
	// RSDPAddr is the RSDP's guest-physical address.
	RSDPAddr uint64
	// Regions are the table bytes and where they go, all inside
	// [ACPIAreaStart, HighMemStart).
	Regions []ACPIRegion
}

// ACPIRegion is a run of table bytes at a guest-physical address.
type ACPIRegion struct {
	GPA  uint64
	Data []byte
}

// validateFirmwareTables checks the MP table (without ACPI) or the ACPI
// regions (with it) fit where they go.
func validateFirmwareTables(p Params) error {
	if p.ACPI == nil {
		return validateMP(MPTableAddr, p.CPUs, p.MP)
	}
	if p.ACPI.RSDPAddr%16 != 0 || p.ACPI.RSDPAddr < ACPIAreaStart || p.ACPI.RSDPAddr+36 > HighMemStart {
		return fmt.Errorf("boot: ACPI RSDP at %#x: must be 16-byte aligned in [%#x, %#x)", p.ACPI.RSDPAddr, ACPIAreaStart, HighMemStart)
	}
	for _, r := range p.ACPI.Regions {
		if r.GPA < ACPIAreaStart || r.GPA > HighMemStart || uint64(len(r.Data)) > HighMemStart-r.GPA {
			return fmt.Errorf("boot: ACPI tables [%#x, %#x) do not fit the %d KiB at [%#x, %#x): fewer vCPUs or NUMA nodes",
				r.GPA, r.GPA+uint64(len(r.Data)), ACPIAreaSize>>10, ACPIAreaStart, HighMemStart)
		}
	}
	return nil
}

// withReserved adds reserved ranges and persistent-memory ranges (outside
// RAM) to a memory map, keeping it sorted by address.
func withReserved(e820 []E820Entry, reserved []E820Entry, pmem []RAMRange) []E820Entry {
	if len(reserved) == 0 && len(pmem) == 0 {
		return e820
	}
	out := slices.Clone(e820)
	for _, r := range reserved {
		r.Type = E820Reserved
		out = append(out, r)
	}
	for _, p := range pmem {
		out = append(out, E820Entry{Addr: p.GPA, Size: p.Size, Type: E820PRAM})
	}
	slices.SortStableFunc(out, func(a, b E820Entry) int {
		switch {
		case a.Addr < b.Addr:
			return -1
		case a.Addr > b.Addr:
			return 1
		}
		return 0
	})
	return out
}
