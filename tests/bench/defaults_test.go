package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDefaultsArgvHasNoTuningFlags(t *testing.T) {
	cfg := Config{HPCVMM: "/h", QEMU: "/q", Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0", MemoryMiB: 512, LaunchPages: pages2M}
	h, err := defaultsArgv(cfg, vmmHPCVMM, defaultsShape{4, 4})
	require.NoError(t, err)
	assert.Equal(t, "/h run --kernel /k --initrd /i --cmdline console=ttyS0 --cpus 4 --memory 4G", strings.Join(h, " "))
	q, err := defaultsArgv(cfg, vmmQEMUMicrovm, defaultsShape{1, 1})
	require.NoError(t, err)
	assert.Equal(t, "/q -M microvm -accel kvm -nographic -smp 1 -m 1G -kernel /k -initrd /i -append console=ttyS0", strings.Join(q, " "))
	for _, a := range append(h, q...) {
		assert.NotContains(t, []string{"--hugepages", "--console", "-object", "-cpu", "memory-backend", "-nodefaults"}, a, "a tuning flag in the defaults case")
	}
	_, err = defaultsArgv(cfg, vmmGoKVM, defaultsShape{1, 1})
	assert.Error(t, err)
}

func TestMemoryStepsAddOneDeviceEach(t *testing.T) {
	cfg := Config{HPCVMM: "/h", Kernel: "/k", Initrd: "/i", Cmdline: "c", MemoryMiB: 512, LaunchPages: pages2M,
		DMAMap: DMAMapConfig{Device: "0000:00:04.0"}}
	var prev string
	for i, m := range memorySteps {
		argv, err := memoryArgv(cfg, m)
		require.NoError(t, err, m.Name)
		j := strings.Join(argv, " ")
		assert.Contains(t, j, "--memory 512M", "the launch case's guest")
		assert.Contains(t, j, "--hugepages 2M", "the launch case's guest")
		switch m.Name {
		case "none":
			assert.Contains(t, j, "--console serial")
		case "console":
			assert.Contains(t, j, "--console virtio")
			assert.NotContains(t, j, "--net")
		case "net":
			assert.Contains(t, j, "--console virtio --net tap="+netTAP+",vhost=off")
			assert.NotContains(t, j, "--gpu")
		case "passthrough":
			assert.True(t, strings.HasSuffix(j, "--net tap="+netTAP+",vhost=off --gpu 0000:00:04.0"), j)
		}
		if i > 0 {
			assert.True(t, strings.HasPrefix(j, strings.Replace(prev, "--console serial", "--console virtio", 1)), "each step keeps the previous one's devices: %q after %q", j, prev)
		}
		prev = j
	}
	_, err := memoryArgv(Config{HPCVMM: "/h", MemoryMiB: 512, DMA: "no IOMMU here"}, memorySteps[3])
	assert.ErrorContains(t, err, "no IOMMU here")
}

func TestRenderDefaultsAndMemory(t *testing.T) {
	var samples []Sample
	for rep := 1; rep <= 3; rep++ {
		for _, d := range defaultsShapes {
			h := newSample(d.caseName(), vmmHPCVMM, whereL1, rep)
			h.Metrics[mLaunchToInit] = float64(1000 * d.CPUs)
			q := newSample(d.caseName(), vmmQEMUMicrovm, whereL1, rep)
			q.Metrics[mLaunchToInit] = float64(2000 * d.CPUs)
			samples = append(samples, h, q)
		}
		for i, m := range memorySteps {
			s := newSample(m.caseName(), vmmHPCVMM, whereL1, rep)
			s.Metrics[mRSSOverhead] = float64(6*1024 + i*512)
			s.Metrics[mRSSAnon] = 2048
			s.Metrics[mRSSFile] = 4096
			samples = append(samples, s)
		}
	}
	rep := &Report{Samples: samples, Config: Config{MemoryMiB: 512, LaunchPages: pages2M}}
	ix := indexStats(summarize(samples))
	d := renderDefaults(rep, ix, whereL1, "L1")
	assert.Contains(t, d, "| 1 vCPU, 1 GiB | 1000 (1000–1000) | 2000 (2000–2000) | 0.50 |")
	assert.Contains(t, d, "| 4 vCPU, 4 GiB | 4000 (4000–4000) | 8000 (8000–8000) | 0.50 |")
	m := renderMemory(rep, ix, whereL1, "L1")
	assert.Contains(t, m, "| no PCI device (`--console serial`) | 6.00 (6.00–6.00) |  | 2.00 | 4.00 | 3/3 |")
	assert.Contains(t, m, "| virtio console (`--console virtio`) | 6.50 (6.50–6.50) | +0.50 |")
	assert.Contains(t, m, "| one passthrough device (`--gpu` edu) | 7.50 (7.50–7.50) | +0.50 |")
	full := renderMarkdown(rep)
	assert.Contains(t, full, "**Defaults: launch → guest /init marker**")
	assert.Contains(t, full, "device by device")
	assert.Empty(t, renderDefaults(&Report{}, indexStats(nil), whereL1, "L1"), "no samples, no table")
	assert.Empty(t, renderMemory(&Report{}, indexStats(nil), whereL1, "L1"), "no samples, no table")
}

func TestParseFlagsNewCases(t *testing.T) {
	o, err := parseFlags([]string{"-cases", "launch,defaults,memory"})
	require.NoError(t, err)
	assert.Equal(t, []string{caseLaunch, caseDefaults, caseMemory}, o.cases)
}

func TestLastGCTrace(t *testing.T) {
	log := "time=... level=INFO msg=x\ngc 1 @0.010s 2%: 0.01+0.2+0.003 ms clock, 0.02+0.1/0.1/0+0.006 ms cpu, 3->3->1 MB, 4 MB goal, 0 MB stacks, 0 MB globals, 2 P\n" +
		"gc 2 @5.1s 0%: 0.02+0.3+0.004 ms clock, 0.04+0/0.2/0+0.008 ms cpu, 1->1->0 MB, 1 MB goal, 0 MB stacks, 0 MB globals, 2 P (forced)\nlevel=INFO msg=y\n"
	assert.True(t, strings.HasPrefix(lastGCTrace(log), "gc 2 @5.1s"), lastGCTrace(log))
	assert.Empty(t, lastGCTrace("no collections here\n"))
}
