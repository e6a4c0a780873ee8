// Package cputopo decides the guest's CPU topology: which vCPUs are threads
// of one core, which cores share a last-level cache, which share a package,
// and so each vCPU's APIC ID. The guest learns all of it from its APIC IDs
// and CPUID (leaves 0x1, 0x4, 0xB/0x1F, AMD 0x80000008/0x8000001D/
// 0x8000001E), which all describe one layout of APIC ID bits:
//
//	APIC ID = package << PackageShift | llc << LLCShift | core << ThreadBits | thread
//
// Mirror makes that layout follow the host CPUs the vCPUs are pinned to:
// vCPUs on SMT siblings become sibling threads of one guest core, vCPUs on
// cores that share an L3 share one in the guest, and vCPUs on different
// host packages sit in different guest packages. An HPC code (or its MPI
// and OpenMP runtime) that places threads by cache and core then makes the
// same choices inside the guest as on the host. Flat is the topology of
// older hpcvmm and of guests without ACPI: n cores of one thread in one
// package, APIC ID = vCPU index.
//
// The package is pure computation; host.CPUTopology reads the host side.
package cputopo

import (
	"errors"
	"fmt"
	"math/bits"
)

// HostCPU is where one vCPU runs on the host.
type HostCPU struct {
	CPU     int // host CPU number
	Package int // physical_package_id
	Core    int // core_id: unique within the package
	// LLC names the host's last-level cache domain the CPU belongs to (any
	// value shared by exactly the CPUs that share the cache, e.g. its
	// first CPU); -1 when unknown, which puts the CPU in its package's
	// single domain.
	LLC int
}

// VCPU is one guest CPU's place in the topology.
type VCPU struct {
	APICID  uint32
	Package int // guest package index
	LLC     int // LLC domain index within the package
	Core    int // core index within the LLC domain
	Thread  int // thread index within the core
}

// Topology is the guest's CPU topology: one VCPU per vCPU index and the
// APIC ID bit layout they share.
type Topology struct {
	VCPUs []VCPU
	// ThreadBits, CoreBits and LLCBits are the widths of the thread, core
	// (within an LLC domain) and LLC-domain (within a package) fields of
	// the APIC ID.
	ThreadBits, CoreBits, LLCBits uint
	// ThreadsPerCore is the most vCPUs of any one core.
	ThreadsPerCore int
}

// LLCShift is the APIC ID shift above which all CPUs sharing a last-level
// cache agree (CPUID leaf 4's "sharing" count is 1<<LLCShift).
func (t Topology) LLCShift() uint { return t.ThreadBits + t.CoreBits }

// PackageShift is the APIC ID shift of the package field (leaf 0xB's core
// level shift; AMD's ApicIdCoreIdSize).
func (t Topology) PackageShift() uint { return t.ThreadBits + t.CoreBits + t.LLCBits }

// LogicalPerPackage is how many vCPUs share vCPU 0's package.
func (t Topology) LogicalPerPackage() int {
	n := 0
	for _, v := range t.VCPUs {
		if v.Package == t.VCPUs[0].Package {
			n++
		}
	}
	return n
}

// MaxAPICID returns the largest APIC ID.
func (t Topology) MaxAPICID() uint32 {
	var m uint32
	for _, v := range t.VCPUs {
		m = max(m, v.APICID)
	}
	return m
}

// APICIDs returns the APIC ID of each vCPU, by index.
func (t Topology) APICIDs() []uint32 {
	ids := make([]uint32, len(t.VCPUs))
	for i, v := range t.VCPUs {
		ids[i] = v.APICID
	}
	return ids
}

// Flat returns n cores of one thread each in one package sharing one LLC,
// with APIC ID = vCPU index.
func Flat(n int) (Topology, error) {
	if n < 1 {
		return Topology{}, fmt.Errorf("cputopo: %d vCPUs", n)
	}
	t := Topology{VCPUs: make([]VCPU, n), CoreBits: bitsFor(n), ThreadsPerCore: 1}
	for i := range t.VCPUs {
		t.VCPUs[i] = VCPU{APICID: uint32(i), Core: i}
	}
	return t, nil
}

// Mirror returns the topology in which vCPU i has the place of host CPU
// cpus[i] (see the package doc). Packages, LLC domains, cores and threads
// are numbered in order of first appearance, so vCPU 0 is always APIC ID 0.
//
// The host CPUs must be distinct: two vCPUs on one host CPU are not SMT
// siblings (they take turns on one thread, they do not run side by side),
// and presenting them as threads of a core would mislead the guest's
// scheduler and every runtime that places threads by core. Oversubscribed
// VMs get Flat.
func Mirror(cpus []HostCPU) (Topology, error) {
	if len(cpus) == 0 {
		return Topology{}, errors.New("cputopo: no vCPUs")
	}
	seen := make(map[int]int, len(cpus))
	for i, c := range cpus {
		if j, dup := seen[c.CPU]; dup {
			return Topology{}, fmt.Errorf("cputopo: vCPUs %d and %d share host CPU %d: a mirrored topology needs distinct host CPUs", j, i, c.CPU)
		}
		seen[c.CPU] = i
	}
	type coreKey struct{ pkg, core int }
	type llcKey struct{ pkg, llc int }
	pkgIndex := map[int]int{}
	llcIndex := map[llcKey]int{}        // host (package, LLC) -> index within package
	llcsPerPkg := map[int]int{}         // guest package -> LLC domains so far
	coreIndex := map[coreKey]int{}      // host core -> index within its LLC domain
	coresPerLLC := map[[2]int]int{}     // (guest package, llc) -> cores so far
	threadsPerCore := map[coreKey]int{} // host core -> threads so far
	t := Topology{VCPUs: make([]VCPU, len(cpus))}
	maxThreads, maxCores, maxLLCs := 1, 1, 1
	for i, c := range cpus {
		if c.Package < 0 || c.Core < 0 {
			return Topology{}, fmt.Errorf("cputopo: host CPU %d has no package or core id (package %d, core %d)", c.CPU, c.Package, c.Core)
		}
		p, ok := pkgIndex[c.Package]
		if !ok {
			p = len(pkgIndex)
			pkgIndex[c.Package] = p
		}
		lk := llcKey{c.Package, c.LLC}
		l, ok := llcIndex[lk]
		if !ok {
			l = llcsPerPkg[p]
			llcIndex[lk] = l
			llcsPerPkg[p]++
		}
		ck := coreKey{c.Package, c.Core}
		core, ok := coreIndex[ck]
		if !ok {
			core = coresPerLLC[[2]int{p, l}]
			coreIndex[ck] = core
			coresPerLLC[[2]int{p, l}]++
		}
		th := threadsPerCore[ck]
		threadsPerCore[ck]++
		t.VCPUs[i] = VCPU{Package: p, LLC: l, Core: core, Thread: th}
		maxThreads = max(maxThreads, th+1)
		maxCores = max(maxCores, core+1)
		maxLLCs = max(maxLLCs, l+1)
	}
	t.ThreadBits, t.CoreBits, t.LLCBits = bitsFor(maxThreads), bitsFor(maxCores), bitsFor(maxLLCs)
	t.ThreadsPerCore = maxThreads
	if t.PackageShift()+bitsFor(len(pkgIndex)) > 32 {
		return Topology{}, fmt.Errorf("cputopo: topology needs more than 32 APIC ID bits")
	}
	for i := range t.VCPUs {
		v := &t.VCPUs[i]
		v.APICID = uint32(v.Package)<<t.PackageShift() | uint32(v.LLC)<<t.LLCShift() | uint32(v.Core)<<t.ThreadBits | uint32(v.Thread)
	}
	return t, nil
}

// bitsFor returns the APIC ID bits that number n items: ceil(log2(n)).
func bitsFor(n int) uint {
	if n <= 1 {
		return 0
	}
	return uint(bits.Len(uint(n - 1)))
}

// WithAPICIDs returns a topology of single-thread cores in one package
// whose vCPU i has APIC ID ids[i] (ids[0] must be 0, the boot CPU, and all
// distinct). It exists to exercise sparse and large APIC IDs (above 254,
// x2APIC only) without hundreds of vCPUs.
func WithAPICIDs(ids []uint32) (Topology, error) {
	if len(ids) == 0 || ids[0] != 0 {
		return Topology{}, errors.New("cputopo: APIC IDs must start with 0, the boot CPU")
	}
	seen := map[uint32]bool{}
	var top uint32
	t := Topology{VCPUs: make([]VCPU, len(ids)), ThreadsPerCore: 1}
	for i, id := range ids {
		if seen[id] {
			return Topology{}, fmt.Errorf("cputopo: APIC ID %d given twice", id)
		}
		seen[id] = true
		top = max(top, id)
		t.VCPUs[i] = VCPU{APICID: id, Core: int(id)}
	}
	t.CoreBits = bitsFor(int(top) + 1)
	return t, nil
}
