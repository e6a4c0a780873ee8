package pci

import (
	"fmt"
	"math/bits"
)

// Default guest windows (see docs/architecture.md, "Guest physical layout").
const (
	// Window32Base and Window32Size are the 32-bit MMIO window for 32-bit
	// BARs: [3 GiB, 3.5 GiB), below the ECAM window at ECAMBase.
	Window32Base = 0xc0000000
	Window32Size = ECAMBase - Window32Base
	// IOWindowBase and IOWindowSize are the port range for I/O BARs, above
	// every legacy ISA/platform port.
	IOWindowBase = 0xc000
	IOWindowSize = 0x4000

	// minMMIOAlign keeps every MMIO BAR on its own page so a passthrough BAR
	// can be mapped directly and small emulated BARs never share a page.
	minMMIOAlign = 4096
)

// Window64 returns the 64-bit MMIO window: from the first 1 GiB-aligned
// address at or above ramEnd (the end of the highest RAM range) up to the
// guest's physical address limit 1<<physBits.
func Window64(ramEnd uint64, physBits uint) (base, size uint64, err error) {
	if physBits < 33 || physBits > 52 {
		return 0, 0, fmt.Errorf("pci: 64-bit window: physical address bits %d outside 33-52", physBits)
	}
	const gib = 1 << 30
	base = (ramEnd + gib - 1) &^ (gib - 1)
	base = max(base, 1<<32)
	limit := uint64(1) << physBits
	if base >= limit {
		return 0, 0, fmt.Errorf("pci: 64-bit window: RAM ends at %#x, at or beyond the %d-bit physical limit; reduce guest memory", ramEnd, physBits)
	}
	return base, limit - base, nil
}

// Allocator hands out naturally aligned ranges from one window, the way
// firmware places BARs. It is a bump allocator: callers allocate largest
// first (Root.AssignBARs does) so alignment wastes nothing.
type Allocator struct {
	name      string
	base, end uint64
	next      uint64
	minAlign  uint64
}

// NewAllocator returns an allocator over [base, base+size). Memory windows
// align every range to at least 4 KiB; I/O windows (io true) only naturally.
func NewAllocator(name string, base, size uint64, io bool) (*Allocator, error) {
	if size == 0 || base+size < base {
		return nil, fmt.Errorf("pci: window %s: invalid range %#x+%#x", name, base, size)
	}
	a := &Allocator{name: name, base: base, end: base + size, next: base, minAlign: minMMIOAlign}
	if io {
		a.minAlign = 4
	}
	return a, nil
}

// Alloc returns the lowest free address aligned to size (a power of two).
func (a *Allocator) Alloc(size uint64) (uint64, error) {
	if bits.OnesCount64(size) != 1 {
		return 0, fmt.Errorf("pci: allocate %#x bytes from %s: size is not a power of two", size, a.name)
	}
	align := max(size, a.minAlign)
	addr := (a.next + align - 1) &^ (align - 1)
	if addr < a.next || addr > a.end || a.end-addr < size {
		return 0, fmt.Errorf("pci: allocate %#x bytes from %s [%#x, %#x): window full (next free %#x)", size, a.name, a.base, a.end, a.next)
	}
	a.next = addr + size
	return addr, nil
}

// Range returns the allocator's window.
func (a *Allocator) Range() (base, end uint64) { return a.base, a.end }
