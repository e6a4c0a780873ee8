package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// The job cases (issues 26 and 27): `hpcvmm run --rootfs IMAGE -- COMMAND`.
const (
	// caseJob runs `-- true` on a busybox rootfs and times it in two
	// parts against QEMU microvm booting the same kernel with an
	// initramfs whose /init runs true and powers off:
	//
	//   - launch → COMMAND started: from the fork of hpcvmm to the arrival
	//     on its stderr of the log line "job: command started in the
	//     guest" (package job logs it at debug level when the agent's
	//     Started message arrives; the agent sends it right after the
	//     command's fork and exec succeeded). For QEMU: to the arrival on
	//     the serial console of the line /init prints just before it runs
	//     true.
	//   - COMMAND exited → hpcvmm exited: from the arrival of "job: command
	//     exited in the guest" (the agent's Exited message) to the end of
	//     the hpcvmm process (wait4 returned). For QEMU: from the marker
	//     line to QEMU's exit, which includes running true.
	//   - the total, launch → process exit, for both: the goal is
	//     hpcvmm ≤ 0.5× QEMU.
	//
	// hpcvmm runs with --log-level debug (for the two lines; the kernel's
	// console is `quiet` for both) and finds its kernel and the job's
	// initramfs cached: one unmeasured run first builds the initramfs, as
	// a node's first job would.
	caseJob = "job"
	// caseJobBuild builds the initramfs of a 512 MiB directory rootfs
	// (4096 files of 128 KiB of random bytes) with initramfs.Build, as
	// `hpcvmm run --rootfs` does: cold (an empty cache: the tree hashed
	// for the key, the archive with the agent and the guest's modules
	// written and renamed into place) and hit (the key computed and the
	// entry checked; nothing built), against `find | cpio -o -H newc` of
	// the same tree, the usual way to make an initramfs. It needs no KVM
	// and runs on the host the suite was started on, where its absolute
	// times mean something.
	caseJobBuild = "job-build"
	// casePingPong runs tests/guest/pingpong (a one-byte round trip
	// through two pipes between processes pinned to the guest's CPU 0
	// and 1) as the job of a 2-vCPU guest on host CPUs 0-1
	// (--cpu-list 0-1: no CPU claims), once with --cpu-mode dedicated and
	// once shared; the guest's median round trip is the metric.
	casePingPong = "pingpong"
)

// VMM names of the pingpong case.
const (
	vmmDedicated = "hpcvmm-dedicated"
	vmmShared    = "hpcvmm-shared"
	// The job-build case: hpcvmm on the directory IMAGE, on a tar of
	// it, and the peer.
	vmmHPCVMMTar = "hpcvmm-tar"
	vmmCPIO      = "cpio"
)

// Job case metrics.
const (
	mJobStarted    = "launch_to_started_ms" // launch → COMMAND started (see caseJob)
	mJobExitToExit = "exited_to_exit_ms"    // COMMAND exited → VMM process exit
	mJobCommand    = "started_to_exited_ms" // COMMAND started → COMMAND exited (hpcvmm)
	mJobTotal      = "launch_to_exit_ms"    // launch → VMM process exit
	mJobInitrd     = "initramfs_ms"         // hpcvmm log: the initramfs step (a cache hit)
	mBuildMs       = "build_ms"             // job-build: the initramfs made, cold
	mFirstHitMs    = "first_hit_ms"         // job-build: the entry's first hit (its SHA-256 checked)
	mHitMs         = "hit_ms"               // job-build: a warm hit
	mArchiveMiB    = "archive_mib"          // job-build: the archive's size
	mPingMedianUs  = "rtt_median_us"        // pingpong: median round trip in the guest
	mPingP10Us     = "rtt_p10_us"
	mPingP90Us     = "rtt_p90_us"
	mPingMeanUs    = "rtt_mean_us"
)

// Log lines and markers the job cases time.
const (
	jobStartedMsg = "job: command started in the guest"
	jobExitedMsg  = "job: command exited in the guest"
	// qemuJobMarker is what the QEMU peer's /init prints before true.
	qemuJobMarker = "HPCVMM-BENCH-JOB-START"
)

// qemuJobInit is the QEMU peer's /init: the marker, the command, power off.
const qemuJobInit = "#!/bin/busybox sh\n/bin/busybox echo " + qemuJobMarker + "\n/bin/busybox true\n/bin/busybox poweroff -f\n"

// jobCmdline is the QEMU peer's kernel command line: hpcvmm's own for a
// job (docs/jobs.md) less its rdinit=.
const jobCmdline = "console=ttyS0 quiet reboot=k panic=-1"

// pingRounds and pingWarmup are the pinger's arguments.
const (
	pingRounds = 2000
	pingWarmup = 200
)

// Where the job cases keep their rootfs directories (inside L1, or on the
// host in host mode).
var jobWorkDir = filepath.Join(os.TempDir(), "hpcvmm-bench-jobs")

// stamps is an io.Writer that keeps what a process writes and the arrival
// time of the first line containing each of its patterns.
type stamps struct {
	mu       sync.Mutex
	buf      bytes.Buffer
	partial  []byte
	patterns []string
	at       map[string]time.Time
}

func newStamps(patterns ...string) *stamps {
	return &stamps{patterns: patterns, at: map[string]time.Time{}}
}

func (s *stamps) Write(p []byte) (int, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p)
	s.partial = append(s.partial, p...)
	for {
		i := bytes.IndexByte(s.partial, '\n')
		if i < 0 {
			break
		}
		s.line(s.partial[:i], now)
		s.partial = s.partial[i+1:]
	}
	// A pattern in an unfinished line counts too: the console's last
	// line may never get its newline.
	s.line(s.partial, now)
	return len(p), nil
}

func (s *stamps) line(l []byte, now time.Time) {
	for _, p := range s.patterns {
		if _, ok := s.at[p]; !ok && bytes.Contains(l, []byte(p)) {
			s.at[p] = now
		}
	}
}

// when returns the arrival of pattern's first line.
func (s *stamps) when(pattern string) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.at[pattern]
	return t, ok
}

func (s *stamps) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// timedRun is one VMM process run to its end.
type timedRun struct {
	start, end     time.Time
	stdout, stderr *stamps
	err            error // from Wait, or the timeout
}

// runToExit runs argv to its end (or cfg.VMTimeout / ctx), stdin empty,
// and times it; stdout and stderr watch for patterns.
func runToExit(ctx context.Context, limit time.Duration, argv []string, patterns ...string) timedRun {
	return runToExitPolling(ctx, limit, argv, nil, patterns...)
}

// runToExitPolling is runToExit with poll called with the process's pid
// every 200 ms while it runs.
func runToExitPolling(ctx context.Context, limit time.Duration, argv []string, poll func(pid int), patterns ...string) timedRun {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	r := timedRun{stdout: newStamps(patterns...), stderr: newStamps(patterns...)}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = r.stdout, r.stderr
	cmd.WaitDelay = 5 * time.Second
	r.start = time.Now()
	if err := cmd.Start(); err != nil {
		r.err = err
		return r
	}
	done := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		if poll == nil {
			return
		}
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				poll(cmd.Process.Pid)
			}
		}
	}()
	r.err = cmd.Wait()
	r.end = time.Now()
	close(done)
	<-polled
	if ctx.Err() != nil {
		r.err = fmt.Errorf("no exit within %v (killed): %w", limit, ctx.Err())
	}
	return r
}

// fail sets s.Err from a run's error and output tails.
func (r timedRun) fail(s *Sample, why string) {
	if why == "" && r.err != nil {
		why = r.err.Error()
	}
	s.Err = fmt.Sprintf("%s; stdout tail: %q; stderr tail: %q", why, tail(r.stdout.String(), 400), tail(r.stderr.String(), 600))
}

// makeBusyboxRootfs makes dir a busybox rootfs (the binary and a link per
// applet in /bin), with extra files copied into /bin.
func makeBusyboxRootfs(dir, busybox string, extra ...string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if err := copyFile(busybox, filepath.Join(bin, "busybox"), 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("%s --list: %w", busybox, err)
	}
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(bin, a)); err != nil {
			return err
		}
	}
	for _, e := range extra {
		if err := copyFile(e, filepath.Join(bin, filepath.Base(e)), 0o755); err != nil {
			return err
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, perm)
}

// jobBaseArgv is hpcvmm's command line for a job of cfg's guest: the
// launch case's kernel (from the primed cache), RAM and page size, debug
// log for the job's lines.
func jobBaseArgv(cfg Config, cpus int, root string) []string {
	argv := []string{cfg.HPCVMM, "run", "--kernel", cfg.Kernel, "--kernel-cache", benchKernelCache,
		"--cpus", strconv.Itoa(cpus), "--memory", strconv.Itoa(cfg.MemoryMiB) + "M", "--log-level", "debug"}
	argv = append(argv, hpcvmmRAMArgs(cfg)...)
	return append(argv, "--rootfs", root)
}

// jobArgv is the job case's command line for vmm.
func jobArgv(cfg Config, vmm, root string) ([]string, error) {
	switch vmm {
	case vmmHPCVMM:
		return append(jobBaseArgv(cfg, 1, root), "--", "true"), nil
	case vmmQEMUMicrovm:
		if cfg.JobQEMUInitrd == "" {
			return nil, errors.New("no initramfs for QEMU's job (it did not build)")
		}
		return append([]string{cfg.QEMU, "-accel", "kvm", "-M", "microvm", "-cpu", "host", "-smp", "1",
			"-m", strconv.Itoa(cfg.MemoryMiB) + "M", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
			"-serial", "stdio", "-kernel", cfg.Kernel, "-initrd", cfg.JobQEMUInitrd, "-append", jobCmdline}, qemuRAMArgs(cfg)...), nil
	}
	return nil, fmt.Errorf("the job case has no command line for %q", vmm)
}

// runJobs runs the job case: one unmeasured hpcvmm run that builds the
// busybox rootfs's initramfs, then Reps runs of hpcvmm and QEMU,
// interleaved.
func runJobs(ctx context.Context, cfg Config, out sink) {
	root := filepath.Join(jobWorkDir, "busybox")
	if err := makeBusyboxRootfs(root, cfg.Busybox); err != nil {
		out.note("job case: the busybox rootfs: " + err.Error())
		return
	}
	if _, err := primeKernelCache(cfg.Kernel); err != nil {
		out.note("job case: priming hpcvmm's kernel cache failed (hpcvmm runs decompress on their own): " + err.Error())
	}
	argv, _ := jobArgv(cfg, vmmHPCVMM, root)
	out.progress("job hpcvmm warm-up (initramfs build)")
	w := runToExit(ctx, cfg.VMTimeout, argv)
	switch a, ok := logRecord(w.stderr.String(), "job: initramfs built"); {
	case w.err != nil:
		s := newSample(caseJob, vmmHPCVMM, cfg.Where, 0)
		w.fail(&s, "the warm-up run (initramfs build) failed: "+errString(w.err))
		out.note(s.Err)
	case ok:
		out.note(fmt.Sprintf("job case: the warm-up run built the busybox rootfs's initramfs (%s MiB, %s modules) in %s; it took %v in all",
			a["size_mib"], a["modules"], a["took"], w.end.Sub(w.start).Round(time.Millisecond)))
	default:
		out.note("job case: the warm-up run built no initramfs (a cache hit: the cache was warm already)")
	}
	// A second unmeasured run once the new entry has settled: the
	// first hit checks the archive's SHA-256 and records its identity
	// (initramfs/cache.go), and the measured runs are a node's later
	// launches, as the kernel cache's are.
	time.Sleep(initramfs.RecordAfter + 100*time.Millisecond)
	out.progress("job hpcvmm warm-up 2 (first cache hit)")
	if w := runToExit(ctx, cfg.VMTimeout, argv); w.err != nil {
		s := newSample(caseJob, vmmHPCVMM, cfg.Where, 0)
		w.fail(&s, "the second warm-up run failed: "+errString(w.err))
		out.note(s.Err)
	} else if a, ok := logRecord(w.stderr.String(), "job: initramfs cache hit"); ok {
		out.note(fmt.Sprintf("job case: the second warm-up run, the entry's first hit (its SHA-256 checked), took %s for the initramfs step", a["took"]))
	}
	for rep := 1; rep <= cfg.Reps; rep++ {
		for _, v := range []string{vmmHPCVMM, vmmQEMUMicrovm} {
			if cfg.done(caseJob, v, rep) {
				continue
			}
			if ctx.Err() != nil {
				out.note(fmt.Sprintf("job case: stopped before %s run %d: time budget", v, rep))
				return
			}
			out.progress(fmt.Sprintf("job %s run %d", v, rep))
			out.sample(runJob(ctx, cfg, v, root, rep))
		}
	}
}

// runJob runs one job of vmm and times it as caseJob describes.
func runJob(ctx context.Context, cfg Config, vmm, root string, rep int) Sample {
	s := newSample(caseJob, vmm, cfg.Where, rep)
	argv, err := jobArgv(cfg, vmm, root)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Info["argv"] = strings.Join(argv, " ")
	r := runToExit(ctx, cfg.VMTimeout, argv, jobStartedMsg, jobExitedMsg, qemuJobMarker)
	if r.err != nil {
		r.fail(&s, "")
		return s
	}
	s.Metrics[mJobTotal] = ms(r.end.Sub(r.start))
	switch vmm {
	case vmmHPCVMM:
		st, ok1 := r.stderr.when(jobStartedMsg)
		ex, ok2 := r.stderr.when(jobExitedMsg)
		if !ok1 || !ok2 {
			r.fail(&s, fmt.Sprintf("hpcvmm exited 0 without the job's log lines (started: %v, exited: %v)", ok1, ok2))
			return s
		}
		s.Metrics[mJobStarted] = ms(st.Sub(r.start))
		s.Metrics[mJobCommand] = ms(ex.Sub(st))
		s.Metrics[mJobExitToExit] = ms(r.end.Sub(ex))
		log := r.stderr.String()
		if a, ok := logRecord(log, "job: initramfs cache hit"); ok {
			if v, ok := durationMs(a["took"]); ok {
				s.Metrics[mJobInitrd] = v
			}
		} else {
			s.Info["initramfs"] = "built (no cache hit)"
		}
		if a, ok := logRecord(log, "first KVM_RUN"); ok {
			if v, ok := durationMs(a["since_start"]); ok {
				s.Metrics[mFirstRunSinceStrt] = v
			}
		}
	case vmmQEMUMicrovm:
		m, ok := r.stdout.when(qemuJobMarker)
		if !ok {
			r.fail(&s, "QEMU exited 0 without /init's marker")
			return s
		}
		s.Metrics[mJobStarted] = ms(m.Sub(r.start))
		s.Metrics[mJobExitToExit] = ms(r.end.Sub(m))
	}
	return s
}

// runPingPongs runs the pingpong case: Reps runs per mode, alternating.
func runPingPongs(ctx context.Context, cfg Config, out sink) {
	if cfg.PingPong == "" {
		out.note("pingpong case: the pinger (tests/guest/pingpong) did not build: " + cfg.PingPongError)
		return
	}
	root := filepath.Join(jobWorkDir, "pingpong")
	if err := makeBusyboxRootfs(root, cfg.Busybox, cfg.PingPong); err != nil {
		out.note("pingpong case: the rootfs: " + err.Error())
		return
	}
	if _, err := primeKernelCache(cfg.Kernel); err != nil {
		out.note("pingpong case: priming hpcvmm's kernel cache failed: " + err.Error())
	}
	for rep := 1; rep <= cfg.Reps; rep++ {
		for _, v := range []string{vmmDedicated, vmmShared} {
			if cfg.done(casePingPong, v, rep) {
				continue
			}
			if ctx.Err() != nil {
				out.note(fmt.Sprintf("pingpong case: stopped before %s run %d: time budget", v, rep))
				return
			}
			out.progress(fmt.Sprintf("pingpong %s run %d", v, rep))
			out.sample(runPingPong(ctx, cfg, v, root, rep))
		}
	}
}

// pingArgv is the pingpong case's command line for mode.
func pingArgv(cfg Config, mode, root string) []string {
	argv := jobBaseArgv(cfg, 2, root)
	return append(argv, "--cpu-list", "0-1", "--cpu-mode", mode, "--", "/bin/"+filepath.Base(cfg.PingPong),
		strconv.Itoa(pingRounds), strconv.Itoa(pingWarmup))
}

// runPingPong runs the pinger once in a guest of vmm's CPU mode.
func runPingPong(ctx context.Context, cfg Config, vmm, root string, rep int) Sample {
	s := newSample(casePingPong, vmm, cfg.Where, rep)
	mode := strings.TrimPrefix(vmm, "hpcvmm-")
	argv := pingArgv(cfg, mode, root)
	s.Info["argv"] = strings.Join(argv, " ")
	// KVM's counters for the VM, the last reading before it exits: the
	// boot, the ping-pong and most of the power-off.
	var last map[string]float64
	r := runToExitPolling(ctx, cfg.VMTimeout, argv, func(pid int) {
		if st, err := readKVMStats(kvmDebugfs, "/proc", pid); err == nil {
			last = st
		}
	})
	if r.err != nil {
		r.fail(&s, "")
		return s
	}
	for _, k := range []string{"exits", "halt_exits", "halt_successful_poll", "halt_wakeup", "irq_exits", "pause_exits"} {
		if v, ok := last[k]; ok {
			s.Metrics["kvm."+k] = v
		}
	}
	// The mode the VM got, from its log: a run that fell back to
	// another mode measures the wrong thing.
	a, ok := logRecord(r.stderr.String(), "CPU mode")
	if !ok || a["mode"] != mode {
		r.fail(&s, fmt.Sprintf("the VM did not run in %s mode (its log: %v)", mode, a))
		return s
	}
	if a["why"] != "" {
		s.Info["cpu_mode_why"] = a["why"]
	}
	res, err := parsePingPong(r.stdout.String())
	if err != nil {
		r.fail(&s, err.Error())
		return s
	}
	for k, v := range res {
		s.Metrics[k] = v
	}
	s.Metrics[mJobTotal] = ms(r.end.Sub(r.start))
	return s
}

// parsePingPong reads the pinger's result line into metrics (µs).
func parsePingPong(stdout string) (map[string]float64, error) {
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "pingpong ")
		if !ok {
			continue
		}
		kv := map[string]float64{}
		for _, f := range strings.Fields(rest) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return nil, fmt.Errorf("pinger output %q: field %q is not KEY=VALUE", sc.Text(), f)
			}
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return nil, fmt.Errorf("pinger output %q: %s: %w", sc.Text(), k, err)
			}
			kv[k] = x
		}
		out := map[string]float64{}
		for metric, field := range map[string]string{mPingMedianUs: "median_ns", mPingP10Us: "p10_ns", mPingP90Us: "p90_ns", mPingMeanUs: "mean_ns"} {
			v, ok := kv[field]
			if !ok || v <= 0 {
				return nil, fmt.Errorf("pinger output %q: no positive %s", sc.Text(), field)
			}
			out[metric] = v / 1000
		}
		return out, nil
	}
	return nil, fmt.Errorf("no \"pingpong ...\" result line in the job's stdout %q", tail(stdout, 300))
}

// The job-build case's tree: like initramfs's BenchmarkBuild512MiBDir.
const (
	buildDirs  = 64
	buildFiles = 64
	buildSize  = 128 << 10 // 64 × 64 × 128 KiB = 512 MiB
)

// makeBuildTree writes the 512 MiB tree under dir (pseudo-random bytes:
// nothing for sparse files or compression to gain).
func makeBuildTree(dir string) error {
	rng := rand.NewChaCha8([32]byte{26})
	buf := make([]byte, buildSize)
	for d := range buildDirs {
		sub := filepath.Join(dir, "usr/share", fmt.Sprintf("d%02d", d))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		for f := range buildFiles {
			_, _ = rng.Read(buf)
			if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%02d", f)), buf, 0o644); err != nil {
				return err
			}
		}
	}
	return nil
}

// buildJob is what the job-build case builds with.
type buildJob struct {
	Agent       string // hpcvmm's static binary
	Release     string // the guest kernel's release
	HostModules string // its modules root
	Reps        int
	Where       string
}

// runJobBuilds runs the job-build case in a scratch directory under dir:
// per run, for the directory IMAGE and a tar of it, a cold build, the
// first hit and a warm hit (buildOnce), then the find | cpio peer.
func runJobBuilds(ctx context.Context, bj buildJob, dir string, out sink) {
	work, err := os.MkdirTemp(dir, "job-build-")
	if err != nil {
		out.note("job-build case: " + err.Error())
		return
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "rootfs")
	t0 := time.Now()
	if err := makeBuildTree(tree); err != nil {
		out.note("job-build case: writing the 512 MiB tree: " + err.Error())
		return
	}
	tarPath := filepath.Join(work, "rootfs.tar")
	if b, err := exec.Command("tar", "-C", tree, "-cf", tarPath, ".").CombinedOutput(); err != nil {
		out.note(fmt.Sprintf("job-build case: tar of the tree: %v: %s", err, b))
		tarPath = ""
	}
	// Files younger than RecordAfter are hashed but not remembered: let
	// them settle, as an image's files have by the time it is launched.
	time.Sleep(initramfs.RecordAfter + 100*time.Millisecond)
	out.note(fmt.Sprintf("job-build case: the 512 MiB tree (%d files) and its tar written in %v (unmeasured; in the page cache for every run)",
		buildDirs*buildFiles, time.Since(t0).Round(time.Millisecond)))
	cpio, cpioErr := exec.LookPath("cpio")
	for rep := 1; rep <= bj.Reps; rep++ {
		if ctx.Err() != nil {
			out.note(fmt.Sprintf("job-build case: stopped before run %d: time budget", rep))
			return
		}
		out.progress(fmt.Sprintf("job-build run %d", rep))
		out.sample(buildOnce(bj, vmmHPCVMM, tree, filepath.Join(work, "cache"), rep))
		if tarPath != "" {
			out.sample(buildOnce(bj, vmmHPCVMMTar, tarPath, filepath.Join(work, "cache"), rep))
		}
		s := newSample(caseJobBuild, vmmCPIO, bj.Where, rep)
		if cpioErr != nil {
			s.Err = "cpio: " + cpioErr.Error()
		} else {
			arc := filepath.Join(work, "peer.cpio")
			c := exec.CommandContext(ctx, "/bin/sh", "-c", `cd "$1" && find . -print0 | "$2" --null --quiet -o -H newc >"$3"`, "sh", tree, cpio, arc)
			t := time.Now()
			b, err := c.CombinedOutput()
			s.Metrics[mBuildMs] = ms(time.Since(t))
			if err != nil {
				s.Err = fmt.Sprintf("find | cpio: %v: %s", err, b)
			} else if fi, err := os.Stat(arc); err == nil {
				s.Metrics[mArchiveMiB] = float64(fi.Size()) / (1 << 20)
			}
			_ = os.Remove(arc)
		}
		out.sample(s)
	}
}

// buildOnce builds image's initramfs into an empty cache (cold: every file
// hashed and copied), then, once the entry has settled, looks it up twice:
// the first hit checks the archive's SHA-256 and records its identity, the
// second is a warm launch's (the state of every launch after a node's
// first two), as `hpcvmm run --rootfs` would.
func buildOnce(bj buildJob, vmm, image, cache string, rep int) Sample {
	s := newSample(caseJobBuild, vmm, bj.Where, rep)
	_ = os.RemoveAll(cache)
	defer os.RemoveAll(cache)
	cfg := func() (initramfs.Config, error) {
		im, err := rootfs.Open(image)
		if err != nil {
			return initramfs.Config{}, err
		}
		return initramfs.Config{Image: im, Agent: bj.Agent, Release: bj.Release, HostModules: bj.HostModules, CacheDir: cache}, nil
	}
	for _, step := range []struct {
		metric string
		hit    bool
	}{{mBuildMs, false}, {mFirstHitMs, true}, {mHitMs, true}} {
		if step.metric == mFirstHitMs {
			time.Sleep(initramfs.RecordAfter + 100*time.Millisecond)
		}
		t := time.Now()
		c, err := cfg()
		if err != nil {
			s.Err = err.Error()
			return s
		}
		res, err := initramfs.Build(c)
		took := time.Since(t)
		c.Image.Close()
		if err != nil {
			s.Err = err.Error()
			return s
		}
		if res.Hit != step.hit {
			s.Err = fmt.Sprintf("initramfs.Build: cache hit %v, want %v", res.Hit, step.hit)
			return s
		}
		s.Metrics[step.metric] = ms(took)
		if !step.hit {
			s.Metrics[mArchiveMiB] = float64(res.Size) / (1 << 20)
			s.Info["modules"] = strings.Join(res.Modules, " ")
		}
	}
	return s
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// jobCases are the cases of this file; jobOnly reports whether cases
// selects nothing else (the report then shows only their tables).
var jobCases = []string{caseJob, caseJobBuild, casePingPong, caseMPI, caseBinds}

func jobOnly(cases []string) bool {
	if len(cases) == 0 {
		return false
	}
	for _, c := range cases {
		if !slices.Contains(jobCases, c) {
			return false
		}
	}
	return true
}

// renderJobs renders the job cases' tables ("" when none ran).
func renderJobs(rep *Report, ix statIndex, where, whereText string) string {
	var b strings.Builder
	cell := func(w, c, v, m string, prec int) (string, Stat, bool) {
		st, ok := ix.get(w, c, v, m)
		if !ok {
			failed, _ := ix.failures(w, c, v)
			if failed > 0 {
				return fmt.Sprintf("failed (%d)", failed), st, false
			}
			return "–", st, false
		}
		return medianCell(ix, w, c, v, st, ok, prec), st, true
	}
	if found(ix, where, caseJob, vmmHPCVMM, vmmQEMUMicrovm) {
		fmt.Fprintf(&b, "\n**Job: `hpcvmm run --rootfs BUSYBOX -- true` against QEMU microvm with an initramfs whose /init runs true and powers off** "+
			"(ms, %s; the same kernel, 1 vCPU, %d MiB; %s; median (min–max); lower is better, ratio < 1: hpcvmm faster; goal: total ≤ 0.5× QEMU's; kernel command line `%s`). "+
			"COMMAND started: hpcvmm's debug log line `%s` arriving on its stderr (the agent's Started message, sent once the command's exec succeeded); "+
			"QEMU: /init's marker line arriving on the serial console, printed just before it runs true. COMMAND exited: hpcvmm's `%s` line; "+
			"QEMU has no such point apart from the marker, so its second column runs from the marker. hpcvmm's kernel and the job's initramfs come "+
			"from their caches (two unmeasured runs first built the initramfs and made its first hit).\n\n",
			whereText, rep.Config.MemoryMiB, "hpcvmm "+ramBacking(rep.Config, vmmHPCVMM)+", QEMU "+ramBacking(rep.Config, vmmQEMUMicrovm), jobCmdline, jobStartedMsg, jobExitedMsg)
		b.WriteString("| step | hpcvmm | qemu-microvm | hpcvmm/QEMU |\n| --- | ---: | ---: | ---: |\n")
		for _, m := range []struct{ metric, label string }{
			{mJobStarted, "launch → COMMAND started"},
			{mJobCommand, "COMMAND started → exited (hpcvmm)"},
			{mJobExitToExit, "COMMAND exited → VMM exited (QEMU: marker → exit)"},
			{mJobTotal, "**total: launch → VMM exited**"},
			{mJobInitrd, "of which: hpcvmm's initramfs step (a warm cache hit, its log)"},
			{mFirstRunSinceStrt, "hpcvmm start → first KVM_RUN (its log)"},
		} {
			h, hs, hok := cell(where, caseJob, vmmHPCVMM, m.metric, 0)
			q, qs, qok := cell(where, caseJob, vmmQEMUMicrovm, m.metric, 0)
			if !hok && !qok {
				continue
			}
			r := ""
			if hok && qok {
				r = fmtRatio(ratio(hs.Median, qs.Median))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m.label, h, q, r)
		}
	}
	if found(ix, where, casePingPong, vmmDedicated, vmmShared) {
		fmt.Fprintf(&b, "\n**Wake-up ping-pong: --cpu-mode dedicated vs shared** (µs per round trip, measured in the guest with CLOCK_MONOTONIC; %s; "+
			"`hpcvmm run --cpus 2 --cpu-list 0-1 --cpu-mode MODE --rootfs BUSYBOX+PINGER -- /bin/pingpong %d %d`: one byte through a pipe "+
			"from a process pinned to the guest's CPU 0 to one on CPU 1 and back through another, %d round trips after %d unmeasured; "+
			"each round trip wakes an idle vCPU twice; median of the runs' medians (min–max); lower is better, ratio < 1: dedicated faster)\n\n",
			whereText, pingRounds, pingWarmup, pingRounds, pingWarmup)
		b.WriteString("| round trip | dedicated | shared | dedicated/shared |\n| --- | ---: | ---: | ---: |\n")
		for _, m := range []struct{ metric, label string }{
			{mPingMedianUs, "median"}, {mPingP10Us, "10th percentile"}, {mPingP90Us, "90th percentile"}, {mPingMeanUs, "mean"},
			{mJobTotal, "whole job, launch → exit (ms)"},
			{"kvm.exits", "KVM exits in the job (its last reading before the VM's exit: boot, ping-pong, power-off)"},
			{"kvm.halt_exits", "of which HLT exits"},
			{"kvm.pause_exits", "PAUSE exits"},
		} {
			prec := 1
			if m.metric == mJobTotal || strings.HasPrefix(m.metric, "kvm.") {
				prec = 0
			}
			d, ds, dok := cell(where, casePingPong, vmmDedicated, m.metric, prec)
			s, ss, sok := cell(where, casePingPong, vmmShared, m.metric, prec)
			if !dok && !sok && strings.HasPrefix(m.metric, "kvm.") {
				continue
			}
			r := ""
			if dok && sok {
				r = fmtRatio(ratio(ds.Median, ss.Median))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", m.label, d, s, r)
		}
	}
	if found(ix, whereHost, caseJobBuild, vmmHPCVMM, vmmHPCVMMTar, vmmCPIO) {
		fmt.Fprintf(&b, "\n**Job initramfs of a 512 MiB rootfs** (ms, on the host itself, not in L1: a directory of %d files of 128 KiB of random bytes, "+
			"and a tar of it, all in the page cache; median (min–max); lower is better). hpcvmm: `initramfs.Build` as `hpcvmm run --rootfs` calls it: "+
			"cold (an empty cache: every file hashed for the key, the newc archive with the agent and the guest's modules written and renamed into "+
			"the cache), the entry's first hit (the key from remembered file hashes; the archive's SHA-256 checked once and its identity recorded) "+
			"and a warm hit (every launch after that: the key and the entry's identity checked; nothing read or built). "+
			"Peer: `find . -print0 | cpio --null -o -H newc` of the directory, no cache, no hashing.\n\n", buildDirs*buildFiles)
		b.WriteString("| step | hpcvmm, directory | hpcvmm, tar | find \\| cpio | directory/cpio | tar/cpio |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
		c, cs, cok := cell(whereHost, caseJobBuild, vmmCPIO, mBuildMs, 0)
		for _, m := range []struct {
			metric, label string
			prec          int
		}{{mBuildMs, "build (cold cache)", 0}, {mFirstHitMs, "first hit (archive verified)", 1}, {mHitMs, "warm hit (a later launch)", 1}, {mArchiveMiB, "archive size (MiB)", 1}} {
			d, ds, dok := cell(whereHost, caseJobBuild, vmmHPCVMM, m.metric, m.prec)
			t, ts, tok := cell(whereHost, caseJobBuild, vmmHPCVMMTar, m.metric, m.prec)
			peer, rd, rt := "–", "", ""
			if m.metric == mBuildMs {
				peer = c
			} else if m.metric == mArchiveMiB {
				peer, _, _ = cell(whereHost, caseJobBuild, vmmCPIO, mArchiveMiB, 1)
			}
			if cok && m.metric != mArchiveMiB {
				if dok {
					rd = fmtRatio(ratio(ds.Median, cs.Median))
				}
				if tok {
					rt = fmtRatio(ratio(ts.Median, cs.Median))
				}
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", m.label, d, t, peer, rd, rt)
		}
	}
	b.WriteString(renderMPI(ix, where, whereText))
	b.WriteString(renderBinds(rep, ix, where, whereText))
	return b.String()
}

// found reports whether any of vmms has a sample (good or failed) in c.
func found(ix statIndex, where, c string, vmms ...string) bool {
	for _, v := range vmms {
		failed, ok := ix.failures(where, c, v)
		if failed > 0 || ok > 0 {
			return true
		}
	}
	return false
}
