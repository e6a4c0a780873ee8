package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// Paths inside the L1 image.
const (
	l1BenchDir    = "/hpcvmm/bench"
	l1ConfigPath  = l1BenchDir + "/config.json"
	l1GoKVM       = l1BenchDir + "/gokvm"
	l1JobInitrd   = l1BenchDir + "/job-qemu.cpio"   // the job case's QEMU initramfs
	l1PingPong    = l1BenchDir + "/pingpong"        // tests/guest/pingpong
	l1FSBench     = l1BenchDir + "/fsbench"         // tests/guest/fsbench
	l1BindsInitrd = l1BenchDir + "/binds-qemu.cpio" // the binds case's QEMU initramfs
	l1Busybox     = "/bin/busybox"                  // L1's own (tests/harness)
	l1QEMU        = "/usr/bin/qemu-system-x86_64"
	benchTest     = "bench" // the "test" name of the suite's result records
)

// The L2 kernel command line of the launch case, the same for every VMM:
// the test bed's, with the guest /init scenario that prints the marker.
const l2Cmdline = "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot"

type options struct {
	where         string
	reps          int
	bindsVMMs     []string // -binds-vmms: the binds case's configurations to run (all when empty)
	timeout       time.Duration
	out           string
	gokvm         string
	hostPrefault  bool
	hostHugepages int
	memoryMiB     int
	launchPages   string
	cases         []string
	render        string
	scaling       scalingOptions
}

func defaultOptions() options {
	return options{
		where: "auto",
		reps:  3,
		// The whole suite inside L1, its boot and one L1 hang included;
		// with the build and the host cases it stays under 15 minutes.
		timeout:      14 * time.Minute,
		gokvm:        "github.com/bobuhiro11/gokvm@latest",
		hostPrefault: true,
		memoryMiB:    512,
		launchPages:  pages2M,
		scaling:      defaultScalingOptions(),
	}
}

// outer builds everything, runs the host prefault cases, then the suite
// (here or inside L1), and returns the report. A report with what was
// measured comes back even when a later step failed. Long on purpose: the
// suite's steps in order, each keeping what was measured before it.
func outer(ctx context.Context, o options) (*Report, error) {
	started := time.Now()
	rep := &Report{
		Date:    started.Format("2006-01-02"),
		Started: started,
		Command: "go run ./tests/bench " + strings.Join(os.Args[1:], " "),
		Host:    describeEnv(Config{Where: whereHost, QEMU: lookQEMU()}),
	}
	defer func() {
		rep.Host["load_end"] = loadavg()
		rep.Stats = summarize(rep.Samples)
		rep.Duration = time.Since(started).Round(time.Second).String()
	}()
	where := o.where
	if where == "auto" {
		where = whereL1
		if kvmUsable() {
			where = whereHost
		}
	}
	if slices.Equal(o.cases, []string{casePrefaultScaling}) {
		// Hugepages are all it needs: nothing to build, no KVM, no L1.
		rep.Config = Config{Where: whereHost, Cases: o.cases}
		progress("prefault scaling on this host (load %s)", loadavg())
		runScaling(ctx, o.scaling, &memorySink{rep: rep})
		return rep, nil
	}
	progress("building hpcvmm, the L2 initramfs, gokvm and the suite")
	art, err := harness.BuildL1Artifacts()
	if err != nil {
		return rep, err
	}
	cache, err := harness.CacheDir()
	if err != nil {
		return rep, err
	}
	benchCache := filepath.Join(cache, "bench")
	if err := os.MkdirAll(benchCache, 0o755); err != nil {
		return rep, err
	}
	// The static copy for L1 is built now, with everything else, rather
	// than after the host cases: the tree is shared with other work.
	inner := filepath.Join(benchCache, "bench-inner")
	if where == whereL1 || wantsMPI(o.cases) {
		if err := buildSelf(inner); err != nil {
			return rep, err
		}
	}
	// The mpi and binds cases have no gokvm run: built only for others.
	ownOnly := len(o.cases) > 0 && !slices.ContainsFunc(o.cases, func(c string) bool { return c != caseMPI && c != caseBinds })
	var gokvm, gokvmVersion string
	var gokvmErr error
	if !ownOnly {
		gokvm, gokvmVersion, gokvmErr = buildGoKVM(ctx, benchCache, o.gokvm)
		if gokvmErr != nil {
			progress("gokvm did not build: %v", gokvmErr)
		}
		rep.Host["gokvm_version"] = gokvmVersion
	}

	cfg := Config{
		Reps:      o.reps,
		BindsVMMs: o.bindsVMMs,
		VMTimeout: 90 * time.Second,
		VMStall:   30 * time.Second,
		Kernel:    art.Kernel.Image,
		Initrd:    art.L2Initrd,
		Cmdline:   l2Cmdline,
		MemoryMiB: o.memoryMiB,
		HPCVMM:    art.HPCVMM,
		QEMU:      lookQEMU(),
		GoKVM:     gokvm,
		VMMs:      []string{vmmHPCVMM, vmmHPCVMMGuestKernel, vmmQEMUMicrovm, vmmQEMUQ35, vmmGoKVM},
		Last:      []string{vmmGoKVM},
		Cases:     o.cases,
		QEMUAccel: "kvm",
		// The booting cases' guest RAM; with 2M every VMM but gokvm
		// uses a prefaulted hugetlb memfd (ram.go).
		LaunchPages: o.launchPages,
		// The guest's 4 MiB through the console: a boot, the guest's
		// dd and sha256sum of the file, then the transfer. -reps runs:
		// QEMU's interrupt counts vary several-fold between runs.
		ConsoleReps:  o.reps,
		ConsoleLimit: 200 * time.Second, // the transfer alone took 69 s with the host's load at 10
	}
	if gokvmErr != nil {
		cfg.GoKVMError = gokvmErr.Error()
	}
	if cfg.wants(caseJob) || cfg.wants(casePingPong) || wantsBinds(o.cases) {
		if err := buildJobArtifacts(benchCache, &cfg); err != nil {
			return rep, err
		}
	}
	if wantsBinds(o.cases) {
		buildBindsArtifacts(benchCache, &cfg)
		if cfg.FSBenchError != "" {
			progress("the binds case's guest programs did not build: %s", cfg.FSBenchError)
		}
	}
	cfg.NetAvailable = netUnavailable(art.HPCVMM)
	cfg.DMA = dmaUnavailable()
	rep.Config = cfg

	sink := &memorySink{rep: rep}
	if o.hostPrefault && cfg.wants(casePrefault) {
		hc := cfg
		hc.Where = whereHost
		hc.QEMUAccel = "tcg" // no machine runs; TCG needs no /dev/kvm
		hc.Prefault = []PrefaultSpec{
			{Page: "4K", SizeMiB: 1024, Workers: []int{1, 2}},
			{Page: "2M", SizeMiB: 1024, Workers: []int{1, 2}},
			{Page: "1G", SizeMiB: 2048, Workers: []int{1, 2}},
		}
		restore, err := raiseHugepages(o.hostHugepages)
		if err != nil {
			sink.note("host prefault 2M: could not reserve hugepages: " + err.Error())
		}
		// The same opt-in lends the 1 GiB pool the two pages of its case
		// (raisePool only asks for what is not already free).
		var restore1G func()
		if o.hostHugepages > 0 {
			if restore1G, err = raisePool("1G", 2048); err != nil {
				sink.note("host prefault 1G: could not reserve hugepages: " + err.Error())
			}
		}
		progress("prefault cases on this host (load %s)", loadavg())
		runPrefaults(ctx, hc, sink)
		if restore1G != nil {
			restore1G()
		}
		if restore != nil {
			if err := restore(); err != nil {
				sink.note("restoring the host's 2 MiB hugepage pool: " + err.Error())
			}
		}
	}

	if cfg.wants(casePrefaultScaling) {
		progress("prefault scaling on this host (load %s)", loadavg())
		runScaling(ctx, o.scaling, sink)
	}
	if cfg.wants(caseJobBuild) {
		progress("job initramfs build on this host (load %s)", loadavg())
		k, err := harness.FindKernel()
		if err != nil {
			sink.note("job-build case: " + err.Error())
		} else {
			runJobBuilds(ctx, buildJob{Agent: art.HPCVMM, Release: k.Version, HostModules: filepath.Dir(k.Modules), Reps: o.reps, Where: whereHost}, benchCache, sink)
		}
		if len(o.cases) == 1 {
			return rep, nil // nothing of it runs in L1
		}
	}

	if wantsMPI(o.cases) {
		// Its own L1 (the Slurm cluster), then the rest as usual.
		err := runMPIInL1(ctx, o, art, inner, cfg, rep)
		o.cases = slices.DeleteFunc(slices.Clone(o.cases), func(c string) bool {
			return c == caseMPI || c == caseJobBuild || c == casePrefaultScaling // done above, on the host
		})
		if len(o.cases) == 0 || err != nil {
			return rep, err
		}
		cfg.Cases = o.cases
	}

	switch where {
	case whereHost:
		cfg.Where = whereHost
		cfg.BudgetSec = int(o.timeout.Seconds())
		cfg.PrefaultSec = 0
		progress("running the suite on this host")
		runSuite(ctx, cfg, sink)
		return rep, nil
	default:
		return rep, runInL1(ctx, o, art, inner, cfg, rep)
	}
}

// runInL1 boots L1 (ProfileBench) with the suite, QEMU and gokvm inside and
// merges what it reported into rep.
func runInL1(ctx context.Context, o options, art harness.L1Artifacts, inner string, cfg Config, rep *Report) error {
	l1 := cfg
	l1.Where = whereL1
	l1.Kernel = "/hpcvmm/l2/vmlinuz"
	l1.Initrd = "/hpcvmm/l2/initrd.cpio.gz"
	l1.HPCVMM = "/hpcvmm/bin/hpcvmm"
	l1.QEMU = l1QEMU
	l1.Busybox = l1Busybox
	if cfg.JobQEMUInitrd != "" {
		l1.JobQEMUInitrd = l1JobInitrd
	}
	if cfg.PingPong != "" {
		l1.PingPong = l1PingPong
	}
	if cfg.FSBench != "" {
		l1.FSBench, l1.BindsQEMUInitrd = l1FSBench, l1BindsInitrd
		// One run: a boot (10-20 s in L1) and fsbench's 256 + 64 MiB
		// and 1,000 files through the emulated devices: 221 s for
		// hpcvmm at 512K/mmap in L1 on 2026-11-27 (a small message
		// size takes more round trips).
		l1.BindsTimeout = 8 * time.Minute
	}
	// The job cases: a warm-up and 2 runs per rep, and 2 pinger runs
	// per rep, of 10-20 s each in L1.
	l1.JobSec = 60 * (1 + o.reps)
	if cfg.GoKVM != "" {
		l1.GoKVM = l1GoKVM
	}
	// The time kept for each case after the launches is about 1.5 times
	// what it took in L1 on a quiet host (2026-11-24: prefault 46 s, four
	// network runs 62 s, four console runs 50 s, the DMA-map case 127 s, a
	// gokvm launch 15 s); the launches get the rest, about 200 s for 13 s
	// boots. On a loaded host the launches are cut first, with a note.
	l1.PrefaultSec = 70
	l1.LastSec = 60
	l1.NetSec = 90 * o.reps
	l1.NetMiB = 16      // long enough for the guest's 10 ms clock to time it
	l1.NetReps = o.reps // each run is a full boot plus two transfers
	l1.NetTimeout = 100 * time.Second
	l1.ConsoleSec = 45 * o.reps
	// The defaults case: 2 guest sizes × 2 VMMs × reps boots of 15-40 s
	// in L1 (the 4 GiB guests prefault or fault 4 GiB under emulation);
	// the memory case: 4 configurations × reps launch-case boots.
	l1.DefaultsSec = 120 * min(3, o.reps)
	l1.MemorySec = 60 * min(3, o.reps)
	l1.DMA = ""
	l1.DMAMap = l1DMAMap(o.reps)
	// Two runs per prefault case: six cases of two VMMs, each run
	// seconds long in L1, must fit next to the launches (the host's own
	// prefault cases, on real hardware, get three).
	l1.PrefaultReps = min(2, o.reps)
	l1.WarmUpMiB = 2048
	l1.Prefault = []PrefaultSpec{
		// 4 KiB pages are the slowest to fault under TCG: half the size.
		{Page: "4K", SizeMiB: 512, Workers: []int{1, 2}},
		{Page: "2M", SizeMiB: 1024, Workers: []int{1, 2}},
		{Page: "1G", SizeMiB: 2048, Workers: []int{1, 2}},
	}
	rep.Config = l1

	// L1 (nested KVM under TCG) sometimes locks up for good — a soft
	// lockup of the L1 CPU running an L2 — a few percent of L2 boots. The
	// suite announces every run on the result port, so a silent port means
	// such a hang: L1 is killed and a fresh one continues with the runs
	// not yet taken, as long as the time limit allows.
	deadline := time.Now().Add(o.timeout)
	for boot := 1; ; boot++ {
		left := time.Until(deadline)
		if left < 2*time.Minute {
			rep.Notes = append(rep.Notes, fmt.Sprintf("no time left for another L1 boot (%v of -timeout %v left)", left.Round(time.Second), o.timeout))
			return nil
		}
		l1.Done, l1.FailedVMMs, l1.FailedRuns = doneSoFar(rep.Samples)
		// L1's own boot (10-20 s) and the teardown come out of the limit.
		l1.BudgetSec = int((left - 60*time.Second).Seconds())
		run, finished, err := bootL1Once(ctx, art, inner, harness.ProfileBench, cfg, l1, left, boot, rep)
		if err != nil || finished || run == nil || !(run.Idle || run.Hung || run.LockedUp) || ctx.Err() != nil {
			return err
		}
	}
}

// bootL1Once boots one L1 with the suite and merges its results into rep.
// finished is true when the suite inside reached its end.
func bootL1Once(ctx context.Context, art harness.L1Artifacts, inner string, profile harness.Profile, cfg, l1 Config, limit time.Duration, boot int, rep *Report) (*harness.L1ProgramRun, bool, error) {
	cfgJSON, err := json.MarshalIndent(l1, "", "  ")
	if err != nil {
		return nil, false, err
	}
	spec := harness.L1Program{
		Name:    "bench-" + profile.Name,
		Profile: profile,
		Program: inner,
		Timeout: limit,
		// Every run announces itself on the result port; silence for
		// longer than the longest run (a DMA-map run: its limit plus the
		// minute its VMM gets to unpin and exit) means L1 itself hung.
		Idle: max(l1.VMTimeout, l1.NetTimeout, l1.ConsoleLimit, l1.DMAMap.Timeout+time.Minute, l1.MPITimeout+30*time.Second, l1.BindsTimeout) + 30*time.Second,
		// A frozen L1 says so on its console long before the idle limit:
		// seen twice on 2026-11-24, both CPUs in a soft lockup that only
		// grew (22 s, 48 s, ... 205 s) until the idle limit killed it.
		SoftLockup: time.Minute,
		Extra: func(im *harness.Image) error {
			im.AddBytes(l1ConfigPath, cfgJSON, 0o644)
			if l1.wants(caseJob) || l1.wants(casePingPong) || wantsBinds(l1.Cases) {
				// What hpcvmm run --rootfs takes from the host for the
				// guest: its kernel's modules.
				if err := harness.AddJobModules(im); err != nil {
					return err
				}
			}
			if cfg.JobQEMUInitrd != "" {
				im.AddFile(l1JobInitrd, cfg.JobQEMUInitrd, 0o644)
			}
			if cfg.PingPong != "" {
				im.AddFile(l1PingPong, cfg.PingPong, 0o755)
			}
			if cfg.FSBench != "" {
				im.AddFile(l1FSBench, cfg.FSBench, 0o755)
				im.AddFile(l1BindsInitrd, cfg.BindsQEMUInitrd, 0o644)
			}
			if cfg.GoKVM != "" {
				im.AddFile(l1GoKVM, cfg.GoKVM, 0o755)
			}
			if cfg.QEMU == "" {
				return nil
			}
			if err := im.AddDynamicProgram(cfg.QEMU); err != nil {
				return err
			}
			for _, f := range harness.QEMUFirmware {
				if fileExists(f) {
					im.AddFile(f, f, 0o644)
				}
			}
			return nil
		},
		Progress: progressWriter{},
	}
	progress("booting L1 #%d (profile %s) to run the suite; limit %v, %d runs already taken", boot, spec.Profile.Name, limit.Round(time.Second), len(l1.Done))
	run, err := harness.RunL1Program(ctx, art, spec)
	finished := false
	if run != nil && run.Results != nil {
		var mErr error
		finished, mErr = mergeL1Results(run.Results, rep)
		if mErr != nil && err == nil {
			err = mErr
		}
		rep.L1["l1_boots"] = strconv.Itoa(boot)
		rep.L1[fmt.Sprintf("l1_boot_%d", boot)] = run.Elapsed.Round(time.Second).String() + " " + run.Dir
		last := lastProgress(run.Results)
		switch {
		case run.Idle:
			rep.Notes = append(rep.Notes, fmt.Sprintf("L1 boot %d: L1 stopped reporting for %v during %q and was killed (a hang of L1 itself, not of the VMM: see its console, %s)", boot, spec.Idle, last, run.ConsolePath))
		case run.LockedUp:
			rep.Notes = append(rep.Notes, fmt.Sprintf("L1 boot %d: L1's console reported a soft lockup of %v or more during %q and L1 was killed (a hang of L1 itself under emulation: see its console, %s)", boot, spec.SoftLockup, last, run.ConsolePath))
		case run.Hung:
			rep.Notes = append(rep.Notes, fmt.Sprintf("L1 boot %d: did not finish within %v (last step started: %q)", boot, limit.Round(time.Second), last))
		case !finished:
			rep.Notes = append(rep.Notes, fmt.Sprintf("L1 boot %d: the suite inside did not finish (no done record): the results are partial", boot))
		}
	}
	return run, finished, err
}

// runMPIInL1 boots ProfileSlurm's L1 (its setup starts the two-node
// Slurm cluster; its image has the MPI rootfs) with the suite running only
// the mpi case, and merges what it reported into rep. One boot: a hung L1
// is noted, and what it measured before is kept.
func runMPIInL1(ctx context.Context, o options, art harness.L1Artifacts, inner string, cfg Config, rep *Report) error {
	l1 := Config{
		Where:      whereL1,
		Reps:       o.reps,
		Kernel:     "/hpcvmm/l2/vmlinuz",
		HPCVMM:     "/hpcvmm/bin/hpcvmm",
		Cases:      []string{caseMPI},
		MemoryMiB:  cfg.MemoryMiB,
		VMTimeout:  cfg.VMTimeout,
		MPITimeout: 5 * time.Minute,
		BudgetSec:  int((o.timeout - time.Minute).Seconds()),
	}
	if len(o.cases) == 1 {
		rep.Config = l1
	}
	progress("the mpi case: booting the Slurm L1")
	// Nothing of the bench L1's extras (QEMU, gokvm, the job files).
	_, _, err := bootL1Once(ctx, art, inner, harness.ProfileSlurm, Config{}, l1, o.timeout, 1, rep)
	return err
}

// doneSoFar lists the L1 runs already taken and the case|VMM pairs whose
// runs all failed, for a fresh L1 to continue where a hung one stopped.
func doneSoFar(samples []Sample) (done, failed map[string]bool, failedRuns map[string]int) {
	done, failed, failedRuns = map[string]bool{}, map[string]bool{}, map[string]int{}
	ok := map[string]bool{}
	for _, s := range samples {
		if s.Where != whereL1 {
			continue
		}
		done[sampleKey(s.Case, s.VMM, s.Rep)] = true
		if s.Err != "" {
			failed[s.Case+"|"+s.VMM] = true
			failedRuns[s.Case+"|"+s.VMM]++
		} else {
			ok[s.Case+"|"+s.VMM] = true
		}
	}
	for k := range ok {
		delete(failed, k)
	}
	return done, failed, failedRuns
}

// mergeL1Results decodes the suite's result records (env/N, sample/N,
// note/N, done) into rep.
func mergeL1Results(res *harness.Results, rep *Report) (finished bool, err error) {
	if rep.L1 == nil {
		rep.L1 = Env{}
	}
	tr := res.Tests[benchTest]
	if tr == nil {
		why := "the suite inside L1 reported nothing"
		if ex := res.L1["exit"]; ex != nil {
			why += fmt.Sprintf(" (it exited with status %s)", ex["code"])
		} else if ab := res.L1["abort"]; ab != nil {
			why += " (L1's /init aborted: " + ab["reason"] + ")"
		}
		return false, fmt.Errorf("%s", why)
	}
	for _, k := range tr.Keys {
		v := tr.Values[k]
		kind, _, _ := strings.Cut(k, "/")
		switch kind {
		case "env":
			var e Env
			if err := json.Unmarshal([]byte(v), &e); err != nil {
				return false, fmt.Errorf("result record %s: %w", k, err)
			}
			for a, b := range e {
				rep.L1[a] = b
			}
		case "sample":
			var s Sample
			if err := json.Unmarshal([]byte(v), &s); err != nil {
				return false, fmt.Errorf("result record %s: %w", k, err)
			}
			rep.Samples = append(rep.Samples, s)
		case "note":
			rep.Notes = append(rep.Notes, v)
		}
	}
	return slices.ContainsFunc(tr.Keys, func(k string) bool { return strings.HasPrefix(k, "done/") }), nil
}

// lastProgress is the last step the suite inside L1 announced.
func lastProgress(res *harness.Results) string {
	tr := res.Tests[benchTest]
	if tr == nil {
		return "before the suite started"
	}
	last := ""
	for _, k := range tr.Keys {
		if strings.HasPrefix(k, "progress/") {
			last = tr.Values[k]
		}
	}
	return last
}

// kvmUsable reports whether this machine can boot guests itself.
func kvmUsable() bool { return harness.KVMUsable() == nil }

func lookQEMU() string {
	p, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return ""
	}
	return p
}

// buildSelf builds this command as a static binary for L1.
func buildSelf(out string) error {
	root, err := harness.ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.Command("go", "build", "-o", out, "./tests/bench")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./tests/bench (static, for L1): %w\n%s", err, b)
	}
	return nil
}

// buildGoKVM builds gokvm from the Go module proxy into dir/gokvm-bin with
// go install (static, outside hpcvmm's module, nothing vendored) and
// returns the binary and the module version it was built from.
func buildGoKVM(ctx context.Context, dir, module string) (bin, version string, err error) {
	gobin := filepath.Join(dir, "gokvm-bin")
	cmd := exec.CommandContext(ctx, "go", "install", module)
	cmd.Dir = dir // not inside hpcvmm's module: go install pkg@version ignores it anyway
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOBIN="+gobin, "GOFLAGS=-mod=mod", "GO111MODULE=on")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go install %s: %w: %s", module, err, strings.TrimSpace(string(b)))
	}
	bin = filepath.Join(gobin, "gokvm")
	if b, err := exec.Command("go", "version", "-m", bin).Output(); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == "mod" {
				version = f[1] + "@" + f[2]
			}
		}
	}
	return bin, version, nil
}

// netUnavailable says why the virtio-net case cannot run ("" if it can):
// hpcvmm run has no --net tap=...,vhost=... flag. The grouped help prints
// the flag as "--net tap=NAME[,...][,vhost=on|off]".
func netUnavailable(hpcvmm string) string {
	out, _ := exec.Command(hpcvmm, "run", "-h").CombinedOutput()
	if strings.Contains(string(out), "--net tap=") && strings.Contains(string(out), "vhost=") {
		return ""
	}
	return "hpcvmm run has no network device flag yet (virtio/net is not wired into the VM)"
}

// dmaUnavailable says why the VFIO DMA-map case is not measured on this
// host (runInL1 clears it: the bench L1 has the IOMMU and the device).
func dmaUnavailable() string {
	return "runs only inside the bench L1 (QEMU's edu behind an emulated intel-iommu, bound to vfio-pci); iommu's BenchmarkMapGuestRAM (HPCVMM_VFIO_GROUP) measures hpcvmm's side alone on a host"
}

// raiseHugepages raises the host's 2 MiB pool by n pages and returns a
// function that puts the old size back.
func raiseHugepages(n int) (restore func() error, err error) {
	if n <= 0 {
		return nil, nil
	}
	const p = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	old, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("%s: %q", p, b)
	}
	if err := os.WriteFile(p, []byte(strconv.Itoa(old+n)), 0o644); err != nil {
		return nil, fmt.Errorf("raising %s from %d by %d: %w (needs root)", p, old, n, err)
	}
	return func() error { return os.WriteFile(p, []byte(strconv.Itoa(old)), 0o644) }, nil
}

// buildJobArtifacts builds what the job cases need on this host: the QEMU
// peer's initramfs (busybox and an /init that prints the marker, runs
// true and powers off) and the static pinger (gcc -static: it runs on a
// busybox rootfs with no libc). A pinger that does not build only costs
// the pingpong case (noted); the QEMU initramfs is required.
func buildJobArtifacts(dir string, cfg *Config) error {
	bb := ""
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if fileExists(p) {
			bb = p
			break
		}
	}
	if bb == "" {
		return fmt.Errorf("job cases: busybox not found: run tests/testbed-packages.sh (installs busybox-static)")
	}
	cfg.Busybox = bb
	im := harness.NewImage()
	im.AddFile("/bin/busybox", bb, 0o755)
	im.AddBytes("/init", []byte(qemuJobInit), 0o755)
	out := filepath.Join(dir, "job-qemu.cpio")
	if _, err := im.Build(out, false); err != nil {
		return fmt.Errorf("job cases: QEMU's initramfs: %w", err)
	}
	cfg.JobQEMUInitrd = out
	root, err := harness.ModuleRoot()
	if err != nil {
		return err
	}
	pp := filepath.Join(dir, "pingpong")
	b, err := exec.Command("gcc", "-static", "-O2", "-Wall", "-o", pp, filepath.Join(root, "tests/guest/pingpong/pingpong.c")).CombinedOutput()
	if err != nil {
		cfg.PingPongError = fmt.Sprintf("gcc -static tests/guest/pingpong/pingpong.c: %v: %s", err, strings.TrimSpace(string(b)))
		return nil
	}
	cfg.PingPong = pp
	return nil
}
