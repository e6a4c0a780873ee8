package addrspace_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

func TestRAM(t *testing.T) {
	type r = addrspace.Range
	cases := []struct {
		size uint64
		want []r
	}{
		{0, nil},
		{512 * mib, []r{{0, 512 * mib}}},
		{3 * gib, []r{{0, 3 * gib}}},
		{3*gib + 1, []r{{0, 3 * gib}, {4 * gib, 1}}},
		{3*gib + 2*mib, []r{{0, 3 * gib}, {4 * gib, 2 * mib}}},
		{20 * gib, []r{{0, 3 * gib}, {4 * gib, 17 * gib}}},
	}
	for _, c := range cases {
		got := addrspace.RAM(c.size)
		assert.Equal(t, c.want, got, "size %#x", c.size)
		var sum uint64
		for _, x := range got {
			sum += x.Size
			assert.False(t, x.GPA < addrspace.HighRAMStart && x.End() > addrspace.PCIHoleStart, "range %+v overlaps the PCI hole", x)
		}
		assert.Equal(t, c.size, sum)
	}
	assert.Equal(t, 21*gib, addrspace.RAMEnd(20*gib))
	assert.Equal(t, uint64(0), addrspace.RAMEnd(0))
}

func TestWindows(t *testing.T) {
	w, err := addrspace.NewWindows(1*gib, 39)
	require.NoError(t, err)
	assert.Equal(t, addrspace.Range{GPA: 3 * gib, Size: 512 * mib}, w.Mem32, "below ECAM")
	assert.Equal(t, addrspace.Range{GPA: 4 * gib, Size: 512*gib - 4*gib}, w.Mem64)
	assert.Equal(t, addrspace.Range{GPA: 0xc000, Size: 0x4000}, w.IO)

	w, err = addrspace.NewWindows(3*gib+1, 46)
	require.NoError(t, err)
	assert.Equal(t, 5*gib, w.Mem64.GPA, "1 GiB above the end of RAM (4 GiB + 1 byte)")

	_, err = addrspace.NewWindows(511*gib, 39) // RAM ends at 2^39
	assert.ErrorContains(t, err, "reduce guest memory")
	_, err = addrspace.NewWindows(gib, 32)
	assert.ErrorContains(t, err, "physical address bits 32")
}

func TestAllocatorFillsAlignmentGaps(t *testing.T) {
	a, err := addrspace.NewAllocator("w", addrspace.Range{GPA: 4 * gib, Size: 508 * gib}, false)
	require.NoError(t, err)
	at, err := a.Alloc(256 * gib)
	require.NoError(t, err)
	assert.Equal(t, 256*gib, at, "naturally aligned")
	at, err = a.Alloc(128 * gib)
	require.NoError(t, err)
	assert.Equal(t, 128*gib, at, "fills the gap below the first BAR")
	at, err = a.Alloc(64 * mib)
	require.NoError(t, err)
	assert.Equal(t, 4*gib, at, "lowest free address")
	at, err = a.Alloc(4)
	require.NoError(t, err)
	assert.Equal(t, 4*gib+64*mib, at, "memory windows align to at least 4 KiB")
	_, err = a.Alloc(256 * gib)
	assert.ErrorContains(t, err, "window full")
	_, err = a.Alloc(3 * mib)
	assert.ErrorContains(t, err, "not a power of two")
	assert.Equal(t, 512*gib, a.End())
}

func TestPlan(t *testing.T) {
	w, err := addrspace.NewWindows(gib, 39)
	require.NoError(t, err)
	bars := []addrspace.BAR{
		{Owner: "gpu", Index: 0, Kind: addrspace.Mem32, Size: 16 * mib},
		{Owner: "gpu", Index: 1, Kind: addrspace.Mem64, Size: 128 * gib},
		{Owner: "nic", Index: 0, Kind: addrspace.Mem64, Size: 256 * gib},
		{Owner: "nic", Index: 2, Kind: addrspace.IO, Size: 32},
		{Owner: "gpu", Index: 3, Kind: addrspace.Mem64, Size: 64 * mib},
	}
	addrs, err := addrspace.Plan(w, bars)
	require.NoError(t, err)
	assert.Equal(t, []uint64{3 * gib, 128 * gib, 256 * gib, 0xc000, 4 * gib}, addrs)

	// 512 MiB + 256 MiB of 32-bit BARs exceed the 512 MiB window below ECAM.
	_, err = addrspace.Plan(w, []addrspace.BAR{
		{Owner: "a", Kind: addrspace.Mem32, Size: 512 * mib},
		{Owner: "b", Kind: addrspace.Mem32, Size: 256 * mib},
	})
	var pe *addrspace.PlanError
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, "b", pe.BAR.Owner)
	assert.Equal(t, 768*mib, pe.Need)

	// A second 256 GiB BAR needs [256, 768) GiB: beyond 2^39.
	_, err = addrspace.Plan(w, []addrspace.BAR{
		{Owner: "a", Kind: addrspace.Mem64, Size: 256 * gib},
		{Owner: "b", Kind: addrspace.Mem64, Size: 256 * gib},
	})
	require.ErrorAs(t, err, &pe)
	assert.Equal(t, 768*gib-4*gib, pe.Need)
}

// FuzzPlan checks, over many BAR sets, that every placed BAR is
// naturally aligned, inside its window and overlaps no other.
func FuzzPlan(f *testing.F) {
	f.Add(uint64(gib), uint8(39), []byte{30, 20, 12, 37, 37, 26})
	f.Fuzz(func(t *testing.T, mem uint64, physBits uint8, sizes []byte) {
		w, err := addrspace.NewWindows(mem%(64*gib), uint(physBits%20)+33)
		if err != nil {
			return
		}
		var bars []addrspace.BAR
		for i, s := range sizes[:min(len(sizes), 256)] {
			kind := addrspace.BARKind(s % 3)
			bars = append(bars, addrspace.BAR{Owner: "d", Index: i, Kind: kind, Size: 1 << (2 + (s>>2)%48)})
		}
		addrs, err := addrspace.Plan(w, bars)
		if err != nil {
			return
		}
		// Plain ifs, not testify: t.Helper's stack walk in this O(n^2)
		// loop made the target run at a few hundred inputs a second.
		win := map[addrspace.BARKind]addrspace.Range{addrspace.Mem32: w.Mem32, addrspace.Mem64: w.Mem64, addrspace.IO: w.IO}
		for i, b := range bars {
			a := addrs[i]
			if a%b.Size != 0 {
				t.Fatalf("BAR %d at %#x not aligned to %#x", i, a, b.Size)
			}
			if r := win[b.Kind]; a < r.GPA || a+b.Size > r.End() || a+b.Size < a {
				t.Fatalf("BAR %d [%#x+%#x) outside %s", i, a, b.Size, r)
			}
			for j := range i {
				if bars[j].Kind == b.Kind && a+b.Size > addrs[j] && addrs[j]+bars[j].Size > a {
					t.Fatalf("BARs %d [%#x+%#x) and %d [%#x+%#x) overlap", i, a, b.Size, j, addrs[j], bars[j].Size)
				}
			}
		}
	})
}

func TestAllocatorSmallWindow(t *testing.T) {
	a, err := addrspace.NewAllocator("w", addrspace.Range{GPA: 0x1000, Size: 0x10000}, false)
	require.NoError(t, err)
	x, err := a.Alloc(0x8000)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x8000), x, "natural alignment skips 0x1000")
	y, err := a.Alloc(16)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x1000), y, "a small allocation fills the gap, page aligned")
	_, err = a.Alloc(0x8000)
	assert.ErrorContains(t, err, "window full")

	io, err := addrspace.NewAllocator("io", addrspace.Range{GPA: 0xc000, Size: 0x4000}, true)
	require.NoError(t, err)
	p, err := io.Alloc(0x20)
	require.NoError(t, err)
	q, err := io.Alloc(4)
	require.NoError(t, err)
	assert.Equal(t, []uint64{0xc000, 0xc020}, []uint64{p, q}, "I/O windows align only naturally")
}

func TestAlignUpSaturates(t *testing.T) {
	assert.Equal(t, uint64(0x2000), addrspace.AlignUp(0x1001, 0x1000))
	assert.Equal(t, uint64(0x1000), addrspace.AlignUp(0x1000, 0x1000))
	assert.Equal(t, ^uint64(0)&^0xfff, addrspace.AlignUp(^uint64(0)-5, 0x1000), "no wrap to 0")
}

func TestWindowsPMEM(t *testing.T) {
	// 1 GiB of RAM and a 100 MiB + 1 byte image: the image at 4 GiB,
	// rounded up to 2 MiB; the 64-bit window at the next 1 GiB above it.
	w, err := addrspace.NewWindowsPMEM(1*gib, 100*mib+1, 46)
	require.NoError(t, err)
	assert.Equal(t, addrspace.Range{GPA: 4 * gib, Size: 102 * mib}, w.PMEM)
	assert.Equal(t, 5*gib, w.Mem64.GPA)
	assert.Equal(t, uint64(1)<<46, w.Mem64.End())

	// 20 GiB of RAM ends at 21 GiB; a 4 GiB image exactly fills
	// [21 GiB, 25 GiB) and the window starts right after it.
	w, err = addrspace.NewWindowsPMEM(20*gib, 4*gib, 46)
	require.NoError(t, err)
	assert.Equal(t, addrspace.Range{GPA: 21 * gib, Size: 4 * gib}, w.PMEM)
	assert.Equal(t, 25*gib, w.Mem64.GPA)

	// No image: NewWindows's layout, and an empty PMEM.
	plain, err := addrspace.NewWindows(20*gib, 46)
	require.NoError(t, err)
	w, err = addrspace.NewWindowsPMEM(20*gib, 0, 46)
	require.NoError(t, err)
	assert.Equal(t, plain, w)
	assert.Zero(t, w.PMEM.Size)

	_, err = addrspace.NewWindowsPMEM(gib, 508*gib, 39) // [4 GiB, 512 GiB) leaves no window
	assert.ErrorContains(t, err, "reduce guest memory or the image")
	_, err = addrspace.NewWindowsPMEM(gib, addrspace.MaxPMEM+1, 52)
	assert.ErrorContains(t, err, "exceeds")
}

// FuzzWindowsPMEM: the image's range is 2 MiB-aligned in base and size,
// covers the image, lies above RAM and 4 GiB, and below the 64-bit
// window, which starts 1 GiB-aligned.
func FuzzWindowsPMEM(f *testing.F) {
	f.Add(uint64(gib), uint64(100*mib+1), uint8(46))
	f.Add(uint64(3*gib+1), uint64(1), uint8(39))
	f.Fuzz(func(t *testing.T, mem, image uint64, physBits uint8) {
		w, err := addrspace.NewWindowsPMEM(mem, image, uint(physBits%20)+33)
		if err != nil {
			return
		}
		p := w.PMEM
		if got := addrspace.PMEM(mem, image); got != p {
			t.Fatalf("PMEM %v, NewWindowsPMEM's %v", got, p)
		}
		if image == 0 {
			if p.Size != 0 {
				t.Fatalf("no image, PMEM %v", p)
			}
			return
		}
		if p.GPA%addrspace.PMEMSizeAlign != 0 || p.Size%addrspace.PMEMSizeAlign != 0 || p.Size < image || p.Size-image >= addrspace.PMEMSizeAlign {
			t.Fatalf("PMEM %v for a %d-byte image", p, image)
		}
		if p.GPA < addrspace.RAMEnd(mem) || p.GPA < addrspace.HighRAMStart || p.End() > w.Mem64.GPA || w.Mem64.GPA%gib != 0 {
			t.Fatalf("PMEM %v, RAM end %#x, window %v", p, addrspace.RAMEnd(mem), w.Mem64)
		}
	})
}
