package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

// VMM names used in samples and tables.
const (
	vmmHPCVMM = "hpcvmm"
	// vmmHPCVMMGuestKernel is hpcvmm with --kernel-decompress guest: the
	// bzImage's own decompressor, as before the kernel cache, measured
	// beside hpcvmm's default (host decompression, warm cache).
	vmmHPCVMMGuestKernel = "hpcvmm-kdecomp-guest"
	vmmQEMUMicrovm       = "qemu-microvm"
	vmmQEMUQ35           = "qemu-q35"
	vmmGoKVM             = "gokvm"
	vmmQEMU              = "qemu" // prefault: QEMU's memory backend, no machine
)

// Where a sample was taken.
const (
	whereL1   = "l1"   // inside the emulated L1 of the nested test bed
	whereHost = "host" // directly on the machine running the command
)

// Case names (Sample.Case); prefault cases are "prefault/PAGE/workers=N".
const (
	caseLaunch   = "launch"
	casePrefault = "prefault"
	caseDMAMap   = "dma-map"
)

// Metric names. Launch samples carry the time metrics, the memory metrics
// and one "kvm.NAME" metric per KVM statistic, "exit.REASON" per hpcvmm
// userspace exit reason.
const (
	mLaunchToInit      = "launch_to_init_ms"       // process launch to the guest's init marker on the console
	mFirstRunSinceStrt = "first_kvm_run_ms"        // hpcvmm's own log: its start to the BSP's first KVM_RUN
	mFirstRunSeen      = "first_kvm_run_seen_ms"   // bench clock: launch to that log line arriving
	mGuestUptimeAtInit = "guest_uptime_at_init_ms" // the guest kernel's uptime when /init ran
	mGuestClockStart   = "guest_clock_start_ms"    // when the guest's clock started, dated by its console lines' arrival (guestClock)
	mGuestClockLost    = "guest_clock_lost_ms"     // wall time the guest's clock did not count by the last line (guestClock)
	mGuestClockRate    = "guest_clock_rate"        // the guest clock's rate against wall time over the last third of the lines
	mRSS               = "vmrss_kib"               // VmRSS + HugetlbPages at the marker
	mHugetlb           = "hugetlb_kib"             // of which HugetlbPages
	mRSSGuest          = "guest_ram_rss_kib"       // resident part of the guest RAM mapping(s)
	mRSSOverhead       = "overhead_rss_kib"        // VmRSS minus guest RAM: what the VMM itself costs
	mRSSAnon           = "rss_anon_kib"            // RssAnon at the marker (heap, stacks)
	mRSSFile           = "rss_file_kib"            // RssFile at the marker (binary and libraries)
	mThreads           = "threads"                 // the VMM's threads at the marker
	mLargestAnon       = "rss_largest_anon_kib"    // the largest anonymous mapping's resident KiB (a Go VMM's heap arena)
	mHWM               = "vmhwm_kib"               // peak RSS
	mHPCVMMPrefault    = "hpcvmm_prefault_ms"      // hpcvmm log: prefault of the guest RAM
	mHPCVMMKernel      = "hpcvmm_kernel_ms"        // hpcvmm log: kernel cache read and SHA-256 check (or decompression)
	mGiBps             = "gib_per_s"               // prefault throughput
	mPrefaultMs        = "prefault_ms"             // prefault time
	mSizeMiB           = "size_mib"                // prefaulted guest RAM
	mReadyPreallocMs   = "qemu_ready_prealloc_ms"  // QEMU: launch to QMP ready with prealloc=on
	mReadyBaselineMs   = "qemu_ready_baseline_ms"  // QEMU: the same with prealloc=off
	mDMAMapMs          = "dma_map_ms"              // VFIO_IOMMU_MAP_DMA of all guest RAM
	mDMAMapCalls       = "map_dma_calls"           // MAP_DMA calls for that
)

// Sample is one run of one VMM in one case.
type Sample struct {
	Case    string             `json:"case"`
	VMM     string             `json:"vmm"`
	Where   string             `json:"where"`
	Rep     int                `json:"rep"`
	Err     string             `json:"error,omitempty"`
	Metrics map[string]float64 `json:"metrics,omitempty"`
	Info    map[string]string  `json:"info,omitempty"`
}

func newSample(c, vmm, where string, rep int) Sample {
	return Sample{Case: c, VMM: vmm, Where: where, Rep: rep, Metrics: map[string]float64{}, Info: map[string]string{}}
}

// Stat summarizes one metric of one VMM in one case over its successful
// runs.
type Stat struct {
	Case   string  `json:"case"`
	Where  string  `json:"where"`
	VMM    string  `json:"vmm"`
	Metric string  `json:"metric"`
	N      int     `json:"n"`
	Failed int     `json:"failed"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// summarize computes a Stat for every (where, case, VMM, metric) present in
// samples. Failed samples count in Failed of every metric the successful
// ones have.
func summarize(samples []Sample) []Stat {
	type key struct{ where, c, vmm, metric string }
	vals := map[key][]float64{}
	type group struct{ where, c, vmm string }
	failed := map[group]int{}
	metrics := map[group]map[string]bool{}
	for _, s := range samples {
		g := group{s.Where, s.Case, s.VMM}
		if metrics[g] == nil {
			metrics[g] = map[string]bool{}
		}
		if s.Err != "" {
			failed[g]++
			continue
		}
		for m, v := range s.Metrics {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				continue
			}
			k := key{s.Where, s.Case, s.VMM, m}
			vals[k] = append(vals[k], v)
			metrics[g][m] = true
		}
	}
	var out []Stat
	for g, ms := range metrics {
		if len(ms) == 0 {
			// Only failures: one line that says so.
			out = append(out, Stat{Where: g.where, Case: g.c, VMM: g.vmm, Failed: failed[g]})
			continue
		}
		for m := range ms {
			v := vals[key{g.where, g.c, g.vmm, m}]
			md, lo, hi := medianMinMax(v)
			out = append(out, Stat{Where: g.where, Case: g.c, VMM: g.vmm, Metric: m, N: len(v), Failed: failed[g], Median: md, Min: lo, Max: hi})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		return fmt.Sprint(a.Where, "\x00", a.Case, "\x00", a.VMM, "\x00", a.Metric) < fmt.Sprint(b.Where, "\x00", b.Case, "\x00", b.VMM, "\x00", b.Metric)
	})
	return out
}

// medianMinMax returns the median (the mean of the two middle values for
// an even count), minimum and maximum; NaN for no values.
func medianMinMax(v []float64) (median, lo, hi float64) {
	if len(v) == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		median = s[n/2]
	} else {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// statIndex finds Stats by (where, case, VMM, metric).
type statIndex map[string]Stat

func indexStats(stats []Stat) statIndex {
	ix := statIndex{}
	for _, s := range stats {
		ix[strings.Join([]string{s.Where, s.Case, s.VMM, s.Metric}, "|")] = s
	}
	return ix
}

func (ix statIndex) get(where, c, vmm, metric string) (Stat, bool) {
	s, ok := ix[strings.Join([]string{where, c, vmm, metric}, "|")]
	return s, ok && s.N > 0
}

// failures returns how many runs of (where, case, VMM) failed, from any
// of its Stats.
func (ix statIndex) failures(where, c, vmm string) (failed, ok int) {
	prefix := strings.Join([]string{where, c, vmm}, "|") + "|"
	for k, s := range ix {
		if strings.HasPrefix(k, prefix) {
			failed = s.Failed
			ok = max(ok, s.N)
		}
	}
	return failed, ok
}

// ratio is a/b, NaN when either is missing or b is zero.
func ratio(a, b float64) float64 {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// Env describes where a set of samples was taken.
type Env map[string]string

// Report is the JSON output of the suite.
type Report struct {
	Date     string    `json:"date"`
	Command  string    `json:"command"`
	Host     Env       `json:"host"`
	L1       Env       `json:"l1,omitempty"`
	Config   Config    `json:"config"`
	Samples  []Sample  `json:"samples"`
	Stats    []Stat    `json:"stats"`
	Notes    []string  `json:"notes"`
	Duration string    `json:"duration"`
	Started  time.Time `json:"started"`
}
