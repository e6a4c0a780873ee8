package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// writeOutputs writes bench-DATE.json and bench-DATE.md and prints the
// Markdown on stdout.
func writeOutputs(o options, rep *Report) error {
	dir := o.out
	if dir == "" {
		cache, err := harness.CacheDir()
		if err != nil {
			return err
		}
		dir = filepath.Join(cache, "bench")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	stamp := rep.Started.Format("20060102-150405")
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	jp := filepath.Join(dir, "bench-"+stamp+".json")
	if err := os.WriteFile(jp, js, 0o644); err != nil {
		return err
	}
	md := renderMarkdown(rep)
	mp := filepath.Join(dir, "bench-"+stamp+".md")
	if err := os.WriteFile(mp, []byte(md), 0o644); err != nil {
		return err
	}
	fmt.Print(md)
	fmt.Fprintf(os.Stderr, "bench: wrote %s and %s\n", mp, jp)
	return nil
}

// launchVMMs is the order of VMM columns and rows.
// vmmHPCVMMGuestKernel is run too but shown only in the kernel table,
// beside hpcvmm.
var launchVMMs = []string{vmmHPCVMM, vmmQEMUMicrovm, vmmQEMUQ35, vmmGoKVM}

// exitCounters are the KVM statistics the exits table shows (all of them
// are in the JSON).
var exitCounters = []string{"exits", "io_exits", "mmio_exits", "halt_exits", "irq_exits", "irq_window_exits",
	"request_irq_exits", "signal_exits", "hypercalls", "insn_emulation", "irq_injections", "pf_taken"}

// renderMarkdown renders the report's tables. Long on purpose: one table
// after another, in the order the report shows them.
func renderMarkdown(rep *Report) string {
	stats := rep.Stats
	if stats == nil {
		stats = summarize(rep.Samples)
	}
	ix := indexStats(stats)
	var b strings.Builder
	if slices.Equal(rep.Config.Cases, []string{casePrefaultScaling}) {
		fmt.Fprintf(&b, "Run %s (%s) on %s, kernel %s, %s CPUs; load average %s at the start, %s at the end.\n",
			rep.Started.Format("2006-01-02 15:04 MST"), rep.Duration, orUnknown(rep.Host["cpu_model"]), orUnknown(rep.Host["kernel"]),
			orUnknown(rep.Host["cpus"]), orUnknown(rep.Host["load_start"]), orUnknown(rep.Host["load_end"]))
		b.WriteString(scalingSection(rep, ix, stats))
		writeNotes(&b, rep)
		return b.String()
	}
	l1Where := "L1 (emulated: TCG L1, nested KVM; only ratios are meaningful)"
	if jobOnly(rep.Config.Cases) {
		where := whereL1
		if rep.Config.Where == whereHost {
			where, l1Where = whereHost, "host"
		}
		fmt.Fprintf(&b, "Run %s (%s) on %s; load average %s at the start, %s at the end (host, %s CPUs shared with other work).\n",
			rep.Started.Format("2006-01-02 15:04 MST"), rep.Duration, orUnknown(rep.Host["cpu_model"]),
			orUnknown(rep.Host["load_start"]), orUnknown(rep.Host["load_end"]), orUnknown(rep.Host["cpus"]))
		if len(rep.L1) > 0 {
			fmt.Fprintf(&b, "L1: %s vCPUs, kernel %s, QEMU %s; load average in L1 %s at the start, %s at the end.\n",
				orUnknown(rep.L1["cpus"]), orUnknown(rep.L1["kernel"]), orUnknown(strings.TrimPrefix(rep.L1["qemu_version"], "QEMU emulator version ")),
				orUnknown(rep.L1["load_start"]), orUnknown(rep.L1["load_end"]))
		}
		b.WriteString(renderJobs(rep, ix, where, l1Where))
		writeNotes(&b, rep)
		return b.String()
	}
	fmt.Fprintf(&b, "Run %s (%s) on %s; load average %s at the start, %s at the end (host, %s CPUs shared with other work).\n",
		rep.Started.Format("2006-01-02 15:04 MST"), rep.Duration, orUnknown(rep.Host["cpu_model"]),
		orUnknown(rep.Host["load_start"]), orUnknown(rep.Host["load_end"]), orUnknown(rep.Host["cpus"]))
	if len(rep.L1) > 0 {
		fmt.Fprintf(&b, "L1: %s vCPUs, kernel %s, %s 1 GiB + %s 2 MiB hugepages, QEMU %s, gokvm %s.\n",
			orUnknown(rep.L1["cpus"]), orUnknown(rep.L1["kernel"]), orUnknown(rep.L1["hugepages_1048576kB"]),
			orUnknown(rep.L1["hugepages_2048kB"]), orUnknown(strings.TrimPrefix(rep.L1["qemu_version"], "QEMU emulator version ")),
			orUnknown(rep.Host["gokvm_version"]))
	}
	fmt.Fprintf(&b, "Guest: Debian's stock kernel, the harness's busybox initramfs, `%s`, 1 vCPU, %d MiB; %s.\n",
		rep.Config.Cmdline, rep.Config.MemoryMiB, runsPerCase(rep.Config))
	fmt.Fprintf(&b, "%s\n", ramBackingLine(rep.Config))

	where := whereL1
	if rep.Config.Where == whereHost {
		where = whereHost
		l1Where = "host"
	}

	// 1. Launch to init marker.
	fmt.Fprintf(&b, "\n**Launch → guest /init marker** (ms, %s; lower is better; ratio < 1: hpcvmm faster)\n\n", l1Where)
	b.WriteString("| VMM | median | min | max | runs | hpcvmm/VMM |\n| --- | ---: | ---: | ---: | ---: | ---: |\n")
	hp, hpOK := ix.get(where, caseLaunch, vmmHPCVMM, mLaunchToInit)
	for _, v := range launchVMMs {
		st, ok := ix.get(where, caseLaunch, v, mLaunchToInit)
		failed, _ := ix.failures(where, caseLaunch, v)
		if !ok {
			fmt.Fprintf(&b, "| %s | %s | | | 0/%d | |\n", v, failureText(rep, where, caseLaunch, v, failed), failed)
			continue
		}
		r := "1"
		if v != vmmHPCVMM && hpOK {
			r = fmtRatio(ratio(hp.Median, st.Median))
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %d/%d | %s |\n", v, st.Median, st.Min, st.Max, st.N, st.N+failed, r)
	}

	// 1b. Where launch time goes before the guest's clock starts: the
	// kernel decompressed by the guest at every launch against hpcvmm's
	// cached vmlinux.
	fmt.Fprintf(&b, "\n**hpcvmm kernel: cached vmlinux (default) vs the guest's decompressor** (ms, median; %s)\n\n", l1Where)
	b.WriteString("Before the guest's clock: launch → /init less the uptime, and (console) when the clock started as dated by the arrival of " +
		"the boot's printk lines, the wall time the guest's clock missed by /init, and its rate over the last third of the boot " +
		"(guestclock.go: in the test bed the guest's clocks stand still for a while early in boot, so launch − uptime overstates).\n\n")
	b.WriteString("| VMM | launch → /init | guest uptime at /init | launch − uptime | clock started (console) | clock missed | clock rate |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, v := range []string{vmmHPCVMM, vmmHPCVMMGuestKernel, vmmQEMUMicrovm, vmmQEMUQ35} {
		l, lok := ix.get(where, caseLaunch, v, mLaunchToInit)
		u, uok := ix.get(where, caseLaunch, v, mGuestUptimeAtInit)
		if !lok || !uok {
			continue
		}
		cs, lost, rt := "–", "–", "–"
		if c, ok := ix.get(where, caseLaunch, v, mGuestClockStart); ok {
			cs = fmt.Sprintf("%.0f", c.Median)
		}
		if c, ok := ix.get(where, caseLaunch, v, mGuestClockLost); ok {
			lost = fmt.Sprintf("%.0f", c.Median)
		}
		if r, ok := ix.get(where, caseLaunch, v, mGuestClockRate); ok {
			rt = fmt.Sprintf("%.2f", r.Median)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %.0f | %s | %s | %s |\n", v, l.Median, u.Median, l.Median-u.Median, cs, lost, rt)
	}

	// 2. Process start to first KVM_RUN.
	fmt.Fprintf(&b, "\n**hpcvmm: process start → first KVM_RUN** (ms, %s)\n\n", l1Where)
	b.WriteString("| measured by | median | min | max | runs |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, m := range []struct{ metric, label string }{
		{mFirstRunSinceStrt, "hpcvmm's log (`first KVM_RUN since_start`, from its Go runtime start)"},
		{mFirstRunSeen, "the suite (fork/exec → that log line arriving)"},
		{mHPCVMMPrefault, fmt.Sprintf("of which: prefault of the %d MiB (%s pages; `guest RAM ready prefault`)", rep.Config.MemoryMiB, rep.Config.launchPages())},
		{mHPCVMMKernel, "alongside the prefault: kernel from the cache, SHA-256 checked or its record trusted (`kernel elapsed`)"},
		{mGuestUptimeAtInit, "for scale: guest kernel uptime when /init ran"},
	} {
		if st, ok := ix.get(where, caseLaunch, vmmHPCVMM, m.metric); ok {
			fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %d |\n", m.label, st.Median, st.Min, st.Max, st.N)
		}
	}

	// 3. Prefault.
	fmt.Fprintf(&b, "\n**Guest RAM prefault throughput** (GiB/s, median (min–max); higher is better; ratio > 1: hpcvmm faster). "+
		"hpcvmm: `guestmem.New` (memfd, MADV_POPULATE_WRITE by N workers); QEMU: `-object memory-backend-memfd,share=on[,hugetlb=on,hugetlbsize=P],prealloc=on,prealloc-threads=N`, "+
		"timed as QEMU ready with prealloc=on minus prealloc=off.\n\n")
	b.WriteString("| where | page | size | workers | hpcvmm | QEMU | hpcvmm/QEMU |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n")
	for _, pc := range prefaultRows(stats) {
		w := "host"
		if pc.where == whereL1 {
			w = "L1 (emulated)"
		}
		h, hok := ix.get(pc.where, pc.c, vmmHPCVMM, mGiBps)
		q, qok := ix.get(pc.where, pc.c, vmmQEMU, mGiBps)
		r := ""
		if hok && qok {
			r = fmtRatio(ratio(h.Median, q.Median))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s |\n", w, pc.page, sizeFor(rep, ix, pc), pc.workers,
			rangeCell(ix, pc.where, pc.c, vmmHPCVMM, h, hok, 2), rangeCell(ix, pc.where, pc.c, vmmQEMU, q, qok, 2), r)
	}

	b.WriteString(scalingSection(rep, ix, stats))

	// 4. KVM exits during boot.
	fmt.Fprintf(&b, "\n**KVM exits from launch to the /init marker** (KVM's per-VM statistics in debugfs, median count; %s; ratio hpcvmm/VMM)\n\n", l1Where)
	b.WriteString("| counter |")
	for _, v := range launchVMMs {
		fmt.Fprintf(&b, " %s |", v)
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(launchVMMs)) + "\n")
	anyExit := false
	for _, c := range exitCounters {
		h, hok := ix.get(where, caseLaunch, vmmHPCVMM, "kvm."+c)
		row := "| " + c + " |"
		seen := false
		for _, v := range launchVMMs {
			st, ok := ix.get(where, caseLaunch, v, "kvm."+c)
			switch {
			case !ok:
				row += " – |"
			case v == vmmHPCVMM || !hok:
				row += fmt.Sprintf(" %.0f |", st.Median)
				seen = true
			default:
				row += fmt.Sprintf(" %.0f (%s) |", st.Median, fmtRatio(ratio(h.Median, st.Median)))
				seen = true
			}
		}
		if seen {
			b.WriteString(row + "\n")
			anyExit = true
		}
	}
	if !anyExit {
		b.WriteString("| (no KVM statistics: debugfs was not available) |" + strings.Repeat(" |", len(launchVMMs)) + "\n")
	}
	if ue := userspaceExits(ix, where); ue != "" {
		fmt.Fprintf(&b, "\nhpcvmm's own count of exits to userspace, from launch until it was stopped just after the marker (median): %s.\n", ue)
	}

	// 5. Memory overhead.
	fmt.Fprintf(&b, "\n**VMM memory overhead at the /init marker** (MiB; VmRSS + HugetlbPages minus the resident part of the guest RAM mapping, hugetlb pages included; %s; lower is better)\n\n", l1Where)
	b.WriteString("| VMM | overhead median | min | max | VmRSS + HugetlbPages median | guest RAM resident | hpcvmm/VMM |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	ho, hoOK := ix.get(where, caseLaunch, vmmHPCVMM, mRSSOverhead)
	for _, v := range launchVMMs {
		st, ok := ix.get(where, caseLaunch, v, mRSSOverhead)
		if !ok {
			fmt.Fprintf(&b, "| %s | – | | | | | |\n", v)
			continue
		}
		rss, _ := ix.get(where, caseLaunch, v, mRSS)
		g, _ := ix.get(where, caseLaunch, v, mRSSGuest)
		r := "1"
		if v != vmmHPCVMM && hoOK {
			r = fmtRatio(ratio(ho.Median, st.Median))
		}
		fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.1f | %.1f | %.1f | %s |\n", v, st.Median/1024, st.Min/1024, st.Max/1024, rss.Median/1024, g.Median/1024, r)
	}

	b.WriteString(renderMemory(rep, ix, where, l1Where))
	b.WriteString(renderDefaults(rep, ix, where, l1Where))

	// 6. virtio-net.
	if rows := netRows(ix, where); rows != "" {
		fmt.Fprintf(&b, "\n**virtio-net throughput** (MiB/s, %d MiB each way over TCP between the guest and L1 through a TAP, timed by the guest; %s; higher is better, ratio > 1: hpcvmm faster; for the exit counts lower is better). "+
			"hpcvmm `--net tap=...,vhost=on|off`; QEMU `-M q35 -netdev tap,vhost=on|off -device virtio-net-pci`. Exits: KVM's counters over both transfers.\n\n", rep.Config.NetMiB, l1Where)
		b.WriteString("| data path | direction | hpcvmm | QEMU q35 | hpcvmm/QEMU |\n| --- | --- | ---: | ---: | ---: |\n")
		b.WriteString(rows)
	}

	// 7. virtio-console.
	b.WriteString(renderConsole(rep, ix, where, l1Where))

	// 8. VFIO DMA map of guest RAM.
	b.WriteString(renderDMAMap(rep, ix, where, l1Where))

	// 8b. Jobs: hpcvmm run --rootfs -- COMMAND, CPU modes, initramfs build.
	b.WriteString(renderJobs(rep, ix, where, l1Where))

	// 9. Everything else the suite noted (skipped cases, failures).
	writeNotes(&b, rep)
	return b.String()
}

// netRows renders the virtio-net table's rows: throughput both ways and
// the transfer's KVM exits, per data path.
func netRows(ix statIndex, where string) string {
	var b strings.Builder
	for _, vhost := range []string{"off", "on"} {
		c := netCase(vhost)
		path := "userspace (vhost=off)"
		if vhost == "on" {
			path = "vhost-net (vhost=on)"
		}
		for _, m := range []struct{ metric, label string }{
			{mNetTxMiBps, "guest → L1 (MiB/s)"},
			{mNetRxMiBps, "L1 → guest (MiB/s)"},
			{"xfer.kvm.exits", "KVM exits during the transfers"},
			{"xfer.kvm.io_exits", "of which PIO to userspace"},
			{"xfer.kvm.mmio_exits", "of which MMIO to userspace"},
			{"xfer.kvm.irq_exits", "KVM irq_exits during the transfers"},
			{"xfer.kvm.irq_window_exits", "KVM irq_window_exits during the transfers"},
			{"xfer.kvm.irq_injections", "KVM interrupt injections during the transfers"},
		} {
			h, hok := ix.get(where, c, vmmHPCVMM, m.metric)
			q, qok := ix.get(where, c, vmmQEMUQ35, m.metric)
			if !hok && !qok {
				continue
			}
			prec := 2
			if strings.HasPrefix(m.metric, "xfer.") {
				prec = 0
			}
			r := ""
			if hok && qok {
				r = fmtRatio(ratio(h.Median, q.Median))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", path, m.label,
				medianCell(ix, where, c, vmmHPCVMM, h, hok, prec), medianCell(ix, where, c, vmmQEMUQ35, q, qok, prec), r)
		}
	}
	return b.String()
}

// medianCell is a median, with the range when there were several runs.
func medianCell(ix statIndex, where, c, vmm string, st Stat, ok bool, prec int) string {
	if ok && st.N == 1 {
		return fmt.Sprintf("%.*f", prec, st.Median)
	}
	return rangeCell(ix, where, c, vmm, st, ok, prec)
}

type prefaultRow struct{ where, c, page, workers string }

// prefaultRows lists the prefault cases present, host first, by page size
// and worker count.
func prefaultRows(stats []Stat) []prefaultRow {
	seen := map[string]bool{}
	var rows []prefaultRow
	for _, s := range stats {
		if !strings.HasPrefix(s.Case, casePrefault+"/") || seen[s.Where+s.Case] {
			continue
		}
		seen[s.Where+s.Case] = true
		parts := strings.Split(s.Case, "/")
		if len(parts) != 3 {
			continue
		}
		rows = append(rows, prefaultRow{s.Where, s.Case, parts[1], strings.TrimPrefix(parts[2], "workers=")})
	}
	pageOrder := map[string]int{"4K": 0, "2M": 1, "1G": 2}
	sort.Slice(rows, func(i, j int) bool {
		a, b := rows[i], rows[j]
		if a.where != b.where {
			return a.where == whereHost
		}
		if a.page != b.page {
			return pageOrder[a.page] < pageOrder[b.page]
		}
		return a.workers < b.workers
	})
	return rows
}

// sizeFor is the guest RAM size of a prefault row, as its samples recorded
// it (reports from before they did: the configured size).
func sizeFor(rep *Report, ix statIndex, pc prefaultRow) string {
	if st, ok := ix.get(pc.where, pc.c, vmmHPCVMM, mSizeMiB); ok {
		return fmt.Sprintf("%.0f MiB", st.Median)
	}
	for _, p := range rep.Config.Prefault {
		if p.Page == pc.page {
			return fmt.Sprintf("%d MiB", p.SizeMiB)
		}
	}
	return "?"
}

func rangeCell(ix statIndex, where, c, vmm string, st Stat, ok bool, prec int) string {
	if !ok {
		if failed, _ := ix.failures(where, c, vmm); failed > 0 {
			return fmt.Sprintf("failed ×%d", failed)
		}
		return "–"
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, st.Median, prec, st.Min, prec, st.Max)
}

// failureText is the table cell of a VMM whose runs all failed: the first
// error, shortened.
func failureText(rep *Report, where, c, vmm string, failed int) string {
	for _, s := range rep.Samples {
		if s.Where == where && s.Case == c && s.VMM == vmm && s.Err != "" {
			return "failed: " + oneLine(s.Err, 160)
		}
	}
	if failed == 0 {
		return "not run"
	}
	return "failed"
}

// userspaceExits renders hpcvmm's "exit.REASON" medians.
func userspaceExits(ix statIndex, where string) string {
	var parts []string
	for k, s := range ix {
		if s.Where == where && s.Case == caseLaunch && s.VMM == vmmHPCVMM && strings.HasPrefix(s.Metric, "exit.") && s.N > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", strings.TrimPrefix(s.Metric, "exit."), s.Median))
		}
		_ = k
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func fmtRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "–"
	}
	return fmt.Sprintf("%.2f", r)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// oneLine flattens s for a table cell or list item and shortens it to n
// bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(strings.ReplaceAll(s, "|", "/")), " ")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// runsPerCase says how many runs each case was given per VMM: the
// launches get Reps, the longer cases fewer so the suite fits its budget.
func runsPerCase(cfg Config) string {
	parts := []string{fmt.Sprintf("runs per VMM: launch %d", cfg.Reps)}
	if cfg.NetReps > 0 {
		parts = append(parts, fmt.Sprintf("virtio-net %d", cfg.NetReps))
	}
	if cfg.ConsoleReps > 0 {
		parts = append(parts, fmt.Sprintf("virtio-console %d", cfg.ConsoleReps))
	}
	if cfg.PrefaultReps > 0 {
		parts = append(parts, fmt.Sprintf("prefault %d in L1 (%d on the host)", cfg.PrefaultReps, cfg.Reps))
	}
	if cfg.DMAMap.Reps > 0 {
		parts = append(parts, fmt.Sprintf("DMA map %d (%d on 4 KiB pages)", cfg.DMAMap.Reps, cfg.DMAMap.repsFor("4K")))
	}
	return strings.Join(parts, ", ")
}

// writeNotes lists the report's notes, if any.
func writeNotes(b *strings.Builder, rep *Report) {
	if len(rep.Notes) > 0 {
		b.WriteString("\nNotes:\n\n")
		for _, n := range rep.Notes {
			fmt.Fprintf(b, "- %s\n", oneLine(n, 240))
		}
	}
}
