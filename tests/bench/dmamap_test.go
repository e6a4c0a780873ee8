package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// mapTraceSample is tracefs "trace" output with the suite's two kprobes as
// Linux 6.1 prints it: QEMU's RAM and ROM mappings, hpcvmm's thread
// mapping guest RAM while another thread's UNMAP_DMA return (no open
// entry) interleaves.
const mapTraceSample = `# tracer: nop
#
# entries-in-buffer/entries-written: 8/8   #P:2
#
#                                _-----=> irqs-off/BH-disabled
#                               / _----=> need-resched
#                              | / _---=> hardirq/softirq
#                              || / _--=> preempt-depth
#                              ||| / _-=> migrate-disable
#                              |||| /     delay
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
 qemu-system-x86-812     [001] .....   101.250000: map_dma: (vfio_iommu_type1_ioctl+0x0/0x1010 [vfio_iommu_type1]) cmd=0x3b71 flags=0x3 vaddr=0x7f4000000000 iova=0x0 size=0xa0000
 qemu-system-x86-812     [001] .....   101.251500: map_dma_ret: (vfio_fops_unl_ioctl+0x3e/0x60 [vfio] <- vfio_iommu_type1_ioctl) ret=0
 qemu-system-x86-812     [000] .....   101.260000: map_dma: (vfio_iommu_type1_ioctl+0x0/0x1010 [vfio_iommu_type1]) cmd=0x3b71 flags=0x1 vaddr=0x7f3ff0000000 iova=0xfffc0000 size=0x40000
 qemu-system-x86-812     [000] .....   101.261000: map_dma_ret: (vfio_fops_unl_ioctl+0x3e/0x60 [vfio] <- vfio_iommu_type1_ioctl) ret=0
          hpcvmm-901     [000] .....   102.000000: map_dma: (vfio_iommu_type1_ioctl+0x0/0x1010 [vfio_iommu_type1]) cmd=0x3b71 flags=0x3 vaddr=0x7f0000000000 iova=0x0 size=0x40000000
          hpcvmm-905     [001] .....   102.100000: map_dma_ret: (vfio_fops_unl_ioctl+0x3e/0x60 [vfio] <- vfio_iommu_type1_ioctl) ret=0
          hpcvmm-901     [001] .....   102.750000: map_dma_ret: (vfio_fops_unl_ioctl+0x3e/0x60 [vfio] <- vfio_iommu_type1_ioctl) ret=0
          hpcvmm-901     [001] .....   102.800000: map_dma: (vfio_iommu_type1_ioctl+0x0/0x1010 [vfio_iommu_type1]) cmd=0x3b71 flags=0x3 vaddr=0x7f5000000000 iova=0xfe000000 size=0x100000
          hpcvmm-901     [001] .....   102.800500: map_dma_ret: (vfio_fops_unl_ioctl+0x3e/0x60 [vfio] <- vfio_iommu_type1_ioctl) ret=-22
`

func TestParseMapTracePairsEntriesWithReturns(t *testing.T) {
	calls, err := parseMapTrace(strings.NewReader(mapTraceSample))
	require.NoError(t, err)
	require.Len(t, calls, 4)
	assert.Equal(t, dmaCall{TID: 812, Start: 101.25, End: 101.2515, Vaddr: 0x7f4000000000, IOVA: 0, Size: 0xa0000, Flags: 3}, calls[0])
	assert.InDelta(t, 1.5, calls[0].ms(), 1e-6)
	assert.Equal(t, uint64(1), calls[1].Flags, "QEMU's ROM mapping is read-only")
	assert.Equal(t, 901, calls[2].TID)
	assert.InDelta(t, 750, calls[2].ms(), 1e-6, "thread 905's return is another ioctl's and must not end 901's call")
	assert.Equal(t, int64(-22), calls[3].Ret)
}

func TestParseMapTraceReportsMissingReturn(t *testing.T) {
	lines := strings.Split(mapTraceSample, "\n")
	// Drop hpcvmm-901's first return: its call never ends, and its next
	// entry must say so.
	var kept []string
	for _, l := range lines {
		if !strings.Contains(l, "102.750000") {
			kept = append(kept, l)
		}
	}
	calls, err := parseMapTrace(strings.NewReader(strings.Join(kept, "\n")))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "thread 901 entered MAP_DMA at 102.800000 without returning")
	assert.Len(t, calls, 3, "the overwritten entry is dropped, the rest are kept")

	var entry string
	for _, l := range lines {
		if strings.Contains(l, "102.000000: map_dma:") {
			entry = l
		}
	}
	_, err = parseMapTrace(strings.NewReader(entry + "\n"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "has no return in the trace")
}

func TestParseMapTraceRejectsUnreadableArguments(t *testing.T) {
	line := ` hpcvmm-1 [000] ..... 1.000000: map_dma: (vfio_iommu_type1_ioctl+0x0/0x10) cmd=0x3b71 flags=0x3 vaddr=(fault) iova=0x0 size=0x1000` + "\n"
	calls, err := parseMapTrace(strings.NewReader(line))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unreadable vaddr")
	assert.Empty(t, calls)
}

const mapsSample = `55d0c0a00000-55d0c0a21000 r--p 00000000 00:15 12    /usr/bin/qemu-system-x86_64
7f3ff0000000-7f3ff0040000 rw-p 00000000 00:00 0
7f4000000000-7f4040000000 rw-s 00000000 00:01 33    /memfd:memory-backend-memfd (deleted)
7f5000000000-7f5000100000 rw-s 00000000 00:0e 99    anon_inode:[vfio-device]
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0     [stack]
`

func TestMemfdRangesAndClassify(t *testing.T) {
	r, err := memfdRanges(strings.NewReader(mapsSample))
	require.NoError(t, err)
	require.Equal(t, []addrRange{{0x7f4000000000, 0x7f4040000000}}, r)

	calls := []dmaCall{
		{Vaddr: 0x7f4000000000, IOVA: 0, Size: 0xa0000, Start: 1, End: 1.002},             // RAM below 640 KiB
		{Vaddr: 0x7f4000100000, IOVA: 0x100000, Size: 0x3ff00000, Start: 1.01, End: 1.51}, // the rest of the GiB
		{Vaddr: 0x7f3ff0000000, Size: 0x40000, Flags: 1, Start: 1.6, End: 1.601},          // a ROM
		{Vaddr: 0x7f5000000000, Size: 0x100000, Start: 1.7, End: 1.7005},                  // a BAR
		{Vaddr: 0x7f4000000000 + 0x3ff00000, Size: 0x200000, Start: 1.8, End: 1.9},        // runs past the memfd
		{Vaddr: 0x7f3fffffffff, Size: 0x2, Start: 2, End: 2.001},                          // starts before it
	}
	res := classifyCalls(calls, r)
	assert.Len(t, res.RAM, 2)
	assert.Len(t, res.Other, 4)

	s := newSample(dmaMapCase("1G", 1024), vmmQEMU, whereL1, 1)
	dmaResult{RAM: res.RAM, Other: res.Other[:2]}.metrics(&s, 1<<30, 1<<20)
	require.Empty(t, s.Err)
	assert.Equal(t, 2.0, s.Metrics[mDMAMapCalls])
	assert.InDelta(t, 502, s.Metrics[mDMAMapMs], 1e-6)
	assert.InDelta(t, 510, s.Metrics[mDMASpanMs], 1e-6)
	assert.InDelta(t, 1023.625, s.Metrics[mDMAMapMiB], 1e-9)
	assert.InDelta(t, 1023.625, s.Metrics[mDMAMapTotalMiB], 1e-9)
	assert.Contains(t, s.Info["ram_calls"], "iova=0x100000 size=0x3ff00000 ret=0 500.000ms")
	assert.Equal(t, 2.0, s.Metrics[mDMAOtherCalls])
	assert.InDelta(t, 1.5, s.Metrics[mDMAOtherMs], 1e-6)

	// Without QEMU's allowance for the legacy hole the same calls are an
	// incomplete mapping.
	s = newSample(dmaMapCase("1G", 1024), vmmHPCVMM, whereL1, 1)
	dmaResult{RAM: res.RAM}.metrics(&s, 1<<30, 0)
	assert.Contains(t, s.Err, "not complete")

	// A section mapped again (QEMU remaps when the chipset's memory map
	// changes) counts in calls, time and total, not in the coverage.
	remap := append(append([]dmaCall(nil), res.RAM...), dmaCall{Vaddr: 0x7f4000100000, IOVA: 0x100000, Size: 0x3ff00000, Start: 2, End: 2.25})
	s = newSample(dmaMapCase("1G", 1024), vmmQEMU, whereL1, 1)
	dmaResult{RAM: remap}.metrics(&s, 1<<30, 1<<20)
	require.Empty(t, s.Err)
	assert.Equal(t, 3.0, s.Metrics[mDMAMapCalls])
	assert.InDelta(t, 752, s.Metrics[mDMAMapMs], 1e-6)
	assert.InDelta(t, 1023.625, s.Metrics[mDMAMapMiB], 1e-9)
	assert.InDelta(t, 2046.625, s.Metrics[mDMAMapTotalMiB], 1e-9)

	s = newSample(dmaMapCase("1G", 1024), vmmHPCVMM, whereL1, 1)
	dmaResult{RAM: []dmaCall{{Vaddr: 1, Size: 1 << 30, Ret: -12}}}.metrics(&s, 1<<30, 0)
	assert.Contains(t, s.Err, "returned -12")
}

func TestDMAMapArgv(t *testing.T) {
	cfg := Config{HPCVMM: "/h", QEMU: "/q", Kernel: "/k", Initrd: "/i", Cmdline: "console=ttyS0", DMAMap: DMAMapConfig{Device: "0000:00:04.0"}}
	h := strings.Join(dmaMapArgv(cfg, vmmHPCVMM, "4K", 4096), " ")
	assert.Contains(t, h, "--memory 4096M --hugepages none")
	assert.Contains(t, h, "--gpu 0000:00:04.0")
	q := strings.Join(dmaMapArgv(cfg, vmmQEMU, "2M", 2048), " ")
	assert.Contains(t, q, "-m 2048M")
	assert.Contains(t, q, "memory-backend-memfd,id=ram,size=2048M,share=on,prealloc=on,prealloc-threads=")
	assert.Contains(t, q, ",hugetlb=on,hugetlbsize=2M")
	assert.Contains(t, q, "-M q35,memory-backend=ram")
	assert.Contains(t, q, "-S -qmp stdio")
	assert.Contains(t, q, "-device vfio-pci,host=0000:00:04.0")
	assert.NotContains(t, strings.Join(dmaMapArgv(cfg, vmmQEMU, "4K", 1024), " "), "hugetlb")
}

func TestRenderDMAMap(t *testing.T) {
	mk := func(vmm, page string, size, rep int, ms, calls float64) Sample {
		s := newSample(dmaMapCase(page, size), vmm, whereL1, rep)
		s.Metrics[mDMAMapMs] = ms
		s.Metrics[mDMAMapCalls] = calls
		s.Metrics[mDMAOtherCalls] = map[string]float64{vmmHPCVMM: 1, vmmQEMU: 3}[vmm]
		s.Metrics[mDMAOtherMs] = 0.5
		s.Metrics[mDMAMapMiB] = float64(size)
		s.Metrics[mDMAMapTotalMiB] = float64(size) * map[string]float64{vmmHPCVMM: 1, vmmQEMU: 1.5}[vmm]
		return s
	}
	var samples []Sample
	for rep := 1; rep <= 3; rep++ {
		samples = append(samples,
			mk(vmmHPCVMM, "2M", 1024, rep, float64(100+rep), 1), mk(vmmQEMU, "2M", 1024, rep, float64(200+rep), 2),
			mk(vmmHPCVMM, "1G", 4096, rep, 50, 2), mk(vmmQEMU, "1G", 4096, rep, 100, float64(2+rep%2)))
	}
	bad := newSample(dmaMapCase("4K", 4096), vmmQEMU, whereL1, 1)
	bad.Err = "not ready within 2m30s"
	samples = append(samples, mk(vmmHPCVMM, "4K", 4096, 1, 9000, 2), bad)
	rep := &Report{Samples: samples, Config: Config{DMAMap: DMAMapConfig{Reps: 3, Reps4K: 1, Device: "0000:00:04.0"}}}
	md := renderDMAMap(rep, indexStats(summarize(samples)), whereL1, "L1")
	lines := strings.Split(md, "\n")
	var rows []string
	for _, l := range lines {
		if strings.HasPrefix(l, "| 1G") || strings.HasPrefix(l, "| 2M") || strings.HasPrefix(l, "| 4K") {
			rows = append(rows, l)
		}
	}
	require.Len(t, rows, 3, md)
	assert.Equal(t, "| 1G | 4 GiB | 50.0 (50.0–50.0) | 100.0 (100.0–100.0) | 0.50 | 2 | 3 (2–3) | 3/3 | 3/3 |", rows[0], "1G before 2M before 4K")
	assert.Equal(t, "| 2M | 1 GiB | 102.0 (101.0–103.0) | 202.0 (201.0–203.0) | 0.50 | 1 | 2 | 3/3 | 3/3 |", rows[1])
	assert.Equal(t, "| 4K | 4 GiB | 9000.0 (9000.0–9000.0) | failed ×1 |  | 2 | – | 1/1 | 0/1 |", rows[2])
	assert.Contains(t, md, "3 runs per cell, 1 with 4 KiB pages")
	assert.Contains(t, md, "Device: 0000:00:04.0")
	assert.Contains(t, md, "hpcvmm 1 calls")
	assert.Contains(t, md, "qemu 3 calls")
	assert.Contains(t, md, "hpcvmm 1.00 (1.00–1.00); qemu 1.50 (1.50–1.50)")

	assert.Empty(t, renderDMAMap(&Report{}, indexStats(nil), whereL1, "L1"), "no samples, no table")
	full := renderMarkdown(rep)
	assert.Contains(t, full, "**VFIO DMA map of guest RAM**", "renderMarkdown includes the table")
}

func TestDMAMapCaseName(t *testing.T) {
	assert.Equal(t, "dma-map/2M/4096", dmaMapCase("2M", 4096))
	assert.Equal(t, "4 GiB", fmtMiB(4096))
	assert.Equal(t, "512 MiB", fmtMiB(512))
	assert.Equal(t, fmt.Sprint(0x3b71), fmt.Sprint(vfioIOMMUMapDMA))
}

func TestDMAMapRepsFor(t *testing.T) {
	dc := DMAMapConfig{Reps: 3, Reps4K: 1}
	assert.Equal(t, 3, dc.repsFor("1G"))
	assert.Equal(t, 1, dc.repsFor("4K"))
	dc.Reps4K = 0
	assert.Equal(t, 3, dc.repsFor("4K"), "no 4K override: the common count")
	assert.Equal(t, []string{"1G", "2M", "4K"}, l1DMAMap(5).Pages)
	assert.Equal(t, 2, l1DMAMap(5).Reps, "two runs per cell keep the case within its share of 15 minutes")
	assert.Equal(t, 1, l1DMAMap(1).Reps)
}

func TestUnionBytes(t *testing.T) {
	assert.Equal(t, uint64(0), unionBytes(nil))
	assert.Equal(t, uint64(30), unionBytes([]addrRange{{20, 40}, {0, 10}, {25, 30}}))
	assert.Equal(t, uint64(40), unionBytes([]addrRange{{0, 30}, {10, 40}}))
}

func TestParseFlagsAcceptsDMAMap(t *testing.T) {
	o, err := parseFlags([]string{"-cases", "dma-map", "-reps", "3"})
	require.NoError(t, err)
	assert.Equal(t, []string{caseDMAMap}, o.cases)
}
