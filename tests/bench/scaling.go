package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
)

// The prefault scaling case (issue 18): guestmem.New as hpcvmm calls it —
// RAM bound to one node, workers pinned to that node's CPUs — on tens of GiB,
// with 1 worker up to all of the node's CPUs, on 2 MiB and 1 GiB pages; and
// beside each, how fast the same number of pinned threads rewrite the same,
// already-faulted pages (the machine's write bandwidth, which the kernel's
// page clearing cannot beat). It needs no KVM, only hugepages, so it runs on
// any host: `go run ./tests/bench -cases prefault-scaling`.
const (
	casePrefaultScaling = "prefault-scaling"
	mRewriteGiBps       = "rewrite_gib_per_s" // the same threads rewriting the faulted pages
	vmmFirstTouch       = "first-touch"       // the unmeasured warm-up round, reported apart
)

// scalingOptions are the case's flags.
type scalingOptions struct {
	gib     int   // guest RAM per run
	node    int   // NUMA node; -1: the node of the first CPU this process may use
	workers []int // worker counts; empty: 1, 2, 4, ... and all of the node's CPUs
	rounds  int   // measured rounds per worker count
	reserve bool  // raise the node's pools for the case and restore them afterwards
}

func defaultScalingOptions() scalingOptions {
	return scalingOptions{gib: 16, node: -1, rounds: 3}
}

func scalingCase(page string, workers int) string {
	return fmt.Sprintf("%s/%s/workers=%d", casePrefaultScaling, page, workers)
}

// parseWorkerList parses "1,2,4" (-scaling-workers).
func parseWorkerList(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-scaling-workers %q: want positive worker counts such as 1,2,4,16", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// scalingWorkers is 1, 2, 4, ... below n, then n.
func scalingWorkers(n int) []int {
	var out []int
	for w := 1; w < n; w *= 2 {
		out = append(out, w)
	}
	return append(out, n)
}

// nodeCPUsAllowed returns the node's CPUs this process may run on, the
// CPUs hpcvmm pins its prefault workers to.
func nodeCPUsAllowed(h *host.Host, node int) (int, []int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return 0, nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	nodes, err := h.Nodes()
	if err != nil {
		return 0, nil, err
	}
	for _, n := range nodes {
		if node >= 0 && n.ID != node {
			continue
		}
		var cpus []int
		for _, c := range n.CPUs {
			if c < 1024 && set.IsSet(c) {
				cpus = append(cpus, c)
			}
		}
		if len(cpus) > 0 {
			return n.ID, cpus, nil
		}
		if node >= 0 {
			return 0, nil, fmt.Errorf("-scaling-node %d: none of its CPUs %v is in this process's affinity mask", node, n.CPUs)
		}
	}
	return 0, nil, fmt.Errorf("-scaling-node %d: no such node with CPUs this process may use", node)
}

// runScaling measures the case on this host and reports samples to out.
func runScaling(ctx context.Context, so scalingOptions, out sink) {
	h := host.New("/sys", "/proc")
	node, cpus, err := nodeCPUsAllowed(h, so.node)
	if err != nil {
		out.note("prefault scaling: " + err.Error())
		return
	}
	workers := so.workers
	if len(workers) == 0 {
		workers = scalingWorkers(len(cpus))
	}
	out.env(Env{"scaling_node": strconv.Itoa(node), "scaling_cpus": host.FormatCPUList(cpus),
		"scaling_size": fmt.Sprintf("%d GiB", so.gib)})
	size := uint64(so.gib) << 30
	for _, ps := range []guestmem.PageSize{guestmem.Page2M, guestmem.Page1G} {
		restore, err := nodePool(h, node, ps, size/uint64(ps), so.reserve)
		if err != nil {
			out.note(fmt.Sprintf("prefault scaling %s: skipped: %v", ps, err))
			continue
		}
		scalePage(ctx, so, node, cpus, workers, ps, out)
		if err := restore(); err != nil {
			out.note(fmt.Sprintf("prefault scaling %s: restoring the pool: %v", ps, err))
		}
	}
}

func scalePage(ctx context.Context, so scalingOptions, node int, cpus, workers []int, ps guestmem.PageSize, out sink) {
	size := uint64(so.gib) << 30
	// Unmeasured in the table: on a VM whose host reports free pages, a
	// pool's pages are backed by the host only when first written.
	out.progress(fmt.Sprintf("prefault scaling %s: first touch", ps))
	first := scalingRun(node, cpus, len(cpus), ps, size, vmmFirstTouch, 1, false)
	out.sample(first)
	if first.Err != "" {
		return
	}
	for _, w := range workers {
		for r := 1; r <= so.rounds; r++ {
			if ctx.Err() != nil {
				out.note(fmt.Sprintf("prefault scaling %s workers=%d: stopped at round %d: %v", ps, w, r, ctx.Err()))
				return
			}
			out.progress(fmt.Sprintf("%s round %d", scalingCase(ps.String(), w), r))
			// The rewrite, at the machine's bandwidth, varies little: once
			// per worker count, after the last round, so that it never runs
			// between two measured prefaults.
			out.sample(scalingRun(node, cpus, w, ps, size, vmmHPCVMM, r, r == so.rounds))
		}
	}
}

// scalingRun is one guestmem.New of size bytes by w workers pinned as hpcvmm
// pins them, then (when rewrite) one rewrite of the faulted pages by w
// threads pinned to the same CPUs.
func scalingRun(node int, cpus []int, w int, ps guestmem.PageSize, size uint64, vmm string, rep int, rewrite bool) Sample {
	s := newSample(scalingCase(ps.String(), w), vmm, whereHost, rep)
	m, err := guestmem.New(guestmem.Options{Size: size, PageSize: ps, Node: node, PrefaultCPUs: cpus, Workers: w})
	if err != nil {
		s.Err = err.Error()
		return s
	}
	defer func() {
		if err := m.Close(); err != nil && s.Err == "" {
			s.Err = err.Error()
		}
	}()
	d, used := m.PrefaultStats()
	s.Metrics[mGiBps] = float64(size) / (1 << 30) / d.Seconds()
	s.Metrics[mSizeMiB] = float64(size >> 20)
	s.Info["workers_used"] = strconv.Itoa(used)
	if !rewrite {
		return s
	}
	rd, err := rewritePages(m.Regions(), cpus, w, uint64(ps))
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Metrics[mRewriteGiBps] = float64(size) / (1 << 30) / rd.Seconds()
	return s
}

// rewritePages zeroes every region with w locked threads, thread i pinned
// to cpus[i mod len], each taking a contiguous, page-aligned share, in 64
// MiB pieces (Go's clear uses non-temporal stores above 32 MiB, the fastest
// way to write memory the CPU has). It returns the time from the threads'
// common start to the last one's end.
func rewritePages(regions []guestmem.Region, cpus []int, w int, page uint64) (time.Duration, error) {
	var total uint64
	for _, r := range regions {
		total += r.Size()
	}
	share := (total/page + uint64(w) - 1) / uint64(w) * page
	var ready, finish sync.WaitGroup
	start := make(chan struct{})
	errs := make([]error, w)
	ready.Add(w)
	finish.Add(w)
	for i := 0; i < w; i++ {
		go func() {
			defer finish.Done()
			runtime.LockOSThread() // never unlocked: the thread exits with its narrowed mask
			var set unix.CPUSet
			set.Set(cpus[i%len(cpus)])
			errs[i] = unix.SchedSetaffinity(0, &set)
			ready.Done()
			<-start
			if errs[i] != nil {
				return
			}
			lo, hi := uint64(i)*share, min(uint64(i+1)*share, total)
			var base uint64
			for _, r := range regions {
				a, b := max(lo, base), min(hi, base+r.Size())
				for p := a; p < b; p += 64 << 20 {
					clear(r.Data[p-base : min(p+64<<20, b)-base])
				}
				base += r.Size()
			}
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	finish.Wait()
	for i, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("pinning rewrite thread %d to CPU %d: %w", i, cpus[i%len(cpus)], err)
		}
	}
	return time.Since(t0), nil
}

// nodePool makes sure the node's pool of ps has need free pages. With
// reserve it raises the pool by what is missing and returns the function
// that puts the old size back; without, a short pool is an error that says
// what to do.
func nodePool(h *host.Host, node int, ps guestmem.PageSize, need uint64, reserve bool) (restore func() error, err error) {
	n, err := h.Node(node)
	if err != nil {
		return nil, err
	}
	pool, ok := n.Pool(uint64(ps))
	if !ok {
		return nil, fmt.Errorf("no %s hugepage pool on node %d", ps, node)
	}
	path := host.NrHugepagesPath(node, uint64(ps), n.PerNode)
	if pool.Free >= need {
		return func() error { return nil }, nil
	}
	if !reserve {
		return nil, fmt.Errorf("node %d has %d free %s hugepages, %d needed: raise %s, or pass -scaling-reserve to have the bench raise and restore it", node, pool.Free, ps, need, path)
	}
	put := func(v uint64) error { return os.WriteFile(path, []byte(strconv.FormatUint(v, 10)), 0o644) }
	if err := put(pool.Total + need - pool.Free); err != nil {
		return nil, fmt.Errorf("raising %s to %d: %w (needs root)", path, pool.Total+need-pool.Free, err)
	}
	restore = func() error { return put(pool.Total) }
	n, err = h.Node(node)
	if err == nil {
		if got, _ := n.Pool(uint64(ps)); got.Free < need {
			err = fmt.Errorf("raised %s by %d pages but only %d are free (memory too fragmented or short for %s pages)", path, need-pool.Free, got.Free, ps)
		}
	}
	if err != nil {
		if rerr := restore(); rerr != nil {
			err = fmt.Errorf("%w; restoring it: %v", err, rerr)
		}
		return nil, err
	}
	return restore, nil
}

// scalingSection renders the case's table, or "" when it has no samples.
func scalingSection(rep *Report, ix statIndex, stats []Stat) string {
	type row struct {
		page    string
		workers int
		c       string
	}
	var rows []row
	for _, s := range stats {
		parts := strings.Split(s.Case, "/")
		if len(parts) != 3 || parts[0] != casePrefaultScaling || s.VMM != vmmHPCVMM || s.Metric != mGiBps {
			continue
		}
		w, _ := strconv.Atoi(strings.TrimPrefix(parts[2], "workers="))
		rows = append(rows, row{parts[1], w, s.Case})
	}
	if len(rows) == 0 {
		return ""
	}
	slices.SortFunc(rows, func(a, b row) int {
		if a.page != b.page {
			return strings.Compare(a.page, b.page)
		}
		return a.workers - b.workers
	})
	var b strings.Builder
	fmt.Fprintf(&b, "\n**Prefault scaling** (host; %s of guest RAM per run bound to node %s, workers pinned to its CPUs %s as hpcvmm pins them; `guestmem.New`; GiB/s, median (min–max) of the measured rounds, each after one unmeasured first touch of the pool; "+
		"efficiency: the rate over workers × the one-worker rate; rewrite: the same number of threads, pinned alike, zeroing the same faulted pages with non-temporal stores after the last round, the machine's write bandwidth).\n\n",
		orUnknown(rep.Host["scaling_size"]), orUnknown(rep.Host["scaling_node"]), orUnknown(rep.Host["scaling_cpus"]))
	b.WriteString("| page | workers | prefault GiB/s | efficiency | rewrite GiB/s | prefault/rewrite |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	one := map[string]float64{}
	for _, r := range rows {
		st, _ := ix.get(whereHost, r.c, vmmHPCVMM, mGiBps)
		if r.workers == 1 {
			one[r.page] = st.Median
		}
		eff := ""
		if o := one[r.page]; o > 0 {
			eff = fmt.Sprintf("%.2f", st.Median/(float64(r.workers)*o))
		}
		rw, rok := ix.get(whereHost, r.c, vmmHPCVMM, mRewriteGiBps)
		rwCell, frac := "", ""
		if rok {
			rwCell = fmt.Sprintf("%.1f (%.1f–%.1f)", rw.Median, rw.Min, rw.Max)
			frac = fmt.Sprintf("%.2f", st.Median/rw.Median)
		}
		fmt.Fprintf(&b, "| %s | %d | %.1f (%.1f–%.1f) | %s | %s | %s |\n", r.page, r.workers, st.Median, st.Min, st.Max, eff, rwCell, frac)
	}
	var firsts []string
	for _, s := range stats {
		if s.VMM == vmmFirstTouch && s.Metric == mGiBps && strings.HasPrefix(s.Case, casePrefaultScaling+"/") {
			parts := strings.Split(s.Case, "/")
			firsts = append(firsts, fmt.Sprintf("%s pages, %s: %.1f GiB/s", parts[1], parts[2], s.Median))
		}
	}
	if len(firsts) > 0 {
		slices.Sort(firsts)
		fmt.Fprintf(&b, "\nFirst touch of the pool (unmeasured above): %s.\n", strings.Join(firsts, "; "))
	}
	return b.String()
}
