package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Config is what one run of the suite does, on the host or inside L1 (where
// it arrives as /hpcvmm/bench/config.json).
type Config struct {
	Where           string          `json:"where"`                       // whereL1 or whereHost
	Reps            int             `json:"reps"`                        // runs per case and VMM
	BindsVMMs       []string        `json:"binds_vmms,omitempty"`        // the binds case's configurations to run (all when empty)
	BudgetSec       int             `json:"budget_s"`                    // the whole suite's time limit
	PrefaultSec     int             `json:"prefault_s"`                  // time kept for the prefault cases
	VMTimeout       time.Duration   `json:"vm_timeout_ns"`               // one boot's limit
	VMStall         time.Duration   `json:"vm_stall_ns"`                 // a boot whose console is silent this long is stuck
	PrefaultReps    int             `json:"prefault_reps"`               // runs per prefault case and VMM
	WarmUpMiB       int             `json:"warm_up_mib"`                 // 4 KiB memory touched once before the launches
	Kernel          string          `json:"kernel"`                      // the L2 kernel: Debian's stock bzImage
	Initrd          string          `json:"initrd"`                      // the L2 initramfs (tests/guest/init)
	Cmdline         string          `json:"cmdline"`                     // the L2 kernel command line, the same for every VMM
	MemoryMiB       int             `json:"memory_mib"`                  // L2 RAM
	HPCVMM          string          `json:"hpcvmm"`                      // static hpcvmm
	QEMU            string          `json:"qemu"`                        // qemu-system-x86_64
	GoKVM           string          `json:"gokvm"`                       // gokvm, empty when it did not build
	GoKVMError      string          `json:"gokvm_error"`                 // why gokvm is missing
	VMMs            []string        `json:"vmms"`                        // launch case VMMs, hpcvmm first
	Last            []string        `json:"last"`                        // VMMs whose launches run at the very end
	LastSec         int             `json:"last_s"`                      // time kept for them
	Prefault        []PrefaultSpec  `json:"prefault"`                    // prefault cases
	QEMUAccel       string          `json:"qemu_accel"`                  // accelerator for QEMU's machine-less prefault runs
	NetAvailable    string          `json:"net_available"`               // "" or why the virtio-net case cannot run
	NetMiB          int             `json:"net_mib"`                     // bytes each way per network run
	NetReps         int             `json:"net_reps"`                    // runs per network configuration
	NetSec          int             `json:"net_s"`                       // time kept for the network case
	NetTimeout      time.Duration   `json:"net_timeout_ns"`              // one network run's limit
	DMA             string          `json:"dma_unavailable"`             // why the VFIO DMA-map case cannot run
	DMAMap          DMAMapConfig    `json:"dma_map"`                     // the VFIO DMA-map case (dmamap.go)
	LaunchPages     string          `json:"launch_pages"`                // guest RAM of the booting cases: pages2M or pages4K ("": 4K, older reports)
	ConsoleReps     int             `json:"console_reps"`                // runs per VMM of the virtio-console case
	ConsoleSec      int             `json:"console_s"`                   // time kept for the console case
	ConsoleLimit    time.Duration   `json:"console_timeout_ns"`          // one console run's limit
	DefaultsSec     int             `json:"defaults_s"`                  // time kept for the defaults case
	MemorySec       int             `json:"memory_s"`                    // time kept for the VMM-memory case
	Cases           []string        `json:"cases"`                       // which cases run: launch, defaults, memory, net, console, prefault, dma-map, job, job-build, pingpong
	Busybox         string          `json:"busybox,omitempty"`           // static busybox for the job cases' rootfs
	JobQEMUInitrd   string          `json:"job_qemu_initrd,omitempty"`   // the job case's QEMU initramfs (/init: true, poweroff)
	PingPong        string          `json:"pingpong,omitempty"`          // the static pinger (tests/guest/pingpong)
	PingPongError   string          `json:"pingpong_error,omitempty"`    // why it is missing
	JobSec          int             `json:"job_s,omitempty"`             // time kept for the job and pingpong cases
	MPITimeout      time.Duration   `json:"mpi_timeout_ns,omitempty"`    // one srun of the mpi case (mpi.go)
	FSBench         string          `json:"fsbench,omitempty"`           // the binds case's static tests/guest/fsbench (binds.go)
	FSBenchError    string          `json:"fsbench_error,omitempty"`     // why it or the QEMU guest is missing
	BindsQEMUInitrd string          `json:"binds_qemu_initrd,omitempty"` // the binds case's QEMU initramfs
	BindsTimeout    time.Duration   `json:"binds_timeout_ns,omitempty"`  // one run of the binds case
	Done            map[string]bool `json:"done,omitempty"`              // samples an earlier L1 boot already took (sampleKey)
	FailedVMMs      map[string]bool `json:"failed,omitempty"`            // case|VMM pairs that failed in an earlier L1 boot
	FailedRuns      map[string]int  `json:"failed_runs,omitempty"`       // how many runs of each case|VMM failed there
}

// sink receives the suite's output as it is produced: inside L1 each piece
// goes to the result port at once, so a hang late in the suite loses
// nothing measured before it.
type sink interface {
	progress(string) // what starts now: lets the outer side tell a hung L1 from a slow one
	env(Env)
	sample(Sample)
	note(string)
}

// runSuite runs every case of cfg within its budget.
func runSuite(ctx context.Context, cfg Config, out sink) {
	start := time.Now()
	deadline := start.Add(time.Duration(cfg.BudgetSec) * time.Second)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	out.env(describeEnv(cfg))

	if cfg.WarmUpMiB > 0 && (cfg.wants(caseLaunch) || cfg.wants(caseDefaults) || cfg.wants(caseMemory) || cfg.wants(caseNet) || cfg.wants(caseConsole) ||
		cfg.wants(caseJob) || cfg.wants(casePingPong)) {
		warmUp(cfg, out)
		if cfg.launchPages() == pages2M {
			warmUpHugepages(cfg, out)
		}
	}
	// Time is kept back only for the cases that run.
	var prefaultReserve, netReserve time.Duration
	if cfg.wants(casePrefault) {
		prefaultReserve = time.Duration(cfg.PrefaultSec) * time.Second
	}
	if cfg.wants(caseNet) {
		netReserve = time.Duration(cfg.NetSec) * time.Second
	}
	// The DMA-map case runs after the prefault case, before the Last
	// VMMs' launches: its time is kept with theirs.
	var dmaReserve time.Duration
	if cfg.wants(caseDMAMap) && cfg.DMA == "" {
		dmaReserve = time.Duration(cfg.DMAMap.Sec) * time.Second
	}
	var consoleReserve time.Duration
	if cfg.wants(caseConsole) {
		consoleReserve = time.Duration(cfg.ConsoleSec) * time.Second
	}
	var defaultsReserve, memoryReserve time.Duration
	if cfg.wants(caseDefaults) {
		defaultsReserve = time.Duration(cfg.DefaultsSec) * time.Second
	}
	if cfg.wants(caseMemory) {
		memoryReserve = time.Duration(cfg.MemorySec) * time.Second
	}
	var jobReserve time.Duration
	if cfg.wants(caseJob) || cfg.wants(casePingPong) {
		jobReserve = time.Duration(cfg.JobSec) * time.Second
	}
	lastOnly := time.Duration(cfg.LastSec) * time.Second
	if kept := fitReserves(time.Until(deadline), &defaultsReserve, &memoryReserve, &prefaultReserve, &netReserve, &dmaReserve, &consoleReserve, &jobReserve, &lastOnly); kept < 1 {
		out.note(fmt.Sprintf("time budget %v: each later case keeps %.0f%% of its usual share", time.Until(deadline).Round(time.Second), 100*kept))
	}
	lastReserve := lastOnly + dmaReserve
	canBoot := cfg.Where == whereL1 || kvmUsable()
	// VMMs in Last run after everything else: in the test bed a stuck
	// gokvm guest once took all of L1 down with it, and nothing measured
	// after it would have come back.
	first, last := splitVMMs(cfg.VMMs, cfg.Last)
	if canBoot && cfg.wants(caseLaunch) {
		c := cfg
		c.VMMs = first
		runLaunches(ctx, c, deadline.Add(-defaultsReserve-memoryReserve-prefaultReserve-netReserve-consoleReserve-jobReserve-lastReserve), out)
	} else if cfg.wants(caseLaunch) {
		out.note("launch cases: skipped on this host (no usable hardware /dev/kvm; they run inside L1)")
	}
	if canBoot && cfg.wants(caseMemory) {
		mctx, mcancel := context.WithDeadline(ctx, deadline.Add(-defaultsReserve-prefaultReserve-netReserve-consoleReserve-jobReserve-lastReserve))
		runMemory(mctx, cfg, out)
		mcancel()
	}
	if canBoot && cfg.wants(caseDefaults) {
		dctx, dcancel := context.WithDeadline(ctx, deadline.Add(-prefaultReserve-netReserve-consoleReserve-jobReserve-lastReserve))
		runDefaults(dctx, cfg, out)
		dcancel()
	}
	switch {
	case !cfg.wants(caseNet):
	case cfg.NetAvailable != "":
		out.note("virtio-net throughput: not yet available: " + cfg.NetAvailable)
	case canBoot && cfg.NetMiB > 0 && cfg.NetReps > 0:
		nctx, ncancel := context.WithDeadline(ctx, deadline.Add(-prefaultReserve-consoleReserve-jobReserve-lastReserve))
		runNets(nctx, cfg, out)
		ncancel()
	}
	if canBoot && cfg.wants(caseConsole) && cfg.ConsoleReps > 0 {
		cctx, ccancel := context.WithDeadline(ctx, deadline.Add(-prefaultReserve-jobReserve-lastReserve))
		runConsoles(cctx, cfg, out)
		ccancel()
	}
	if canBoot && (cfg.wants(caseJob) || cfg.wants(casePingPong)) {
		jctx, jcancel := context.WithDeadline(ctx, deadline.Add(-prefaultReserve-lastReserve))
		if cfg.wants(caseJob) {
			runJobs(jctx, cfg, out)
		}
		if cfg.wants(casePingPong) {
			runPingPongs(jctx, cfg, out)
		}
		jcancel()
	} else if cfg.wants(caseJob) || cfg.wants(casePingPong) {
		out.note("job and pingpong cases: skipped on this host (no usable hardware /dev/kvm; they run inside L1)")
	}
	// The binds case runs only when named (binds.go).
	if canBoot && wantsBinds(cfg.Cases) {
		runBinds(ctx, cfg, out)
	}
	// The mpi case runs only when named, in the Slurm L1 (mpi.go).
	if canBoot && wantsMPI(cfg.Cases) {
		runMPIs(ctx, cfg, out)
	}
	if cfg.wants(casePrefault) {
		pctx, pcancel := context.WithDeadline(ctx, deadline.Add(-lastReserve))
		runPrefaults(pctx, cfg, out)
		pcancel()
	}
	switch {
	case !cfg.wants(caseDMAMap):
	case cfg.DMA != "":
		out.note("DMA map (VFIO): not measured: " + cfg.DMA)
	case canBoot:
		dctx, dcancel := context.WithDeadline(ctx, deadline.Add(-lastReserve+dmaReserve))
		runDMAMaps(dctx, cfg, out)
		dcancel()
	}
	if canBoot && cfg.wants(caseLaunch) && len(last) > 0 {
		c := cfg
		c.VMMs = last
		runLaunches(ctx, c, deadline, out)
	}
	e := Env{"load_end": loadavg(), "suite_duration": time.Since(start).Round(time.Second).String()}
	out.env(e)
}

// fitReserves shrinks the times kept for the later cases, all by the same
// factor, when together they would take more than four fifths of budget
// (an L1 boot that continues after a hung one has less time than the
// first), and returns the factor. Time a case does not use passes on to
// the cases after it, so a case that needs less than its share (or has
// nothing left to run) costs the others nothing; shrinking the shares
// evenly keeps every case some time instead of starving the earlier ones.
func fitReserves(budget time.Duration, reserves ...*time.Duration) float64 {
	var sum time.Duration
	for _, r := range reserves {
		sum += *r
	}
	limit := budget * 4 / 5
	if sum <= limit || sum <= 0 {
		return 1
	}
	f := float64(max(limit, 0)) / float64(sum)
	for _, r := range reserves {
		*r = time.Duration(float64(*r) * f)
	}
	return f
}

// splitVMMs separates the VMMs named in last from the others, keeping
// their order.
func splitVMMs(vmms, last []string) (first, tail []string) {
	for _, v := range vmms {
		if slices.Contains(last, v) {
			tail = append(tail, v)
		} else {
			first = append(first, v)
		}
	}
	return first, tail
}

// maxFailures is how many failed runs without a single success make a VMM
// count as unable to run a case.
const maxFailures = 2

// sampleKey names one run for Done.
func sampleKey(c, vmm string, rep int) string { return fmt.Sprintf("%s|%s|%d", c, vmm, rep) }

// done reports whether an earlier L1 boot already took this run.
func (cfg Config) done(c, vmm string, rep int) bool { return cfg.Done[sampleKey(c, vmm, rep)] }

// failedBefore reports whether vmm failed every run of case c it had in
// an earlier L1 boot; like such a failure in this boot, it is not repeated.
func (cfg Config) failedBefore(c, vmm string) bool { return cfg.FailedVMMs[c+"|"+vmm] }

// succeededBefore reports whether vmm had a successful run of case c in an
// earlier L1 boot.
func (cfg Config) succeededBefore(c, vmm string) bool {
	for k := range cfg.Done {
		if strings.HasPrefix(k, c+"|"+vmm+"|") && !cfg.FailedVMMs[c+"|"+vmm] {
			return true
		}
	}
	return false
}

// wants reports whether case c is selected (all are when Cases is empty).
func (cfg Config) wants(c string) bool {
	return len(cfg.Cases) == 0 || slices.Contains(cfg.Cases, c)
}

// runLaunches boots every VMM Reps times, interleaved (rep 1 of each VMM,
// then rep 2, ...) so that a change in the machine's load hits all VMMs
// alike. A VMM that failed twice without ever booting is not run again:
// that is a property of the VMM (it cannot boot this kernel), and each
// retry would cost a timeout. Any other failure is the test bed's (an L2
// stalled or panicked under nested KVM on TCG, which happens to every VMM
// now and then): it is counted, and the remaining runs go ahead.
func runLaunches(ctx context.Context, cfg Config, until time.Time, out sink) {
	failed := map[string]bool{}
	succeeded := map[string]bool{}
	failures := map[string]int{}
	for _, v := range cfg.VMMs {
		failures[v] = cfg.FailedRuns[caseLaunch+"|"+v]
		failed[v] = cfg.failedBefore(caseLaunch, v) && failures[v] >= maxFailures
	}
	if d, err := primeKernelCache(cfg.Kernel); err != nil {
		out.note(fmt.Sprintf("launch cases: priming hpcvmm's kernel cache failed (hpcvmm runs decompress on their own): %v", err))
	} else {
		out.note(fmt.Sprintf("launch cases: hpcvmm's kernel cache primed in %v (unmeasured); every hpcvmm run finds it warm", d.Round(time.Millisecond)))
	}
	longest := map[string]time.Duration{}
	ran := false
	for rep := 1; rep <= cfg.Reps; rep++ {
		var need time.Duration
		for _, v := range cfg.VMMs {
			if !failed[v] && !cfg.done(caseLaunch, v, rep) {
				need += longest[v]
			}
		}
		if ran && time.Now().Add(need).After(until) {
			out.note(fmt.Sprintf("launch cases: stopped before run %d of %d per VMM to stay within the time budget", rep, cfg.Reps))
			return
		}
		for _, v := range cfg.VMMs {
			if failed[v] || cfg.done(caseLaunch, v, rep) {
				continue
			}
			ran = true
			out.progress(fmt.Sprintf("launch %s run %d", v, rep))
			t0 := time.Now()
			s := runLaunch(ctx, cfg, v, rep)
			longest[v] = max(longest[v], time.Since(t0))
			out.sample(s)
			switch {
			case s.Err == "":
				succeeded[v] = true
			case succeeded[v] || cfg.succeededBefore(caseLaunch, v):
				out.note(fmt.Sprintf("launch %s: run %d failed (it had booted before, so the remaining runs go ahead): %s", v, rep, s.Err))
			default:
				failures[v]++
				if failures[v] >= maxFailures {
					failed[v] = true
					out.note(fmt.Sprintf("launch %s: run %d failed, %d failures and no boot: not run again: %s", v, rep, failures[v], s.Err))
				} else {
					out.note(fmt.Sprintf("launch %s: run %d failed (it gets one more run before it counts as unable to boot): %s", v, rep, s.Err))
				}
			}
			if ctx.Err() != nil {
				out.note("launch cases: suite time budget exhausted")
				return
			}
		}
	}
}

// runPrefaults measures hpcvmm's and QEMU's RAM prefault for every page
// size and worker count, alternating hpcvmm and QEMU per run.
func runPrefaults(ctx context.Context, cfg Config, out sink) {
	for _, spec := range cfg.Prefault {
		if why := poolShort(spec); why != "" {
			out.note(fmt.Sprintf("prefault %s (%s): skipped: %s", spec.Page, cfg.Where, why))
			continue
		}
		todo := false
		for _, w := range spec.Workers {
			for rep := 1; rep <= max(cfg.PrefaultReps, 1); rep++ {
				todo = todo || !cfg.done(prefaultCase(spec.Page, w), vmmHPCVMM, rep) || !cfg.done(prefaultCase(spec.Page, w), vmmQEMU, rep)
			}
		}
		if !todo {
			continue
		}
		if cfg.WarmUpMiB > 0 {
			// Unmeasured: the first touch of these hugepages is paid by
			// the host under L1 (TCG allocates L1's RAM lazily), and must
			// not be billed to whichever VMM comes first.
			if w := runHPCVMMPrefault(cfg.Where, spec, 0, 0); w.Err != "" {
				out.note(fmt.Sprintf("prefault %s warm-up (%s): %s", spec.Page, cfg.Where, w.Err))
			}
		}
		reps := cfg.PrefaultReps
		if reps < 1 {
			reps = cfg.Reps
		}
		for _, w := range spec.Workers {
			for rep := 1; rep <= reps; rep++ {
				if ctx.Err() != nil {
					out.note(fmt.Sprintf("prefault %s workers=%d (%s): stopped at run %d of %d: time budget", spec.Page, w, cfg.Where, rep, reps))
					return
				}
				c := prefaultCase(spec.Page, w)
				out.progress(fmt.Sprintf("%s run %d", c, rep))
				if !cfg.done(c, vmmHPCVMM, rep) {
					out.sample(runHPCVMMPrefault(cfg.Where, spec, w, rep))
				}
				if cfg.QEMU != "" && !cfg.done(c, vmmQEMU, rep) {
					if ctx.Err() != nil {
						// Not a failure of QEMU's: its run never started.
						out.note(fmt.Sprintf("prefault %s workers=%d (%s): QEMU's run %d not started: time budget", spec.Page, w, cfg.Where, rep))
						return
					}
					out.sample(runQEMUPrefault(ctx, cfg.Where, cfg.QEMU, cfg.QEMUAccel, spec, w, rep))
				}
			}
		}
	}
}

// warmUp touches cfg.WarmUpMiB of ordinary memory once and frees it. Inside
// L1 the host backs L1's RAM only when L1 first touches it, which would
// make the first VMM's boot pay for everyone's; afterwards the kernel hands
// out pages the host already backs.
func warmUp(cfg Config, out sink) {
	t0 := time.Now()
	s := runHPCVMMPrefault(cfg.Where, PrefaultSpec{Page: "4K", SizeMiB: cfg.WarmUpMiB}, 0, 0)
	if s.Err != "" {
		out.note(fmt.Sprintf("warm-up of %d MiB (%s): %s", cfg.WarmUpMiB, cfg.Where, s.Err))
		return
	}
	out.env(Env{"warm_up": fmt.Sprintf("%d MiB touched in %v before the launches", cfg.WarmUpMiB, time.Since(t0).Round(time.Millisecond))})
}

// poolShort says why spec's hugepages are not available ("" if they are).
func poolShort(spec PrefaultSpec) string {
	var kb int
	switch spec.Page {
	case "2M":
		kb = 2048
	case "1G":
		kb = 1048576
	default:
		return ""
	}
	dir := fmt.Sprintf("/sys/kernel/mm/hugepages/hugepages-%dkB", kb)
	b, err := os.ReadFile(dir + "/free_hugepages")
	if err != nil {
		return fmt.Sprintf("no %s hugepages on this kernel (%v)", spec.Page, err)
	}
	var free int
	fmt.Sscan(string(b), &free)
	need := spec.SizeMiB * 1024 / kb
	if free < need {
		return fmt.Sprintf("%d free %s hugepages, %d needed (raise %s/nr_hugepages)", free, spec.Page, need, dir)
	}
	return ""
}

// describeEnv records the machine the samples come from.
func describeEnv(cfg Config) Env {
	e := Env{"where": cfg.Where, "load_start": loadavg(), "cpus": fmt.Sprint(runtime.NumCPU())}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		e["kernel"] = unix.ByteSliceToString(u.Release[:])
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				e["cpu_model"] = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && k == "MemTotal" {
				e["memtotal_kib"] = fmt.Sprint(parseKiB(v))
			}
		}
	}
	for _, kb := range []int{2048, 1048576} {
		if b, err := os.ReadFile(fmt.Sprintf("/sys/kernel/mm/hugepages/hugepages-%dkB/nr_hugepages", kb)); err == nil {
			e[fmt.Sprintf("hugepages_%dkB", kb)] = strings.TrimSpace(string(b))
		}
	}
	if cfg.QEMU != "" {
		if b, err := exec.Command(cfg.QEMU, "--version").Output(); err == nil {
			e["qemu_version"] = strings.SplitN(strings.TrimSpace(string(b)), "\n", 2)[0]
		}
	}
	return e
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return strings.TrimSpace(string(b))
	}
	return strings.Join(f[:3], " ")
}
