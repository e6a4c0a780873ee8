package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The defaults case and the VMM-memory case (issue 18): boots measured
// like the launch case (runBoot), with other command lines.
const (
	// caseDefaults launches each VMM as a user would, with no tuning
	// flags beyond kernel, initrd, command line, memory and vCPUs:
	// hpcvmm's own defaults (virtio console, 1 GiB pages, prefault),
	// QEMU's `-M microvm` defaults. Cases "defaults/<cpus>cpu-<GiB>G".
	caseDefaults = "defaults"
	// caseMemory boots hpcvmm with its devices added one at a time and
	// takes its resident memory beyond guest RAM at the guest's /init:
	// the increments are what each device costs. Cases "memory/<step>".
	caseMemory = "memory"
)

// defaultsShape is one guest size of the defaults case.
type defaultsShape struct {
	CPUs   int `json:"cpus"`
	MemGiB int `json:"mem_gib"`
}

// defaultsShapes are the two: a small guest and an HPC-like one.
var defaultsShapes = []defaultsShape{{1, 1}, {4, 4}}

// defaultsVMMs are compared in the defaults case: the ratio the README
// gives is hpcvmm against QEMU microvm.
var defaultsVMMs = []string{vmmHPCVMM, vmmQEMUMicrovm}

func (d defaultsShape) caseName() string {
	return fmt.Sprintf("%s/%dcpu-%dG", caseDefaults, d.CPUs, d.MemGiB)
}

// defaultsArgv is vmm's command line for shape d with nothing but the
// essentials. QEMU gets `-accel kvm` (without it QEMU emulates the CPU) and
// `-nographic` (without it the guest's serial console goes to a display
// that does not exist here, and the /init marker is never seen); neither
// is tuning. The guest command line is the launch case's for both: its
// console=ttyS0 is the UART, which hpcvmm also has (next to its default
// virtio console) and microvm has by default.
func defaultsArgv(cfg Config, vmm string, d defaultsShape) ([]string, error) {
	mem := strconv.Itoa(d.MemGiB) + "G"
	cpus := strconv.Itoa(d.CPUs)
	switch vmm {
	case vmmHPCVMM:
		return []string{cfg.HPCVMM, "run", "--kernel", cfg.Kernel, "--initrd", cfg.Initrd, "--cmdline", cfg.Cmdline,
			"--cpus", cpus, "--memory", mem}, nil
	case vmmQEMUMicrovm:
		return []string{cfg.QEMU, "-M", "microvm", "-accel", "kvm", "-nographic", "-smp", cpus, "-m", mem,
			"-kernel", cfg.Kernel, "-initrd", cfg.Initrd, "-append", cfg.Cmdline}, nil
	}
	return nil, fmt.Errorf("the defaults case has no command line for %q", vmm)
}

// memoryStep is one configuration of the memory case: the devices of the
// previous one plus one.
type memoryStep struct {
	Name  string // case suffix
	Adds  string // what this step adds, for the report
	extra func(argv []string, cfg Config) []string
}

// memorySteps are the memory case's configurations in order. The first is
// the launch case's hpcvmm (UART console only, no PCI device); each later
// one adds a device, the last has every device the issue names on
// (virtio console, virtio-net with vhost off, one passthrough device).
var memorySteps = []memoryStep{
	{Name: "none", Adds: "no PCI device (`--console serial`)", extra: func(a []string, _ Config) []string { return a }},
	{Name: "console", Adds: "virtio console (`--console virtio`)", extra: func(a []string, _ Config) []string {
		return replaceArg(a, "--console", "virtio")
	}},
	{Name: "net", Adds: "virtio-net, vhost off (`--net tap=" + netTAP + ",vhost=off`)", extra: func(a []string, _ Config) []string {
		return append(replaceArg(a, "--console", "virtio"), "--net", "tap="+netTAP+",vhost=off")
	}},
	{Name: "passthrough", Adds: "one passthrough device (`--gpu` edu)", extra: func(a []string, cfg Config) []string {
		return append(append(replaceArg(a, "--console", "virtio"), "--net", "tap="+netTAP+",vhost=off"), "--gpu", cfg.DMAMap.Device)
	}},
}

func (m memoryStep) caseName() string { return caseMemory + "/" + m.Name }

// replaceArg returns argv with the value after flag set to v.
func replaceArg(argv []string, flag, v string) []string {
	out := slices.Clone(argv)
	for i := 0; i+1 < len(out); i++ {
		if out[i] == flag {
			out[i+1] = v
		}
	}
	return out
}

// memoryArgv is hpcvmm's command line for step m of the memory case.
func memoryArgv(cfg Config, m memoryStep) ([]string, error) {
	base, err := launchArgv(cfg, vmmHPCVMM)
	if err != nil {
		return nil, err
	}
	if m.Name == "passthrough" && cfg.DMAMap.Device == "" {
		return nil, fmt.Errorf("no device to pass through: %s", orUnknown(cfg.DMA))
	}
	return m.extra(base, cfg), nil
}

// bootRun is one configuration of a booting case.
type bootRun struct {
	c, vmm   string
	ramBytes uint64
	argv     func() ([]string, error)
}

// runBoots runs every configuration cfg.Reps times, rep by rep, skipping
// runs an earlier L1 boot took and configurations that failed
// maxFailures times without booting.
func runBoots(ctx context.Context, cfg Config, name string, runs []bootRun, out sink) {
	failures := map[string]int{}
	booted := map[string]bool{}
	for rep := 1; rep <= cfg.Reps; rep++ {
		for _, r := range runs {
			key := r.c + "|" + r.vmm
			if cfg.done(r.c, r.vmm, rep) || failures[key]+cfg.FailedRuns[key] >= maxFailures {
				continue
			}
			if ctx.Err() != nil {
				out.note(name + ": stopped: time budget")
				return
			}
			out.progress(fmt.Sprintf("%s %s run %d", r.c, r.vmm, rep))
			var s Sample
			argv, err := r.argv()
			if err != nil {
				s = newSample(r.c, r.vmm, cfg.Where, rep)
				s.Err = err.Error()
			} else {
				s = runBoot(ctx, cfg, r.c, r.vmm, rep, argv, r.ramBytes)
			}
			out.sample(s)
			switch {
			case s.Err == "":
				booted[key] = true
			case booted[key] || cfg.succeededBefore(r.c, r.vmm):
				out.note(fmt.Sprintf("%s %s: run %d failed (it had booted before): %s", r.c, r.vmm, rep, s.Err))
			default:
				failures[key]++
				out.note(fmt.Sprintf("%s %s: run %d failed: %s", r.c, r.vmm, rep, s.Err))
			}
		}
	}
}

// runDefaults runs the defaults case. Its boots get more time than the
// launch case's: hpcvmm's default prefault of a 4 GiB guest keeps the
// console silent for seconds under emulation, and four vCPUs boot slower.
func runDefaults(ctx context.Context, cfg Config, out sink) {
	cfg.VMTimeout = max(cfg.VMTimeout, 3*time.Minute)
	cfg.VMStall = max(cfg.VMStall, 90*time.Second)
	var runs []bootRun
	for _, d := range defaultsShapes {
		for _, v := range defaultsVMMs {
			runs = append(runs, bootRun{c: d.caseName(), vmm: v, ramBytes: uint64(d.MemGiB) << 30,
				argv: func() ([]string, error) { return defaultsArgv(cfg, v, d) }})
		}
	}
	runBoots(ctx, cfg, "defaults", runs, out)
}

// runMemory runs the memory case.
func runMemory(ctx context.Context, cfg Config, out sink) {
	var runs []bootRun
	for _, m := range memorySteps {
		runs = append(runs, bootRun{c: m.caseName(), vmm: vmmHPCVMM, ramBytes: uint64(cfg.MemoryMiB) << 20,
			argv: func() ([]string, error) { return memoryArgv(cfg, m) }})
	}
	runBoots(ctx, cfg, "VMM memory", runs, out)
}

// renderDefaults is the defaults case's table: launch → /init medians and
// the ratio to QEMU microvm per guest size.
func renderDefaults(rep *Report, ix statIndex, where, whereText string) string {
	var b strings.Builder
	found := false
	for _, d := range defaultsShapes {
		for _, v := range defaultsVMMs {
			_, ok := ix.get(where, d.caseName(), v, mLaunchToInit)
			failed, _ := ix.failures(where, d.caseName(), v)
			found = found || ok || failed > 0
		}
	}
	if !found {
		return ""
	}
	fmt.Fprintf(&b, "\n**Defaults: launch → guest /init marker** (ms, %s; each VMM as a user launches it, no flags beyond kernel, initrd, "+
		"command line, memory and vCPUs: `hpcvmm run --kernel K --initrd I --cmdline C --cpus N --memory M` (its defaults: virtio console, "+
		"1 GiB pages, prefault), `qemu-system-x86_64 -M microvm -accel kvm -nographic -smp N -m M -kernel K -initrd I -append C` "+
		"(its defaults: 4 KiB anonymous RAM faulted by the guest); median (min–max); lower is better, ratio < 1: hpcvmm faster)\n\n", whereText)
	b.WriteString("| guest | hpcvmm | qemu-microvm | hpcvmm/microvm | hpcvmm first KVM_RUN | hpcvmm prefault | guest uptime at /init (hpcvmm / microvm) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, d := range defaultsShapes {
		c := d.caseName()
		h, hok := ix.get(where, c, vmmHPCVMM, mLaunchToInit)
		q, qok := ix.get(where, c, vmmQEMUMicrovm, mLaunchToInit)
		r := ""
		if hok && qok {
			r = fmtRatio(ratio(h.Median, q.Median))
		}
		fr, fok := ix.get(where, c, vmmHPCVMM, mFirstRunSinceStrt)
		pf, pok := ix.get(where, c, vmmHPCVMM, mHPCVMMPrefault)
		hu, huok := ix.get(where, c, vmmHPCVMM, mGuestUptimeAtInit)
		qu, quok := ix.get(where, c, vmmQEMUMicrovm, mGuestUptimeAtInit)
		fmt.Fprintf(&b, "| %d vCPU, %d GiB | %s | %s | %s | %s | %s | %s / %s |\n", d.CPUs, d.MemGiB,
			rangeCell(ix, where, c, vmmHPCVMM, h, hok, 0), rangeCell(ix, where, c, vmmQEMUMicrovm, q, qok, 0), r,
			medianOr(fr, fok), medianOr(pf, pok), medianOr(hu, huok), medianOr(qu, quok))
	}
	return b.String()
}

// renderMemory is the memory case's table: hpcvmm's memory beyond guest
// RAM at /init with each device added, and what each added.
func renderMemory(rep *Report, ix statIndex, where, whereText string) string {
	var b strings.Builder
	if _, ok := ix.get(where, memorySteps[0].caseName(), vmmHPCVMM, mRSSOverhead); !ok {
		if f, _ := ix.failures(where, memorySteps[0].caseName(), vmmHPCVMM); f == 0 {
			return ""
		}
	}
	fmt.Fprintf(&b, "\n**hpcvmm memory beyond guest RAM at the /init marker, device by device** (MiB; VmRSS + HugetlbPages minus the "+
		"resident guest RAM; %s; %d MiB guest on %s pages; each row adds one device to the row above; median (min–max) of the runs; "+
		"RssAnon is the Go heap, stacks and runtime, RssFile the binary's pages in use (inside L1 the binary lies on ramfs: "+
		"its pages count as RssShmem and RssFile is about 0))\n\n", whereText, rep.Config.MemoryMiB, rep.Config.launchPages())
	b.WriteString("| devices | beyond guest RAM | added by this device | RssAnon | RssFile | runs |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	prev, prevOK := Stat{}, false
	for _, m := range memorySteps {
		c := m.caseName()
		st, ok := ix.get(where, c, vmmHPCVMM, mRSSOverhead)
		failed, _ := ix.failures(where, c, vmmHPCVMM)
		if !ok {
			fmt.Fprintf(&b, "| %s | %s | | | | 0/%d |\n", m.Adds, failureText(rep, where, c, vmmHPCVMM, failed), failed)
			prevOK = false
			continue
		}
		add := ""
		if prevOK {
			add = fmt.Sprintf("%+.2f", (st.Median-prev.Median)/1024)
		}
		an, aok := ix.get(where, c, vmmHPCVMM, mRSSAnon)
		fi, fok := ix.get(where, c, vmmHPCVMM, mRSSFile)
		fmt.Fprintf(&b, "| %s | %.2f (%.2f–%.2f) | %s | %s | %s | %d/%d |\n", m.Adds, st.Median/1024, st.Min/1024, st.Max/1024, add,
			mibOr(an, aok), mibOr(fi, fok), st.N, st.N+failed)
		prev, prevOK = st, true
	}
	return b.String()
}

func medianOr(st Stat, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.0f", st.Median)
}

func mibOr(st Stat, ok bool) string {
	if !ok {
		return "—"
	}
	return fmt.Sprintf("%.2f", st.Median/1024)
}
