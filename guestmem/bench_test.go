package guestmem

import (
	"fmt"
	"testing"
)

// BenchmarkPrefault measures New end to end (memfd, reservation, prefault,
// unmap) by page size and worker count and reports the prefault rate.
// Sizes whose hugepage pool is short are skipped with the reason.
func BenchmarkPrefault(b *testing.B) {
	for _, c := range []struct {
		ps   PageSize
		size uint64
	}{
		{Page4K, 256 * mib},
		{Page2M, 256 * mib},
		{Page1G, 2 * gib},
	} {
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/workers=%d", c.ps, workers), func(b *testing.B) {
				if c.ps.hugetlb() {
					skipUnlessPool(b, c.ps, int64(c.size/uint64(c.ps)))
				}
				b.SetBytes(int64(c.size))
				var total float64
				for b.Loop() {
					m, err := New(Options{Size: c.size, PageSize: c.ps, Node: -1, Workers: workers})
					if err != nil {
						b.Fatal(err)
					}
					d, _ := m.PrefaultStats()
					total += d.Seconds()
					if err := m.Close(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(c.size)*float64(b.N)/gib/total, "GiB/s")
			})
		}
	}
}

// BenchmarkSlice is the per-access cost device models pay; it must not
// allocate.
func BenchmarkSlice(b *testing.B) {
	m := newSmall(b, 4*mib)
	b.ReportAllocs()
	var sink byte
	for i := 0; b.Loop(); i++ {
		s, err := m.Slice(uint64(i%1024)*4096, 16)
		if err != nil {
			b.Fatal(err)
		}
		sink += s[0]
	}
	_ = sink
}
