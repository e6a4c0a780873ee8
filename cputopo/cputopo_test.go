package cputopo_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/cputopo"
)

func TestMirrorSMTSiblingsAreThreadsOfOneCore(t *testing.T) {
	// Host CPUs 0 and 8 are the two threads of core 0.
	top, err := cputopo.Mirror([]cputopo.HostCPU{{CPU: 0, Core: 0, LLC: 0}, {CPU: 8, Core: 0, LLC: 0}})
	require.NoError(t, err)
	assert.Equal(t, []uint32{0, 1}, top.APICIDs())
	assert.Equal(t, uint(1), top.ThreadBits)
	assert.Equal(t, 2, top.ThreadsPerCore)
	assert.Equal(t, top.VCPUs[0].Core, top.VCPUs[1].Core)
	assert.Equal(t, uint(1), top.PackageShift())
}

func TestMirrorTwoCoresAreTwoCores(t *testing.T) {
	top, err := cputopo.Mirror([]cputopo.HostCPU{{CPU: 0, Core: 0, LLC: 0}, {CPU: 1, Core: 1, LLC: 0}})
	require.NoError(t, err)
	assert.Equal(t, []uint32{0, 1}, top.APICIDs())
	assert.Equal(t, uint(0), top.ThreadBits)
	assert.Equal(t, uint(1), top.CoreBits)
	assert.Equal(t, 1, top.ThreadsPerCore)
	assert.NotEqual(t, top.VCPUs[0].Core, top.VCPUs[1].Core)
	assert.Equal(t, uint(1), top.LLCShift(), "both cores share the LLC")
}

func TestMirrorPackagesAndLLCDomains(t *testing.T) {
	// 2 packages; package 0 has two L3 domains (like an AMD CCX split);
	// core 3 of package 0 runs two vCPUs (SMT).
	cpus := []cputopo.HostCPU{
		{CPU: 0, Package: 0, Core: 0, LLC: 0},
		{CPU: 1, Package: 0, Core: 1, LLC: 0},
		{CPU: 4, Package: 0, Core: 4, LLC: 4},
		{CPU: 68, Package: 0, Core: 4, LLC: 4}, // sibling of CPU 4
		{CPU: 32, Package: 1, Core: 0, LLC: 32},
	}
	top, err := cputopo.Mirror(cpus)
	require.NoError(t, err)
	assert.Equal(t, uint(1), top.ThreadBits, "one core has two threads")
	assert.Equal(t, uint(1), top.CoreBits, "at most two cores per LLC domain")
	assert.Equal(t, uint(1), top.LLCBits, "two LLC domains in package 0")
	assert.Equal(t, []uint32{0b000, 0b010, 0b100, 0b101, 0b1000}, top.APICIDs())
	// Linux's view: llc id = APIC ID >> LLCShift, package = >> PackageShift.
	llc := func(i int) uint32 { return top.VCPUs[i].APICID >> top.LLCShift() }
	pkg := func(i int) uint32 { return top.VCPUs[i].APICID >> top.PackageShift() }
	assert.Equal(t, llc(0), llc(1))
	assert.NotEqual(t, llc(1), llc(2))
	assert.Equal(t, llc(2), llc(3))
	assert.Equal(t, pkg(0), pkg(3))
	assert.NotEqual(t, pkg(0), pkg(4))
	assert.Equal(t, 4, top.LogicalPerPackage())
	assert.Equal(t, uint32(8), top.MaxAPICID())
}

func TestMirrorSMTOff16Cores(t *testing.T) {
	// The H100 capture's host: 1 socket, 16 cores, 1 thread each, one L3.
	var cpus []cputopo.HostCPU
	for i := 0; i < 16; i++ {
		cpus = append(cpus, cputopo.HostCPU{CPU: i, Core: i, LLC: 0})
	}
	top, err := cputopo.Mirror(cpus)
	require.NoError(t, err)
	flat, err := cputopo.Flat(16)
	require.NoError(t, err)
	assert.Equal(t, flat, top, "a single-package, single-L3 host without SMT mirrors as flat")
}

func TestMirrorRejectsUnknownTopology(t *testing.T) {
	_, err := cputopo.Mirror(nil)
	assert.Error(t, err)
	_, err = cputopo.Mirror([]cputopo.HostCPU{{CPU: 3, Package: -1}})
	assert.ErrorContains(t, err, "host CPU 3")
	_, err = cputopo.Flat(0)
	assert.Error(t, err)
}

// FuzzMirror checks for any host layout that APIC IDs are unique, vCPU 0
// has APIC ID 0, and the APIC ID fields reproduce the host's sharing: two
// vCPUs share a guest core exactly when they share a host core, an LLC
// domain exactly when they share a host LLC and package, a package exactly
// when they share a host package.
func FuzzMirror(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 1, 0, 1, 1, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		var cpus []cputopo.HostCPU
		for i := 0; i+2 < len(b) && len(cpus) < 64; i += 3 {
			cpus = append(cpus, cputopo.HostCPU{CPU: len(cpus), Package: int(b[i] % 4), Core: int(b[i+1] % 16), LLC: int(b[i+2] % 3)})
		}
		if len(cpus) == 0 {
			return
		}
		// A host core lives in one LLC: normalise the fuzzer's choice.
		first := map[[2]int]int{}
		for i := range cpus {
			k := [2]int{cpus[i].Package, cpus[i].Core}
			if l, ok := first[k]; ok {
				cpus[i].LLC = l
			} else {
				first[k] = cpus[i].LLC
			}
		}
		top, err := cputopo.Mirror(cpus)
		require.NoError(t, err)
		require.Equal(t, uint32(0), top.VCPUs[0].APICID)
		seen := map[uint32]bool{}
		for i, v := range top.VCPUs {
			if seen[v.APICID] {
				t.Fatalf("vCPU %d: duplicate APIC ID %d", i, v.APICID)
			}
			seen[v.APICID] = true
		}
		for i := range cpus {
			for j := range cpus {
				a, c := top.VCPUs[i].APICID, top.VCPUs[j].APICID
				samePkg := cpus[i].Package == cpus[j].Package
				if samePkg != (a>>top.PackageShift() == c>>top.PackageShift()) ||
					(samePkg && cpus[i].LLC == cpus[j].LLC) != (a>>top.LLCShift() == c>>top.LLCShift()) ||
					(samePkg && cpus[i].Core == cpus[j].Core) != (a>>top.ThreadBits == c>>top.ThreadBits) {
					t.Fatalf("vCPUs %d (%+v, APIC %#x) and %d (%+v, APIC %#x): guest sharing differs from the host's", i, cpus[i], a, j, cpus[j], c)
				}
			}
		}
	})
}

func TestWithAPICIDs(t *testing.T) {
	top, err := cputopo.WithAPICIDs([]uint32{0, 256})
	require.NoError(t, err)
	assert.Equal(t, []uint32{0, 256}, top.APICIDs())
	assert.Equal(t, uint(9), top.PackageShift(), "IDs up to 256 need 9 core bits")
	assert.Equal(t, uint32(256), top.MaxAPICID())
	_, err = cputopo.WithAPICIDs([]uint32{1, 2})
	assert.ErrorContains(t, err, "start with 0")
	_, err = cputopo.WithAPICIDs([]uint32{0, 3, 3})
	assert.ErrorContains(t, err, "twice")
}

// TestMirrorRejectsSharedHostCPUs: two vCPUs on one host CPU are not
// threads of a core.
func TestMirrorRejectsSharedHostCPUs(t *testing.T) {
	_, err := cputopo.Mirror([]cputopo.HostCPU{{CPU: 0, Package: 0, Core: 0}, {CPU: 1, Package: 0, Core: 1}, {CPU: 0, Package: 0, Core: 0}})
	require.ErrorContains(t, err, "vCPUs 0 and 2 share host CPU 0")
}
