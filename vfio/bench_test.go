package vfio

import "testing"

// BenchmarkTrappedBARAccess measures the exit-side work of the accesses
// that still trap: an MSI-X table read (emulated) and a register read in
// the MSI-X page forwarded to the device (one pread on a real device). Both
// must not allocate.
func BenchmarkTrappedBARAccess(b *testing.B) {
	f := h100(b, true)
	r := newRig(b, f, nil)
	defer r.dev.Close()
	h := r.dev.BARHandler(0)
	var buf [4]byte
	b.Run("msix-table-read", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			h.Read(0xb90000+uint64(i%9)*16, buf[:])
		}
	})
	b.Run("msix-table-mask-write", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			buf[0] = 1
			h.Write(0xb9000c, buf[:]) // vector 0 stays masked: no routing change
		}
	})
	b.Run("forwarded-register-read", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			h.Read(0xb90800, buf[:])
		}
	})
}
