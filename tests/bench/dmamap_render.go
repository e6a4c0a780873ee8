package main

// The DMA-map table.

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// The VFIO DMA-map case (issues 5 and 8): how long each VMM spends in
// VFIO_IOMMU_MAP_DMA to make its guest RAM reachable by a passed-through
// device, and in how many calls, for 1, 2 and 4 GiB of guest RAM on 1 GiB,
// 2 MiB and 4 KiB pages. hpcvmm runs `hpcvmm run --gpu BDF --memory X
// --hugepages P`; QEMU runs q35 with the same kind of memory backend
// (memfd, shared, hugetlb of the page size, preallocated) and
// `-device vfio-pci,host=BDF`. Both are stopped once their RAM is mapped:
// hpcvmm at its first KVM_RUN (it maps guest RAM while building the VM),
// QEMU when its monitor answers with the machine paused (-S), since
// vfio-pci maps every RAM section while the device is realized.
//
// The measurement is the kernel's, the same for both VMMs: a kprobe on
// vfio_iommu_type1_ioctl (filtered to VFIO_IOMMU_MAP_DMA, recording the
// struct vfio_iommu_type1_dma_map the caller passed: vaddr, iova, size,
// flags) and a kretprobe on the same function, timestamped by the trace
// clock "mono". strace was the first choice but Debian bookworm's strace
// 6.1 prints "VFIO_DEVICE_PCI_HOT_RESET or VFIO_IOMMU_MAP_DMA, 0x7ffd..."
// (the two ioctls share a number and it decodes neither struct), so it
// could not tell guest RAM from ROM or BAR mappings; it also stops the VMM
// at every traced syscall, which ftrace does not.
//
// A call maps guest RAM when [vaddr, vaddr+size) lies in a memfd mapping
// of the VMM (both back guest RAM with a memfd; nothing else they map for
// DMA is one): QEMU's ROMs (read-only) and hpcvmm's peer-to-peer BAR
// mappings are counted apart.

// renderDMAMap renders the DMA-map table ("" without samples). Long on
// purpose: the table's header, rows and notes in the order they print.
func renderDMAMap(rep *Report, ix statIndex, where, whereText string) string {
	type row struct {
		page string
		size int
	}
	seen := map[row]bool{}
	var rows []row
	for _, st := range ix {
		if st.Where != where || !strings.HasPrefix(st.Case, caseDMAMap+"/") {
			continue
		}
		parts := strings.Split(st.Case, "/")
		if len(parts) != 3 {
			continue
		}
		size, err := strconv.Atoi(parts[2])
		if err != nil {
			continue
		}
		r := row{parts[1], size}
		if !seen[r] {
			seen[r] = true
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return ""
	}
	order := map[string]int{"1G": 0, "2M": 1, "4K": 2}
	sort.Slice(rows, func(i, j int) bool {
		if rows[i].page != rows[j].page {
			return order[rows[i].page] < order[rows[j].page]
		}
		return rows[i].size < rows[j].size
	})
	var b strings.Builder
	runs := fmt.Sprintf("%d runs per cell", rep.Config.DMAMap.Reps)
	if r4 := rep.Config.DMAMap.Reps4K; r4 > 0 && r4 != rep.Config.DMAMap.Reps {
		runs += fmt.Sprintf(", %d with 4 KiB pages (their runs are long: each prefaults its RAM at 4 KiB under emulation)", r4)
	}
	fmt.Fprintf(&b, "\n**VFIO DMA map of guest RAM** (ms in VFIO_IOMMU_MAP_DMA, summed over the calls that map guest RAM, median (min–max); MAP_DMA calls; %s; %s; lower is better, ratio < 1: hpcvmm faster). "+
		"hpcvmm `run --gpu BDF --memory SIZE --hugepages P`, stopped at its first KVM_RUN; QEMU `-M q35,memory-backend=ram -object memory-backend-memfd,share=on,prealloc=on[,hugetlb=on,hugetlbsize=P] -device vfio-pci,host=BDF -S`, stopped when QMP answers. "+
		"Timed by kprobes on vfio_iommu_type1_ioctl (entry filtered to MAP_DMA, and return), the same for both; a call maps guest RAM when its vaddr range lies in the VMM's guest RAM memfd. Device: %s.\n\n",
		whereText, runs, orUnknown(rep.Config.DMAMap.Device))
	b.WriteString("| page | guest RAM | hpcvmm ms | QEMU ms | hpcvmm/QEMU | MAP_DMA calls hpcvmm | MAP_DMA calls QEMU | runs hpcvmm | runs QEMU |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		c := dmaMapCase(r.page, r.size)
		h, hok := ix.get(where, c, vmmHPCVMM, mDMAMapMs)
		q, qok := ix.get(where, c, vmmQEMU, mDMAMapMs)
		ratioCell := ""
		if hok && qok {
			ratioCell = fmtRatio(ratio(h.Median, q.Median))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.page, fmtMiB(r.size),
			rangeCell(ix, where, c, vmmHPCVMM, h, hok, 1), rangeCell(ix, where, c, vmmQEMU, q, qok, 1), ratioCell,
			callsCell(ix, where, c, vmmHPCVMM), callsCell(ix, where, c, vmmQEMU),
			runsCell(ix, where, c, vmmHPCVMM), runsCell(ix, where, c, vmmQEMU))
	}
	var other []string
	for _, v := range []string{vmmHPCVMM, vmmQEMU} {
		var calls, msv []float64
		for _, r := range rows {
			c := dmaMapCase(r.page, r.size)
			if st, ok := ix.get(where, c, v, mDMAOtherCalls); ok {
				calls = append(calls, st.Median)
			}
			if st, ok := ix.get(where, c, v, mDMAOtherMs); ok {
				msv = append(msv, st.Median)
			}
		}
		if len(calls) == 0 {
			continue
		}
		cm, clo, chi := medianMinMax(calls)
		mm, _, _ := medianMinMax(msv)
		what := "ROMs, read-only"
		if v == vmmHPCVMM {
			what = "the device's BAR, for peer-to-peer (`--p2p`)"
		}
		other = append(other, fmt.Sprintf("%s %s calls (%s; %.1f ms median)", v, rangeText(cm, clo, chi), what, mm))
	}
	if len(other) > 0 {
		fmt.Fprintf(&b, "\nMAP_DMA calls not for guest RAM, left out above (median per run over the cells): %s.\n", strings.Join(other, "; "))
	}
	var again []string
	for _, v := range []string{vmmHPCVMM, vmmQEMU} {
		var f []float64
		for _, r := range rows {
			c := dmaMapCase(r.page, r.size)
			tot, ok1 := ix.get(where, c, v, mDMAMapTotalMiB)
			cov, ok2 := ix.get(where, c, v, mDMAMapMiB)
			if ok1 && ok2 && cov.Median > 0 {
				f = append(f, tot.Median/cov.Median)
			}
		}
		if len(f) > 0 {
			md, lo, hi := medianMinMax(f)
			again = append(again, fmt.Sprintf("%s %.2f (%.2f–%.2f)", v, md, lo, hi))
		}
	}
	if len(again) > 0 {
		fmt.Fprintf(&b, "Bytes passed to guest-RAM MAP_DMA calls per byte of guest RAM mapped (above 1: ranges mapped again; their calls and time are counted above): %s.\n", strings.Join(again, "; "))
	}
	return b.String()
}

// callsCell is the median MAP_DMA count, with the range if runs differed.
func callsCell(ix statIndex, where, c, vmm string) string {
	st, ok := ix.get(where, c, vmm, mDMAMapCalls)
	if !ok {
		return "–"
	}
	return rangeText(st.Median, st.Min, st.Max)
}

func rangeText(md, lo, hi float64) string {
	if lo == hi {
		return fmt.Sprintf("%.0f", md)
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", md, lo, hi)
}

// runsCell is "ok/attempted".
func runsCell(ix statIndex, where, c, vmm string) string {
	failed, ok := ix.failures(where, c, vmm)
	return fmt.Sprintf("%d/%d", ok, ok+failed)
}

// fmtMiB writes whole GiB as "4 GiB".
func fmtMiB(mib int) string {
	if mib%1024 == 0 {
		return fmt.Sprintf("%d GiB", mib/1024)
	}
	return fmt.Sprintf("%d MiB", mib)
}
