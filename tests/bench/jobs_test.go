package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"
)

func TestParsePingPong(t *testing.T) {
	m, err := parsePingPong("noise\npingpong rounds=2000 median_ns=30435 p10_ns=29705 p90_ns=44998 mean_ns=32527 min_ns=6279 max_ns=81321\n")
	require.NoError(t, err)
	assert.InDelta(t, 30.435, m[mPingMedianUs], 1e-9)
	assert.InDelta(t, 29.705, m[mPingP10Us], 1e-9)
	assert.InDelta(t, 44.998, m[mPingP90Us], 1e-9)
	assert.InDelta(t, 32.527, m[mPingMeanUs], 1e-9)
	for _, bad := range []string{"", "pingpong rounds=1", "pingpong median_ns=x p10_ns=1 p90_ns=1 mean_ns=1", "pingpong median_ns=0 p10_ns=1 p90_ns=1 mean_ns=1", "pingpong junk"} {
		_, err := parsePingPong(bad)
		assert.Error(t, err, "%q", bad)
	}
}

// TestPingPongBinary builds the pinger as the suite does and runs it on
// this machine when it has two CPUs: its line parses, and a bad argument
// is refused.
func TestPingPongBinary(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc:", err)
	}
	dir := t.TempDir()
	cfg := Config{}
	require.NoError(t, buildJobArtifacts(dir, &cfg))
	require.Empty(t, cfg.PingPongError)
	out, err := exec.Command(cfg.PingPong, "x").CombinedOutput()
	assert.Error(t, err)
	assert.Contains(t, string(out), "ROUNDS x")
	out, err = exec.Command(cfg.PingPong, "200", "10").Output()
	if err != nil {
		t.Skipf("the pinger cannot run here (needs CPUs 0 and 1): %v", err)
	}
	m, err := parsePingPong(string(out))
	require.NoError(t, err)
	assert.Greater(t, m[mPingMedianUs], 0.0)
	assert.LessOrEqual(t, m[mPingP10Us], m[mPingMedianUs])
	assert.LessOrEqual(t, m[mPingMedianUs], m[mPingP90Us])

	// QEMU's initramfs: busybox and the /init that runs true.
	f, err := os.Open(cfg.JobQEMUInitrd)
	require.NoError(t, err)
	defer f.Close()
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	require.NoError(t, err)
	files := map[string]string{}
	for _, r := range recs {
		b := make([]byte, r.FileSize)
		if r.FileSize > 0 {
			_, err := r.ReadAt(b, 0)
			require.NoError(t, err)
		}
		files[r.Name] = string(b)
	}
	assert.Equal(t, qemuJobInit, files["init"])
	assert.Contains(t, files, "bin/busybox")
}

func TestStampsTimesFirstLineOfEachPattern(t *testing.T) {
	s := newStamps("started", "exited")
	_, _ = s.Write([]byte("level=DEBUG msg=\"job: command sta"))
	_, ok := s.when("started")
	assert.False(t, ok)
	_, _ = s.Write([]byte("rted\"\nother\n"))
	t1, ok := s.when("started")
	require.True(t, ok)
	time.Sleep(2 * time.Millisecond)
	_, _ = s.Write([]byte("started again\nexited"))
	t2, _ := s.when("started")
	assert.Equal(t, t1, t2, "the first line counts")
	_, ok = s.when("exited")
	assert.True(t, ok, "a last line without its newline counts")
	assert.Contains(t, s.String(), "started again")
}

func TestMakeBusyboxRootfs(t *testing.T) {
	bb := "/bin/busybox"
	if !fileExists(bb) {
		t.Skip("no /bin/busybox")
	}
	extra := filepath.Join(t.TempDir(), "helper")
	require.NoError(t, os.WriteFile(extra, []byte("#!/bin/sh\n"), 0o755))
	root := filepath.Join(t.TempDir(), "root")
	require.NoError(t, makeBusyboxRootfs(root, bb, extra))
	l, err := os.Readlink(filepath.Join(root, "bin/true"))
	require.NoError(t, err)
	assert.Equal(t, "busybox", l)
	fi, err := os.Stat(filepath.Join(root, "bin/helper"))
	require.NoError(t, err)
	assert.NotZero(t, fi.Mode()&0o100)
}

func TestJobArgv(t *testing.T) {
	cfg := Config{HPCVMM: "/h", QEMU: "/q", Kernel: "/k", MemoryMiB: 512, LaunchPages: pages2M, JobQEMUInitrd: "/i"}
	h, err := jobArgv(cfg, vmmHPCVMM, "/root")
	require.NoError(t, err)
	j := strings.Join(h, " ")
	assert.Contains(t, j, "--rootfs /root -- true")
	assert.Contains(t, j, "--log-level debug", "the job's Started/Exited lines are debug")
	assert.Contains(t, j, "--kernel /k")
	q, err := jobArgv(cfg, vmmQEMUMicrovm, "/root")
	require.NoError(t, err)
	j = strings.Join(q, " ")
	assert.Contains(t, j, "-M microvm")
	assert.Contains(t, j, "-kernel /k -initrd /i -append "+jobCmdline)
	assert.Contains(t, j, "hugetlb=on", "the same RAM backing as hpcvmm's")
	cfg.PingPong = "/x/pingpong"
	p := strings.Join(pingArgv(cfg, "dedicated", "/pp"), " ")
	assert.Contains(t, p, "--cpus 2")
	assert.Contains(t, p, "--cpu-list 0-1 --cpu-mode dedicated -- /bin/pingpong")
}

func TestRenderJobs(t *testing.T) {
	var samples []Sample
	add := func(c, vmm, where string, rep int, m map[string]float64) {
		s := newSample(c, vmm, where, rep)
		for k, v := range m {
			s.Metrics[k] = v
		}
		samples = append(samples, s)
	}
	for rep := 1; rep <= 3; rep++ {
		add(caseJob, vmmHPCVMM, whereL1, rep, map[string]float64{mJobStarted: 900, mJobCommand: 5, mJobExitToExit: 100, mJobTotal: 1000})
		add(caseJob, vmmQEMUMicrovm, whereL1, rep, map[string]float64{mJobStarted: 3000, mJobExitToExit: 1000, mJobTotal: 4000})
		add(casePingPong, vmmDedicated, whereL1, rep, map[string]float64{mPingMedianUs: 50, mPingP10Us: 40, mPingP90Us: 60, mPingMeanUs: 52})
		add(casePingPong, vmmShared, whereL1, rep, map[string]float64{mPingMedianUs: 200, mPingP10Us: 150, mPingP90Us: 300, mPingMeanUs: 220})
		add(caseJobBuild, vmmHPCVMM, whereHost, rep, map[string]float64{mBuildMs: 2000, mFirstHitMs: 300, mHitMs: 20, mArchiveMiB: 520})
		add(caseJobBuild, vmmHPCVMMTar, whereHost, rep, map[string]float64{mBuildMs: 3000, mFirstHitMs: 300, mHitMs: 2, mArchiveMiB: 520})
		add(caseJobBuild, "cpio", whereHost, rep, map[string]float64{mBuildMs: 1000, mArchiveMiB: 515})
	}
	rep := &Report{Config: Config{Cases: []string{caseJob, casePingPong, caseJobBuild}, MemoryMiB: 512, LaunchPages: pages2M, Where: whereL1}, Samples: samples}
	md := renderMarkdown(rep)
	assert.Contains(t, md, "| **total: launch → VMM exited** | 1000 (1000–1000) | 4000 (4000–4000) | 0.25 |")
	assert.Contains(t, md, "| median | 50.0 (50.0–50.0) | 200.0 (200.0–200.0) | 0.25 |")
	assert.Contains(t, md, "| build (cold cache) | 2000 (2000–2000) | 3000 (3000–3000) | 1000 (1000–1000) | 2.00 | 3.00 |")
	assert.Contains(t, md, "| warm hit (a later launch) | 20.0 (20.0–20.0) | 2.0 (2.0–2.0) | – | 0.02 | 0.00 |")
	assert.NotContains(t, md, "Launch → guest /init marker", "a job-only run shows only its tables")
	assert.True(t, jobOnly([]string{caseJob}))
	assert.False(t, jobOnly([]string{caseJob, caseLaunch}))
	assert.False(t, jobOnly(nil))
}
