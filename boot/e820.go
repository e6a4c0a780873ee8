package boot

import "fmt"

// E820 region types (boot_e820_entry.type).
const (
	// E820RAM is usable RAM.
	E820RAM = 1
	// E820Reserved is memory the OS must not use.
	E820Reserved = 2
	// E820PRAM is legacy persistent memory (E820_TYPE_PRAM): Linux's
	// nd_e820 driver makes each such range a pmem region, which nd_pmem
	// turns into /dev/pmemN. hpcvmm describes a read-only image this way
	// (Params.PMEM).
	E820PRAM = 12
)

// PMEMAlign is the alignment of a persistent-memory range's base and size:
// the guest's nd_pmem maps the region with memremap_pages, which maps whole
// 2 MiB subsections on x86 (addrspace.PMEMSizeAlign says more).
const PMEMAlign = 2 << 20

// E820Entry is one region of the BIOS-style memory map handed to the kernel
// in the zero page.
type E820Entry struct {
	Addr, Size uint64
	Type       uint32
}

// End returns the first address after the entry.
func (e E820Entry) End() uint64 { return e.Addr + e.Size }

// RAMRange is one contiguous range of guest RAM, as laid out by guestmem.
type RAMRange struct {
	GPA, Size uint64
}

// End returns the first address after the range.
func (r RAMRange) End() uint64 { return r.GPA + r.Size }

// E820Map builds the memory map for the given RAM ranges (ascending,
// non-overlapping, the first starting at 0). The legacy hole
// [0x9fc00, 0x100000) - EBDA, VGA memory and BIOS ROM on a PC, and where the
// MP table lives here - is carved out of the first range and reported as
// reserved, so the kernel never allocates over the MP table. Empty ranges are
// skipped. Load validates the ranges first; E820Map itself does not judge
// them.
func E820Map(ram []RAMRange) []E820Entry {
	out := make([]E820Entry, 0, len(ram)+2)
	carved := false
	for _, r := range ram {
		if r.Size == 0 {
			continue
		}
		if !carved && r.GPA == 0 {
			carved = true
			end := r.End()
			out = append(out, E820Entry{Addr: 0, Size: min(end, EBDAStart), Type: E820RAM})
			out = append(out, E820Entry{Addr: EBDAStart, Size: HighMemStart - EBDAStart, Type: E820Reserved})
			if end > HighMemStart {
				out = append(out, E820Entry{Addr: HighMemStart, Size: end - HighMemStart, Type: E820RAM})
			}
			continue
		}
		carved = true
		out = append(out, E820Entry{Addr: r.GPA, Size: r.Size, Type: E820RAM})
	}
	return out
}

// validatePMEM checks the persistent-memory ranges: each non-empty,
// PMEMAlign-aligned in base and size, not wrapping, overlapping neither
// RAM, the reserved ranges nor another.
func validatePMEM(pmem []RAMRange, ram []RAMRange, reserved []E820Entry) error {
	taken := make([]RAMRange, 0, len(ram)+len(reserved)+len(pmem))
	taken = append(taken, ram...)
	for _, r := range reserved {
		taken = append(taken, RAMRange{GPA: r.Addr, Size: r.Size})
	}
	for i, p := range pmem {
		switch {
		case p.Size == 0:
			return fmt.Errorf("boot: persistent memory range %d at %#x is empty", i, p.GPA)
		case p.End() < p.GPA:
			return fmt.Errorf("boot: persistent memory range %d [%#x +%#x) wraps around the address space", i, p.GPA, p.Size)
		case p.GPA%PMEMAlign != 0 || p.Size%PMEMAlign != 0:
			return fmt.Errorf("boot: persistent memory range %d [%#x +%#x) is not 2 MiB-aligned in base and size, which the guest's pmem driver needs", i, p.GPA, p.Size)
		}
		for _, t := range taken {
			if p.GPA < t.End() && t.GPA < p.End() {
				return fmt.Errorf("boot: persistent memory range %d [%#x, %#x) overlaps [%#x, %#x) of RAM or a reserved range", i, p.GPA, p.End(), t.GPA, t.End())
			}
		}
		taken = append(taken, p)
	}
	return nil
}

// validateRAM checks the shape E820Map and Load rely on and returns the end
// of the low RAM range (the one starting at 0), where every boot structure,
// the kernel and the initrd must fit.
func validateRAM(ram []RAMRange) (lowEnd uint64, err error) {
	if len(ram) == 0 {
		return 0, fmt.Errorf("boot: RAM layout is empty: the VM needs guest memory")
	}
	if ram[0].GPA != 0 {
		return 0, fmt.Errorf("boot: RAM layout starts at 0x%x: the low RAM range must start at guest-physical 0", ram[0].GPA)
	}
	for i, r := range ram {
		if r.Size == 0 {
			return 0, fmt.Errorf("boot: RAM range %d at 0x%x is empty", i, r.GPA)
		}
		if r.End() < r.GPA {
			return 0, fmt.Errorf("boot: RAM range %d [0x%x +0x%x) wraps around the address space", i, r.GPA, r.Size)
		}
		if i > 0 && r.GPA < ram[i-1].End() {
			return 0, fmt.Errorf("boot: RAM range %d at 0x%x overlaps or precedes range %d ending at 0x%x: ranges must be ascending and disjoint", i, r.GPA, i-1, ram[i-1].End())
		}
	}
	lowEnd = ram[0].End()
	if lowEnd <= HighMemStart {
		return 0, fmt.Errorf("boot: low RAM ends at 0x%x, below 1 MiB: give the VM more --memory", lowEnd)
	}
	if lowEnd > 1<<32 {
		return 0, fmt.Errorf("boot: low RAM range ends at 0x%x, above 4 GiB: it must stop at the 32-bit PCI hole", lowEnd)
	}
	return lowEnd, nil
}
