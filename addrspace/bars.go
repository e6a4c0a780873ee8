package addrspace

import (
	"cmp"
	"fmt"
	"math/bits"
	"slices"
)

// BARKind says which window a BAR goes in.
type BARKind uint8

// The BAR kinds Plan places.
const (
	Mem32 BARKind = iota // 32-bit memory BAR: the 32-bit window
	Mem64                // 64-bit memory BAR: the 64-bit window
	IO                   // I/O BAR: the I/O window
)

func (k BARKind) String() string {
	switch k {
	case Mem32:
		return "32-bit memory"
	case Mem64:
		return "64-bit memory"
	case IO:
		return "I/O"
	}
	return fmt.Sprintf("BARKind(%d)", uint8(k))
}

// BAR is one BAR to place: its owner and index (for messages), kind and
// size (a power of two, as BAR sizing dictates).
type BAR struct {
	Owner string
	Index int
	Kind  BARKind
	Size  uint64
	// Prefetchable is the BAR's prefetchable bit. It matters only behind a
	// bridge, where a 64-bit prefetchable BAR goes in the bridge's 64-bit
	// prefetchable window and every other memory BAR in its 32-bit one.
	Prefetchable bool
	// Behind is the bridge whose secondary side the BAR's device sits on
	// (PlanHierarchy); nil is the root bus.
	Behind *Bridge
}

// minMMIOAlign keeps every memory BAR on its own page so a passthrough BAR
// can be mapped directly and small emulated BARs never share a page.
const minMMIOAlign = 4096

// Allocator hands out naturally aligned ranges from one window, the way
// firmware places BARs: each at the lowest free address aligned to its size,
// so a small BAR fills the alignment gap a large one left below it.
type Allocator struct {
	name     string
	window   Range
	minAlign uint64
	used     []Range // sorted by GPA, non-overlapping
}

// NewAllocator returns an allocator over window. Memory windows align every
// range to at least 4 KiB; I/O windows (io true) only naturally.
func NewAllocator(name string, window Range, io bool) (*Allocator, error) {
	if window.Size == 0 || window.GPA+window.Size < window.GPA {
		return nil, fmt.Errorf("addrspace: window %s: invalid range %#x+%#x", name, window.GPA, window.Size)
	}
	a := &Allocator{name: name, window: window, minAlign: minMMIOAlign}
	if io {
		a.minAlign = 4
	}
	return a, nil
}

// Alloc returns the lowest free address in the window aligned to size (a
// power of two) where size bytes fit.
func (a *Allocator) Alloc(size uint64) (uint64, error) {
	if bits.OnesCount64(size) != 1 {
		return 0, fmt.Errorf("addrspace: allocate %#x bytes from %s: size is not a power of two", size, a.name)
	}
	return a.AllocAligned(size, size)
}

// AllocAligned returns the lowest free address in the window aligned to
// align (a power of two; the window's minimum alignment applies too) where
// size bytes fit. Bridge windows need it: their size is a multiple of 1 MiB
// (4 KiB for I/O) but not a power of two, and their alignment is that of
// the largest BAR inside.
func (a *Allocator) AllocAligned(size, align uint64) (uint64, error) {
	if size == 0 || bits.OnesCount64(align) != 1 {
		return 0, fmt.Errorf("addrspace: allocate %#x bytes aligned to %#x from %s: want a non-zero size and a power-of-two alignment", size, align, a.name)
	}
	align = max(align, a.minAlign)
	end := a.window.End()
	at := AlignUp(a.window.GPA, align)
	pos := len(a.used)
	for i, u := range a.used {
		if at <= end && end-at >= size && at+size <= u.GPA {
			pos = i
			break
		}
		if u.End() > at {
			at = AlignUp(u.End(), align)
		}
	}
	if at < a.window.GPA || at > end || end-at < size {
		return 0, fmt.Errorf("addrspace: allocate %#x bytes from %s %s: window full", size, a.name, a.window)
	}
	a.used = slices.Insert(a.used, pos, Range{GPA: at, Size: size})
	return at, nil
}

// End returns the end of the highest allocated range (the window's start
// when nothing is allocated).
func (a *Allocator) End() uint64 {
	if len(a.used) == 0 {
		return a.window.GPA
	}
	return a.used[len(a.used)-1].End()
}

// Window returns the allocator's window.
func (a *Allocator) Window() Range { return a.window }

// AlignUp rounds v up to a multiple of align (a power of two), saturating
// at the highest multiple below 2^64 instead of wrapping: the one rounding
// helper of the project (BAR and window placement here, ACPI table layout,
// preflight's suggested sizes).
func AlignUp(v, align uint64) uint64 {
	if v > ^uint64(0)-(align-1) {
		return ^uint64(0) &^ (align - 1)
	}
	return (v + align - 1) &^ (align - 1)
}

// PlanError is Plan's error: the BAR that did not fit and how much of its
// window the BARs of that kind need.
type PlanError struct {
	BAR    BAR
	Window Range
	// Need is the bytes of window the BARs of this kind would need from the
	// window's start, placed by the same rule with no end (0 if unknown).
	Need uint64
}

func (e *PlanError) Error() string {
	return fmt.Sprintf("addrspace: %s BAR%d (%s, %#x bytes) does not fit the %s window %s: the %s BARs need %#x bytes of it",
		e.BAR.Owner, e.BAR.Index, e.BAR.Kind, e.BAR.Size, e.BAR.Kind, e.Window, e.BAR.Kind, e.Need)
}

// Plan places bars in w, largest first so natural alignment wastes least,
// each at the lowest free aligned address of its window (NewAllocator). It
// returns the address of each BAR in input order, or a *PlanError for the
// first that does not fit. Both the VM (pci.Root.AssignBARs) and preflight
// call it, so they agree on every layout.
func Plan(w Windows, bars []BAR) ([]uint64, error) {
	allocs := map[BARKind]*Allocator{}
	for kind, r := range map[BARKind]Range{Mem32: w.Mem32, Mem64: w.Mem64, IO: w.IO} {
		if r.Size == 0 {
			continue
		}
		a, err := NewAllocator(kind.String()+" window", r, kind == IO)
		if err != nil {
			return nil, err
		}
		allocs[kind] = a
	}
	order := make([]int, len(bars))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(bars[b].Size, bars[a].Size) })
	addrs := make([]uint64, len(bars))
	for _, i := range order {
		b := bars[i]
		a := allocs[b.Kind]
		if a == nil {
			return nil, fmt.Errorf("addrspace: %s BAR%d (%s, %#x bytes): the guest has no %s window", b.Owner, b.Index, b.Kind, b.Size, b.Kind)
		}
		addr, err := a.Alloc(b.Size)
		if err != nil {
			if bits.OnesCount64(b.Size) != 1 {
				return nil, fmt.Errorf("addrspace: %s BAR%d: %w", b.Owner, b.Index, err)
			}
			return nil, &PlanError{BAR: b, Window: a.window, Need: need(a.window.GPA, bars, b.Kind)}
		}
		addrs[i] = addr
	}
	return addrs, nil
}

// need returns how many bytes from start the BARs of kind take when placed
// with no upper limit.
func need(start uint64, bars []BAR, kind BARKind) uint64 {
	var sized []BAR
	for _, b := range bars {
		if b.Kind == kind {
			sized = append(sized, b)
		}
	}
	slices.SortStableFunc(sized, func(a, b BAR) int { return cmp.Compare(b.Size, a.Size) })
	a := &Allocator{name: "unbounded", window: Range{GPA: start, Size: ^uint64(0) - start}, minAlign: minMMIOAlign}
	if kind == IO {
		a.minAlign = 4
	}
	for _, b := range sized {
		if _, err := a.Alloc(b.Size); err != nil {
			return 0
		}
	}
	return a.End() - start
}
