package guestmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

const (
	mib = 1 << 20
	gib = 1 << 30
)

func TestParsePageSize(t *testing.T) {
	for in, want := range map[string]PageSize{
		"1G": Page1G, "1GiB": Page1G, "1g": Page1G, " 1G ": Page1G,
		"2M": Page2M, "2MiB": Page2M, "2m": Page2M,
		"4K": Page4K, "none": Page4K, "NONE": Page4K,
	} {
		got, err := ParsePageSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	_, err := ParsePageSize("3M")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `"3M"`)
	assert.Contains(t, err.Error(), "1G")
	assert.Contains(t, err.Error(), "2M")
	assert.Contains(t, err.Error(), "none")

	for _, p := range []PageSize{Page4K, Page2M, Page1G} {
		back, err := ParsePageSize(p.String())
		require.NoError(t, err)
		assert.Equal(t, p, back)
	}
	assert.Equal(t, "1G", Page1G.String())
	assert.Equal(t, "2M", Page2M.String())
	assert.Equal(t, "4K", Page4K.String())
}

func newSmall(t testing.TB, size uint64) *Memory {
	t.Helper()
	m, err := New(Options{Size: size, PageSize: Page4K, Node: -1, Workers: 2})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	return m
}

func TestNew4K(t *testing.T) {
	m := newSmall(t, 8*mib)
	assert.Equal(t, uint64(8*mib), m.Size())
	assert.Equal(t, uint64(8*mib), m.End())
	assert.Equal(t, Page4K, m.PageSize())
	assert.GreaterOrEqual(t, m.FD(), 0)
	d, workers := m.PrefaultStats()
	assert.Positive(t, d)
	assert.Equal(t, 1, workers, "8 MiB is one prefault chunk, so one worker")

	regions := m.Regions()
	require.Len(t, regions, 1)
	assert.Equal(t, uint64(0), regions[0].GPA)
	assert.Equal(t, uint64(8*mib), regions[0].Size())

	// Writes through Slice land in the memfd, which is what vhost
	// backends will map.
	b, err := m.Slice(0x1234, 4)
	require.NoError(t, err)
	copy(b, "ram!")
	got := make([]byte, 4)
	_, err = unix.Pread(m.FD(), got, 0x1234)
	require.NoError(t, err)
	assert.Equal(t, "ram!", string(got))

	// The prefault really populated the mapping: the memfd's blocks
	// cover the whole size.
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(m.FD(), &st))
	assert.Equal(t, int64(8*mib), st.Blocks*512, "all pages allocated by the prefault")
}

func TestNewValidation(t *testing.T) {
	_, err := New(Options{Size: 3*mib + 1, PageSize: Page4K, Node: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), strconv.Itoa(3*mib+1))
	assert.Contains(t, err.Error(), "4K")

	_, err = New(Options{Size: 3 * mib, PageSize: Page2M, Node: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "2M")
	assert.Contains(t, err.Error(), strconv.Itoa(3*mib))

	_, err = New(Options{Size: 0, PageSize: Page4K, Node: -1})
	require.Error(t, err)

	_, err = New(Options{Size: 4 * mib, PageSize: 12345, Node: -1})
	require.Error(t, err)

	_, err = New(Options{Size: 4 * mib, PageSize: Page4K, Node: -2})
	require.Error(t, err)

	_, err = New(Options{Size: 4 * mib, PageSize: Page4K, Node: -1, PrefaultCPUs: []int{-1}})
	require.Error(t, err)
}

func TestNewPinnedWorkers(t *testing.T) {
	m, err := New(Options{Size: 192 * mib, PageSize: Page4K, Node: -1, PrefaultCPUs: []int{0, 0, 0}, Workers: 2})
	require.NoError(t, err)
	defer m.Close()
	_, workers := m.PrefaultStats()
	assert.Equal(t, 2, workers, "capped at Workers")
}

func TestNewBadCPUReleasesEverything(t *testing.T) {
	fdsBefore := openFDs(t)
	// CPU 1023 is valid for a CPUSet but not online here, so pinning fails.
	_, err := New(Options{Size: 4 * mib, PageSize: Page4K, Node: -1, PrefaultCPUs: []int{1023}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CPU 1023")
	assert.Equal(t, fdsBefore, openFDs(t), "memfd closed on the error path")
}

func TestNewNodeBinding(t *testing.T) {
	if _, err := os.Stat("/sys/devices/system/node/node0"); err != nil {
		t.Skipf("no NUMA node 0 in sysfs: %v", err)
	}
	m, err := New(Options{Size: 4 * mib, PageSize: Page4K, Node: 0})
	require.NoError(t, err)
	// The kernel reports the policy and where the pages went.
	maps, err := os.ReadFile("/proc/self/numa_maps")
	require.NoError(t, err)
	var line string
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "memfd:hpcvmm-guest-ram") {
			line = l
		}
	}
	assert.Contains(t, line, "bind:0")
	assert.Contains(t, line, "N0=1024", "all 1024 4K pages prefaulted on node 0")
	require.NoError(t, m.Close())

	_, err = New(Options{Size: 4 * mib, PageSize: Page4K, Node: 1000})
	require.Error(t, err, "binding to a node that does not exist")
	assert.Contains(t, err.Error(), "node 1000")
}

func TestClose(t *testing.T) {
	m, err := New(Options{Size: 4 * mib, PageSize: Page4K, Node: -1})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	require.NoError(t, m.Close(), "idempotent")
	assert.Equal(t, -1, m.FD())
	assert.Empty(t, m.Regions())
	_, err = m.Slice(0, 1)
	assert.ErrorIs(t, err, ErrOutOfRange)
}

// fakeMemory builds a Memory with the layout of size but tiny backing
// slices, so high-region bounds can be tested without gigabytes of RAM.
func fakeMemory(size uint64, backing uint64) *Memory {
	m := &Memory{fd: -1, size: size, pageSize: Page4K}
	for i, r := range addrspace.RAM(size) {
		n := min(r.Size, backing)
		m.regions[i] = Region{GPA: r.GPA, Data: make([]byte, n)}
	}
	m.nregions = len(addrspace.RAM(size))
	return m
}

func TestSliceBounds(t *testing.T) {
	m := newSmall(t, 4*mib)

	b, err := m.Slice(0, 4*mib)
	require.NoError(t, err)
	assert.Len(t, b, 4*mib)

	b, err = m.Slice(4*mib-8, 8)
	require.NoError(t, err)
	assert.Len(t, b, 8)
	assert.Equal(t, 8, cap(b), "capacity clipped so append cannot reach past the access")

	b, err = m.Slice(4*mib, 0)
	require.NoError(t, err, "empty access at the end")
	assert.Empty(t, b)

	for _, c := range []struct{ gpa, n uint64 }{
		{4*mib - 8, 9},
		{4 * mib, 1},
		{0, 4*mib + 1},
		{1 << 40, 1},
		{math.MaxUint64, 1},
	} {
		_, err := m.Slice(c.gpa, c.n)
		assert.ErrorIs(t, err, ErrOutOfRange, "gpa %#x n %#x", c.gpa, c.n)
		assert.Contains(t, err.Error(), fmt.Sprintf("%#x", c.gpa))
	}

	// The PCI hole and the high region, on a layout with both.
	f := fakeMemory(5*gib, 1<<10) // low [0, 1 KiB), high [4 GiB, 4 GiB + 1 KiB)
	_, err = f.Slice(addrspace.PCIHoleStart, 1)
	assert.ErrorIs(t, err, ErrOutOfRange, "inside the PCI hole")
	b, err = f.Slice(addrspace.HighRAMStart+16, 16)
	require.NoError(t, err)
	assert.Len(t, b, 16)
	_, err = f.Slice(addrspace.HighRAMStart-1, 2)
	assert.ErrorIs(t, err, ErrOutOfRange, "straddling the hole and high RAM")
	_, err = f.Slice(1<<10-1, 2)
	assert.ErrorIs(t, err, ErrOutOfRange, "straddling the end of the low region")
}

func TestSliceRejectsWrap(t *testing.T) {
	m := newSmall(t, 4*mib)
	// gpa+n wraps to a small number that would pass a naive
	// "gpa+n <= end" check.
	for _, c := range []struct{ gpa, n uint64 }{
		{16, math.MaxUint64 - 15},
		{16, math.MaxUint64},
		{math.MaxUint64, 2},
		{4*mib - 1, math.MaxUint64},
	} {
		require.Less(t, c.gpa+c.n, c.gpa, "test case must wrap")
		_, err := m.Slice(c.gpa, c.n)
		assert.ErrorIs(t, err, ErrOutOfRange, "gpa %#x n %#x", c.gpa, c.n)
	}
}

func TestSliceZeroAllocs(t *testing.T) {
	m := newSmall(t, 4*mib)
	allocs := testing.AllocsPerRun(1000, func() {
		b, err := m.Slice(0x1000, 64)
		if err != nil || len(b) != 64 {
			t.Fatal("slice failed")
		}
	})
	assert.Zero(t, allocs)
}

func FuzzSlice(f *testing.F) {
	f.Add(uint64(0), uint64(1), uint64(8*mib))
	f.Add(uint64(math.MaxUint64), uint64(2), uint64(4*gib))
	f.Add(uint64(addrspace.HighRAMStart-1), uint64(2), uint64(5*gib))
	f.Add(uint64(16), uint64(math.MaxUint64), uint64(5*gib))
	f.Fuzz(func(t *testing.T, gpa, n, size uint64) {
		size %= 64 * gib
		m := fakeMemory(size, 1<<12)
		b, err := m.Slice(gpa, n)
		if err != nil {
			if !errors.Is(err, ErrOutOfRange) {
				t.Fatalf("unexpected error type: %v", err)
			}
			return
		}
		if uint64(len(b)) != n {
			t.Fatalf("Slice(%#x, %#x) returned %d bytes", gpa, n, len(b))
		}
		// A successful access must lie in one region, without wrapping.
		in := false
		for _, r := range m.Regions() {
			if gpa >= r.GPA && gpa-r.GPA <= r.Size() && n <= r.Size()-(gpa-r.GPA) {
				in = true
			}
		}
		if !in {
			t.Fatalf("Slice(%#x, %#x) succeeded outside every region", gpa, n)
		}
	})
}

// meminfo returns the HugePages_* counters of /proc/meminfo.
func meminfo(t testing.TB) map[string]int64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	require.NoError(t, err)
	defer f.Close()
	out := map[string]int64{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok || !strings.HasPrefix(k, "HugePages_") {
			continue
		}
		n, err := strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		require.NoError(t, err)
		out[k] = n
	}
	return out
}

// skipUnlessPool skips unless n pages of ps can be allocated right now.
func skipUnlessPool(t testing.TB, ps PageSize, n int64) {
	t.Helper()
	avail, err := poolAvailable(ps, -1)
	if err != nil {
		t.Skipf("cannot read the %s hugepage pool: %v", ps, err)
	}
	if avail < n {
		t.Skipf("%s hugepage pool has %d pages available, test needs %d: raise /sys/kernel/mm/hugepages/%s/nr_hugepages to run it",
			ps, avail, n, ps.sysfsName())
	}
}

func TestNew2M(t *testing.T) {
	skipUnlessPool(t, Page2M, 4)
	before := meminfo(t)
	m, err := New(Options{Size: 8 * mib, PageSize: Page2M, Node: -1, Workers: 2})
	require.NoError(t, err)
	after := meminfo(t)
	// 2 MiB is the default hugepage size, the one /proc/meminfo counts.
	assert.Equal(t, before["HugePages_Free"]-4, after["HugePages_Free"], "all 4 pages faulted in")
	b, err := m.Slice(6*mib, 2*mib)
	require.NoError(t, err)
	b[len(b)-1] = 1
	require.NoError(t, m.Close())
	assert.Equal(t, before, meminfo(t), "pages returned to the pool")
}

func TestNew2MShortPool(t *testing.T) {
	overcommit, err := readCounter("/proc/sys/vm/nr_overcommit_hugepages")
	if err != nil {
		t.Skipf("cannot read /proc/sys/vm/nr_overcommit_hugepages: %v", err)
	}
	if overcommit != 0 {
		t.Skipf("hugepage overcommit is %d, so a short pool would be topped up with surplus pages", overcommit)
	}
	avail, err := poolAvailable(Page2M, -1)
	if err != nil {
		t.Skipf("cannot read the 2M hugepage pool: %v", err)
	}
	before := meminfo(t)
	need := avail + 1
	_, err = New(Options{Size: uint64(need) * uint64(Page2M), PageSize: Page2M, Node: -1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("need %d free 2M hugepages, have %d", need, avail))
	assert.Contains(t, err.Error(), "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
	after := meminfo(t)
	assert.Equal(t, before["HugePages_Rsvd"], after["HugePages_Rsvd"])
	assert.Equal(t, before["HugePages_Free"], after["HugePages_Free"])
}

func TestWorkerCount(t *testing.T) {
	assert.Equal(t, 3, workerCount(Options{Workers: 3}, 100))
	assert.Equal(t, 2, workerCount(Options{PrefaultCPUs: []int{4, 5}}, 100))
	assert.Equal(t, 2, workerCount(Options{PrefaultCPUs: []int{4, 5}, Workers: 8}, 100), "one worker per pinned CPU")
	assert.Equal(t, 1, workerCount(Options{PrefaultCPUs: []int{4, 5}, Workers: 1}, 100))
	assert.Equal(t, 1, workerCount(Options{Workers: 8}, 1), "no more workers than chunks")
	assert.GreaterOrEqual(t, workerCount(Options{}, 100), 1)
}

func TestProgressLine(t *testing.T) {
	var buf bytes.Buffer
	writeProgress(&buf, "prefaulting guest RAM: %.1f/%.1f GiB (%.1f GiB/s)\n", 12*gib, 20*gib, 4*1e9)
	assert.Equal(t, "prefaulting guest RAM: 12.0/20.0 GiB (3.0 GiB/s)\n", buf.String())
}

func TestNewProgress(t *testing.T) {
	old := progressInterval
	progressInterval = time.Millisecond
	t.Cleanup(func() { progressInterval = old })
	var buf bytes.Buffer
	m, err := New(Options{Size: 64 * mib, PageSize: Page4K, Node: -1, Workers: 1, Progress: &buf})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	require.NotEmpty(t, lines)
	assert.Regexp(t, `^prefaulted guest RAM: 0\.1/0\.1 GiB \([0-9.]+ GiB/s\)$`, lines[len(lines)-1])
	for _, l := range lines[:len(lines)-1] {
		assert.Regexp(t, `^prefaulting guest RAM: [0-9.]+/0\.1 GiB \([0-9.]+ GiB/s\)$`, l)
	}

	// Quick prefaults stay silent at the default interval.
	buf.Reset()
	progressInterval = old
	m, err = New(Options{Size: 4 * mib, PageSize: Page4K, Node: -1, Progress: &buf})
	require.NoError(t, err)
	require.NoError(t, m.Close())
	assert.Empty(t, buf.String())
}

func TestShortPoolHint(t *testing.T) {
	dir := t.TempDir()
	pool := dir + "/kernel/mm/hugepages/hugepages-1048576kB"
	require.NoError(t, os.MkdirAll(pool, 0o755))
	require.NoError(t, os.WriteFile(pool+"/free_hugepages", []byte("7\n"), 0o644))
	require.NoError(t, os.WriteFile(pool+"/resv_hugepages", []byte("2\n"), 0o644))
	old := sysfsRoot
	sysfsRoot = dir
	t.Cleanup(func() { sysfsRoot = old })
	hint := shortPoolHint(Page1G, 20*gib)
	assert.Contains(t, hint, "need 20 free 1G hugepages, have 5: raise /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages (or the per-node file")
}

// openFDs returns the number of open file descriptors of this process.
func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// unbackedHugeMapping maps one 2M hugetlb page with MAP_NORESERVE from an
// empty pool, so touching it cannot be satisfied.
func unbackedHugeMapping(t *testing.T) []byte {
	t.Helper()
	if avail, err := poolAvailable(Page2M, -1); err != nil || avail != 0 {
		t.Skipf("needs an empty 2M hugepage pool (available: %d, err: %v)", avail, err)
	}
	fd, err := unix.MemfdCreate("hpcvmm-test", unix.MFD_CLOEXEC|unix.MFD_HUGETLB|unix.MFD_HUGE_2MB)
	if err != nil {
		t.Skipf("no hugetlb memfd: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	require.NoError(t, unix.Ftruncate(fd, int64(Page2M)))
	b, err := unix.Mmap(fd, 0, int(Page2M), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}

func TestPopulateShortPoolIsError(t *testing.T) {
	b := unbackedHugeMapping(t)
	err := populate(b, uint64(Page2M))
	require.Error(t, err, "MADV_POPULATE_WRITE reports the failed allocation")
	t.Log(err)
}

func TestTouchSIGBUSIsError(t *testing.T) {
	b := unbackedHugeMapping(t)
	err := touch(b, uint64(Page2M))
	require.Error(t, err, "the fallback path turns SIGBUS into an error")
	t.Log(err)
}

func TestTouch(t *testing.T) {
	m := newSmall(t, 4*mib)
	require.NoError(t, touch(m.regions[0].Data, uint64(Page4K)))
}
