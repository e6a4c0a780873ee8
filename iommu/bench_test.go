package iommu

import (
	"fmt"
	"os"
	"strconv"
	"testing"

	"github.com/hpcvmm/hpcvmm/guestmem"
)

// BenchmarkMapGuestRAM measures DMA-mapping guest RAM of 1, 2 and 4 GiB
// backed by 4 KiB, 2 MiB and 1 GiB pages, one MAP_DMA per region, and
// reports the MAP_DMA calls per mapping. It needs a real IOMMU: set
// HPCVMM_VFIO_GROUP to the number of an IOMMU group whose devices are bound
// to vfio-pci (in the nested test bed: the edu device's group). Sizes or
// page sizes the host cannot provide are skipped.
func BenchmarkMapGuestRAM(b *testing.B) {
	gs := os.Getenv("HPCVMM_VFIO_GROUP")
	if gs == "" {
		b.Skip("set HPCVMM_VFIO_GROUP to a vfio-pci bound IOMMU group to benchmark real DMA mapping")
	}
	group, err := strconv.Atoi(gs)
	if err != nil {
		b.Fatalf("HPCVMM_VFIO_GROUP=%q: %v", gs, err)
	}
	c, err := Open(Options{})
	if err != nil {
		b.Skipf("no VFIO: %v", err)
	}
	defer c.Close()
	if _, err := c.AddGroup(group); err != nil {
		b.Fatal(err)
	}
	for _, size := range []uint64{1 << 30, 2 << 30, 4 << 30} {
		for _, ps := range []guestmem.PageSize{guestmem.Page1G, guestmem.Page2M, guestmem.Page4K} {
			b.Run(fmt.Sprintf("%dGiB/%s", size>>30, ps), func(b *testing.B) {
				mem, err := guestmem.New(guestmem.Options{Size: size, PageSize: ps, Node: -1})
				if err != nil {
					b.Skipf("guest RAM %d GiB with %s pages: %v", size>>30, ps, err)
				}
				defer mem.Close()
				b.ResetTimer()
				start := c.MapCalls()
				for i := 0; i < b.N; i++ {
					if err := c.MapGuestRAM(mem.Regions()); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					if err := c.UnmapAll(); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				b.ReportMetric(float64(c.MapCalls()-start)/float64(b.N), "MAP_DMA/op")
			})
		}
	}
}
