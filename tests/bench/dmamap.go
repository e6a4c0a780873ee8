package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
