package main

import (
	"bufio"
	"context"
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

// caseBinds (issue 37) measures a job's host directories (hpcvmm run -B,
// 9P2000.L over a virtio-console port, the guest's trans=fd client fed by
// the agent's relay) against QEMU's virtio-9p (-virtfs local, the same
// protocol over its own device) on the same L1 directory, and against L1
// natively: tests/guest/fsbench reads a 256 MiB file (1 MiB reads), writes
// 64 MiB (1 MiB writes, fsync, close) and creates and stats 1,000 files
// of 4 KiB, timing each in the guest. hpcvmm runs once per message size
// (128K, 512K, 1M with the default cache mode) and cache mode (none,
// mmap, loose at the default message size), through the hidden
// --bind-msize and --bind-cache; QEMU with the default's msize and cache
// mode. Runs are interleaved (run 1 of every configuration, then run 2,
// ...). It boots many guests that each move hundreds of MiB through
// emulated devices, so it runs only when -cases names it.
const caseBinds = "binds"

// wantsBinds reports whether cases names the binds case; it is not part
// of "all cases" (it takes longer than the rest of the suite).
func wantsBinds(cases []string) bool { return slices.Contains(cases, caseBinds) }

// The defaults of cmd/hpcvmm/jobbinds.go (bindMSize, bindCache), the centre
// of the case's matrix: keep them in step.
const (
	bindsDefaultMSize = 512 << 10
	bindsDefaultCache = "mmap"
)

// VMM names of the binds case.
const (
	vmmBindsNative = "l1-native"
	vmmBindsQEMU   = "qemu-q35-virtio-9p"
)

// Binds case metrics, from fsbench's lines.
const (
	mFSReadMiBs  = "read_mib_s"  // 256 MiB read sequentially
	mFSWriteMiBs = "write_mib_s" // 64 MiB written, fsync, close
	mFSCreateMs  = "create_ms"   // 1,000 files of 4 KiB created
	mFSStatMs    = "stat_ms"     // and stat-ed
	mFSMetaMs    = "meta_ms"     // both
	mFSMSize     = "msize"       // the mount's msize, as the guest kernel took it
)

// fsbench's sizes (its defaults, the issue's).
const (
	fsReadMiB  = 256
	fsWriteMiB = 64
	fsFiles    = 1000
)

// bindsVariant is one hpcvmm configuration of the case.
type bindsVariant struct {
	msize int
	cache string
}

// name is the variant's VMM name in the report, e.g. hpcvmm-512K-mmap.
func (v bindsVariant) name() string { return "hpcvmm-" + sizeName(v.msize) + "-" + v.cache }

// sizeName writes n bytes as hpcvmm's size flags take them (K or M).
func sizeName(n int) string {
	if n%(1<<20) == 0 {
		return strconv.Itoa(n>>20) + "M"
	}
	return strconv.Itoa(n>>10) + "K"
}

// bindsVariants are hpcvmm's configurations: the default first, then the
// other message sizes with the default cache mode, then the other cache
// modes with the default message size.
func bindsVariants() []bindsVariant {
	out := []bindsVariant{{bindsDefaultMSize, bindsDefaultCache}}
	for _, m := range []int{128 << 10, 512 << 10, 1 << 20} {
		if m != bindsDefaultMSize {
			out = append(out, bindsVariant{m, bindsDefaultCache})
		}
	}
	for _, c := range []string{"none", "mmap", "loose"} {
		if c != bindsDefaultCache {
			out = append(out, bindsVariant{bindsDefaultMSize, c})
		}
	}
	return out
}

// bindsVMMs are the case's configurations in run order.
func bindsVMMs() []string {
	out := []string{vmmBindsNative}
	for _, v := range bindsVariants() {
		out = append(out, v.name())
	}
	return append(out, vmmBindsQEMU)
}

// bindsQEMUInit is the QEMU peer's /init: load the 9P client over virtio,
// mount the tag "data" with the msize and cache mode the kernel command
// line names (fsbench.msize=, fsbench.cache=: unknown dotted parameters
// are left to /proc/cmdline), run fsbench on it, power off.
const bindsQEMUInit = `#!/bin/busybox sh
bb=/bin/busybox
$bb mkdir -p /proc /sys /data
$bb mount -t proc proc /proc
$bb mount -t sysfs sys /sys
for m in $($bb cat /etc/fsbench-modules); do $bb insmod $m || echo "fsbench error=\"insmod $m failed\""; done
msize=524288; cache=mmap
for a in $($bb cat /proc/cmdline); do
	case $a in fsbench.msize=*) msize=${a#*=};; fsbench.cache=*) cache=${a#*=};; esac
done
if $bb mount -t 9p -o trans=virtio,version=9p2000.L,msize=$msize,cache=$cache,nosuid,nodev data /data; then
	/bin/fsbench /data
	$bb sync
	$bb umount /data
else
	echo "fsbench error=\"mount -t 9p data /data failed\""
fi
$bb poweroff -f
`

// bindsQEMUModules are the QEMU guest's modules: the PCI transport of
// q35's virtio-9p-pci and the 9P client over virtio (with what they
// need, from modprobe).
var bindsQEMUModules = []string{"virtio_pci", "9pnet_virtio", "9p"}

// buildBindsArtifacts builds, on this host, fsbench (static, for every
// guest and L1) and the QEMU peer's initramfs (busybox, fsbench, the
// modules, bindsQEMUInit). A failure costs only the binds case (noted).
func buildBindsArtifacts(dir string, cfg *Config) {
	if err := buildBindsFiles(dir, cfg); err != nil {
		cfg.FSBench, cfg.BindsQEMUInitrd = "", ""
		cfg.FSBenchError = err.Error()
	}
}

func buildBindsFiles(dir string, cfg *Config) error {
	root, err := harness.ModuleRoot()
	if err != nil {
		return err
	}
	fsb := filepath.Join(dir, "fsbench")
	cmd := exec.Command("go", "build", "-o", fsb, "./tests/guest/fsbench")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./tests/guest/fsbench (static): %w: %s", err, strings.TrimSpace(string(b)))
	}
	cfg.FSBench = fsb
	if cfg.Busybox == "" {
		return fmt.Errorf("no busybox for the QEMU guest (run tests/testbed-packages.sh)")
	}
	k, err := harness.FindKernel()
	if err != nil {
		return err
	}
	mods, err := harness.ModuleDeps(k, bindsQEMUModules)
	if err != nil {
		return err
	}
	im := harness.NewImage()
	im.AddFile("/bin/busybox", cfg.Busybox, 0o755)
	im.AddFile("/bin/fsbench", fsb, 0o755)
	im.AddBytes("/init", []byte(bindsQEMUInit), 0o755)
	for _, m := range mods {
		if !strings.HasSuffix(m, ".ko") {
			return fmt.Errorf("module %s is compressed: busybox insmod in the QEMU guest takes plain .ko files", m)
		}
		im.AddFile(m, m, 0o644)
	}
	im.AddBytes("/etc/fsbench-modules", []byte(strings.Join(mods, "\n")+"\n"), 0o644)
	out := filepath.Join(dir, "binds-qemu.cpio")
	if _, err := im.Build(out, false); err != nil {
		return fmt.Errorf("the QEMU peer's initramfs: %w", err)
	}
	cfg.BindsQEMUInitrd = out
	return nil
}

// bindsDir is the L1 directory every configuration measures.
var bindsDir = filepath.Join(jobWorkDir, "binds-data")

// bindsArgv is the command line of configuration vmm on dir (fsbench
// directly for the native run).
func bindsArgv(cfg Config, vmm, root, dir string) ([]string, error) {
	if vmm == vmmBindsNative {
		return []string{cfg.FSBench, dir}, nil
	}
	if vmm == vmmBindsQEMU {
		if cfg.BindsQEMUInitrd == "" {
			return nil, fmt.Errorf("no initramfs for QEMU's guest (it did not build)")
		}
		cmdline := fmt.Sprintf("%s fsbench.msize=%d fsbench.cache=%s", jobCmdline, bindsDefaultMSize, bindsDefaultCache)
		return append([]string{cfg.QEMU, "-accel", "kvm", "-M", "q35", "-cpu", "host", "-smp", "1",
			"-m", strconv.Itoa(cfg.MemoryMiB) + "M", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
			"-serial", "stdio", "-kernel", cfg.Kernel, "-initrd", cfg.BindsQEMUInitrd, "-append", cmdline,
			"-virtfs", "local,path=" + dir + ",mount_tag=data,security_model=none"}, qemuRAMArgs(cfg)...), nil
	}
	for _, v := range bindsVariants() {
		if v.name() == vmm {
			// Shared, as QEMU's vCPU is, and the test bed's mode
			// (harness.TestbedCPUMode says why).
			return append(jobBaseArgv(cfg, 1, root), "--cpu-mode", harness.TestbedCPUMode, "--contain", "-B", dir+":/data",
				"--bind-msize", sizeName(v.msize), "--bind-cache", v.cache, "--", "/bin/fsbench", "/data"), nil
		}
	}
	return nil, fmt.Errorf("the binds case has no configuration %q", vmm)
}

// runBinds runs the binds case in L1: the rootfs (busybox and fsbench),
// the directory with its 256 MiB file (written natively, unmeasured),
// then Reps runs of every configuration, interleaved.
func runBinds(ctx context.Context, cfg Config, out sink) {
	if cfg.FSBench == "" {
		out.note("binds case: fsbench or the QEMU guest did not build: " + cfg.FSBenchError)
		return
	}
	root := filepath.Join(jobWorkDir, "fsbench-root")
	if err := makeBusyboxRootfs(root, cfg.Busybox, cfg.FSBench); err != nil {
		out.note("binds case: the rootfs: " + err.Error())
		return
	}
	_ = os.RemoveAll(bindsDir)
	if err := os.MkdirAll(bindsDir, 0o755); err != nil {
		out.note("binds case: " + err.Error())
		return
	}
	if b, err := exec.CommandContext(ctx, cfg.FSBench, "-prepare", bindsDir).CombinedOutput(); err != nil {
		out.note(fmt.Sprintf("binds case: fsbench -prepare %s: %v: %s", bindsDir, err, b))
		return
	}
	if _, err := primeKernelCache(cfg.Kernel); err != nil {
		out.note("binds case: priming hpcvmm's kernel cache failed (hpcvmm runs decompress on their own): " + err.Error())
	}
	limit := cfg.BindsTimeout
	if limit <= 0 {
		limit = 5 * time.Minute
	}
	failures := map[string]int{}
	for rep := 1; rep <= cfg.Reps; rep++ {
		for _, v := range bindsVMMs() {
			if len(cfg.BindsVMMs) > 0 && !slices.Contains(cfg.BindsVMMs, v) {
				continue
			}
			if cfg.done(caseBinds, v, rep) || failures[v]+cfg.FailedRuns[caseBinds+"|"+v] >= maxFailures && !cfg.succeededBefore(caseBinds, v) {
				continue
			}
			if ctx.Err() != nil {
				out.note(fmt.Sprintf("binds case: stopped before %s run %d: time budget", v, rep))
				return
			}
			out.progress(fmt.Sprintf("binds %s run %d", v, rep))
			s := runBind(ctx, cfg, v, root, limit, rep)
			if s.Err != "" {
				failures[v]++
			}
			out.sample(s)
		}
	}
}

// runBind runs configuration vmm once and reads fsbench's lines.
func runBind(ctx context.Context, cfg Config, vmm, root string, limit time.Duration, rep int) Sample {
	s := newSample(caseBinds, vmm, cfg.Where, rep)
	argv, err := bindsArgv(cfg, vmm, root, bindsDir)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Info["argv"] = strings.Join(argv, " ")
	r := runToExit(ctx, limit, argv)
	if r.err != nil {
		r.fail(&s, "")
		return s
	}
	res, err := parseFSBench(r.stdout.String())
	if err != nil {
		r.fail(&s, err.Error())
		return s
	}
	for k, v := range res.metrics {
		s.Metrics[k] = v
	}
	s.Info["mount"] = res.mount
	s.Metrics[mJobTotal] = ms(r.end.Sub(r.start))
	return s
}

// fsbenchResult is what fsbench printed, as metrics.
type fsbenchResult struct {
	metrics map[string]float64
	mount   string // the mount's type and options
}

// parseFSBench reads fsbench's lines (among a console's other lines, with
// carriage returns) into metrics; a missing measurement, an error line or
// no "fsbench done" is an error.
func parseFSBench(stdout string) (fsbenchResult, error) {
	res := fsbenchResult{metrics: map[string]float64{}}
	seen := map[string]map[string]string{}
	done := false
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if msg, ok := strings.CutPrefix(line, "fsbench error="); ok {
			return res, fmt.Errorf("fsbench failed: %s", msg)
		}
		rest, ok := strings.CutPrefix(line, "fsbench ")
		if !ok {
			continue
		}
		kind, fields, _ := strings.Cut(rest, " ")
		if kind == "done" {
			done = true
			continue
		}
		kv := map[string]string{}
		for _, f := range strings.Fields(fields) {
			k, v, ok := strings.Cut(f, "=")
			if !ok {
				return res, fmt.Errorf("fsbench line %q: field %q is not KEY=VALUE", line, f)
			}
			kv[k] = v
		}
		seen[kind] = kv
	}
	if !done {
		return res, fmt.Errorf("no \"fsbench done\" line in the output %q", tail(stdout, 300))
	}
	num := func(kind, key string) (float64, error) {
		v, err := strconv.ParseFloat(seen[kind][key], 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("fsbench's %s line: no positive %s (%q)", kind, key, seen[kind][key])
		}
		return v, nil
	}
	for _, m := range []struct{ kind, metric string }{{"read", mFSReadMiBs}, {"write", mFSWriteMiBs}} {
		n, err := num(m.kind, "bytes")
		if err != nil {
			return res, err
		}
		ns, err := num(m.kind, "ns")
		if err != nil {
			return res, err
		}
		res.metrics[m.metric] = n / (1 << 20) / (ns / 1e9)
	}
	for _, m := range []struct{ kind, metric string }{{"create", mFSCreateMs}, {"stat", mFSStatMs}, {"meta", mFSMetaMs}} {
		ns, err := num(m.kind, "ns")
		if err != nil {
			return res, err
		}
		if _, err := num(m.kind, "files"); err != nil {
			return res, err
		}
		res.metrics[m.metric] = ns / 1e6
	}
	mt := seen["mount"]
	res.mount = strings.TrimSpace(mt["fstype"] + " " + mt["options"])
	if v, ok := mountOption(mt["options"], "msize"); ok {
		if n, err := strconv.ParseFloat(v, 64); err == nil {
			res.metrics[mFSMSize] = n
		}
	}
	return res, nil
}

// mountOption is option key's value in a comma-separated option list.
func mountOption(options, key string) (string, bool) {
	for _, o := range strings.Split(options, ",") {
		if v, ok := strings.CutPrefix(o, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

// renderBinds renders the binds case's table ("" when it did not run).
func renderBinds(rep *Report, ix statIndex, where, whereText string) string {
	vmms := bindsVMMs()
	if !found(ix, where, caseBinds, vmms...) {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n**9P binds: `hpcvmm run --contain -B DIR:/data --bind-msize M --bind-cache C --rootfs BUSYBOX+FSBENCH -- /bin/fsbench /data` "+
		"against QEMU q35 `-virtfs local,path=DIR,mount_tag=data,security_model=none` (its guest mounts `trans=virtio,version=9p2000.L,msize=%d,cache=%s`) "+
		"and fsbench on DIR in L1 natively** (%s; the same kernel, 1 vCPU, %d MiB; DIR in L1's RAM; timed in the guest by tests/guest/fsbench: "+
		"a %d MiB file read in 1 MiB reads, %d MiB written in 1 MiB writes + fsync + close, %d files of 4 KiB created, then stat-ed; "+
		"median (min–max); msize: as the guest kernel took it. ×QEMU: throughput over QEMU's (> 1: faster), time over QEMU's (< 1: faster))\n\n",
		bindsDefaultMSize, bindsDefaultCache, whereText, rep.Config.MemoryMiB, fsReadMiB, fsWriteMiB, fsFiles)
	b.WriteString("| configuration | msize | read (MiB/s) | ×QEMU | write (MiB/s) | ×QEMU | create (ms) | stat (ms) | create + stat (ms) | ×QEMU |\n" +
		"| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	q := map[string]Stat{}
	for _, m := range []string{mFSReadMiBs, mFSWriteMiBs, mFSMetaMs} {
		if st, ok := ix.get(where, caseBinds, vmmBindsQEMU, m); ok {
			q[m] = st
		}
	}
	for _, v := range vmms {
		if !found(ix, where, caseBinds, v) {
			continue
		}
		cell := func(m string, prec int) string {
			st, ok := ix.get(where, caseBinds, v, m)
			if !ok {
				if failed, _ := ix.failures(where, caseBinds, v); failed > 0 {
					return fmt.Sprintf("failed ×%d", failed)
				}
				return "–"
			}
			return medianCell(ix, where, caseBinds, v, st, ok, prec)
		}
		vs := func(m string) string {
			st, ok := ix.get(where, caseBinds, v, m)
			qs, qok := q[m]
			if !ok || !qok || v == vmmBindsQEMU {
				return ""
			}
			return fmtRatio(ratio(st.Median, qs.Median))
		}
		msize := "–"
		if st, ok := ix.get(where, caseBinds, v, mFSMSize); ok {
			msize = sizeName(int(st.Median))
			if int(st.Median)%(1<<10) != 0 {
				msize = strconv.Itoa(int(st.Median))
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v, msize,
			cell(mFSReadMiBs, 1), vs(mFSReadMiBs), cell(mFSWriteMiBs, 1), vs(mFSWriteMiBs),
			cell(mFSCreateMs, 0), cell(mFSStatMs, 0), cell(mFSMetaMs, 0), vs(mFSMetaMs))
	}
	return b.String()
}
