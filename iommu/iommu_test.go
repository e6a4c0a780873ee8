package iommu

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/uapi"
)

type call struct {
	op         string
	iova, size uint64
}

// fakeBackend records calls and fails the failAt-th MapDMA (1-based).
type fakeBackend struct {
	info   uapi.VFIOIOMMUInfo
	calls  []call
	maps   int
	failAt int
	closed int
}

func (f *fakeBackend) IOMMUInfo() (uapi.VFIOIOMMUInfo, error) { return f.info, nil }
func (f *fakeBackend) MapDMA(iova uint64, mem []byte, flags uint32) error {
	f.maps++
	if f.maps == f.failAt {
		return errors.New("ENOMEM")
	}
	if flags != uapi.VFIODMAMapFlagRead|uapi.VFIODMAMapFlagWrite {
		return fmt.Errorf("unexpected flags %#x", flags)
	}
	f.calls = append(f.calls, call{"map", iova, uint64(len(mem))})
	return nil
}
func (f *fakeBackend) UnmapDMA(iova, size uint64) (uint64, error) {
	f.calls = append(f.calls, call{"unmap", iova, size})
	return size, nil
}
func (f *fakeBackend) Close() error { f.closed++; return nil }

// x86Info is what an Intel IOMMU with 39-bit addressing reports: 4K/2M/1G
// pages, the MSI window carved out.
func x86Info() uapi.VFIOIOMMUInfo {
	return uapi.VFIOIOMMUInfo{
		Flags: uapi.VFIOIOMMUInfoPgsizes | uapi.VFIOIOMMUInfoCaps, PageSizes: 1<<12 | 1<<21 | 1<<30,
		IOVARanges:  []uapi.VFIOIOVARange{{Start: 0, End: 0xfedfffff}, {Start: 0xfef00000, End: 1<<39 - 1}},
		DMAAvail:    65535,
		HasDMAAvail: true,
	}
}

func newFake(t *testing.T, info uapi.VFIOIOMMUInfo) (*Container, *fakeBackend) {
	f := &fakeBackend{info: info}
	c, err := NewWithBackend(f)
	require.NoError(t, err)
	return c, f
}

// untimed clears the mappings' durations, which vary from run to run.
func untimed(ms []Mapping) []Mapping {
	for i := range ms {
		ms[i].Took = 0
	}
	return ms
}

func ram(gpa uint64, n int) guestmem.Region { return guestmem.Region{GPA: gpa, Data: make([]byte, n)} }

func TestMapGuestRAMOneCallPerRegion(t *testing.T) {
	c, f := newFake(t, x86Info())
	regions := []guestmem.Region{ram(0, 64<<10), ram(4<<30, 32<<10)}
	require.NoError(t, c.MapGuestRAM(regions))
	assert.Equal(t, uint64(2), c.MapCalls())
	assert.Equal(t, []call{{"map", 0, 64 << 10}, {"map", 4 << 30, 32 << 10}}, f.calls)
	assert.Equal(t, []Mapping{{0, 64 << 10, GuestRAM, "ram0", 0}, {4 << 30, 32 << 10, GuestRAM, "ram1", 0}}, untimed(c.Mappings()))
	m, ok := c.Mapping(4 << 30)
	assert.True(t, ok)
	assert.Equal(t, "ram1", m.Name)
	_, ok = c.Mapping(4096)
	assert.False(t, ok, "no mapping starts at 4096")

	require.NoError(t, c.Close())
	assert.Equal(t, []call{{"unmap", 4 << 30, 32 << 10}, {"unmap", 0, 64 << 10}}, f.calls[2:], "Close unmaps newest first")
	assert.Equal(t, 1, f.closed)
	require.NoError(t, c.Close())
	assert.Equal(t, 1, f.closed, "second Close is a no-op")
	assert.Error(t, c.MapGuestRAM(regions))
}

func TestMapGuestRAMChecksIOVARanges(t *testing.T) {
	c, f := newFake(t, x86Info())
	// 4 KiB straddling the 39-bit limit.
	err := c.MapGuestRAM([]guestmem.Region{ram(0, 4096), ram(1<<39-4096, 8192)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outside the container's usable IOVA ranges [0x0, 0xfedfffff], [0xfef00000, 0x7fffffffff]")
	assert.Contains(t, err.Error(), "39 bits")
	assert.Empty(t, f.calls, "nothing mapped when any region fails the check")
	assert.Zero(t, c.MapCalls())

	// The MSI window is not mappable.
	err = c.MapBAR(0xfee00000, make([]byte, 4096), "dev BAR0")
	assert.ErrorContains(t, err, "outside the container's usable IOVA ranges")
}

func TestMapGuestRAMChecksPageSize(t *testing.T) {
	info := x86Info()
	info.PageSizes = 1 << 21 // 2 MiB granularity only
	c, f := newFake(t, info)
	err := c.MapGuestRAM([]guestmem.Region{ram(0, 64<<10)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not aligned to the IOMMU page size 0x200000")
	assert.Empty(t, f.calls)
	assert.Equal(t, uint64(1<<21), c.PageSize())
}

func TestMapGuestRAMRollsBackOnFailure(t *testing.T) {
	c, f := newFake(t, x86Info())
	f.failAt = 2
	err := c.MapGuestRAM([]guestmem.Region{ram(0, 4096), ram(4<<30, 4096)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "region 1 [0x100000000, 0x100001000)")
	assert.Equal(t, []call{{"map", 0, 4096}, {"unmap", 0, 4096}}, f.calls)
	assert.Empty(t, c.Mappings())
}

func TestMapGuestRAMRejectsOverlapsAndLimits(t *testing.T) {
	c, _ := newFake(t, x86Info())
	assert.ErrorContains(t, c.MapGuestRAM([]guestmem.Region{ram(0, 8192), ram(4096, 4096)}), "overlap")
	require.NoError(t, c.MapGuestRAM([]guestmem.Region{ram(0, 8192)}))
	assert.ErrorContains(t, c.MapBAR(4096, make([]byte, 4096), "gpu BAR1"), `overlaps existing guest RAM mapping "ram0"`)
	assert.ErrorContains(t, c.MapGuestRAM([]guestmem.Region{{GPA: 1 << 20}}), "empty range")

	info := x86Info()
	info.DMAAvail = 1
	c2, _ := newFake(t, info)
	assert.ErrorContains(t, c2.MapGuestRAM([]guestmem.Region{ram(0, 4096), ram(1<<20, 4096)}), "accepts only 1 more mappings")
}

func TestMapBARAndUnmap(t *testing.T) {
	c, f := newFake(t, uapi.VFIOIOMMUInfo{}) // an old kernel: no ranges, no page sizes
	require.NoError(t, c.MapBAR(64<<30, make([]byte, 16<<10), "00:04.0 BAR2"))
	assert.Equal(t, uint64(1), c.MapCalls())
	assert.Equal(t, []Mapping{{64 << 30, 16 << 10, BAR, "00:04.0 BAR2", 0}}, untimed(c.Mappings()))
	assert.ErrorContains(t, c.Unmap(1), "no mapping starts there")
	require.NoError(t, c.Unmap(64<<30))
	assert.Empty(t, c.Mappings())
	assert.Equal(t, call{"unmap", 64 << 30, 16 << 10}, f.calls[len(f.calls)-1])
}

func TestAddGroupNeedsVFIO(t *testing.T) {
	c, _ := newFake(t, x86Info())
	_, err := c.AddGroup(3)
	assert.ErrorContains(t, err, "no VFIO backend")
	_, err = Open(Options{ContainerPath: t.TempDir() + "/vfio"})
	assert.ErrorContains(t, err, "modprobe vfio-pci")
}
