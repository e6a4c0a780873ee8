package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Guest RAM backings of the booting cases (-launch-pages).
const (
	// pages2M puts hpcvmm and both QEMU machines on the same backing:
	// a shared hugetlb memfd of 2 MiB pages, prefaulted before the guest
	// runs. It is hpcvmm's real configuration (it refuses 4 KiB pages
	// outside development), so this is the comparison that matters.
	pages2M = "2M"
	// pages4K gives each VMM 4 KiB pages: hpcvmm a prefaulted shared
	// memfd (--hugepages none), QEMU its default anonymous RAM, which
	// the kernel may back with transparent 2 MiB pages as the guest
	// touches it.
	pages4K = "4K"
)

// launchPages is the guest RAM page size of the booting cases. Reports
// written before the choice existed ran on 4 KiB pages.
func (cfg Config) launchPages() string {
	if cfg.LaunchPages == "" {
		return pages4K
	}
	return cfg.LaunchPages
}

// hpcvmmRAMArgs is hpcvmm's guest RAM flag for cfg's page size.
func hpcvmmRAMArgs(cfg Config) []string {
	if cfg.launchPages() == pages2M {
		return []string{"--hugepages", "2M"}
	}
	return []string{"--hugepages", "none"}
}

// qemuRAMArgs is the memory backend that makes QEMU's guest RAM what
// hpcvmm's is with 2 MiB pages: a memfd (share=on, as hpcvmm's memfd is
// MAP_SHARED) of 2 MiB hugetlb pages, preallocated before the guest starts
// as hpcvmm prefaults. With 4 KiB pages QEMU keeps its default RAM.
func qemuRAMArgs(cfg Config) []string {
	if cfg.launchPages() != pages2M {
		return nil
	}
	return []string{
		"-object", fmt.Sprintf("memory-backend-memfd,id=ram,size=%dM,hugetlb=on,hugetlbsize=2M,share=on,prealloc=on", cfg.MemoryMiB),
		"-machine", "memory-backend=ram",
	}
}

// ramBacking describes, for the report, the guest RAM each VMM had.
func ramBacking(cfg Config, vmm string) string {
	twoM := cfg.launchPages() == pages2M
	switch vmm {
	case vmmHPCVMM:
		if twoM {
			return "`--hugepages 2M` (hugetlb memfd, shared, prefaulted)"
		}
		return "`--hugepages none` (4 KiB memfd, shared, prefaulted)"
	case vmmQEMUMicrovm, vmmQEMUQ35:
		if twoM {
			return fmt.Sprintf("`-object memory-backend-memfd,id=ram,size=%dM,hugetlb=on,hugetlbsize=2M,share=on,prealloc=on -machine memory-backend=ram`", cfg.MemoryMiB)
		}
		return "its default anonymous RAM (`-m`; 4 KiB pages, transparent 2 MiB pages where the kernel gives them, faulted in by the guest)"
	case vmmGoKVM:
		return "its own anonymous RAM (it has no option to choose a backing; 4 KiB pages, transparent hugepages where the kernel gives them)"
	}
	return "?"
}

// ramBackingLine is one sentence naming every VMM's guest RAM backing.
func ramBackingLine(cfg Config) string {
	var parts []string
	for _, v := range launchVMMs {
		name := v
		if v == vmmQEMUMicrovm {
			name = "QEMU (microvm and q35)"
		} else if v == vmmQEMUQ35 {
			continue
		}
		parts = append(parts, name+": "+ramBacking(cfg, v))
	}
	return fmt.Sprintf("Guest RAM (%s pages): %s.", cfg.launchPages(), strings.Join(parts, "; "))
}

// warmUpHugepages prefaults every free 2 MiB hugepage once, unmeasured,
// before the boots that use them: inside L1 the host backs a hugepage's
// memory only when L1 first touches it, which would bill the first VMM to
// get that page for everyone's.
func warmUpHugepages(cfg Config, out sink) {
	b, err := os.ReadFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	if err != nil {
		out.note("warm-up of the 2 MiB hugepages: " + err.Error())
		return
	}
	free, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || free*2 < cfg.MemoryMiB {
		out.note(fmt.Sprintf("launch pages 2M: only %q free 2 MiB hugepages for %d MiB of guest RAM: the boots will fail", strings.TrimSpace(string(b)), cfg.MemoryMiB))
		return
	}
	if s := runHPCVMMPrefault(cfg.Where, PrefaultSpec{Page: pages2M, SizeMiB: free * 2}, 0, 0); s.Err != "" {
		out.note(fmt.Sprintf("warm-up of %d free 2 MiB hugepages (%s): %s", free, cfg.Where, s.Err))
		return
	}
	out.env(Env{"warm_up_2m": fmt.Sprintf("%d free 2 MiB hugepages touched once before the boots", free)})
}
