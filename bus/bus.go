// Package bus dispatches guest port-I/O and MMIO accesses to the device that
// owns the address.
//
// Lookups run on every vCPU exit, so they take no lock and allocate nothing:
// the ranges are an immutable sorted slice found by binary search, replaced
// copy-on-write when a device is added or the guest moves a PCI BAR (rare,
// and possibly on another vCPU's thread while this one dispatches). Addresses no device claims are reported
// to the caller, which decides what an unhandled access means (reads return
// all ones on x86).
package bus

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
)

// Device is the guest-visible behaviour behind one registered address range.
// Offsets are relative to the start of the range. data is the exact access
// width (1, 2, 4 or 8 bytes for CPU accesses); a Read fills it, a Write
// consumes it. Implementations must treat every access as untrusted guest
// input: any offset inside the range and any width may arrive.
//
// Read and Write are called concurrently: each vCPU thread dispatches its
// own exits with no lock of the bus held, so two vCPUs may be in the same
// device at once (and a device goroutine or the host side may be too). A
// device guards its own state (a mutex annotated for checklocks, or
// atomics), must not block on the guest, and must not allocate per access:
// this is the exit path.
type Device interface {
	Read(offset uint64, data []byte)
	Write(offset uint64, data []byte)
}

// Range is one registered address window.
type Range struct {
	Base   uint64
	Size   uint64
	Name   string
	Device Device
}

// End returns the first address after the range.
func (r Range) End() uint64 { return r.Base + r.Size }

// Bus maps address ranges to devices. The zero value is an empty bus. All
// methods are safe for concurrent use.
type Bus struct {
	mu     sync.Mutex              // serialises Register/Unregister
	ranges atomic.Pointer[[]Range] // sorted by Base, non-overlapping; never mutated once stored
}

// snapshot returns the current ranges; callers must not modify them.
func (b *Bus) snapshot() []Range {
	if p := b.ranges.Load(); p != nil {
		return *p
	}
	return nil
}

// Register claims [base, base+size) for dev. Overlapping an existing range or
// a zero size is an error: two devices answering one address is always a
// wiring bug in the VMM, never something to resolve silently.
func (b *Bus) Register(base, size uint64, name string, dev Device) error {
	if size == 0 {
		return fmt.Errorf("bus: register %s: zero-sized range at %#x", name, base)
	}
	if base+size < base {
		return fmt.Errorf("bus: register %s: range %#x+%#x wraps the address space", name, base, size)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.snapshot()
	r := Range{Base: base, Size: size, Name: name, Device: dev}
	i := sort.Search(len(cur), func(i int) bool { return cur[i].Base >= base })
	if i > 0 && cur[i-1].End() > base {
		p := cur[i-1]
		return fmt.Errorf("bus: register %s at %#x-%#x: overlaps %s at %#x-%#x", name, base, r.End()-1, p.Name, p.Base, p.End()-1)
	}
	if i < len(cur) && cur[i].Base < r.End() {
		n := cur[i]
		return fmt.Errorf("bus: register %s at %#x-%#x: overlaps %s at %#x-%#x", name, base, r.End()-1, n.Name, n.Base, n.End()-1)
	}
	next := make([]Range, 0, len(cur)+1)
	next = append(append(append(next, cur[:i]...), r), cur[i:]...)
	b.ranges.Store(&next)
	return nil
}

// Unregister removes the range that starts at base, reporting whether one
// was there. Used when the guest moves a PCI BAR.
func (b *Bus) Unregister(base uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	cur := b.snapshot()
	i := sort.Search(len(cur), func(i int) bool { return cur[i].Base >= base })
	if i == len(cur) || cur[i].Base != base {
		return false
	}
	next := make([]Range, 0, len(cur)-1)
	next = append(append(next, cur[:i]...), cur[i+1:]...)
	b.ranges.Store(&next)
	return true
}

// find returns the range containing the whole access [addr, addr+n), if any.
func (b *Bus) find(addr uint64, n int) (*Range, bool) {
	// Hand-written binary search: sort.Search takes a closure, which would
	// escape and allocate on this per-exit path.
	ranges := b.snapshot()
	lo, hi := 0, len(ranges)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if ranges[mid].End() <= addr {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == len(ranges) {
		return nil, false
	}
	r := &ranges[lo]
	if addr < r.Base || addr+uint64(n) > r.End() || addr+uint64(n) < addr {
		return nil, false
	}
	return r, true
}

// Read dispatches a read of len(data) bytes at addr. It returns false, with
// data untouched, when no single device owns the whole access.
func (b *Bus) Read(addr uint64, data []byte) bool {
	r, ok := b.find(addr, len(data))
	if !ok {
		return false
	}
	r.Device.Read(addr-r.Base, data)
	return true
}

// Write dispatches a write of data at addr. It returns false when no single
// device owns the whole access.
func (b *Bus) Write(addr uint64, data []byte) bool {
	r, ok := b.find(addr, len(data))
	if !ok {
		return false
	}
	r.Device.Write(addr-r.Base, data)
	return true
}

// Ranges returns a copy of the registered ranges in address order, for
// diagnostics.
func (b *Bus) Ranges() []Range { return append([]Range(nil), b.snapshot()...) }
