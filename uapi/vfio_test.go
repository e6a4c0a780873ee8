package uapi

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// capBuf builds an info buffer: a fixed part of fixed bytes followed by
// capabilities, each linked to the next, the way the kernel lays them out.
type capBuf struct {
	b    []byte
	last int // offset of the last capability header, 0 for none
}

func newCapBuf(fixed int) *capBuf { return &capBuf{b: make([]byte, fixed)} }

func (c *capBuf) add(id, version uint16, body []byte) int {
	off := len(c.b)
	hdr := make([]byte, 8)
	binary.LittleEndian.PutUint16(hdr, id)
	binary.LittleEndian.PutUint16(hdr[2:], version)
	c.b = append(c.b, hdr...)
	c.b = append(c.b, body...)
	if c.last != 0 {
		binary.LittleEndian.PutUint32(c.b[c.last+4:], uint32(off))
	}
	c.last = off
	return off
}

func u32s(v ...uint32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], x)
	}
	return b
}

func u64s(v ...uint64) []byte {
	b := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

// regionInfo builds a vfio_region_info for a 16 KiB BAR with a sparse mmap
// capability (two areas around an MSI-X page) and MSIX_MAPPABLE.
func regionInfo() []byte {
	c := newCapBuf(int(sizeofVFIORegionInfo))
	first := c.add(VFIORegionInfoCapSparseMmap, 1, append(u32s(2, 0), u64s(0, 0x1000, 0x2000, 0x2000)...))
	c.add(VFIORegionInfoCapMSIXMappable, 1, nil)
	c.add(VFIORegionInfoCapType, 1, u32s(0x80001234, 7))
	b := c.b
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(b)))
	le.PutUint32(b[4:], VFIORegionInfoFlagRead|VFIORegionInfoFlagWrite|VFIORegionInfoFlagMmap|VFIORegionInfoFlagCaps)
	le.PutUint32(b[8:], 2)
	le.PutUint32(b[12:], uint32(first))
	le.PutUint64(b[16:], 0x4000)
	le.PutUint64(b[24:], 2<<40)
	return b
}

func TestParseVFIORegionInfoCaps(t *testing.T) {
	info, err := ParseVFIORegionInfo(regionInfo())
	require.NoError(t, err)
	assert.Equal(t, uint32(2), info.Index)
	assert.Equal(t, uint64(0x4000), info.Size)
	assert.Equal(t, uint64(2<<40), info.Offset)
	assert.True(t, info.Sparse)
	assert.True(t, info.MSIXMappable)
	assert.Equal(t, []VFIOSparseArea{{0, 0x1000}, {0x2000, 0x2000}}, info.Areas)
	assert.Equal(t, info.Areas, info.MmapAreas())
	assert.Equal(t, uint32(0x80001234), info.Type)
	assert.Equal(t, uint32(7), info.Subtype)
}

func TestParseVFIORegionInfoNoCaps(t *testing.T) {
	b := regionInfo()
	binary.LittleEndian.PutUint32(b[4:], VFIORegionInfoFlagRead|VFIORegionInfoFlagMmap)
	info, err := ParseVFIORegionInfo(b)
	require.NoError(t, err)
	assert.False(t, info.Sparse)
	assert.Equal(t, []VFIOSparseArea{{0, 0x4000}}, info.MmapAreas(), "mmappable without sparse cap: whole region")
	binary.LittleEndian.PutUint32(b[4:], VFIORegionInfoFlagRead)
	info, err = ParseVFIORegionInfo(b)
	require.NoError(t, err)
	assert.Empty(t, info.MmapAreas())
}

func TestParseVFIORegionInfoMalformed(t *testing.T) {
	_, err := ParseVFIORegionInfo(make([]byte, 8))
	assert.ErrorContains(t, err, "want at least")

	b := regionInfo()
	binary.LittleEndian.PutUint32(b[int(sizeofVFIORegionInfo)+4:], uint32(sizeofVFIORegionInfo)) // first cap links to itself
	_, err = ParseVFIORegionInfo(b)
	assert.ErrorContains(t, err, "loops")

	b = regionInfo()
	binary.LittleEndian.PutUint32(b[12:], 8) // cap inside the fixed struct
	_, err = ParseVFIORegionInfo(b)
	assert.ErrorContains(t, err, "outside")

	b = regionInfo()
	binary.LittleEndian.PutUint32(b[int(sizeofVFIORegionInfo)+8:], 1000) // nr_areas too large
	_, err = ParseVFIORegionInfo(b)
	assert.ErrorContains(t, err, "claims 1000 areas")

	b = regionInfo()
	binary.LittleEndian.PutUint64(b[int(sizeofVFIORegionInfo)+16+16:], 0x3000) // second area offset: 0x3000+0x2000 > 0x4000
	_, err = ParseVFIORegionInfo(b)
	assert.ErrorContains(t, err, "outside the 0x4000-byte region")
}

func TestParseVFIOIOMMUInfo(t *testing.T) {
	c := newCapBuf(int(sizeofVFIOIOMMUInfo))
	first := c.add(VFIOIOMMUType1InfoCapIOVA, 1, append(u32s(2, 0), u64s(0, 0xfedfffff, 0xfef00000, 1<<39-1)...))
	c.add(VFIOIOMMUType1InfoCapMigrate, 1, make([]byte, 24))
	c.add(VFIOIOMMUType1InfoDMAAvail, 1, u32s(65535, 0))
	b := c.b
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(b)))
	le.PutUint32(b[4:], VFIOIOMMUInfoPgsizes|VFIOIOMMUInfoCaps)
	le.PutUint64(b[8:], 0x40201000) // 4K, 2M, 1G
	le.PutUint32(b[16:], uint32(first))
	info, err := ParseVFIOIOMMUInfo(b)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x40201000), info.PageSizes)
	assert.Equal(t, []VFIOIOVARange{{0, 0xfedfffff}, {0xfef00000, 1<<39 - 1}}, info.IOVARanges)
	assert.True(t, info.HasDMAAvail)
	assert.Equal(t, uint32(65535), info.DMAAvail)

	le.PutUint32(b[4:], VFIOIOMMUInfoPgsizes) // no caps flag: chain ignored
	info, err = ParseVFIOIOMMUInfo(b)
	require.NoError(t, err)
	assert.Empty(t, info.IOVARanges)
	assert.False(t, info.HasDMAAvail)
}

// FuzzParseVFIOInfo feeds arbitrary bytes to both capability-chain parsers:
// they must never panic.
func FuzzParseVFIOInfo(f *testing.F) {
	f.Add(regionInfo())
	f.Add(make([]byte, 64))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = ParseVFIORegionInfo(b)
		if len(b) >= 8 {
			b[4] |= VFIOIOMMUInfoCaps
		}
		_, _ = ParseVFIOIOMMUInfo(b)
	})
}

func TestOpenVFIOErrorsNamePath(t *testing.T) {
	p := filepath.Join(t.TempDir(), "vfio")
	_, err := OpenVFIOContainerPath(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Contains(t, err.Error(), "vfio-pci")
	_, err = OpenVFIOGroupPath(filepath.Join(t.TempDir(), "7"), 7)
	assert.ErrorContains(t, err, "/7")
}

// TestVFIOContainerLive exercises the container ioctls that need no device
// when the host has VFIO.
func TestVFIOContainerLive(t *testing.T) {
	c, err := OpenVFIOContainer()
	if err != nil {
		t.Skipf("no VFIO container on this host: %v", err)
	}
	defer c.Close()
	v, err := c.APIVersion()
	require.NoError(t, err)
	assert.Equal(t, VFIOAPIVersion, v)
	_, err = c.CheckExtension(VFIOType1v2IOMMU)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "second close is a no-op")
}

func TestMmapAlignment(t *testing.T) {
	assert.Equal(t, 4096, mmapAlignment(1))
	assert.Equal(t, 4096, mmapAlignment(4096))
	assert.Equal(t, 8192, mmapAlignment(12288))
	assert.Equal(t, 2<<20, mmapAlignment(3<<20))
	assert.Equal(t, 1<<30, mmapAlignment(1<<30))
	assert.Equal(t, 1<<30, mmapAlignment(128<<30), "capped at the largest x86 page")
}

// TestMmapLinesUpWithTheFileOffset maps a memfd the way Mmap maps a BAR
// and checks what large-page mappings depend on: the address agrees with
// the file offset modulo the alignment, the bytes are the file's, the
// mapping is exactly the asked size, and Munmap removes it.
func TestMmapLinesUpWithTheFileOffset(t *testing.T) {
	fd, err := unix.MemfdCreate("mmap-test", 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	const fileSize = 8 << 20
	require.NoError(t, unix.Ftruncate(fd, fileSize))
	_, err = unix.Pwrite(fd, []byte("marker"), 2<<20+4096)
	require.NoError(t, err)
	d := &VFIODevice{fd: fd, Name: "memfd"}
	for _, tc := range []struct{ off, size int }{
		{0, 4 << 20}, {2<<20 + 4096, 4096}, {4096, 2 << 20}, {2 << 20, 6 << 20},
	} {
		mem, err := d.Mmap(int64(tc.off), tc.size, unix.PROT_READ|unix.PROT_WRITE)
		require.NoError(t, err)
		require.Len(t, mem, tc.size)
		addr := uintptr(unsafe.Pointer(unsafe.SliceData(mem)))
		align := uintptr(mmapAlignment(tc.size))
		assert.Equal(t, uintptr(tc.off)%align, addr%align, "offset %#x size %#x", tc.off, tc.size)
		if tc.off <= 2<<20+4096 && 2<<20+4096 < tc.off+tc.size {
			i := 2<<20 + 4096 - tc.off
			assert.Equal(t, "marker", string(mem[i:i+6]))
		}
		var lo, hi uintptr
		line := mapsLine(t, addr)
		_, err = fmt.Sscanf(line, "%x-%x", &lo, &hi)
		require.NoError(t, err, line)
		assert.Equal(t, [2]uintptr{addr, addr + uintptr(tc.size)}, [2]uintptr{lo, hi}, "one mapping of exactly the asked size: %s", line)
		require.NoError(t, d.Munmap(mem))
		assert.NotContains(t, mapsLine(t, addr), "memfd:mmap-test")
	}
	_, err = d.Mmap(0, 0, unix.PROT_READ)
	assert.Error(t, err)
}

// mapsLine returns the /proc/self/maps line that contains addr, or "".
func mapsLine(t *testing.T, addr uintptr) string {
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for _, l := range strings.Split(string(maps), "\n") {
		var lo, hi uintptr
		if _, err := fmt.Sscanf(l, "%x-%x", &lo, &hi); err == nil && lo <= addr && addr < hi {
			return l
		}
	}
	return ""
}
