package uapi

import (
	"sync/atomic"
	"unsafe"
)

// Guest memory shared with a running guest is read and written by the
// guest's vCPUs concurrently with hpcvmm. The virtio ring indices and
// notification fields in it are 16-bit values the driver and device hand
// over with single loads and stores; a torn or compiler-split access would
// let the device see half an index. binary.LittleEndian on a byte slice
// happens to compile to one load on amd64 but promises nothing, and orders
// nothing. These helpers make each access one sync/atomic operation, which
// is atomic and sequentially consistent by the Go memory model.
//
// sync/atomic has no 16-bit operations, so a 16-bit field is reached
// through the naturally aligned 32-bit word that contains it: a load is
// one atomic 32-bit load and a shift; a store is a compare-and-swap loop
// on that word that replaces only the field's half, so the other half
// (which may be the guest's) is never overwritten with a stale value. The
// pointer conversion needs unsafe, which is why this lives in uapi, the
// one package allowed it.
//
// Callers pass a byte slice whose first byte is 4-byte aligned in memory
// (check once with Aligned4) and an even offset whose word lies inside it
// (off&^3+4 <= len(b)). Only little-endian hosts are supported (see doc.go:
// linux/amd64), so the field at the word's lower address is its low half.

// Aligned4 reports whether b is non-empty, starts at a 4-byte aligned
// address and is a whole number of 32-bit words long: what AtomicLoadUint16
// and AtomicStoreUint16 need of their slice.
func Aligned4(b []byte) bool {
	return len(b) > 0 && len(b)%4 == 0 && uintptr(unsafe.Pointer(&b[0]))%4 == 0
}

// word returns the aligned 32-bit word of b holding the 16-bit field at
// off. The slice expression bounds-checks it.
func word(b []byte, off uint64) *uint32 {
	w := off &^ 3
	return (*uint32)(unsafe.Pointer(&b[w : w+4 : w+4][0]))
}

// AtomicLoadUint16 returns the little-endian 16-bit field at b[off:off+2]
// with one atomic load of the word containing it. Allocation-free.
func AtomicLoadUint16(b []byte, off uint64) uint16 {
	return uint16(atomic.LoadUint32(word(b, off)) >> (8 * (off & 2)))
}

// AtomicStoreUint16 stores v to the little-endian 16-bit field at
// b[off:off+2] with one atomic compare-and-swap of the word containing it,
// leaving the word's other half as it is at that instant. Allocation-free.
func AtomicStoreUint16(b []byte, off uint64, v uint16) {
	p := word(b, off)
	shift := 8 * (off & 2)
	mask := uint32(0xffff) << shift
	for {
		old := atomic.LoadUint32(p)
		if atomic.CompareAndSwapUint32(p, old, old&^mask|uint32(v)<<shift) {
			return
		}
	}
}
