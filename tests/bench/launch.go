package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/vmlinux"
)

// initMarker is what tests/guest/init prints first thing when it starts:
// the end of a boot for every VMM alike.
const initMarker = "HPCVMM-GUEST-MARKER init-started"

// launchArgv returns the command line that boots the L2 guest with vmm:
// 1 vCPU, cfg.MemoryMiB of RAM (on the backing cfg.LaunchPages chooses),
// the same kernel, initramfs and command line for all, direct kernel boot,
// the guest console on the serial port and on the VMM's standard output,
// and no other devices.
func launchArgv(cfg Config, vmm string) ([]string, error) {
	mem := strconv.Itoa(cfg.MemoryMiB) + "M"
	qemu := func(machine string) []string {
		return append([]string{cfg.QEMU, "-accel", "kvm", "-M", machine, "-cpu", "host", "-smp", "1", "-m", mem,
			"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
			"-kernel", cfg.Kernel, "-initrd", cfg.Initrd, "-append", cfg.Cmdline}, qemuRAMArgs(cfg)...)
	}
	switch vmm {
	case vmmHPCVMM, vmmHPCVMMGuestKernel:
		// --console serial: the guest console is the UART, as for the
		// peers (the default virtio console would add a PCI device).
		// --hugepages 2M, or none for 4 KiB pages like the peers'
		// default RAM, which hpcvmm still prefaults (hpcvmmRAMArgs).
		// The kernel cache was filled before the first run
		// (primeKernelCache): every hpcvmm run measures a warm cache.
		argv := []string{cfg.HPCVMM, "run", "--kernel", cfg.Kernel, "--initrd", cfg.Initrd, "--cmdline", cfg.Cmdline,
			"--cpus", "1", "--memory", mem, "--kernel-cache", benchKernelCache}
		if vmm == vmmHPCVMMGuestKernel {
			argv = append(argv, "--kernel-decompress", "guest")
		}
		return append(append(argv, hpcvmmRAMArgs(cfg)...), "--console", "serial"), nil
	case vmmQEMUMicrovm:
		return qemu("microvm"), nil
	case vmmQEMUQ35:
		return qemu("q35"), nil
	case vmmGoKVM:
		if cfg.GoKVM == "" {
			return nil, fmt.Errorf("gokvm was not built: %s", cfg.GoKVMError)
		}
		return []string{cfg.GoKVM, "boot", "-k", cfg.Kernel, "-i", cfg.Initrd, "-p", gokvmCmdline(cfg.Cmdline, hostTSCkHz()), "-c", "1", "-m", mem}, nil
	}
	return nil, fmt.Errorf("unknown VMM %q", vmm)
}

// gokvmCmdline is the guest command line for gokvm: the common one plus
// what Debian's stock kernel needs to boot under gokvm at all. gokvm
// passes KVM_GET_SUPPORTED_CPUID through with the hypervisor bit clear, so
// the guest never finds KVM, gets no kvm-clock and calibrates the TSC
// against the PIT, which fails in the nested test bed ("could not
// calculate TSC khz", then silence); tsc_early_khz gives it the rate.
// gokvm's MP table lists processors only, and with the I/O APIC in use no
// timer interrupt arrived; noapic keeps the timer on the PIC. Both were
// found by trial in L1 (with them gokvm reached /init; without, 0 of 2).
func gokvmCmdline(common string, tscKHz int) string {
	if tscKHz > 0 {
		common += " tsc_early_khz=" + strconv.Itoa(tscKHz)
	}
	return common + " noapic"
}

// hostTSCkHz is the TSC rate of the machine the suite runs on, from the
// first "cpu MHz" of /proc/cpuinfo (the kernel's calibrated TSC rate on
// x86); 0 when it cannot be read.
func hostTSCkHz() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return parseCPUMHz(string(b))
}

// parseCPUMHz returns the first "cpu MHz" of a /proc/cpuinfo text in kHz.
func parseCPUMHz(cpuinfo string) int {
	for _, l := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0
		}
		return int(mhz * 1000)
	}
	return 0
}

// benchKernelCache is hpcvmm's kernel cache in the launch runs.
var benchKernelCache = filepath.Join(os.TempDir(), "hpcvmm-bench-kernels")

// primeKernelCache fills benchKernelCache with the decompressed L2 kernel
// the way hpcvmm does on a miss (package vmlinux), so that every measured
// hpcvmm launch finds a warm cache, the state of every launch after a
// node's first.
func primeKernelCache(kernel string) (time.Duration, error) {
	t0 := time.Now()
	img, err := os.ReadFile(kernel)
	if err != nil {
		return 0, err
	}
	k, err := boot.ParseBzImage(img)
	if err != nil {
		return 0, err
	}
	c, err := vmlinux.OpenCache(benchKernelCache, 0)
	if err != nil {
		return 0, err
	}
	if e, err := c.Get(vmlinux.KeyOf(img)); err == nil {
		return time.Since(t0), e.Close()
	}
	elf, _, err := vmlinux.Decompress(k)
	if err != nil {
		return 0, err
	}
	if err := c.Put(vmlinux.KeyOf(img), elf); err != nil {
		return 0, err
	}
	took := time.Since(t0)
	// A node's later launches trust the cache's record of the entry's
	// and the bzImage's hash (vmlinux/identity.go): read both once the
	// files have settled, as a node's first launch after this one would.
	time.Sleep(vmlinux.RecordAfter + 100*time.Millisecond)
	fi, err := os.Stat(kernel)
	if err != nil {
		return 0, err
	}
	c.KeyFor(img, fi)
	e, err := c.Get(vmlinux.KeyOf(img))
	if err != nil {
		return 0, err
	}
	return took, e.Close()
}

// runLaunch boots the guest once with vmm and measures launch → init
// marker; at the marker it snapshots KVM's statistics for the VM and the
// VMM's memory, then stops the VMM.
func runLaunch(ctx context.Context, cfg Config, vmm string, rep int) Sample {
	argv, err := launchArgv(cfg, vmm)
	if err != nil {
		s := newSample(caseLaunch, vmm, cfg.Where, rep)
		s.Err = err.Error()
		return s
	}
	return runBoot(ctx, cfg, caseLaunch, vmm, rep, argv, uint64(cfg.MemoryMiB)<<20)
}

// runBoot boots argv (vmm's command line for case c, with ramBytes of guest
// RAM) once and measures it as runLaunch describes. Long on purpose: one
// boot's measurements in the order the boot yields them.
func runBoot(ctx context.Context, cfg Config, c, vmm string, rep int, argv []string, ramBytes uint64) Sample {
	s := newSample(c, vmm, cfg.Where, rep)
	s.Info["argv"] = strings.Join(argv, " ")
	cmd := exec.Command(argv[0], argv[1:]...)
	if strings.HasPrefix(c, caseMemory+"/") {
		// The Go runtime's own account of the heap at each collection,
		// next to the kernel's of the process: what the breakdown needs.
		cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
	}
	stdout := newWatch(initMarker)
	stderr := newWatch("first KVM_RUN")
	cmd.Stdout, cmd.Stderr = stdout, stderr
	p, err := startVMM(cmd, func(t time.Time) { stdout.start, stderr.start = t, t })
	if err != nil {
		s.Err = err.Error()
		return s
	}
	defer p.stdin.Close()
	start, exited, pid := p.start, p.exited, cmd.Process.Pid

	reached, why := waitMarker(ctx, cfg, stdout, exited)
	if !reached && strings.Contains(why, "(stuck)") {
		select {
		case <-exited:
		default:
			s.Info["stall"] = stallReport(vmm, pid, exited, stderr.String)
		}
	}
	if reached {
		s.Metrics[mLaunchToInit] = ms(stdout.at.Sub(start))
		// KVM's counters first: the guest keeps running.
		if st, err := readKVMStats(kvmDebugfs, "/proc", pid); err == nil {
			for k, v := range st {
				s.Metrics["kvm."+k] = v
			}
		} else {
			s.Info["kvm_stats_error"] = err.Error()
		}
		if mi, err := readMemInfo("/proc", pid, ramBytes); err == nil {
			s.Metrics[mRSS] = float64(mi.RSSKiB)
			s.Metrics[mRSSAnon] = float64(mi.AnonKiB)
			s.Metrics[mRSSFile] = float64(mi.FileKiB)
			s.Metrics[mHWM] = float64(mi.HWMKiB)
			s.Metrics[mThreads] = float64(mi.Threads)
			s.Metrics[mLargestAnon] = float64(mi.LargestAnonKiB)
			if mi.HugetlbKiB > 0 {
				s.Metrics[mHugetlb] = float64(mi.HugetlbKiB)
			}
			if mi.GuestMaps > 0 {
				s.Metrics[mRSSGuest] = float64(mi.GuestRSSKiB)
				s.Metrics[mRSSOverhead] = float64(mi.RSSKiB) - float64(mi.GuestRSSKiB)
			} else {
				s.Info["mem_error"] = "no guest-RAM-sized mapping in smaps"
			}
		} else {
			s.Info["mem_error"] = err.Error()
		}
	}
	if reached {
		// The guest prints its uptime right after the marker; give the
		// line a moment so the report can set launch time against it.
		deadline := time.Now().Add(3 * time.Second)
		for guestUptimeAtInit(stdout.String()) < 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	stopVMM(cmd, vmm, exited)
	if !stderr.at.IsZero() {
		s.Metrics[mFirstRunSeen] = ms(stderr.at.Sub(start))
	}
	log := stderr.String()
	if a, ok := logRecord(log, "first KVM_RUN"); ok {
		if v, ok := durationMs(a["since_start"]); ok {
			s.Metrics[mFirstRunSinceStrt] = v
		}
	}
	if a, ok := logRecord(log, "guest RAM ready"); ok {
		if v, ok := durationMs(a["prefault"]); ok {
			s.Metrics[mHPCVMMPrefault] = v
		}
	}
	if a, ok := logRecord(log, "kernel"); ok {
		if v, ok := durationMs(a["elapsed"]); ok {
			s.Metrics[mHPCVMMKernel] = v
		}
		if a["cache_hit"] != "" {
			s.Info["kernel_cache_hit"] = a["cache_hit"]
		}
	}
	if a, ok := logRecord(log, "userspace exits by reason"); ok {
		for k, v := range a {
			if n, err := strconv.ParseFloat(v, 64); err == nil {
				s.Metrics["exit."+k] = n
			}
		}
	}
	if gc := lastGCTrace(log); gc != "" {
		s.Info["gctrace_last"] = gc
	}
	stdout.mu.Lock()
	clockStart, clockLost, clockRate, clockOK := guestClock(stdout.clock.lines)
	stdout.mu.Unlock()
	if clockOK {
		s.Metrics[mGuestClockStart] = clockStart
		s.Metrics[mGuestClockLost] = clockLost
		s.Metrics[mGuestClockRate] = clockRate
	}
	if g := guestUptimeAtInit(stdout.String()); g >= 0 {
		s.Metrics[mGuestUptimeAtInit] = g
	}
	if !reached {
		if why == "" {
			status := "exit status 0: the guest reset itself, by a panic with panic=-1 or a triple fault"
			if p.waitErr != nil {
				status = p.waitErr.Error()
			}
			why = fmt.Sprintf("exited before the guest's init marker (%s)", status)
		}
		s.Err = fmt.Sprintf("%s after %v; console tail: %q; stderr tail: %q", why,
			time.Since(start).Round(time.Millisecond), tail(stdout.String(), 600), tail(log, 600))
	}
	return s
}

// lastGCTrace returns the last GODEBUG=gctrace=1 line in a VMM's stderr
// ("gc N @Ts P%: ... A->B->C MB, D MB goal, ..."), or "".
func lastGCTrace(stderr string) string {
	last := ""
	for _, l := range strings.Split(stderr, "\n") {
		if strings.HasPrefix(l, "gc ") && strings.Contains(l, "MB goal") {
			last = l
		}
	}
	return last
}

// waitMarker waits for the init marker. It gives up when the VMM exits,
// when the console has been silent for cfg.VMStall (a guest stuck early in
// boot never prints again, and waiting out the whole VMTimeout for it would
// eat the suite's budget), at cfg.VMTimeout, or when ctx ends. why says
// which, except for an exit, which the caller describes with its status.
func waitMarker(ctx context.Context, cfg Config, stdout *watch, exited <-chan struct{}) (reached bool, why string) {
	timer := time.NewTimer(cfg.VMTimeout)
	defer timer.Stop()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stdout.hit:
			return true, ""
		case <-exited:
			return false, ""
		case <-timer.C:
			return false, fmt.Sprintf("no init marker within %v", cfg.VMTimeout)
		case <-ctx.Done():
			return false, "suite deadline reached before the init marker"
		case <-tick.C:
			if cfg.VMStall > 0 {
				if quiet := stdout.silentFor(); quiet > cfg.VMStall {
					return false, fmt.Sprintf("guest console silent for %v before the init marker (stuck)", quiet.Round(time.Second))
				}
			}
		}
	}
}

// vmmProcess is the VMM of one run, started by startVMM.
type vmmProcess struct {
	stdin   io.WriteCloser // kept open: no VMM sees console EOF mid-boot
	start   time.Time      // taken just before the fork
	exited  chan struct{}  // closed once the VMM has exited
	waitErr error          // cmd.Wait's result; read it only after exited is closed
}

// startVMM starts cmd with a stdin pipe and a goroutine that reaps it.
// atStart, if not nil, gets the start time before the fork: the output
// watches time their markers from it.
func startVMM(cmd *exec.Cmd, atStart func(time.Time)) (*vmmProcess, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("stdin pipe: %w", err)
	}
	// Don't hang on output pipes a VMM's child inherited.
	cmd.WaitDelay = 5 * time.Second
	p := &vmmProcess{stdin: stdin, start: time.Now(), exited: make(chan struct{})}
	if atStart != nil {
		atStart(p.start)
	}
	if err := cmd.Start(); err != nil {
		stdin.Close()
		return nil, fmt.Errorf("starting %s: %w", cmd.Path, err)
	}
	go func() { p.waitErr = cmd.Wait(); close(p.exited) }()
	return p, nil
}

// stopVMM ends a VMM that reached its marker (or hung). hpcvmm and QEMU get
// SIGTERM, which makes hpcvmm log its userspace exits; whatever is still
// alive after a grace period is killed.
func stopVMM(cmd *exec.Cmd, vmm string, exited <-chan struct{}) {
	grace := 15 * time.Second
	if vmm == vmmGoKVM {
		grace = 0 // gokvm has no orderly shutdown on a signal
	}
	if grace > 0 {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
			return
		case <-time.After(grace):
		}
	}
	_ = cmd.Process.Kill()
	<-exited
}

// guestUptimeAtInit finds "hpcvmm-guest scenario=... uptime=SECONDS" (the
// guest kernel's uptime when /init started) and returns it in ms, or -1.
func guestUptimeAtInit(console string) float64 {
	for _, line := range strings.Split(console, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "hpcvmm-guest ")
		if !ok || !strings.Contains(rest, "scenario=") {
			continue
		}
		for _, f := range strings.Fields(rest) {
			if v, ok := strings.CutPrefix(f, "uptime="); ok {
				if x, err := strconv.ParseFloat(v, 64); err == nil {
					return x * 1000
				}
			}
		}
	}
	return -1
}

// watch is an io.Writer that keeps what a VMM writes and notes when a
// pattern first appears.
type watch struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	pattern []byte
	start   time.Time
	at      time.Time // when the pattern arrived; zero until then
	last    time.Time // the last write
	hit     chan struct{}
	clock   lineClock // printk lines and their arrival, for guestClock
}

func newWatch(pattern string) *watch {
	return &watch{pattern: []byte(pattern), hit: make(chan struct{})}
}

func (w *watch) Write(p []byte) (int, error) {
	now := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.last = now
	old := w.buf.Len()
	w.buf.Write(p)
	if !w.start.IsZero() {
		w.clock.write(p, now.Sub(w.start))
	}
	if w.at.IsZero() {
		// Only the new bytes and a pattern's length before them can hold
		// a first occurrence.
		from := max(0, old-len(w.pattern)+1)
		if bytes.Contains(w.buf.Bytes()[from:], w.pattern) {
			w.at = now
			close(w.hit)
		}
	}
	return len(p), nil
}

// silentFor is the time since the last write (or since start without
// any).
func (w *watch) silentFor() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := w.last
	if last.IsZero() {
		last = w.start
	}
	return time.Since(last)
}

func (w *watch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

var _ io.Writer = (*watch)(nil)

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// fileExists is a small helper for optional artifacts.
func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}
