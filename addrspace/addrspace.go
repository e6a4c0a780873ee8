// Package addrspace is the one model of the guest-physical address space
// that every part of hpcvmm consults: where guest RAM sits around the 32-bit
// PCI hole, where the ECAM window and the 32-bit, 64-bit and I/O BAR windows
// are, and how BARs are placed in them. The VM places BARs with Plan and
// preflight predicts the same placement with the same call, so `hpcvmm
// check` and the VM cannot disagree about whether a set of devices fits.
//
// Layout (docs/architecture.md, "Guest physical layout"):
//
//	[0, 3 GiB)             RAM (less when the guest is smaller)
//	[3 GiB, 3.5 GiB)       32-bit MMIO window (Window32)
//	[3.5 GiB, 3.75 GiB)    ECAM, 256 buses
//	0xfeb00000             ACPI GED event register
//	0xfec00000, 0xfee00000 IOAPIC, LAPIC
//	[4 GiB, ...)           the rest of RAM
//	[1 GiB-aligned end of RAM, +image)       read-only image as pmem (PMEM), when there is one
//	[1 GiB-aligned end of the above, 2^physbits)  64-bit MMIO window
//
// It is pure arithmetic with no dependencies, so devices, preflight and the
// VM can all import it.
package addrspace

import "fmt"

// Fixed guest-physical addresses of the layout.
const (
	// PCIHoleStart is where RAM stops below 4 GiB: [PCIHoleStart, 4 GiB)
	// holds 32-bit BARs, ECAM, the IOAPIC and the LAPIC.
	PCIHoleStart = 3 << 30
	// HighRAMStart is where RAM beyond PCIHoleStart bytes continues.
	HighRAMStart = 4 << 30

	// Window32Base and Window32Size are the 32-bit MMIO window for 32-bit
	// BARs: [3 GiB, 3.5 GiB), below the ECAM window.
	Window32Base = PCIHoleStart
	Window32Size = ECAMBase - Window32Base

	// ECAMBase is where the PCIe enhanced configuration window goes: inside
	// the 32-bit hole, above Window32 and below the IOAPIC (0xfec00000).
	ECAMBase = 0xe0000000

	// GEDBase is the ACPI Generic Event Device's register block (package
	// platform's GED), between ECAM's end (0xf0000000) and the IOAPIC.
	GEDBase = 0xfeb00000

	// IOWindowBase and IOWindowSize are the port range for I/O BARs, above
	// every legacy ISA/platform port.
	IOWindowBase = 0xc000
	IOWindowSize = 0x4000
)

// MaxRAM is the largest guest RAM the layout holds: the high region must end
// below 2^52, the architectural limit of x86-64 physical addresses, so no
// address computation on the layout can wrap.
const MaxRAM = 1<<52 - (HighRAMStart - PCIHoleStart)

// Range is a guest-physical address range [GPA, GPA+Size).
type Range struct {
	GPA  uint64
	Size uint64
}

// End returns the first address after the range.
func (r Range) End() uint64 { return r.GPA + r.Size }

// String formats the range as "[start, end)" in hex.
func (r Range) String() string { return fmt.Sprintf("[%#x, %#x)", r.GPA, r.End()) }

// RAM returns where size bytes of guest RAM live: up to 3 GiB from address
// 0, the rest from 4 GiB. A zero size has no ranges.
func RAM(size uint64) []Range {
	switch {
	case size == 0:
		return nil
	case size <= PCIHoleStart:
		return []Range{{GPA: 0, Size: size}}
	default:
		return []Range{{GPA: 0, Size: PCIHoleStart}, {GPA: HighRAMStart, Size: size - PCIHoleStart}}
	}
}

// RAMEnd returns the first guest-physical address above size bytes of RAM.
func RAMEnd(size uint64) uint64 {
	r := RAM(size)
	if len(r) == 0 {
		return 0
	}
	return r[len(r)-1].End()
}

// Windows are the guest's BAR windows for one RAM size and physical address
// width, and where a read-only image sits between RAM and the 64-bit
// window.
type Windows struct {
	Mem32 Range // 32-bit memory BARs
	Mem64 Range // 64-bit memory BARs: above RAM (and PMEM), up to 2^physBits
	IO    Range // I/O BARs (ports)
	// PMEM is the read-only image's range (NewWindowsPMEM), empty without
	// one.
	PMEM Range
}

// Alignment of the read-only image's range (PMEM).
//
// The guest's nd_e820 turns the e820 type-12 range into one pmem region,
// and nd_pmem maps a region from e820 (ND_REGION_PAGEMAP) with
// memremap_pages, which maps whole memory-hotplug subsections on x86: 2 MiB
// (SUBSECTION_SIZE; memremap_compat_align() says so to libnvdimm, and the
// 128 MiB section rule is gone since Linux 5.3's subsection hotplug). A
// smaller size makes the guest's pmem probe fail. The size is therefore
// rounded up to 2 MiB. The base is 1 GiB-aligned, where the 64-bit window
// started before the image took its place, which is 2 MiB-aligned too and
// lets the guest's direct map use 1 GiB pages over it.
const (
	PMEMBaseAlign = 1 << 30
	PMEMSizeAlign = 2 << 20
)

// MaxPMEM bounds the image's size: with the largest RAM it must still
// end below 2^52, and no sum of the layout can wrap.
const MaxPMEM = 1 << 50

// PMEM returns the range NewWindowsPMEM gives a read-only image of image
// bytes in a guest with memory bytes of RAM (empty for no image), for
// callers that need it before the windows: the BARs' reserved ranges.
// Both sizes must be within MaxRAM and MaxPMEM.
func PMEM(memory, image uint64) Range {
	if image == 0 {
		return Range{}
	}
	base := max(AlignUp(RAMEnd(memory), PMEMBaseAlign), HighRAMStart)
	return Range{GPA: base, Size: AlignUp(image, PMEMSizeAlign)}
}

// NewWindows returns the BAR windows of a guest with memory bytes of RAM on
// a CPU with physBits physical address bits (the host's: the guest sees the
// same width, and large GPU BARs need all of it). The 64-bit window runs
// from the first 1 GiB-aligned address at or above both the end of RAM and
// 4 GiB up to 2^physBits.
func NewWindows(memory uint64, physBits uint) (Windows, error) {
	return NewWindowsPMEM(memory, 0, physBits)
}

// NewWindowsPMEM is NewWindows for a guest with a read-only image of
// image bytes mapped as persistent memory (0 for none): the image takes
// [b, b + image rounded up to PMEMSizeAlign) where b is the 1 GiB-aligned
// address at or above both the end of RAM and 4 GiB, and the 64-bit
// window starts at the next 1 GiB boundary above it. The image goes below
// the window rather than above it: the window runs to the top of the
// physical address space, and a guest kernel with 4-level paging maps
// physical memory only up to 2^46 (MAX_PHYSMEM_BITS), so pmem at the top of
// a wider space would be unusable.
func NewWindowsPMEM(memory, image uint64, physBits uint) (Windows, error) {
	if physBits < 33 || physBits > 52 {
		return Windows{}, fmt.Errorf("addrspace: physical address bits %d outside 33-52", physBits)
	}
	if memory > MaxRAM {
		return Windows{}, fmt.Errorf("addrspace: %d bytes of RAM exceed the layout's maximum %d", memory, uint64(MaxRAM))
	}
	if image > MaxPMEM {
		return Windows{}, fmt.Errorf("addrspace: a %d-byte image exceeds the layout's maximum %d", image, uint64(MaxPMEM))
	}
	ramEnd := RAMEnd(memory)
	base := max(AlignUp(ramEnd, PMEMBaseAlign), HighRAMStart)
	pmem := PMEM(memory, image)
	if image > 0 {
		base = AlignUp(pmem.End(), PMEMBaseAlign)
	}
	limit := uint64(1) << physBits
	if base >= limit {
		if image > 0 {
			return Windows{}, fmt.Errorf("addrspace: RAM and the %d-byte image end at %#x, at or beyond the %d-bit physical limit: reduce guest memory or the image", image, pmem.End(), physBits)
		}
		return Windows{}, fmt.Errorf("addrspace: RAM ends at %#x, at or beyond the %d-bit physical limit: reduce guest memory", ramEnd, physBits)
	}
	return Windows{
		Mem32: Range{GPA: Window32Base, Size: Window32Size},
		Mem64: Range{GPA: base, Size: limit - base},
		IO:    Range{GPA: IOWindowBase, Size: IOWindowSize},
		PMEM:  pmem,
	}, nil
}
