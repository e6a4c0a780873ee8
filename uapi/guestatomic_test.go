package uapi

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestAtomicUint16Fields(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	require.True(t, Aligned4(mem))
	assert.False(t, Aligned4(mem[2:6]), "starts at 2 mod 4")
	assert.False(t, Aligned4(mem[0:6]), "not whole words")
	assert.False(t, Aligned4(nil))

	b := mem[8:16]
	binary.LittleEndian.PutUint64(b, 0x8877665544332211)
	assert.Equal(t, uint16(0x2211), AtomicLoadUint16(b, 0))
	assert.Equal(t, uint16(0x4433), AtomicLoadUint16(b, 2))
	assert.Equal(t, uint16(0x6655), AtomicLoadUint16(b, 4))
	assert.Equal(t, uint16(0x8877), AtomicLoadUint16(b, 6))
	AtomicStoreUint16(b, 2, 0xbeef)
	AtomicStoreUint16(b, 4, 0xcafe)
	assert.Equal(t, uint64(0x8877cafebeef2211), binary.LittleEndian.Uint64(b), "only the field's bytes change")
	assert.Equal(t, uint64(0), binary.LittleEndian.Uint64(mem[0:]), "nothing outside the slice")
	assert.Equal(t, uint64(0), binary.LittleEndian.Uint64(mem[16:]))
}

// TestAtomicStoreUint16KeepsTheOtherHalf: another CPU (the guest) changes
// the other half of the word all along; no store may write back a stale
// copy of it. A store done as load-modify-store of the word loses some of
// the other side's increments.
func TestAtomicStoreUint16KeepsTheOtherHalf(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	w := (*uint32)(unsafe.Pointer(&mem[0]))
	const n = 200000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the "guest": increments the high half
		defer wg.Done()
		for i := 0; i < n; i++ {
			atomic.AddUint32(w, 1<<16)
		}
	}()
	for i := 0; i < n; i++ {
		AtomicStoreUint16(mem, 0, uint16(i))
	}
	wg.Wait()
	assert.Equal(t, uint16(n&0xffff), AtomicLoadUint16(mem, 2), "every increment of the other half survived")
	assert.Equal(t, uint16((n-1)&0xffff), AtomicLoadUint16(mem, 0))
}

func BenchmarkAtomicUint16(b *testing.B) {
	mem := make([]byte, 64)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		AtomicStoreUint16(mem, 2, uint16(i))
		if AtomicLoadUint16(mem, 2) != uint16(i) {
			b.Fatal("lost store")
		}
	}
}
