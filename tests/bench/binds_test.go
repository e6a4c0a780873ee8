package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

const fsbenchOut = "[    1.2] 9p: something the kernel said\r\n" +
	"fsbench mount fstype=9p source=data options=rw,nosuid,nodev,relatime,rw,access=client,msize=512000,trans=virtio,cache=mmap\r\n" +
	"fsbench read bytes=268435456 ns=4000000000 mib_s=64.00\r\n" +
	"fsbench write bytes=67108864 ns=2000000000 mib_s=32.00\r\n" +
	"fsbench create files=1000 bytes=4096 ns=3000000000\r\n" +
	"fsbench stat files=1000 ns=500000000\r\n" +
	"fsbench meta files=1000 ns=3500000000\r\n" +
	"fsbench done\r\n" +
	"reboot: Power down\r\n"

func TestParseFSBench(t *testing.T) {
	r, err := parseFSBench(fsbenchOut)
	require.NoError(t, err)
	assert.InDelta(t, 64.0, r.metrics[mFSReadMiBs], 1e-9)
	assert.InDelta(t, 32.0, r.metrics[mFSWriteMiBs], 1e-9)
	assert.InDelta(t, 3000.0, r.metrics[mFSCreateMs], 1e-9)
	assert.InDelta(t, 500.0, r.metrics[mFSStatMs], 1e-9)
	assert.InDelta(t, 3500.0, r.metrics[mFSMetaMs], 1e-9)
	assert.InDelta(t, 512000.0, r.metrics[mFSMSize], 1e-9, "the msize the guest kernel took")
	assert.Contains(t, r.mount, "9p rw,")

	// A native run: no msize.
	r, err = parseFSBench(strings.Replace(fsbenchOut, "msize=512000,", "", 1))
	require.NoError(t, err)
	_, has := r.metrics[mFSMSize]
	assert.False(t, has)

	for name, bad := range map[string]string{
		"no done line":      strings.Replace(fsbenchOut, "fsbench done", "", 1),
		"an error line":     "fsbench mount fstype=9p\nfsbench error=\"read: short\"\nfsbench done\n",
		"a missing measure": strings.Replace(fsbenchOut, "fsbench stat files=1000 ns=500000000\r\n", "", 1),
		"a zero time":       strings.Replace(fsbenchOut, "ns=4000000000", "ns=0", 1),
		"a bad field":       strings.Replace(fsbenchOut, "bytes=67108864", "bytes67108864", 1),
		"nothing":           "",
	} {
		_, err := parseFSBench(bad)
		assert.Error(t, err, name)
	}
	_, err = parseFSBench("fsbench error=\"mount -t 9p data /data failed\"\n")
	assert.ErrorContains(t, err, "mount -t 9p data /data failed")
}

// TestBindsMatrix: the matrix around the default: 128K, 512K and
// 1M with the default cache mode, none, mmap and loose at the default
// message size, each once; native first, QEMU last.
func TestBindsMatrix(t *testing.T) {
	vmms := bindsVMMs()
	assert.Equal(t, vmmBindsNative, vmms[0])
	assert.Equal(t, vmmBindsQEMU, vmms[len(vmms)-1])
	for _, want := range []string{"hpcvmm-128K-mmap", "hpcvmm-512K-mmap", "hpcvmm-1M-mmap", "hpcvmm-512K-none", "hpcvmm-512K-loose"} {
		assert.Contains(t, vmms, want)
	}
	sorted := slices.Clone(vmms)
	slices.Sort(sorted)
	assert.Len(t, slices.Compact(sorted), len(vmms), "no configuration twice")
	assert.Equal(t, "hpcvmm-"+sizeName(bindsDefaultMSize)+"-"+bindsDefaultCache, vmms[1], "the default runs first of hpcvmm's")
}

func TestBindsArgv(t *testing.T) {
	cfg := Config{HPCVMM: "/h", QEMU: "/q", Kernel: "/k", MemoryMiB: 512, LaunchPages: pages2M, FSBench: "/f", BindsQEMUInitrd: "/i"}
	a, err := bindsArgv(cfg, "hpcvmm-128K-mmap", "/root", "/d")
	require.NoError(t, err)
	j := strings.Join(a, " ")
	assert.Contains(t, j, "--rootfs /root --cpu-mode shared --contain -B /d:/data --bind-msize 128K --bind-cache mmap -- /bin/fsbench /data")
	assert.Contains(t, j, "--hugepages 2M")
	a, err = bindsArgv(cfg, vmmBindsQEMU, "/root", "/d")
	require.NoError(t, err)
	j = strings.Join(a, " ")
	assert.Contains(t, j, "-M q35")
	assert.Contains(t, j, "-virtfs local,path=/d,mount_tag=data,security_model=none")
	assert.Contains(t, j, "-initrd /i -append "+jobCmdline+" fsbench.msize=524288 fsbench.cache=mmap")
	assert.Contains(t, j, "hugetlb=on", "the same RAM backing as hpcvmm's")
	a, err = bindsArgv(cfg, vmmBindsNative, "/root", "/d")
	require.NoError(t, err)
	assert.Equal(t, []string{"/f", "/d"}, a)
	_, err = bindsArgv(cfg, "hpcvmm-2M-mmap", "/root", "/d")
	assert.Error(t, err)
	cfg.BindsQEMUInitrd = ""
	_, err = bindsArgv(cfg, vmmBindsQEMU, "/root", "/d")
	assert.Error(t, err)
}

func TestRenderBinds(t *testing.T) {
	var samples []Sample
	add := func(vmm string, rep int, m map[string]float64) {
		s := newSample(caseBinds, vmm, whereL1, rep)
		for k, v := range m {
			s.Metrics[k] = v
		}
		samples = append(samples, s)
	}
	for rep := 1; rep <= 2; rep++ {
		add(vmmBindsNative, rep, map[string]float64{mFSReadMiBs: 1000, mFSWriteMiBs: 500, mFSCreateMs: 50, mFSStatMs: 5, mFSMetaMs: 55})
		add("hpcvmm-512K-mmap", rep, map[string]float64{mFSReadMiBs: 60, mFSWriteMiBs: 40, mFSCreateMs: 3000, mFSStatMs: 1000, mFSMetaMs: 4000, mFSMSize: 524288})
		add(vmmBindsQEMU, rep, map[string]float64{mFSReadMiBs: 30, mFSWriteMiBs: 20, mFSCreateMs: 1500, mFSStatMs: 500, mFSMetaMs: 2000, mFSMSize: 512000})
	}
	f := newSample(caseBinds, "hpcvmm-1M-mmap", whereL1, 1)
	f.Err = "boom"
	samples = append(samples, f)
	rep := &Report{Config: Config{Cases: []string{caseBinds}, MemoryMiB: 512, Where: whereL1}, Samples: samples}
	md := renderMarkdown(rep)
	assert.Contains(t, md, "| hpcvmm-512K-mmap | 512K | 60.0 (60.0–60.0) | 2.00 | 40.0 (40.0–40.0) | 2.00 | 3000 (3000–3000) | 1000 (1000–1000) | 4000 (4000–4000) | 2.00 |")
	assert.Contains(t, md, "| qemu-q35-virtio-9p | 500K | 30.0 (30.0–30.0) |  | 20.0 (20.0–20.0) |  |")
	assert.Contains(t, md, "| l1-native | – | 1000.0 (1000.0–1000.0) | 33.33 |")
	assert.Contains(t, md, "| hpcvmm-1M-mmap | – | failed ×1 |")
	assert.NotContains(t, md, "hpcvmm-128K-mmap", "a configuration that never ran has no row")
	assert.NotContains(t, md, "Launch → guest /init marker", "a binds-only run shows only its table")
}

func TestParseFlagsBinds(t *testing.T) {
	o, err := parseFlags([]string{"-cases", "binds"})
	require.NoError(t, err)
	assert.True(t, wantsBinds(o.cases))
	o, err = parseFlags(nil)
	require.NoError(t, err)
	assert.False(t, wantsBinds(o.cases), "not part of all cases")
}

// TestBindsArtifacts builds fsbench and the QEMU guest's initramfs as the
// suite does, runs the built fsbench here on a small directory and parses
// its output with the suite's parser: the program and the parser agree.
func TestBindsArtifacts(t *testing.T) {
	if _, err := harness.FindKernel(); err != nil {
		t.Skip("no guest kernel and modules here:", err)
	}
	dir := t.TempDir()
	cfg := Config{Busybox: "/bin/busybox"}
	if !fileExists(cfg.Busybox) {
		t.Skip("no /bin/busybox")
	}
	buildBindsArtifacts(dir, &cfg)
	require.Empty(t, cfg.FSBenchError)

	data := t.TempDir()
	out, err := exec.Command(cfg.FSBench, "-prepare", "-read-mib", "2", data).CombinedOutput()
	require.NoError(t, err, "%s", out)
	out, err = exec.Command(cfg.FSBench, "-read-mib", "2", "-write-mib", "1", "-files", "3", data).CombinedOutput()
	require.NoError(t, err, "%s", out)
	r, err := parseFSBench(string(out))
	require.NoError(t, err)
	assert.Greater(t, r.metrics[mFSReadMiBs], 0.0)
	assert.Greater(t, r.metrics[mFSMetaMs], 0.0)

	f, err := os.Open(cfg.BindsQEMUInitrd)
	require.NoError(t, err)
	defer f.Close()
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	require.NoError(t, err)
	files := map[string]string{}
	for _, rec := range recs {
		b := make([]byte, rec.FileSize)
		if rec.FileSize > 0 {
			_, err := rec.ReadAt(b, 0)
			require.NoError(t, err)
		}
		files[rec.Name] = string(b)
	}
	assert.Equal(t, bindsQEMUInit, files["init"])
	assert.Contains(t, files, "bin/fsbench")
	mods := strings.Fields(files["etc/fsbench-modules"])
	base := func(p string) string { return strings.TrimSuffix(filepath.Base(p), ".ko") }
	var names []string
	for _, m := range mods {
		assert.Contains(t, files, strings.TrimPrefix(m, "/"), "each listed module is in the image")
		names = append(names, base(m))
	}
	i9pnet, iVirtio, i9p := slices.Index(names, "9pnet"), slices.Index(names, "9pnet_virtio"), slices.Index(names, "9p")
	require.True(t, i9pnet >= 0 && iVirtio >= 0 && i9p >= 0, "%v", names)
	assert.Less(t, i9pnet, iVirtio, "dependencies load first")
	assert.Less(t, i9pnet, i9p)
}
