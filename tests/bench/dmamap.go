package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The VFIO DMA-map case (issues 5 and 8): how long each VMM spends in
// VFIO_IOMMU_MAP_DMA to make its guest RAM reachable by a passed-through
// device, and in how many calls, for 1, 2 and 4 GiB of guest RAM on 1 GiB,
// 2 MiB and 4 KiB pages. hpcvmm runs `hpcvmm run --gpu BDF --memory X
// --hugepages P`; QEMU runs q35 with the same kind of memory backend
// (memfd, shared, hugetlb of the page size, preallocated) and
// `-device vfio-pci,host=BDF`. Both are stopped once their RAM is mapped:
// hpcvmm at its first KVM_RUN (it maps guest RAM while building the VM),
// QEMU when its monitor answers with the machine paused (-S), since
// vfio-pci maps every RAM section while the device is realized.
//
// The measurement is the kernel's, the same for both VMMs: a kprobe on
// vfio_iommu_type1_ioctl (filtered to VFIO_IOMMU_MAP_DMA, recording the
// struct vfio_iommu_type1_dma_map the caller passed: vaddr, iova, size,
// flags) and a kretprobe on the same function, timestamped by the trace
// clock "mono". strace was the first choice but Debian bookworm's strace
// 6.1 prints "VFIO_DEVICE_PCI_HOT_RESET or VFIO_IOMMU_MAP_DMA, 0x7ffd..."
// (the two ioctls share a number and it decodes neither struct), so it
// could not tell guest RAM from ROM or BAR mappings; it also stops the VMM
// at every traced syscall, which ftrace does not.
//
// A call maps guest RAM when [vaddr, vaddr+size) lies in a memfd mapping
// of the VMM (both back guest RAM with a memfd; nothing else they map for
// DMA is one): QEMU's ROMs (read-only) and hpcvmm's peer-to-peer BAR
// mappings are counted apart.

// DMAMapConfig configures the DMA-map case.
type DMAMapConfig struct {
	Device   string        `json:"device"`     // PCI device bound to vfio-pci, passed to both VMMs
	Pages    []string      `json:"pages"`      // page sizes, in run order: 1G, 2M, 4K
	SizesMiB []int         `json:"sizes_mib"`  // guest RAM sizes
	Reps     int           `json:"reps"`       // runs per size, page and VMM
	Reps4K   int           `json:"reps_4k"`    // the same for 4 KiB pages, when positive
	Sec      int           `json:"s"`          // time kept for the case
	Timeout  time.Duration `json:"timeout_ns"` // one run's limit
}

// dmaMapCase names the case of one page and size: "dma-map/2M/4096".
func dmaMapCase(page string, sizeMiB int) string {
	return fmt.Sprintf("%s/%s/%d", caseDMAMap, page, sizeMiB)
}

// Metrics of the DMA-map case besides mDMAMapMs and mDMAMapCalls.
const (
	mDMAMapMiB      = "dma_map_mib"              // guest RAM the RAM calls mapped (union of their IOVA ranges)
	mDMAMapTotalMiB = "dma_map_total_mib"        // sum of their sizes: more than the union when a range was mapped again
	mDMASpanMs      = "dma_map_span_ms"          // first RAM call's entry to the last one's return
	mDMAOtherCalls  = "dma_other_calls"          // MAP_DMA calls of anything else (ROM, BAR)
	mDMAOtherMs     = "dma_other_ms"             // time in those
	mDMALogCalls    = "hpcvmm_log_map_dma_calls" // hpcvmm's own count ("guest RAM DMA-mapped map_dma_calls")
	mDMAStopAfterMs = "ready_ms"                 // launch to the point where the VMM was stopped
)

// vfioIOMMUMapDMA is VFIO_IOMMU_MAP_DMA, _IO(VFIO_TYPE, VFIO_BASE + 13)
// from linux/vfio.h: the kprobe filter's command number.
const vfioIOMMUMapDMA = 0x3b71

// Kprobe event names (group hpcvmm_bench, so removing them cannot touch
// anyone else's events).
const (
	kprobeGroup  = "hpcvmm_bench"
	kprobeMap    = "map_dma"
	kprobeMapRet = "map_dma_ret"
)

// kprobeDefs are the probe definitions for kprobe_events: on x86-64
// vfio_iommu_type1_ioctl(iommu_data, cmd, arg) has cmd in %si and the
// user pointer arg in %dx; +uN() reads the caller's struct
// vfio_iommu_type1_dma_map {u32 argsz, flags; u64 vaddr, iova, size}.
var kprobeDefs = []string{
	"p:" + kprobeGroup + "/" + kprobeMap + " vfio_iommu_type1_ioctl cmd=%si:x32 flags=+u4(%dx):x32 vaddr=+u8(%dx):x64 iova=+u16(%dx):x64 size=+u24(%dx):x64",
	"r:" + kprobeGroup + "/" + kprobeMapRet + " vfio_iommu_type1_ioctl ret=$retval:s64",
}

// dmaCall is one VFIO_IOMMU_MAP_DMA seen in the trace.
type dmaCall struct {
	TID               int
	Start, End        float64 // trace clock, seconds
	Vaddr, IOVA, Size uint64
	Flags             uint64
	Ret               int64
}

func (c dmaCall) ms() float64 { return (c.End - c.Start) * 1000 }

// traceLine matches an ftrace text line: "COMM-TID [CPU] FLAGS TIME: EVENT: ARGS"
// (the irq-flags column and the "(TGID)" column are optional).
var traceLine = regexp.MustCompile(`^\s*(.*?)-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(\d+\.\d+):\s+([\w.-]+):\s*(.*)$`)

// parseMapTrace pairs the map_dma entries of an ftrace text dump with the
// next map_dma_ret of the same thread (a thread is inside one ioctl at a
// time; returns of the other type1 ioctls, which the entry filter leaves
// out, have no open entry and are skipped). It returns the completed
// calls in entry order and describes entries that never returned.
func parseMapTrace(r io.Reader) ([]dmaCall, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	open := map[int]int{} // tid -> index in calls
	var calls []dmaCall
	var problems []string
	for sc.Scan() {
		m := traceLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tid, _ := strconv.Atoi(m[2])
		ts, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		args := traceArgs(m[5])
		switch m[4] {
		case kprobeMap:
			if i, ok := open[tid]; ok {
				problems = append(problems, fmt.Sprintf("thread %d entered MAP_DMA at %.6f without returning from the one at %.6f", tid, ts, calls[i].Start))
			}
			c := dmaCall{TID: tid, Start: ts}
			var bad []string
			for _, f := range []struct {
				k string
				p *uint64
			}{{"vaddr", &c.Vaddr}, {"iova", &c.IOVA}, {"size", &c.Size}, {"flags", &c.Flags}} {
				v, err := strconv.ParseUint(args[f.k], 0, 64)
				if err != nil {
					bad = append(bad, f.k)
				}
				*f.p = v
			}
			if len(bad) > 0 {
				problems = append(problems, fmt.Sprintf("MAP_DMA entry at %.6f: unreadable %s in %q", ts, strings.Join(bad, ", "), m[5]))
				delete(open, tid)
				continue
			}
			open[tid] = len(calls)
			calls = append(calls, c)
		case kprobeMapRet:
			i, ok := open[tid]
			if !ok {
				continue
			}
			delete(open, tid)
			calls[i].End = ts
			ret, err := strconv.ParseInt(args["ret"], 0, 64)
			if err != nil {
				ret = math.MinInt64
			}
			calls[i].Ret = ret
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	done := calls[:0]
	for _, c := range calls {
		if c.End == 0 && c.Start != 0 {
			problems = append(problems, fmt.Sprintf("MAP_DMA of thread %d at %.6f (iova %#x, size %#x) has no return in the trace", c.TID, c.Start, c.IOVA, c.Size))
			continue
		}
		done = append(done, c)
	}
	if len(problems) > 0 {
		return done, errors.New(strings.Join(problems, "; "))
	}
	return done, nil
}

// traceArgs splits "k=v k=v" event arguments.
func traceArgs(s string) map[string]string {
	out := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			out[k] = v
		}
	}
	return out
}

// addrRange is one mapping of a process, [Start, End).
type addrRange struct{ Start, End uint64 }

// memfdRanges returns the memfd mappings in a /proc/PID/maps dump: guest
// RAM for both VMMs (hpcvmm "/memfd:hpcvmm-guest-ram", QEMU's
// memory-backend-memfd "/memfd:memory-backend-memfd"; " (deleted)" may
// follow).
func memfdRanges(r io.Reader) ([]addrRange, error) {
	var out []addrRange
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || !strings.HasPrefix(f[5], "/memfd:") {
			continue
		}
		a, b, ok := strings.Cut(f[0], "-")
		start, err1 := strconv.ParseUint(a, 16, 64)
		end, err2 := strconv.ParseUint(b, 16, 64)
		if !ok || err1 != nil || err2 != nil || end <= start {
			continue
		}
		out = append(out, addrRange{start, end})
	}
	return out, sc.Err()
}

// dmaResult is one run's MAP_DMA calls, split into guest RAM and the rest.
type dmaResult struct {
	RAM, Other []dmaCall
}

// classifyCalls splits calls into those that map guest RAM (inside one of
// the memfd ranges) and the others.
func classifyCalls(calls []dmaCall, memfds []addrRange) dmaResult {
	var r dmaResult
	for _, c := range calls {
		inRAM := false
		for _, m := range memfds {
			if c.Vaddr >= m.Start && c.Size <= m.End-c.Vaddr && c.Vaddr < m.End {
				inRAM = true
				break
			}
		}
		if inRAM {
			r.RAM = append(r.RAM, c)
		} else {
			r.Other = append(r.Other, c)
		}
	}
	return r
}

// metrics fills s from the run's calls; guestBytes is the guest RAM size,
// holeBytes what the VMM may leave unmapped (QEMU: the legacy VGA and ROM
// area below 1 MiB). Every RAM call counts, also one that maps a range
// again (QEMU unmaps and remaps a RAM section when the chipset's memory map
// changes during machine setup: that is time it spends); completeness is
// judged on the union of the IOVA ranges. Incomplete or failed mappings
// make s an error.
func (r dmaResult) metrics(s *Sample, guestBytes, holeBytes uint64) {
	var parts []string
	for _, c := range r.RAM {
		parts = append(parts, fmt.Sprintf("iova=%#x size=%#x ret=%d %.3fms", c.IOVA, c.Size, c.Ret, c.ms()))
	}
	s.Info["ram_calls"] = strings.Join(parts, "; ")
	parts = parts[:0]
	for _, c := range r.Other {
		parts = append(parts, fmt.Sprintf("iova=%#x size=%#x flags=%#x ret=%d %.3fms", c.IOVA, c.Size, c.Flags, c.Ret, c.ms()))
	}
	s.Info["other_calls"] = strings.Join(parts, "; ")

	var ms, otherMs float64
	var total uint64
	first, last := math.Inf(1), math.Inf(-1)
	spans := make([]addrRange, 0, len(r.RAM))
	for _, c := range r.RAM {
		if c.Ret != 0 {
			s.Err = fmt.Sprintf("MAP_DMA of guest RAM (iova %#x, size %#x) returned %d", c.IOVA, c.Size, c.Ret)
			return
		}
		ms += c.ms()
		total += c.Size
		first, last = math.Min(first, c.Start), math.Max(last, c.End)
		spans = append(spans, addrRange{c.IOVA, c.IOVA + c.Size})
	}
	for _, c := range r.Other {
		otherMs += c.ms()
	}
	covered := unionBytes(spans)
	if covered+holeBytes < guestBytes || covered > guestBytes {
		s.Err = fmt.Sprintf("MAP_DMA calls of guest RAM cover %d of its %d bytes (%d calls): the mapping was not complete when the VMM was stopped", covered, guestBytes, len(r.RAM))
		return
	}
	s.Metrics[mDMAMapMs] = ms
	s.Metrics[mDMAMapCalls] = float64(len(r.RAM))
	s.Metrics[mDMAMapMiB] = float64(covered) / (1 << 20)
	s.Metrics[mDMAMapTotalMiB] = float64(total) / (1 << 20)
	s.Metrics[mDMASpanMs] = (last - first) * 1000
	s.Metrics[mDMAOtherCalls] = float64(len(r.Other))
	s.Metrics[mDMAOtherMs] = otherMs
}

// unionBytes is the size of the union of the ranges.
func unionBytes(rs []addrRange) uint64 {
	rs = append([]addrRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	var n, end uint64
	for i, r := range rs {
		if i == 0 || r.Start > end {
			n += r.End - r.Start
			end = r.End
		} else if r.End > end {
			n += r.End - end
			end = r.End
		}
	}
	return n
}

// mapTracer owns the two kprobe events in tracefs.
type mapTracer struct{ dir string }

// tracefsDirs are where tracefs may be mounted (ProfileBench mounts the
// first; the second appears under debugfs).
var tracefsDirs = []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"}

// startMapTracer installs and enables the MAP_DMA probes.
func startMapTracer() (*mapTracer, error) {
	var t *mapTracer
	for _, d := range tracefsDirs {
		if fileExists(filepath.Join(d, "kprobe_events")) {
			t = &mapTracer{dir: d}
			break
		}
	}
	if t == nil {
		return nil, fmt.Errorf("no tracefs with kprobe_events under %s (CONFIG_KPROBE_EVENTS, tracefs mounted?)", strings.Join(tracefsDirs, " or "))
	}
	t.remove() // leftovers of an interrupted run
	for _, d := range kprobeDefs {
		if err := t.write("kprobe_events", d+"\n", true); err != nil {
			t.remove()
			return nil, fmt.Errorf("defining the kprobe %q: %w (is vfio_iommu_type1 loaded?)", d, err)
		}
	}
	steps := []struct{ file, val string }{
		{"trace_clock", "mono"}, // one clock for all CPUs: a call may return on another CPU than it entered
		{"events/" + kprobeGroup + "/" + kprobeMap + "/filter", fmt.Sprintf("cmd == %d", vfioIOMMUMapDMA)},
		{"events/" + kprobeGroup + "/" + kprobeMap + "/enable", "1"},
		{"events/" + kprobeGroup + "/" + kprobeMapRet + "/enable", "1"},
		{"tracing_on", "1"},
	}
	for _, st := range steps {
		if err := t.write(st.file, st.val+"\n", false); err != nil {
			t.remove()
			return nil, err
		}
	}
	return t, nil
}

func (t *mapTracer) write(file, val string, appendTo bool) error {
	flags := os.O_WRONLY | os.O_TRUNC
	if appendTo {
		flags = os.O_WRONLY | os.O_APPEND
	}
	f, err := os.OpenFile(filepath.Join(t.dir, file), flags, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(val)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing %q to %s: %w", strings.TrimSpace(val), filepath.Join(t.dir, file), err)
	}
	return nil
}

// clear empties the trace buffer before a run.
func (t *mapTracer) clear() error { return t.write("trace", "", false) }

// calls parses what the buffer holds.
func (t *mapTracer) calls() ([]dmaCall, error) {
	f, err := os.Open(filepath.Join(t.dir, "trace"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMapTrace(f)
}

// remove disables and deletes this package's probes.
func (t *mapTracer) remove() {
	for _, e := range []string{kprobeMap, kprobeMapRet} {
		_ = t.write("events/"+kprobeGroup+"/"+e+"/enable", "0\n", false)
		_ = t.write("kprobe_events", "-:"+kprobeGroup+"/"+e+"\n", true)
	}
}

// dmaMapUnavailable says why the case cannot run here ("" if it can).
func dmaMapUnavailable(dev string) string {
	link, err := os.Readlink("/sys/bus/pci/devices/" + dev + "/driver")
	if err != nil || filepath.Base(link) != "vfio-pci" {
		return fmt.Sprintf("%s is not bound to vfio-pci (driver link %q, %v)", dev, link, err)
	}
	return ""
}

// runDMAMaps measures every page size and guest RAM size. Runs go round
// by round (run 1 of every cell, then run 2, ...) so a short time budget
// still leaves one run of every cell, and the VMM that goes first
// alternates between rounds. Each page size's hugepage pool is raised for
// its cells and put back afterwards.
func runDMAMaps(ctx context.Context, cfg Config, out sink) {
	dc := cfg.DMAMap
	if len(dc.Pages) == 0 || len(dc.SizesMiB) == 0 {
		out.note("DMA map (VFIO): not measured: no page or guest RAM sizes configured")
		return
	}
	if why := dmaMapUnavailable(dc.Device); why != "" {
		out.note("DMA map (VFIO): not measured: " + why)
		return
	}
	t, err := startMapTracer()
	if err != nil {
		out.note("DMA map (VFIO): not measured: " + err.Error())
		return
	}
	defer t.remove()
	start := time.Now()
	defer func() { out.env(Env{"dma_map_duration": time.Since(start).Round(time.Second).String()}) }()
	deadline, hasDeadline := ctx.Deadline()
	longest := map[string]time.Duration{}
	skipped := map[string]bool{}
	for rep := 1; rep <= max(dc.Reps, dc.Reps4K); rep++ {
		vmms := []string{vmmHPCVMM, vmmQEMU}
		if rep%2 == 0 {
			vmms = []string{vmmQEMU, vmmHPCVMM}
		}
		for _, page := range dc.Pages {
			if rep > dc.repsFor(page) || skipped[page] {
				continue
			}
			todo := false
			for _, size := range dc.SizesMiB {
				c := dmaMapCase(page, size)
				todo = todo || !cfg.done(c, vmmHPCVMM, rep) || !cfg.done(c, vmmQEMU, rep)
			}
			if !todo {
				continue
			}
			restore, err := raisePool(page, slices.Max(dc.SizesMiB))
			if err != nil {
				out.note(fmt.Sprintf("DMA map %s: skipped: %v", page, err))
				skipped[page] = true
				continue
			}
			for _, size := range dc.SizesMiB {
				c := dmaMapCase(page, size)
				for _, v := range vmms {
					if cfg.done(c, v, rep) || (v == vmmQEMU && cfg.QEMU == "") {
						continue
					}
					if ctx.Err() != nil || (hasDeadline && time.Now().Add(longest[c]).After(deadline)) {
						out.note(fmt.Sprintf("DMA map: stopped before %s %s run %d: time budget", c, v, rep))
						restore()
						return
					}
					out.progress(fmt.Sprintf("%s %s run %d", c, v, rep))
					t0 := time.Now()
					out.sample(runDMAMap(ctx, cfg, t, v, page, size, rep))
					longest[c] = max(longest[c], time.Since(t0))
				}
			}
			restore()
		}
	}
}

// repsFor is the number of runs per cell of a page size.
func (dc DMAMapConfig) repsFor(page string) int {
	if page == "4K" && dc.Reps4K > 0 {
		return dc.Reps4K
	}
	return dc.Reps
}

// raisePool makes sizeMiB of page-sized hugepages free (nothing for 4K,
// which needs that much ordinary memory instead) and returns the function
// that puts the pool back to its old size.
func raisePool(page string, sizeMiB int) (restore func(), err error) {
	var kb int
	switch page {
	case "1G":
		kb = 1 << 20
	case "2M":
		kb = 2048
	default:
		if avail := memAvailableMiB(); avail >= 0 && avail < sizeMiB+256 {
			return nil, fmt.Errorf("%d MiB available, %d MiB of 4 KiB pages needed and some room", avail, sizeMiB)
		}
		return func() {}, nil
	}
	dir := fmt.Sprintf("/sys/kernel/mm/hugepages/hugepages-%dkB", kb)
	read := func(f string) int {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return -1
		}
		return n
	}
	nr, free := read("nr_hugepages"), read("free_hugepages")
	if nr < 0 || free < 0 {
		return nil, fmt.Errorf("no %s hugepage pool at %s", page, dir)
	}
	need := sizeMiB * 1024 / kb
	put := func(n int) error {
		return os.WriteFile(filepath.Join(dir, "nr_hugepages"), []byte(strconv.Itoa(n)), 0o644)
	}
	restore = func() { _ = put(nr) }
	if free >= need {
		return restore, nil
	}
	if err := put(nr + need - free); err != nil {
		return nil, fmt.Errorf("raising %s/nr_hugepages from %d to %d: %w", dir, nr, nr+need-free, err)
	}
	if got := read("free_hugepages"); got < need {
		restore()
		return nil, fmt.Errorf("raised %s/nr_hugepages by %d but only %d of %d pages are free (memory too fragmented or short; reserve them at boot)", dir, need-free, got, need)
	}
	return restore, nil
}

// memAvailableMiB is MemAvailable, or -1.
func memAvailableMiB() int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "MemAvailable:"); ok {
			return int(parseKiB(v) / 1024)
		}
	}
	return -1
}

// dmaMapArgv is the command line of one VMM for the case.
func dmaMapArgv(cfg Config, vmm, page string, sizeMiB int) []string {
	mem := strconv.Itoa(sizeMiB) + "M"
	switch vmm {
	case vmmHPCVMM:
		hp := page
		if page == "4K" {
			hp = "none"
		}
		return []string{cfg.HPCVMM, "run", "--kernel", cfg.Kernel, "--initrd", cfg.Initrd, "--cmdline", cfg.Cmdline,
			"--cpus", "1", "--memory", mem, "--hugepages", hp, "--console", "serial", "--gpu", cfg.DMAMap.Device}
	default:
		// The backend hpcvmm uses: a shared memfd, hugetlb of the page
		// size, prefaulted (prealloc-threads: hpcvmm's workers default to
		// the node's CPUs).
		obj := fmt.Sprintf("memory-backend-memfd,id=ram,size=%s,share=on,prealloc=on,prealloc-threads=%d", mem, runtime.NumCPU())
		if page != "4K" {
			obj += ",hugetlb=on,hugetlbsize=" + page
		}
		return []string{cfg.QEMU, "-accel", "kvm", "-M", "q35,memory-backend=ram", "-cpu", "host", "-smp", "1", "-m", mem,
			"-nodefaults", "-no-user-config", "-display", "none", "-S", "-qmp", "stdio",
			"-object", obj, "-device", "vfio-pci,host=" + cfg.DMAMap.Device}
	}
}

// runDMAMap runs one VMM until its guest RAM is DMA-mapped, reads its
// memfd mappings, stops it and measures its MAP_DMA calls from the trace.
func runDMAMap(ctx context.Context, cfg Config, t *mapTracer, vmm, page string, sizeMiB, rep int) Sample {
	s := newSample(dmaMapCase(page, sizeMiB), vmm, cfg.Where, rep)
	argv := dmaMapArgv(cfg, vmm, page, sizeMiB)
	s.Info["argv"] = strings.Join(argv, " ")
	if err := t.clear(); err != nil {
		s.Err = err.Error()
		return s
	}
	timeout := cfg.DMAMap.Timeout
	if timeout <= 0 {
		timeout = 150 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.Command(argv[0], argv[1:]...)
	ready := "first KVM_RUN"
	if vmm == vmmQEMU {
		ready = `"return"` // QMP's answer to qmp_capabilities
	}
	stdout, stderr := newWatch(ready), newWatch(ready)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	p, err := startVMM(cmd, nil)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	defer p.stdin.Close()
	stdin, begin, exited := p.stdin, p.start, p.exited
	readyOn := stderr
	if vmm == vmmQEMU {
		// Queued before QEMU is ready; read once its main loop runs.
		_, _ = io.WriteString(stdin, `{"execute":"qmp_capabilities"}`+"\n")
		readyOn = stdout
	}
	var why string
	select {
	case <-readyOn.hit:
	case <-exited:
		why = fmt.Sprintf("exited before its guest RAM was mapped (%v)", p.waitErr)
	case <-ctx.Done():
		why = fmt.Sprintf("not ready within %v", timeout)
	}
	var memfds []addrRange
	if why == "" {
		s.Metrics[mDMAStopAfterMs] = ms(time.Since(begin))
		f, err := os.Open(fmt.Sprintf("/proc/%d/maps", cmd.Process.Pid))
		if err == nil {
			memfds, err = memfdRanges(f)
			f.Close()
		}
		if err != nil || len(memfds) == 0 {
			why = fmt.Sprintf("no memfd mapping in /proc/%d/maps (%v)", cmd.Process.Pid, err)
		}
	}
	if vmm == vmmQEMU {
		_, _ = io.WriteString(stdin, `{"execute":"quit"}`+"\n")
	}
	// Wait for the exit: the next run needs the hugepages this one holds,
	// and unpinning them is part of the exit.
	t0 := time.Now()
	stopDMAVMM(cmd, exited)
	s.Info["stop"] = time.Since(t0).Round(time.Millisecond).String()
	if why != "" {
		s.Err = fmt.Sprintf("%s %s after %v; stdout tail: %q; stderr tail: %q", vmm, why, time.Since(begin).Round(time.Millisecond),
			tail(stdout.String(), 300), tail(stderr.String(), 600))
		return s
	}
	calls, err := t.calls()
	if err != nil {
		s.Err = "MAP_DMA trace: " + err.Error()
		return s
	}
	var hole uint64
	if vmm == vmmQEMU {
		hole = 1 << 20
	}
	classifyCalls(calls, memfds).metrics(&s, uint64(sizeMiB)<<20, hole)
	if vmm == vmmHPCVMM {
		if a, ok := logRecord(stderr.String(), "guest RAM DMA-mapped"); ok {
			if n, err := strconv.ParseFloat(a["map_dma_calls"], 64); err == nil {
				s.Metrics[mDMALogCalls] = n
				if s.Err == "" && n != s.Metrics[mDMAMapCalls] {
					s.Info["count_mismatch"] = fmt.Sprintf("hpcvmm logged %v map_dma_calls, the trace saw %v guest RAM calls", n, s.Metrics[mDMAMapCalls])
				}
			}
		}
	}
	return s
}

// stopDMAVMM stops a VMM of the DMA-map case: SIGTERM (QEMU was also asked
// to quit), and a kill when a grace period that covers unpinning 4 GiB of
// 4 KiB pages under emulation has passed.
func stopDMAVMM(cmd *exec.Cmd, exited <-chan struct{}) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(60 * time.Second):
	}
	_ = cmd.Process.Kill()
	<-exited
}

// renderDMAMap renders the DMA-map table ("" without samples). Long on
// purpose: the table's header, rows and notes in the order they print.
func renderDMAMap(rep *Report, ix statIndex, where, whereText string) string {
	type row struct {
		page string
		size int
	}
	seen := map[row]bool{}
	var rows []row
	for _, st := range ix {
		if st.Where != where || !strings.HasPrefix(st.Case, caseDMAMap+"/") {
			continue
		}
		parts := strings.Split(st.Case, "/")
		if len(parts) != 3 {
			continue
		}
		size, err := strconv.Atoi(parts[2])
		if err != nil {
			continue
		}
		r := row{parts[1], size}
		if !seen[r] {
			seen[r] = true
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return ""
	}
	order := map[string]int{"1G": 0, "2M": 1, "4K": 2}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].page != rows[j].page {
			return order[rows[i].page] < order[rows[j].page]
		}
		return rows[i].size < rows[j].size
	})
	var b strings.Builder
	runs := fmt.Sprintf("%d runs per cell", rep.Config.DMAMap.Reps)
	if r4 := rep.Config.DMAMap.Reps4K; r4 > 0 && r4 != rep.Config.DMAMap.Reps {
		runs += fmt.Sprintf(", %d with 4 KiB pages (their runs are long: each prefaults its RAM at 4 KiB under emulation)", r4)
	}
	fmt.Fprintf(&b, "\n**VFIO DMA map of guest RAM** (ms in VFIO_IOMMU_MAP_DMA, summed over the calls that map guest RAM, median (min–max); MAP_DMA calls; %s; %s; lower is better, ratio < 1: hpcvmm faster). "+
		"hpcvmm `run --gpu BDF --memory SIZE --hugepages P`, stopped at its first KVM_RUN; QEMU `-M q35,memory-backend=ram -object memory-backend-memfd,share=on,prealloc=on[,hugetlb=on,hugetlbsize=P] -device vfio-pci,host=BDF -S`, stopped when QMP answers. "+
		"Timed by kprobes on vfio_iommu_type1_ioctl (entry filtered to MAP_DMA, and return), the same for both; a call maps guest RAM when its vaddr range lies in the VMM's guest RAM memfd. Device: %s.\n\n",
		whereText, runs, orUnknown(rep.Config.DMAMap.Device))
	b.WriteString("| page | guest RAM | hpcvmm ms | QEMU ms | hpcvmm/QEMU | MAP_DMA calls hpcvmm | MAP_DMA calls QEMU | runs hpcvmm | runs QEMU |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		c := dmaMapCase(r.page, r.size)
		h, hok := ix.get(where, c, vmmHPCVMM, mDMAMapMs)
		q, qok := ix.get(where, c, vmmQEMU, mDMAMapMs)
		ratioCell := ""
		if hok && qok {
			ratioCell = fmtRatio(ratio(h.Median, q.Median))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.page, fmtMiB(r.size),
			rangeCell(ix, where, c, vmmHPCVMM, h, hok, 1), rangeCell(ix, where, c, vmmQEMU, q, qok, 1), ratioCell,
			callsCell(ix, where, c, vmmHPCVMM), callsCell(ix, where, c, vmmQEMU),
			runsCell(ix, where, c, vmmHPCVMM), runsCell(ix, where, c, vmmQEMU))
	}
	var other []string
	for _, v := range []string{vmmHPCVMM, vmmQEMU} {
		var calls, msv []float64
		for _, r := range rows {
			c := dmaMapCase(r.page, r.size)
			if st, ok := ix.get(where, c, v, mDMAOtherCalls); ok {
				calls = append(calls, st.Median)
			}
			if st, ok := ix.get(where, c, v, mDMAOtherMs); ok {
				msv = append(msv, st.Median)
			}
		}
		if len(calls) == 0 {
			continue
		}
		cm, clo, chi := medianMinMax(calls)
		mm, _, _ := medianMinMax(msv)
		what := "ROMs, read-only"
		if v == vmmHPCVMM {
			what = "the device's BAR, for peer-to-peer (`--p2p`)"
		}
		other = append(other, fmt.Sprintf("%s %s calls (%s; %.1f ms median)", v, rangeText(cm, clo, chi), what, mm))
	}
	if len(other) > 0 {
		fmt.Fprintf(&b, "\nMAP_DMA calls not for guest RAM, left out above (median per run over the cells): %s.\n", strings.Join(other, "; "))
	}
	var again []string
	for _, v := range []string{vmmHPCVMM, vmmQEMU} {
		var f []float64
		for _, r := range rows {
			c := dmaMapCase(r.page, r.size)
			tot, ok1 := ix.get(where, c, v, mDMAMapTotalMiB)
			cov, ok2 := ix.get(where, c, v, mDMAMapMiB)
			if ok1 && ok2 && cov.Median > 0 {
				f = append(f, tot.Median/cov.Median)
			}
		}
		if len(f) > 0 {
			md, lo, hi := medianMinMax(f)
			again = append(again, fmt.Sprintf("%s %.2f (%.2f–%.2f)", v, md, lo, hi))
		}
	}
	if len(again) > 0 {
		fmt.Fprintf(&b, "Bytes passed to guest-RAM MAP_DMA calls per byte of guest RAM mapped (above 1: ranges mapped again; their calls and time are counted above): %s.\n", strings.Join(again, "; "))
	}
	return b.String()
}

// callsCell is the median MAP_DMA count, with the range if runs differed.
func callsCell(ix statIndex, where, c, vmm string) string {
	st, ok := ix.get(where, c, vmm, mDMAMapCalls)
	if !ok {
		return "–"
	}
	return rangeText(st.Median, st.Min, st.Max)
}

func rangeText(md, lo, hi float64) string {
	if lo == hi {
		return fmt.Sprintf("%.0f", md)
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", md, lo, hi)
}

// runsCell is "ok/attempted".
func runsCell(ix statIndex, where, c, vmm string) string {
	failed, ok := ix.failures(where, c, vmm)
	return fmt.Sprintf("%d/%d", ok, ok+failed)
}

// fmtMiB writes whole GiB as "4 GiB".
func fmtMiB(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%d GiB", mib/1024)
	}
	return fmt.Sprintf("%d MiB", mib)
}

// l1DMAMap is the DMA-map case inside the bench L1: edu, 1, 2 and 4 GiB on
// each page size, at most two runs per cell, one with 4 KiB pages. Every
// run prefaults its guest RAM under emulation before it maps it; measured
// in L1 with a host load of 10: 20 s for 1 GiB of 4 KiB pages against 6 s
// for 1 GiB of 1 GiB pages, so three rounds of the 4 KiB cells alone
// would take about 15 minutes.
func l1DMAMap(reps int) DMAMapConfig {
	return DMAMapConfig{
		Device:   harness.EduBDF,
		Pages:    []string{"1G", "2M", "4K"},
		SizesMiB: []int{1024, 2048, 4096},
		Reps:     min(2, reps),
		Reps4K:   1,
		Sec:      180,
		// The longest run measured (4 GiB of 4 KiB pages, host load 8)
		// was ready after 45 s and gone 9 s later; the outer side's idle
		// limit (a hung L1) grows with this.
		Timeout: 100 * time.Second,
	}
}
