// Command prefaultrepro measures how fast this host's kernel faults in
// hugetlb memory, by strategy, page size, worker count and worker placement,
// and how fast the same threads can rewrite the pages once they exist. It
// uses nothing of hpcvmm's prefault (package guestmem), only package uapi's
// mbind system call wrapper for -mbind: it is the outside reference hpcvmm's
// prefault is compared with (issue 18, part 1), so a gap between the two is
// hpcvmm's and a limit both share is the kernel's or the machine's.
//
// Every round creates a fresh hugetlb memfd, maps it (which reserves the
// pages), faults every page in with the chosen strategy, then unmaps and
// closes it, returning the pages to the pool. The first round of a
// configuration may be cold (on a VM whose host reports free pages, hugepages
// newly added to the pool are backed by the host only when first written);
// the summary is the median of the later rounds.
//
// Strategies:
//
//	populate   madvise(MADV_POPULATE_WRITE) of chunks taken from a shared queue
//	split      madvise(MADV_POPULATE_WRITE) of one contiguous 1/N of the range per worker
//	touch      a one-byte write per page, chunks from the shared queue
//	fallocate  fallocate(2) of chunks of the memfd, from the shared queue (no mapping touched)
//
// With -ceiling, the pages of one fully faulted mapping are then rewritten by
// the same numbers of pinned threads, three ways: one REP STOSB per 4 KiB
// (stosb4K: what the kernel runs, clear_page_erms on each 4 KiB piece of a
// huge page), one REP STOSB per huge page (stosbPage: what a kernel clearing
// whole extents would run), and Go's clear of 64 MiB pieces (clearNT:
// non-temporal AVX2 stores, the machine's write bandwidth). The first is what
// the kernel's page clearing can reach on these threads, the last the
// ceiling.
//
// The hugepage pools must hold the pages (see /sys/kernel/mm/hugepages); the
// command never changes them.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

const (
	mib = 1 << 20
	gib = 1 << 30
)

type config struct {
	sizeGiB    int
	pages      []uint64
	workers    []int
	strategies []string
	chunk      uint64
	rounds     int
	pin        bool
	ceiling    bool
	mbind      int  // NUMA node to bind each round's mapping to, -1 for none
	reuse      bool // one memfd for all rounds, its pages punched out after each
	procs      int  // GOMAXPROCS; 0: the largest worker count + 2
	cpus       []int
}

func main() {
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "prefaultrepro:", err)
		os.Exit(2)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "prefaultrepro:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("prefaultrepro", flag.ContinueOnError)
	fs.IntVar(&c.sizeGiB, "size", 16, "memory per round in GiB")
	pages := fs.String("pages", "2M,1G", "page sizes: 2M, 1G")
	workers := fs.String("workers", "", "worker counts (default: 1, 2, 4, ... and the number of CPUs this process may use)")
	strategies := fs.String("strategies", "populate", "populate, split, touch, fallocate")
	chunk := fs.Int("chunk", 64, "MiB per queued chunk (at least one page)")
	fs.IntVar(&c.rounds, "rounds", 4, "rounds per configuration; the first counts as cold")
	fs.BoolVar(&c.pin, "pin", true, "pin worker i to the i-th CPU this process may use (round robin when there are more workers)")
	fs.BoolVar(&c.ceiling, "ceiling", false, "also rewrite the faulted pages with the same threads: REP STOSB per 4 KiB and per page, and non-temporal stores")
	fs.IntVar(&c.mbind, "mbind", -1, "bind each round's mapping to this NUMA node with mbind(MPOL_BIND, MPOL_MF_STRICT) before the first touch, as hpcvmm does (-1: no binding)")
	fs.BoolVar(&c.reuse, "reuse", false, "keep one memfd (and mapping) for all rounds of a page size, punching its pages out after each round, instead of a fresh memfd per round")
	fs.IntVar(&c.procs, "procs", 0, "GOMAXPROCS (0: the largest worker count + 2, so no worker returning from the kernel waits for a P)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if c.sizeGiB < 1 {
		return c, fmt.Errorf("-size %d: want at least 1 (GiB)", c.sizeGiB)
	}
	if c.rounds < 1 {
		return c, fmt.Errorf("-rounds %d: want at least 1", c.rounds)
	}
	if *chunk < 2 {
		return c, fmt.Errorf("-chunk %d: want at least 2 (MiB)", *chunk)
	}
	c.chunk = uint64(*chunk) * mib
	for _, p := range strings.Split(*pages, ",") {
		switch strings.TrimSpace(p) {
		case "2M":
			c.pages = append(c.pages, 2*mib)
		case "1G":
			c.pages = append(c.pages, gib)
		default:
			return c, fmt.Errorf("-pages: %q: want 2M or 1G", p)
		}
	}
	for _, s := range strings.Split(*strategies, ",") {
		switch s = strings.TrimSpace(s); s {
		case "populate", "split", "touch", "fallocate":
			c.strategies = append(c.strategies, s)
		default:
			return c, fmt.Errorf("-strategies: %q: want populate, split, touch or fallocate", s)
		}
	}
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return c, fmt.Errorf("sched_getaffinity: %w", err)
	}
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			c.cpus = append(c.cpus, i)
		}
	}
	if *workers == "" {
		for w := 1; w < len(c.cpus); w *= 2 {
			c.workers = append(c.workers, w)
		}
		c.workers = append(c.workers, len(c.cpus))
	} else {
		for _, s := range strings.Split(*workers, ",") {
			w, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || w < 1 {
				return c, fmt.Errorf("-workers: %q: want positive numbers", s)
			}
			c.workers = append(c.workers, w)
		}
	}
	return c, nil
}

// result is one configuration's rounds.
type result struct {
	name   string
	rates  []float64 // GiB/s per round
	calls  []string  // per round: p50/max duration of one call
	errMsg string
}

func run(c config) error {
	if c.procs > 0 {
		runtime.GOMAXPROCS(c.procs)
	} else {
		runtime.GOMAXPROCS(max(runtime.GOMAXPROCS(0), slices.Max(c.workers)+2))
	}
	fmt.Printf("# prefaultrepro: %d GiB per round, CPUs %d, pin %v, chunk %d MiB, mbind %d, GOMAXPROCS %d, kernel %s\n", c.sizeGiB, len(c.cpus), c.pin, c.chunk/mib, c.mbind, runtime.GOMAXPROCS(0), kernelRelease())
	var results []result
	for _, page := range c.pages {
		size := uint64(c.sizeGiB) * gib
		for _, strat := range c.strategies {
			for _, w := range c.workers {
				r := result{name: fmt.Sprintf("%s %-9s workers=%-3d pin=%-5v chunk=%dM mbind=%d procs=%d reuse=%v", pageName(page), strat, w, c.pin, max(c.chunk, page)/mib, c.mbind, runtime.GOMAXPROCS(0), c.reuse)}
				for round := 1; round <= c.rounds; round++ {
					rate, calls, err := prefaultRound(c, page, size, strat, w)
					if err != nil {
						r.errMsg = err.Error()
						fmt.Printf("%s round %d: %v\n", r.name, round, err)
						break
					}
					r.rates = append(r.rates, rate)
					r.calls = append(r.calls, calls)
					fmt.Printf("%s round %d: %6.1f GiB/s  (one call: %s)\n", r.name, round, rate, calls)
				}
				results = append(results, r)
			}
		}
		if c.ceiling {
			results = append(results, ceilingRuns(c, page, size)...)
		}
	}
	fmt.Printf("\n# summary: GiB/s, median of rounds 2..%d (round 1 in brackets)\n", c.rounds)
	for _, r := range results {
		if r.errMsg != "" {
			fmt.Printf("%s  error: %s\n", r.name, r.errMsg)
			continue
		}
		fmt.Printf("%s  %6.1f  [%.1f]  rounds %s\n", r.name, warmMedian(r.rates), r.rates[0], fmtRates(r.rates))
	}
	return nil
}

func pageName(page uint64) string {
	if page == gib {
		return "1G"
	}
	return "2M"
}

func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

func warmMedian(r []float64) float64 {
	if len(r) > 1 {
		r = r[1:]
	}
	s := slices.Clone(r)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func fmtRates(r []float64) string {
	parts := make([]string, len(r))
	for i, v := range r {
		parts[i] = fmt.Sprintf("%.1f", v)
	}
	return strings.Join(parts, "/")
}

// memfd is one round's hugetlb memory.
type memfd struct {
	fd   int
	data []byte
}

func newMemfd(page, size uint64, mapIt bool) (*memfd, error) {
	flags := unix.MFD_CLOEXEC | unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	if page == gib {
		flags = unix.MFD_CLOEXEC | unix.MFD_HUGETLB | unix.MFD_HUGE_1GB
	}
	fd, err := unix.MemfdCreate("prefaultrepro", flags)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %s: %w", pageName(page), err)
	}
	m := &memfd{fd: fd}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		m.close()
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	if mapIt {
		if err := m.mmap(size); err != nil {
			m.close()
			return nil, err
		}
	}
	return m, nil
}

// bind applies the NUMA policy hpcvmm applies before the first touch.
func (m *memfd) bind(node int) error {
	if node < 0 || m.data == nil {
		return nil
	}
	if err := uapi.Mbind(m.data, uapi.MPolBind, []int{node}, uapi.MPolMFStrict); err != nil {
		return fmt.Errorf("mbind to node %d: %w", node, err)
	}
	return nil
}

func (m *memfd) mmap(size uint64) error {
	d, err := unix.Mmap(m.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("mmap %d bytes: %w (is the hugepage pool large enough?)", size, err)
	}
	m.data = d
	return nil
}

func (m *memfd) close() {
	if m.data != nil {
		_ = unix.Munmap(m.data)
	}
	_ = unix.Close(m.fd)
}

// pinned runs fn on n locked threads, thread i pinned to c.cpus[i mod len]
// when c.pin, all released at once; it returns the time from the release to
// the last thread's end and the first error.
func pinned(c config, n int, fn func(i int) error) (time.Duration, error) {
	var ready, finish sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, n)
	ready.Add(n)
	finish.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer finish.Done()
			runtime.LockOSThread() // never unlocked: the thread dies with its narrowed mask
			if c.pin {
				var set unix.CPUSet
				set.Set(c.cpus[i%len(c.cpus)])
				if err := unix.SchedSetaffinity(0, &set); err != nil {
					errs[i] = fmt.Errorf("pin to CPU %d: %w", c.cpus[i%len(c.cpus)], err)
				}
			}
			ready.Done()
			<-start
			if errs[i] == nil {
				errs[i] = fn(i)
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	finish.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// reused is the memfd -reuse keeps across rounds, per page size.
var reused = map[uint64]*memfd{}

func prefaultRound(c config, page, size uint64, strat string, w int) (float64, string, error) {
	var m *memfd
	if c.reuse && strat != "fallocate" {
		// One file for every round: the kernel's hugetlb fault mutex is
		// chosen by hashing the file's mapping and the page index, so the
		// same file gives every round the same pairs of pages that share a
		// mutex, where a fresh file draws new ones.
		if m = reused[page]; m == nil {
			var err error
			if m, err = newMemfd(page, size, true); err != nil {
				return 0, "", err
			}
			if err := m.bind(c.mbind); err != nil {
				return 0, "", err
			}
			reused[page] = m
		}
		defer func() {
			// Free the pages to the pool and keep the file and mapping.
			if err := unix.Fallocate(m.fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, int64(size)); err != nil {
				fmt.Fprintln(os.Stderr, "prefaultrepro: punching the pages out:", err)
			}
		}()
	} else {
		var err error
		if m, err = newMemfd(page, size, strat != "fallocate"); err != nil {
			return 0, "", err
		}
		defer m.close()
		if err := m.bind(c.mbind); err != nil {
			return 0, "", err
		}
	}
	chunk := max(c.chunk, page)
	if strat == "split" {
		// One contiguous, page-aligned share per worker.
		pages := size / page
		chunk = (pages + uint64(w) - 1) / uint64(w) * page
	}
	nchunks := (size + chunk - 1) / chunk
	durs := make([][]time.Duration, w)
	for i := range durs {
		durs[i] = make([]time.Duration, 0, nchunks)
	}
	var next atomic.Uint64
	d, err := pinned(c, w, func(i int) error {
		for {
			var k uint64
			if strat == "split" {
				k = uint64(i)
			} else {
				k = next.Add(1) - 1
			}
			off := k * chunk
			if off >= size {
				return nil
			}
			end := min(off+chunk, size)
			t := time.Now()
			var err error
			switch strat {
			case "populate", "split":
				err = populate(m.data[off:end])
			case "touch":
				for p := off; p < end; p += page {
					m.data[p] = 1
				}
			case "fallocate":
				err = unix.Fallocate(m.fd, 0, int64(off), int64(end-off))
			}
			durs[i] = append(durs[i], time.Since(t))
			if err != nil {
				return fmt.Errorf("%s %#x-%#x: %w", strat, off, end, err)
			}
			if strat == "split" {
				return nil
			}
		}
	})
	if err != nil {
		return 0, "", err
	}
	var all []time.Duration
	for _, ds := range durs {
		all = append(all, ds...)
	}
	slices.Sort(all)
	calls := "none"
	if len(all) > 0 {
		calls = fmt.Sprintf("n=%d p50 %v max %v", len(all), all[len(all)/2].Round(10*time.Microsecond), all[len(all)-1].Round(10*time.Microsecond))
	}
	return float64(size) / gib / d.Seconds(), calls, nil
}

func populate(b []byte) error {
	for {
		err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// ceilingRuns faults one mapping in, then times its rewrite by each worker
// count, with 4 KiB and 64 MiB steps.
func ceilingRuns(c config, page, size uint64) []result {
	m, err := newMemfd(page, size, true)
	if err != nil {
		return []result{{name: pageName(page) + " ceiling", errMsg: err.Error()}}
	}
	defer m.close()
	if err := populate(m.data); err != nil {
		return []result{{name: pageName(page) + " ceiling", errMsg: err.Error()}}
	}
	var out []result
	for _, kind := range []string{"stosb4K", "stosbPage", "clearNT"} {
		for _, w := range c.workers {
			r := result{name: fmt.Sprintf("%s %-9s workers=%-3d", pageName(page), kind, w)}
			share := (size/page + uint64(w) - 1) / uint64(w) * page
			for round := 1; round <= c.rounds; round++ {
				d, err := pinned(c, w, func(i int) error {
					lo := min(uint64(i)*share, size)
					hi := min(lo+share, size)
					rewrite(kind, m.data[lo:hi], page)
					return nil
				})
				if err != nil {
					r.errMsg = err.Error()
					break
				}
				r.rates = append(r.rates, float64(size)/gib/d.Seconds())
			}
			fmt.Printf("%s rounds %s GiB/s\n", r.name, fmtRates(r.rates))
			out = append(out, r)
		}
	}
	return out
}

// rewrite zeroes b the way kind says: stosb4K one REP STOSB per 4 KiB, as
// the kernel clears a huge page (folio_zero_user → clear_page_erms);
// stosbPage one REP STOSB per huge page; clearNT Go's clear of 64 MiB
// pieces, which uses non-temporal AVX2 stores above 32 MiB.
func rewrite(kind string, b []byte, page uint64) {
	step := uint64(4 << 10)
	switch kind {
	case "stosbPage":
		step = page
	case "clearNT":
		step = 64 * mib
	}
	for p := uint64(0); p < uint64(len(b)); p += step {
		q := b[p:min(p+step, uint64(len(b)))]
		if kind == "clearNT" {
			clear(q)
		} else {
			stosb(q)
		}
	}
}
