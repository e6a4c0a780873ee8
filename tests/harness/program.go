package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// l1Program is where RunL1Program puts the program it runs inside L1; L1's
// /init runs it instead of the integration test binary when the run
// configuration names it (HPCVMM_PROGRAM).
const l1Program = "/hpcvmm/program"

// ProfileBench is the L1 of the benchmark suite (tests/bench): two vCPUs so
// parallel prefault has more than one CPU to scale to (testbed.md saw no
// hang with L1 -smp 2 and 1-vCPU L2 guests, which is all the suite boots),
// both hugepage sizes reserved at boot (four 1 GiB pages, 1 GiB of 2 MiB
// pages), debugfs for KVM's per-VM statistics, tracefs for the kprobes
// that time VFIO_IOMMU_MAP_DMA, and an IOMMU with edu bound to vfio-pci for
// the DMA-map case.
//
// The IOMMU and edu are ProfilePassthrough's (the kernel VFIO selftests'
// recipe); edu is bound in Setup rather than per run because the DMA-map
// case passes it to every VMM alike and nothing else in the suite uses it.
//
// Memory: 12G puts 2 GiB below the 32-bit PCI hole and 10 GiB above it.
// The boot pools (5 GiB) serve the prefault case and the DMA-map case's
// 4 GiB of 1 GiB pages: measured, raising the 1 GiB pool from 2 to 4 at
// runtime worked twice and then failed (only 2 of 4 free) once 4 GiB of
// 4 KiB pages had been used and freed, so those are reserved at boot. The
// 2 MiB pool is raised to 4 GiB at runtime for the DMA-map case and put
// back, and its 4 KiB case needs 4 GiB of ordinary memory next to L1's
// initramfs (7 GiB are left). QEMU under TCG allocates L1's RAM lazily:
// the host pays only for what the benchmarks touch.
var ProfileBench = Profile{
	Name:    "bench",
	Machine: "q35,kernel-irqchip=split",
	Memory:  "12G",
	CPUs:    2,
	Devices: []string{
		// intel-iommu must come before the PCI devices it translates.
		"-device", "intel-iommu,intremap=on,caching-mode=on,aw-bits=48",
		"-device", "edu,addr=04.0",
	},
	// nohz=off highres=off: a periodic tick, as in ProfileBasic: QEMU
	// 7.2's TCG can lose L1's one-shot LAPIC timer wakeup, which stalled
	// L2 boots and hung L1 in this suite's runs.
	Cmdline: []string{"intel_iommu=on", "hugepagesz=1G", "hugepages=4", "hugepagesz=2M", "hugepages=512", "nohz=off", "highres=off"},
	Setup: `g=$(cat /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)
m=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)
echo "bench profile: $g 1 GiB and $m 2 MiB hugepages"
mkdir -p /sys/kernel/debug /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || echo "bench profile: debugfs did not mount; KVM exit statistics will be missing"
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null || echo "bench profile: tracefs did not mount; the DMA-map case cannot time MAP_DMA"
edu=/sys/bus/pci/devices/` + EduBDF + `
if [ -e $edu/iommu_group ]; then
	[ -e $edu/driver ] && echo ` + EduBDF + ` >$edu/driver/unbind
	echo vfio-pci >$edu/driver_override
	echo ` + EduBDF + ` >/sys/bus/pci/drivers_probe
	g=$(readlink $edu/iommu_group)
	[ -c /dev/vfio/${g##*/} ] && echo "bench profile: edu ` + EduBDF + ` on vfio-pci, /dev/vfio/${g##*/}" ||
		echo "bench profile: edu did not bind to vfio-pci; the DMA-map case will be skipped"
else
	echo "bench profile: edu has no IOMMU group (no intel_iommu?); the DMA-map case will be skipped"
fi`,
}

// L1Program describes a program other than the integration test binary —
// the benchmark suite, for instance — to run inside one L1 boot. L1's /init
// prepares L1 as for the scenarios (modules, /dev/kvm, the profile's setup,
// HPCVMM_TEST_* variables naming hpcvmm and the L2 kernel and initramfs)
// and then runs the program once instead of the test binary. The program
// reports through the result port (HPCVMM_TEST_RESULTS, /dev/ttyS1) with
// ResultPrefix records; its standard output lands on L1's console.
type L1Program struct {
	// Name names the L1 image (L1-NAME.cpio in the cache) and run directory.
	Name string
	// Profile is the L1 machine; its Setup is packed into the image.
	Profile Profile
	// Program is a static binary on this host; inside L1 it runs as
	// /hpcvmm/program with no arguments.
	Program string
	// Extra adds more files to the L1 image (configuration, other VMMs).
	Extra func(im *Image) error
	// Timeout bounds the whole L1 boot; QEMU is killed when it passes.
	Timeout time.Duration
	// Progress, when non-nil, receives L1's console lines while L1 runs.
	Progress io.Writer
	// Idle, when positive, ends the boot early when the result port has
	// been silent that long: a program that reports before each step makes
	// a hung L1 cost Idle instead of the whole Timeout.
	Idle time.Duration
	// SoftLockup, when positive, ends the boot early when L1's console
	// reports a soft lockup at least this long (see watchSoftLockup).
	SoftLockup time.Duration
}

// L1Artifacts are the pieces RunL1Program builds on this host.
type L1Artifacts struct {
	Kernel   Kernel // L1 and L2 kernel
	HPCVMM   string // static hpcvmm
	L2Initrd string // the L2 initramfs with tests/guest/init
}

// BuildL1Artifacts builds (or finds in the cache) the kernel, hpcvmm and
// the L2 initramfs, for callers that also need them on the host.
func BuildL1Artifacts() (L1Artifacts, error) {
	var a L1Artifacts
	root, cache, err := rootAndCache()
	if err != nil {
		return a, err
	}
	if a.Kernel, err = FindKernel(); err != nil {
		return a, err
	}
	if a.HPCVMM, err = BuildHPCVMM(root, cache); err != nil {
		return a, err
	}
	a.L2Initrd, err = BuildL2Initrd(root, cache, a.Kernel)
	return a, err
}

// L1ProgramRun is one finished L1 boot of an L1Program.
type L1ProgramRun struct {
	Dir         string        // run directory: console log, result port file, QEMU command line
	ConsolePath string        // L1's console (ttyS0)
	ResultsPath string        // L1's result port (ttyS1)
	Console     string        // content of ConsolePath
	Results     *Results      // parsed result records
	QEMUOutput  string        // QEMU's own stdout and stderr
	Elapsed     time.Duration // QEMU start to exit
	Hung        bool          // QEMU was killed at the timeout
	Idle        bool          // QEMU was killed because the result port stayed silent for L1Program.Idle
	LockedUp    bool          // QEMU was killed because L1 reported a soft lockup of L1Program.SoftLockup or more
}

// RunL1Program builds the L1 image for spec and boots it once. An error
// means the boot could not be prepared or QEMU failed; a program that ran
// and reported is not an error even if it failed (see Results.L1["exit"]).
func RunL1Program(ctx context.Context, a L1Artifacts, spec L1Program) (*L1ProgramRun, error) {
	if err := spec.Profile.Validate(); err != nil {
		return nil, err
	}
	if spec.Name == "" || strings.ContainsAny(spec.Name, " /,:") {
		return nil, fmt.Errorf("L1 program name %q: want a non-empty name without spaces, '/', ',' or ':'", spec.Name)
	}
	qemu, err := qemuPath()
	if err != nil {
		return nil, err
	}
	root, cache, err := rootAndCache()
	if err != nil {
		return nil, err
	}
	initrd, err := buildL1ProgramInitrd(root, cache, a, spec)
	if err != nil {
		return nil, err
	}
	runsDir := filepath.Join(cache, "runs")
	pruneOldRuns(runsDir, 24*time.Hour)
	if err := os.MkdirAll(runsDir, 0o755); err != nil {
		return nil, err
	}
	r := &L1ProgramRun{}
	if r.Dir, err = os.MkdirTemp(runsDir, spec.Name+"-"); err != nil {
		return nil, err
	}
	r.ConsolePath = filepath.Join(r.Dir, "l1-console.log")
	r.ResultsPath = filepath.Join(r.Dir, "results.txt")
	timeout := spec.Timeout
	if timeout <= 0 {
		timeout = defaultL1Timeout
	}
	cfg := programRunConfig(l1Program, timeout)
	b := L1Boot{QEMU: qemu, Kernel: a.Kernel.Image, Initrd: initrd, ConsolePath: r.ConsolePath, ResultsPath: r.ResultsPath}
	args, err := spec.Profile.QEMUArgs(b, base64.StdEncoding.EncodeToString([]byte(cfg)))
	if err != nil {
		return nil, err
	}
	// The profile's per-run devices (the passthrough profiles' NVMe
	// backing file), as for a scenario run.
	if spec.Profile.Prepare != nil {
		extra, err := spec.Profile.Prepare(r.Dir)
		if err != nil {
			return nil, err
		}
		args = append(args, extra...)
	}
	if err := os.WriteFile(filepath.Join(r.Dir, "qemu.cmdline"), []byte(shellJoin(append([]string{qemu}, args...))+"\n"), 0o644); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	idleCtx, idleKill := context.WithCancel(ctx)
	defer idleKill()
	cmd := exec.CommandContext(idleCtx, qemu, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", qemu, err)
	}
	stopTail := make(chan struct{})
	tailDone := make(chan struct{})
	go func() {
		defer close(tailDone)
		if spec.Progress != nil {
			followFile(r.ConsolePath, spec.Progress, stopTail)
		}
	}()
	idleDone := make(chan bool, 1)
	go func() {
		idleDone <- spec.Idle > 0 && watchIdle(r.ResultsPath, spec.Idle, stopTail, idleKill)
	}()
	lockupDone := make(chan bool, 1)
	go func() {
		lockupDone <- spec.SoftLockup > 0 && watchSoftLockup(r.ConsolePath, spec.SoftLockup, stopTail, idleKill)
	}()
	runErr := cmd.Wait()
	close(stopTail)
	<-tailDone
	r.Idle = <-idleDone
	r.LockedUp = <-lockupDone
	r.Elapsed = time.Since(start)
	r.QEMUOutput = out.String()
	r.Hung = errors.Is(ctx.Err(), context.DeadlineExceeded)

	con, _ := os.ReadFile(r.ConsolePath)
	r.Console = string(con)
	f, err := os.Open(r.ResultsPath)
	if err != nil {
		return r, fmt.Errorf("L1 result port file: %w (QEMU: %v %s)", err, runErr, r.QEMUOutput)
	}
	defer f.Close()
	if r.Results, err = ParseResults(f); err != nil {
		return r, err
	}
	if runErr != nil && !r.Hung && !r.Idle && !r.LockedUp {
		return r, fmt.Errorf("qemu-system-x86_64 failed: %v\n%s", runErr, r.QEMUOutput)
	}
	return r, nil
}

// watchIdle calls kill and returns true when path has not grown for idle,
// or returns false when stop is closed first.
func watchIdle(path string, idle time.Duration, stop <-chan struct{}, kill func()) bool {
	tick := time.NewTicker(min(idle/4, 2*time.Second))
	defer tick.Stop()
	var size int64 = -1
	last := time.Now()
	for {
		select {
		case <-stop:
			return false
		case <-tick.C:
			var n int64
			if st, err := os.Stat(path); err == nil {
				n = st.Size()
			}
			if n != size {
				size, last = n, time.Now()
			} else if time.Since(last) > idle {
				kill()
				return true
			}
		}
	}
}

// programRunConfig is the shell fragment L1's /init sources for a program
// run: which program to start and, for the record, its time limit.
func programRunConfig(program string, timeout time.Duration) string {
	return fmt.Sprintf("HPCVMM_PROGRAM=%s\nHPCVMM_TIMEOUT=%s\n", shellQuote(program), shellQuote(timeout.Round(time.Second).String()))
}

// buildL1ProgramInitrd assembles the L1 image of an L1Program: L1's /init,
// busybox, the L1 modules, hpcvmm, the L2 kernel and initramfs, the
// profile's setup script, the program, and spec.Extra's files.
func buildL1ProgramInitrd(root, cache string, a L1Artifacts, spec L1Program) (string, error) {
	bb, err := findBusybox()
	if err != nil {
		return "", err
	}
	mods, err := ModuleDeps(a.Kernel, l1Modules)
	if err != nil {
		return "", err
	}
	im := NewImage()
	im.AddFile("/init", filepath.Join(root, "tests", "l1", "init.sh"), 0o755)
	im.AddFile(busyboxInImage, bb, 0o755)
	if err := addModules(im, a.Kernel, mods, l1ModulesList, cache); err != nil {
		return "", err
	}
	im.AddFile(l1HPCVMM, a.HPCVMM, 0o755)
	im.AddFile(l1L2Kernel, a.Kernel.Image, 0o644)
	im.AddFile(l1L2Initrd, a.L2Initrd, 0o644)
	p := spec.Profile
	im.AddBytes(filepath.Join(l1ProfilesDir, p.Name+".sh"), []byte("# setup of profile "+p.Name+", sourced by L1's /init\n"+p.Setup+"\n"), 0o644)
	im.AddFile(l1Program, spec.Program, 0o755)
	// A profile with an image of its own (ProfileSlurm: Slurm, the MPI
	// rootfs) gets it here too, with nvme-cli for the passthrough setup
	// it shares.
	if p.ownImage() {
		nvme, err := findNVMe()
		if err != nil {
			return "", err
		}
		if err := addDynamicProgram(im, nvme); err != nil {
			return "", err
		}
		if err := addProfileFiles(im, a.Kernel, mods, p, cache); err != nil {
			return "", err
		}
	}
	if spec.Extra != nil {
		if err := spec.Extra(im); err != nil {
			return "", err
		}
	}
	out := filepath.Join(cache, "l1-"+spec.Name+".cpio")
	_, err = im.Build(out, false)
	return out, err
}

// AddDynamicProgram copies the dynamically linked program prog and every
// shared library and the interpreter ldd reports for it into the image at
// their host paths, so it runs in L1 as it does on this host.
func (im *Image) AddDynamicProgram(prog string) error { return addDynamicProgram(im, prog) }

// followFile copies complete lines appended to path to w until stop is
// closed, then copies what is left. The file may not exist yet at first.
func followFile(path string, w io.Writer, stop <-chan struct{}) {
	var off int64
	var partial []byte
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	flush := func(final bool) {
		f, err := os.Open(path)
		if err != nil {
			return
		}
		defer f.Close()
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			return
		}
		rd := bufio.NewReader(f)
		for {
			line, err := rd.ReadBytes('\n')
			off += int64(len(line))
			partial = append(partial, line...)
			if err != nil {
				break
			}
			_, _ = w.Write(partial) // progress only; a closed writer is not fatal
			partial = partial[:0]
		}
		if final && len(partial) > 0 {
			_, _ = w.Write(append(partial, '\n'))
		}
	}
	for {
		select {
		case <-stop:
			flush(true)
			return
		case <-tick.C:
			flush(false)
		}
	}
}
