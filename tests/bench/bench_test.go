package main

import (
	"bufio"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMedianMinMax(t *testing.T) {
	md, lo, hi := medianMinMax([]float64{5, 1, 3})
	assert.Equal(t, []float64{3, 1, 5}, []float64{md, lo, hi})
	md, lo, hi = medianMinMax([]float64{4, 1, 2, 10})
	assert.Equal(t, []float64{3, 1, 10}, []float64{md, lo, hi}, "even count: mean of the middle two")
	md, _, _ = medianMinMax(nil)
	assert.True(t, math.IsNaN(md))
}

func TestSummarizeCountsFailuresAndSkipsNaN(t *testing.T) {
	ok := func(rep int, v float64) Sample {
		s := newSample(caseLaunch, vmmHPCVMM, whereL1, rep)
		s.Metrics[mLaunchToInit] = v
		return s
	}
	bad := newSample(caseLaunch, vmmHPCVMM, whereL1, 3)
	bad.Err = "boom"
	nan := ok(4, math.NaN())
	only := newSample(caseLaunch, vmmGoKVM, whereL1, 1)
	only.Err = "cannot boot"
	stats := summarize([]Sample{ok(1, 10), ok(2, 30), bad, nan, only})
	ix := indexStats(stats)
	st, found := ix.get(whereL1, caseLaunch, vmmHPCVMM, mLaunchToInit)
	require.True(t, found)
	assert.Equal(t, 2, st.N)
	assert.Equal(t, 1, st.Failed)
	assert.Equal(t, 20.0, st.Median)
	failed, n := ix.failures(whereL1, caseLaunch, vmmGoKVM)
	assert.Equal(t, 1, failed)
	assert.Equal(t, 0, n)
}

func TestRatio(t *testing.T) {
	assert.Equal(t, 0.5, ratio(1, 2))
	assert.True(t, math.IsNaN(ratio(1, 0)))
	assert.Equal(t, "–", fmtRatio(math.NaN()))
	assert.Equal(t, "0.50", fmtRatio(0.5))
}

const smapsSample = `55d0c0a00000-55d0c0a21000 r--p 00000000 00:15 12 /usr/bin/qemu-system-x86_64
Size:                132 kB
Rss:                 132 kB
VmFlags: rd mr mw me sd
7f0000000000-7f0020000000 rw-s 00000000 00:01 33 /memfd:hpcvmm-guest-ram (deleted)
Size:             524288 kB
Rss:              524288 kB
Pss:              524288 kB
VmFlags: rd wr sh mr mw me ms sd
7f0020000000-7f0020800000 rw-p 00000000 00:00 0
Size:               8192 kB
Rss:                  16 kB
VmFlags: rd wr mr mw me ac sd
`

func TestGuestRSSFromSmaps(t *testing.T) {
	rss, n, _, err := guestRSSFromSmaps(bufio.NewScanner(strings.NewReader(smapsSample)), 512<<20)
	require.NoError(t, err)
	assert.Equal(t, 1, n, "only the 512 MiB mapping is guest RAM; the 8 MiB stack is not")
	assert.Equal(t, uint64(524288), rss)

	_, n, _, err = guestRSSFromSmaps(bufio.NewScanner(strings.NewReader(smapsSample)), 4<<30)
	require.NoError(t, err)
	assert.Equal(t, 0, n, "no mapping of a 4 GiB guest's size")
}

func TestReadMemInfo(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "42")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\thpcvmm\nVmHWM:\t  600000 kB\nVmRSS:\t  541900 kB\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "smaps"), []byte(smapsSample), 0o644))
	mi, err := readMemInfo(root, 42, 512<<20)
	require.NoError(t, err)
	assert.Equal(t, memInfo{RSSKiB: 541900, HWMKiB: 600000, GuestRSSKiB: 524288, GuestMaps: 1}, mi)
	_, err = readMemInfo(root, 43, 512<<20)
	assert.ErrorContains(t, err, "43")
}

func TestReadKVMStatsFindsTheCreatingThread(t *testing.T) {
	dbg, proc := t.TempDir(), t.TempDir()
	// The VM was created by thread 107 of process 100 (a Go VMM).
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "100", "task", "100"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "100", "task", "107"), 0o755))
	vm := filepath.Join(dbg, "107-11")
	require.NoError(t, os.MkdirAll(filepath.Join(vm, "vcpu0"), 0o755))
	for name, v := range map[string]string{"exits": "1234\n", "io_exits": "1000\n", "halt_poll_success_hist": "1 2 3\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(vm, name), []byte(v), 0o644))
	}
	// Another process's VM must not be picked up.
	require.NoError(t, os.MkdirAll(filepath.Join(dbg, "1000-12"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dbg, "1000-12", "exits"), []byte("9\n"), 0o644))

	st, err := readKVMStats(dbg, proc, 100)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"exits": 1234, "io_exits": 1000}, st, "histograms and vCPU directories skipped")

	_, err = readKVMStats(dbg, proc, 555)
	assert.ErrorContains(t, err, "555")
}

func TestReadKVMStatsFindsAVMWhoseCreatingThreadExited(t *testing.T) {
	dbg, proc := t.TempDir(), t.TempDir()
	// Process 100 holds its VM as fd 11; thread 107, which created it, is gone.
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "100", "task", "100"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "100", "fd"), 0o755))
	require.NoError(t, os.Symlink("anon_inode:kvm-vm", filepath.Join(proc, "100", "fd", "11")))
	require.NoError(t, os.Symlink("/dev/kvm", filepath.Join(proc, "100", "fd", "12")))
	require.NoError(t, os.MkdirAll(filepath.Join(dbg, "107-11"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dbg, "107-11", "exits"), []byte("77\n"), 0o644))
	// Fd 11 of a running process 300 is a different VM; a "-12" directory
	// is not a VM of process 100's.
	require.NoError(t, os.MkdirAll(filepath.Join(proc, "300"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(dbg, "300-11"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dbg, "300-11", "exits"), []byte("9000\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(dbg, "108-12"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dbg, "108-12", "exits"), []byte("8000\n"), 0o644))

	st, err := readKVMStats(dbg, proc, 100)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"exits": 77}, st)
}

func TestLogRecord(t *testing.T) {
	log := `time=2026-11-23T08:00:00.000Z level=INFO msg="guest RAM ready" size=512M page=4K prefault=2.921s workers=1 setup=2.93s
time=2026-11-23T08:00:00.500Z level=INFO msg="first KVM_RUN" since_start=3.467712s
time=2026-11-23T08:00:30.000Z level=INFO msg="userspace exits by reason" KVM_EXIT_IO=75338 KVM_EXIT_MMIO=12
`
	a, ok := logRecord(log, "first KVM_RUN")
	require.True(t, ok)
	v, ok := durationMs(a["since_start"])
	require.True(t, ok)
	assert.InDelta(t, 3467.712, v, 1e-9)
	a, ok = logRecord(log, "userspace exits by reason")
	require.True(t, ok)
	assert.Equal(t, map[string]string{"KVM_EXIT_IO": "75338", "KVM_EXIT_MMIO": "12"}, a)
	_, ok = logRecord(log, "missing")
	assert.False(t, ok)
	assert.Equal(t, map[string]string{"a": "x y", "b": "2"}, parseLogfmt(`a="x y" b=2 junk "`))
}

func TestGuestUptimeAtInit(t *testing.T) {
	con := "[    1.0] boot\r\nHPCVMM-GUEST-MARKER init-started\r\nhpcvmm-guest scenario=boot uptime=12.39\r\n"
	assert.InDelta(t, 12390.0, guestUptimeAtInit(con), 1e-9)
	assert.Equal(t, -1.0, guestUptimeAtInit("HPCVMM-GUEST-MARKER init-started\n"))
}

func TestWatchFindsPatternAcrossWrites(t *testing.T) {
	w := newWatch(initMarker)
	w.start = time.Now()
	_, _ = w.Write([]byte("boot log\nHPCVMM-GUEST-MA"))
	select {
	case <-w.hit:
		t.Fatal("pattern reported before it was complete")
	default:
	}
	_, _ = w.Write([]byte("RKER init-started\n"))
	select {
	case <-w.hit:
	default:
		t.Fatal("pattern split over two writes not found")
	}
	assert.False(t, w.at.IsZero())
	_, _ = w.Write([]byte(initMarker)) // a second occurrence must not close hit again
}

func TestLaunchArgvSameGuestForAll(t *testing.T) {
	cfg := Config{Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0 x=1", MemoryMiB: 512, HPCVMM: "/h", QEMU: "/q", GoKVM: "/g"}
	for _, v := range launchVMMs {
		argv, err := launchArgv(cfg, v)
		require.NoError(t, err, v)
		joined := strings.Join(argv, " ")
		for _, want := range []string{"/k", "/i", "512M"} {
			assert.Contains(t, argv, want, "%s: %s", v, joined)
		}
		// The common command line, first: gokvm only appends what it
		// needs to boot at all (gokvmCmdline).
		assert.Contains(t, joined, " console=ttyS0 x=1", v)
	}
	argv, _ := launchArgv(cfg, vmmQEMUMicrovm)
	assert.Contains(t, strings.Join(argv, " "), "-accel kvm -M microvm")
	cfg.GoKVM, cfg.GoKVMError = "", "no network"
	_, err := launchArgv(cfg, vmmGoKVM)
	assert.ErrorContains(t, err, "no network")
	_, err = launchArgv(cfg, "bhyve")
	assert.Error(t, err)
}

func TestGoKVMCmdline(t *testing.T) {
	assert.Equal(t, "console=ttyS0 tsc_early_khz=2594123 noapic", gokvmCmdline("console=ttyS0", 2594123))
	assert.Equal(t, "console=ttyS0 noapic", gokvmCmdline("console=ttyS0", 0), "no rate known: no tsc_early_khz")
	assert.Equal(t, 2594123, parseCPUMHz("processor\t: 0\nmodel name\t: AMD EPYC\ncpu MHz\t\t: 2594.123\ncache size\t: 512 KB\n"))
	assert.Equal(t, 0, parseCPUMHz("processor\t: 0\n"))
	assert.Equal(t, 0, parseCPUMHz("cpu MHz\t: fast\n"))
}

func TestQEMUBackendArgsMatchHPCVMMMemory(t *testing.T) {
	j := strings.Join(qemuBackendArgs("q", "kvm", PrefaultSpec{Page: "2M", SizeMiB: 1024}, 2, true), " ")
	assert.Contains(t, j, "memory-backend-memfd,id=ram,size=1024M,share=on,hugetlb=on,hugetlbsize=2M,prealloc=on,prealloc-threads=2")
	assert.Contains(t, j, "-M none")
	j = strings.Join(qemuBackendArgs("q", "tcg", PrefaultSpec{Page: "4K", SizeMiB: 64}, 1, false), " ")
	assert.Contains(t, j, "size=64M,share=on,prealloc=off")
	assert.NotContains(t, j, "hugetlb")
}

func TestParseFlags(t *testing.T) {
	o, err := parseFlags([]string{"-reps", "3", "-where", "l1"})
	require.NoError(t, err)
	assert.Equal(t, 3, o.reps)
	assert.Equal(t, whereL1, o.where)
	o, err = parseFlags([]string{"-cases", "net, launch"})
	require.NoError(t, err)
	assert.Equal(t, []string{caseNet, caseLaunch}, o.cases)
	assert.True(t, Config{Cases: o.cases}.wants(caseNet))
	assert.False(t, Config{Cases: o.cases}.wants(casePrefault))
	assert.True(t, Config{}.wants(casePrefault), "no selection: everything")
	for _, bad := range [][]string{{"-reps", "0"}, {"-where", "moon"}, {"-memory", "1"}, {"extra"}, {"-cases", "dma"}} {
		_, err := parseFlags(bad)
		assert.Error(t, err, "%v", bad)
	}
}

// TestRenderMarkdown checks that the tables carry the medians, the ratios
// in the documented direction, the failure of a peer, and the notes.
func TestRenderMarkdown(t *testing.T) {
	var samples []Sample
	add := func(c, vmm, where string, rep int, m map[string]float64) {
		s := newSample(c, vmm, where, rep)
		s.Metrics = m
		samples = append(samples, s)
	}
	for rep, v := range []float64{100, 110, 120} {
		add(caseLaunch, vmmHPCVMM, whereL1, rep+1, map[string]float64{mLaunchToInit: v, "kvm.exits": 1000, mRSSOverhead: 10240, mRSS: 534528, mRSSGuest: 524288, mFirstRunSinceStrt: 30, "exit.KVM_EXIT_IO": 900})
		add(caseLaunch, vmmQEMUMicrovm, whereL1, rep+1, map[string]float64{mLaunchToInit: 2 * v, "kvm.exits": 4000, mRSSOverhead: 40960, mRSS: 172032, mRSSGuest: 131072})
		add(prefaultCase("2M", 2), vmmHPCVMM, whereHost, rep+1, map[string]float64{mGiBps: 4, mSizeMiB: 1024})
		add(prefaultCase("2M", 2), vmmQEMU, whereHost, rep+1, map[string]float64{mGiBps: 2})
	}
	add(netCase("on"), vmmHPCVMM, whereL1, 1, map[string]float64{mNetTxMiBps: 3, mNetRxMiBps: 4, "xfer.kvm.exits": 500})
	add(netCase("on"), vmmQEMUQ35, whereL1, 1, map[string]float64{mNetTxMiBps: 1.5, mNetRxMiBps: 2, "xfer.kvm.exits": 1000})
	g := newSample(caseLaunch, vmmGoKVM, whereL1, 1)
	g.Err = "guest console silent for 1m0s before the init marker (stuck)"
	samples = append(samples, g)
	rep := &Report{Samples: samples, Config: Config{Where: whereL1, Cmdline: "console=ttyS0", MemoryMiB: 512, Reps: 3},
		Host:  Env{"cpu_model": "AMD EPYC", "load_start": "1.0 1.0 1.0", "load_end": "2.0 2.0 2.0", "cpus": "2"},
		Notes: []string{"virtio-net throughput: not yet available"}}
	md := renderMarkdown(rep)
	assert.Contains(t, md, "| hpcvmm | 110 | 100 | 120 | 3/3 | 1 |")
	assert.Contains(t, md, "| qemu-microvm | 220 | 200 | 240 | 3/3 | 0.50 |")
	assert.Contains(t, md, "| gokvm | failed: guest console silent")
	assert.Contains(t, md, "| host | 2M | 1024 MiB | 2 | 4.00 (4.00–4.00) | 2.00 (2.00–2.00) | 2.00 |")
	assert.Contains(t, md, "| exits | 1000 | 4000 (0.25) |")
	assert.Contains(t, md, "| hpcvmm | 10.0 | 10.0 | 10.0 | 522.0 | 512.0 | 1 |")
	assert.Contains(t, md, "| qemu-microvm | 40.0 |")
	assert.Contains(t, md, "KVM_EXIT_IO 900")
	assert.Contains(t, md, "- virtio-net throughput: not yet available")
	assert.Contains(t, md, "| vhost-net (vhost=on) | guest → L1 (MiB/s) | 3.00 | 1.50 | 2.00 |")
	assert.Contains(t, md, "| vhost-net (vhost=on) | KVM exits during the transfers | 500 | 1000 | 0.50 |")
	assert.NotContains(t, md, "userspace (vhost=off)", "no rows for a data path that was not measured")
	assert.Contains(t, md, "load average 1.0 1.0 1.0")
}

func TestNetArgv(t *testing.T) {
	cfg := Config{Kernel: "/k", Initrd: "/i", MemoryMiB: 512, HPCVMM: "/h", QEMU: "/q", NetMiB: 4}
	argv, err := netArgv(cfg, vmmHPCVMM, "on")
	require.NoError(t, err)
	j := strings.Join(argv, " ")
	assert.Contains(t, j, "--net tap="+netTAP+",vhost=on")
	assert.Contains(t, j, "hpcvmm.scenario=net hpcvmm.net_addr="+netGuest+" hpcvmm.net_peer="+netPeer+" hpcvmm.net_mib=4")
	argv, err = netArgv(cfg, vmmQEMUQ35, "off")
	require.NoError(t, err)
	j = strings.Join(argv, " ")
	assert.Contains(t, j, "-M q35")
	assert.Contains(t, j, "-netdev tap,id=n0,ifname="+netTAP+",script=no,downscript=no,vhost=off -device virtio-net-pci,netdev=n0,romfile=")
	_, err = netArgv(cfg, vmmGoKVM, "off")
	assert.Error(t, err)
}

func TestDoneSoFarLetsAFreshL1Continue(t *testing.T) {
	ok := newSample(caseLaunch, vmmHPCVMM, whereL1, 2)
	bad := newSample(caseLaunch, vmmGoKVM, whereL1, 1)
	bad.Err = "stuck"
	host := newSample(prefaultCase("4K", 1), vmmHPCVMM, whereHost, 1)
	flaky := newSample(caseLaunch, vmmHPCVMM, whereL1, 3)
	flaky.Err = "guest panicked"
	done, failed, runs := doneSoFar([]Sample{ok, bad, host, flaky})
	cfg := Config{Done: done, FailedVMMs: failed, FailedRuns: runs}
	assert.Equal(t, map[string]int{caseLaunch + "|" + vmmGoKVM: 1, caseLaunch + "|" + vmmHPCVMM: 1}, runs)
	assert.True(t, cfg.done(caseLaunch, vmmHPCVMM, 2))
	assert.False(t, cfg.done(caseLaunch, vmmHPCVMM, 1))
	assert.False(t, cfg.done(prefaultCase("4K", 1), vmmHPCVMM, 1), "host samples do not count for L1")
	assert.True(t, cfg.failedBefore(caseLaunch, vmmGoKVM))
	assert.False(t, cfg.failedBefore(caseLaunch, vmmHPCVMM), "a failure after a success is retried")
	assert.True(t, cfg.succeededBefore(caseLaunch, vmmHPCVMM))
	assert.False(t, cfg.succeededBefore(caseLaunch, vmmGoKVM))
	first, last := splitVMMs(launchVMMs, []string{vmmGoKVM})
	assert.Equal(t, []string{vmmHPCVMM, vmmQEMUMicrovm, vmmQEMUQ35}, first)
	assert.Equal(t, []string{vmmGoKVM}, last)
}

func TestRunsPerCaseNamesEveryCase(t *testing.T) {
	cfg := Config{Reps: 3, NetReps: 2, ConsoleReps: 2, PrefaultReps: 2, DMAMap: DMAMapConfig{Reps: 2, Reps4K: 1}}
	assert.Equal(t, "runs per VMM: launch 3, virtio-net 2, virtio-console 2, prefault 2 in L1 (3 on the host), DMA map 2 (1 on 4 KiB pages)", runsPerCase(cfg))
	assert.Equal(t, "runs per VMM: launch 5", runsPerCase(Config{Reps: 5}), "an older report without the other cases")
}

func TestFitReservesShrinksEvenlyOnlyWhenShort(t *testing.T) {
	a, b := 100*time.Second, 300*time.Second
	assert.Equal(t, 1.0, fitReserves(600*time.Second, &a, &b), "400 s fit in four fifths of 600 s")
	assert.Equal(t, 100*time.Second, a)

	// The second L1 boot of 2026-11-24 02:29: 288 s left, 400 s of shares.
	pre, con, dma, last := 70*time.Second, 90*time.Second, 180*time.Second, 60*time.Second
	f := fitReserves(288*time.Second, &pre, &con, &dma, &last)
	assert.InDelta(t, 0.576, f, 0.001)
	assert.InDelta(t, (288 * time.Second * 4 / 5).Seconds(), (pre + con + dma + last).Seconds(), 0.01)
	assert.InDelta(t, 103.7, dma.Seconds(), 0.1)

	none := 0 * time.Second
	assert.Equal(t, 1.0, fitReserves(-time.Second, &none), "nothing kept, nothing to shrink")
}

func TestScalingWorkers(t *testing.T) {
	assert.Equal(t, []int{1, 2, 4, 8, 16}, scalingWorkers(16))
	assert.Equal(t, []int{1, 2, 4, 8, 12}, scalingWorkers(12))
	assert.Equal(t, []int{1}, scalingWorkers(1))
	w, err := parseWorkerList("1, 4,16")
	require.NoError(t, err)
	assert.Equal(t, []int{1, 4, 16}, w)
	_, err = parseWorkerList("1,0")
	assert.ErrorContains(t, err, "-scaling-workers")
}

func TestScalingFlags(t *testing.T) {
	o, err := parseFlags([]string{"-cases", "prefault-scaling", "-scaling-gib", "32", "-scaling-workers", "1,8", "-scaling-reserve"})
	require.NoError(t, err)
	assert.Equal(t, []string{casePrefaultScaling}, o.cases)
	assert.Equal(t, 32, o.scaling.gib)
	assert.Equal(t, []int{1, 8}, o.scaling.workers)
	assert.True(t, o.scaling.reserve)
	assert.Equal(t, 16, defaultOptions().scaling.gib, "the case is specified at 16 GiB")
	for _, bad := range [][]string{{"-scaling-gib", "0"}, {"-scaling-rounds", "0"}, {"-scaling-node", "-2"}, {"-scaling-workers", "x"}} {
		_, err := parseFlags(bad)
		assert.Error(t, err, "%v", bad)
	}
}

func TestScalingSection(t *testing.T) {
	rep := &Report{Config: Config{Where: whereHost, Cases: []string{casePrefaultScaling}},
		Host: Env{"scaling_size": "16 GiB", "scaling_node": "0", "scaling_cpus": "0-15", "cpu_model": "Xeon", "kernel": "6.18"}}
	for r := 1; r <= 3; r++ {
		s := newSample(scalingCase("2M", 1), vmmHPCVMM, whereHost, r)
		s.Metrics[mGiBps] = 5 + float64(r)
		rep.Samples = append(rep.Samples, s)
		s = newSample(scalingCase("2M", 16), vmmHPCVMM, whereHost, r)
		s.Metrics[mGiBps] = 48
		if r == 3 {
			s.Metrics[mRewriteGiBps] = 120
		}
		rep.Samples = append(rep.Samples, s)
	}
	first := newSample(scalingCase("2M", 16), vmmFirstTouch, whereHost, 1)
	first.Metrics[mGiBps] = 40
	rep.Samples = append(rep.Samples, first)
	md := renderMarkdown(rep)
	assert.Contains(t, md, "**Prefault scaling**")
	assert.Contains(t, md, "| 2M | 1 | 7.0 (6.0–8.0) | 1.00 |")
	// 48 / (16 × 7) = 0.43; 48/120 = 0.40.
	assert.Contains(t, md, "| 2M | 16 | 48.0 (48.0–48.0) | 0.43 | 120.0 (120.0–120.0) | 0.40 |")
	assert.Contains(t, md, "First touch of the pool (unmeasured above): 2M pages, workers=16: 40.0 GiB/s.")
	assert.NotContains(t, md, "KVM exits", "a scaling-only run renders only its own table")
}

// TestStallReportDescribesAProcess: the report of a running process names
// each thread with its state and CPU, and the timer interrupt counts.
func TestStallReportDescribesAProcess(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	r := stallReport(vmmQEMUQ35, cmd.Process.Pid, nil, func() string { return "" })
	assert.Regexp(t, `threads: \[\d+ sleep [RS] cpu=\d+ wchan=\S+ syscall=\S+`, r)
	assert.Regexp(t, `local timer interrupts per CPU: \d+(/\d+)*, 2 s later \d+`, r)
	assert.NotContains(t, r, "goroutine dump", "only hpcvmm is sent SIGQUIT")
}
