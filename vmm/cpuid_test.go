package vmm

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// hostCPUID is a trimmed table as KVM_GET_SUPPORTED_CPUID returns it on an
// AMD EPYC host (leaf 0xB present, 48 physical address bits).
func hostCPUID() []uapi.CPUIDEntry {
	return []uapi.CPUIDEntry{
		{Function: 0, EAX: 0x10},
		{Function: leafFeatures, EBX: 0x00000800, ECX: 0x7ed8320b, EDX: 0x178bfbff},
		{Function: leafTopology, Index: 0, Flags: 1, EAX: 1, EBX: 2, ECX: 0x100},
		{Function: leafTopology, Index: 1, Flags: 1, EAX: 7, EBX: 64, ECX: 0x201},
		{Function: leafKVMSignature, EAX: leafKVMFeatures},
		{Function: leafKVMFeatures, EAX: 0x01007afb},
		{Function: leafExtFeatures, ECX: 0x75c237ff},
		{Function: leafAddressSizes, EAX: 0x3030, ECX: 0x703f},
	}
}

func find(entries []uapi.CPUIDEntry, fn, idx uint32) (uapi.CPUIDEntry, bool) {
	for _, e := range entries {
		if e.Function == fn && e.Index == idx {
			return e, true
		}
	}
	return uapi.CPUIDEntry{}, false
}

func TestGuestCPUIDTopologyIsConsistent(t *testing.T) {
	for _, n := range []int{1, 2, 4, 6} {
		for i := 0; i < n; i++ {
			out := guestCPUID(hostCPUID(), flat(t, n), i, cpuidOptions{})
			l1, ok := find(out, leafFeatures, 0)
			require.True(t, ok)
			assert.Equal(t, uint32(i), l1.EBX>>24, "APIC ID in leaf 1")
			assert.Equal(t, uint32(n), (l1.EBX>>16)&0xff, "logical count in leaf 1")
			assert.NotZero(t, l1.ECX&featECXHypervisor, "hypervisor bit")
			assert.Equal(t, n > 1, l1.EDX&featEDXHTT != 0, "HTT iff more than one CPU")

			smt, ok := find(out, leafTopology, 0)
			require.True(t, ok)
			core, ok := find(out, leafTopology, 1)
			require.True(t, ok)
			assert.Equal(t, uint32(1), smt.EBX, "one thread per core")
			assert.Equal(t, uint32(n), core.EBX, "n cores in the package")
			assert.Equal(t, uint32(i), core.EDX, "x2APIC ID")
			assert.True(t, 1<<core.EAX >= n, "core shift covers every APIC ID")
			assert.Equal(t, uint32(topoLevelCore), (core.ECX>>8)&0xff)

			as, ok := find(out, leafAddressSizes, 0)
			require.True(t, ok)
			assert.Equal(t, uint32(0x30), as.EAX&0xff, "host physical address bits passed through")
			assert.Equal(t, uint32(n-1), as.ECX&0xff, "AMD NC = n-1")
		}
	}
}

func TestGuestCPUIDHasKVMSignature(t *testing.T) {
	out := guestCPUID(hostCPUID()[:2], flat(t, 1), 0, cpuidOptions{}) // host table without the paravirt leaves
	sig, ok := find(out, leafKVMSignature, 0)
	require.True(t, ok)
	assert.Equal(t, kvmSignature, [3]uint32{sig.EBX, sig.ECX, sig.EDX})
	b := []byte{}
	for _, r := range kvmSignature {
		b = append(b, byte(r), byte(r>>8), byte(r>>16), byte(r>>24))
	}
	assert.Equal(t, "KVMKVMKVM\x00\x00\x00", string(b))
}

func TestPhysAddrBits(t *testing.T) {
	assert.Equal(t, 48, physAddrBits(hostCPUID()))
	assert.Equal(t, 36, physAddrBits(nil))
}

// nestedL1CPUID is the part of KVM_GET_SUPPORTED_CPUID that decides XSAVE,
// as KVM reported it inside the test bed's L1 (QEMU 7.2 TCG, -cpu max, AMD,
// kernel 6.1): x87, SSE, AVX and PKRU (0x207), standard format, 2696 bytes.
func nestedL1CPUID() []uapi.CPUIDEntry {
	return []uapi.CPUIDEntry{
		{Function: 0, EAX: 0xd, EBX: 0x68747541, ECX: 0x444d4163, EDX: 0x69746e65},
		{Function: leafFeatures, EAX: 0x00060fb1, EBX: 0x01020800, ECX: 0x76f83203, EDX: 0x0f8bfbfd},
		{Function: 7, Index: 0, Flags: 1, EBX: 0x019803ab, ECX: 0x0001020c, EDX: 0x20000000},
		{Function: leafXSave, Index: 0, Flags: 1, EAX: 0x207, EBX: 0xa88, ECX: 0xa88},
		{Function: leafXSave, Index: 1, Flags: 1, EAX: 0x5},
		{Function: leafXSave, Index: 2, Flags: 1, EAX: 0x100, EBX: 0x240},
		{Function: leafXSave, Index: 9, Flags: 1, EAX: 0x8, EBX: 0xa80},
	}
}

// xsaveSize is the standard-format XSAVE area size for the components in
// xcr0, from the offsets and sizes of CPUID leaf 0xD: what KVM reports in
// CPUID 0xD.0 EBX for the XCR0 it tracks, and what Linux computes for the
// components it enables and compares with it (paranoid_xstate_size_valid).
func xsaveSize(cpuid []uapi.CPUIDEntry, xcr0 uint64) uint32 {
	size := uint32(512 + 64) // legacy area and XSAVE header
	for i := uint32(2); i < 64; i++ {
		if xcr0&(1<<i) == 0 {
			continue
		}
		if e, ok := find(cpuid, leafXSave, i); ok {
			size = max(size, e.EBX+e.EAX)
		}
	}
	return size
}

func TestGuestXCR0MatchesWhatLinuxEnables(t *testing.T) {
	cpuid := guestCPUID(nestedL1CPUID(), flat(t, 1), 0, cpuidOptions{})
	xcr0 := guestXCR0(cpuid)
	assert.Equal(t, uint64(0x207), xcr0, "x87, SSE, AVX, PKRU")
	leaf, ok := find(cpuid, leafXSave, 0)
	require.True(t, ok)
	// Linux sizes its buffers for every announced component (2696 bytes
	// here) and refuses XSAVE when CPUID 0xD.0 EBX, computed by KVM from
	// its XCR0, disagrees. With the architectural reset value XCR0 = 1,
	// which KVM keeps where it cannot see the guest's XSETBV (nested TCG),
	// it reads 576.
	assert.Equal(t, leaf.ECX, xsaveSize(cpuid, xcr0), "area size for the initial XCR0 = size of everything announced")
	assert.Equal(t, uint32(576), xsaveSize(cpuid, 1))
}

func TestGuestXCR0DropsComponentsWithoutTheirFeature(t *testing.T) {
	mod := func(f func(c []uapi.CPUIDEntry)) []uapi.CPUIDEntry {
		c := nestedL1CPUID()
		f(c)
		return c
	}
	noPKU := mod(func(c []uapi.CPUIDEntry) { c[2].ECX &^= ext7ECXPKU })
	assert.Equal(t, uint64(0x7), guestXCR0(noPKU))
	noAVX := mod(func(c []uapi.CPUIDEntry) { c[1].ECX &^= featECXAVX })
	assert.Equal(t, uint64(0x203), guestXCR0(noAVX))
	noXSave := mod(func(c []uapi.CPUIDEntry) { c[1].ECX &^= featECXXSave })
	assert.Zero(t, guestXCR0(noXSave))
	assert.Zero(t, guestXCR0(nestedL1CPUID()[:3]), "no leaf 0xD")
	// Half an MPX or AVX-512 group in leaf 0xD is dropped whole: KVM
	// refuses such an XCR0.
	halfMPX := mod(func(c []uapi.CPUIDEntry) { c[2].EBX |= ext7EBXMPX; c[3].EAX |= 1 << 3 })
	assert.Equal(t, uint64(0x207), guestXCR0(halfMPX))
	avx512 := mod(func(c []uapi.CPUIDEntry) { c[2].EBX |= ext7EBXAVX512F; c[3].EAX |= xfeatAVX512 })
	assert.Equal(t, uint64(0x2e7), guestXCR0(avx512))
	avx512NoAVX := mod(func(c []uapi.CPUIDEntry) {
		c[2].EBX |= ext7EBXAVX512F
		c[3].EAX |= xfeatAVX512
		c[1].ECX &^= featECXAVX
	})
	assert.Equal(t, uint64(0x203), guestXCR0(avx512NoAVX), "AVX-512 state needs YMM")
}

// TestGuestXCR0AlwaysValid checks, over random CPUID tables, the rules
// KVM_SET_XCRS enforces, so a host with an unusual leaf 0xD cannot make
// hpcvmm request an XCR0 KVM rejects.
func TestGuestXCR0AlwaysValid(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		c := nestedL1CPUID()
		c[1].ECX, c[1].EDX = r.Uint32(), r.Uint32()
		c[2].EBX, c[2].ECX, c[2].EDX = r.Uint32(), r.Uint32(), r.Uint32()
		c[3].EAX, c[3].EDX = r.Uint32(), r.Uint32()
		x := guestXCR0(c)
		if x == 0 {
			continue
		}
		leaf := uint64(c[3].EDX)<<32 | uint64(c[3].EAX)
		require.NotZero(t, x&xfeatFP, "%#x", x)
		require.Zero(t, x&^(leaf|xfeatFP), "only components leaf 0xD offers: %#x of %#x", x, leaf)
		require.False(t, x&xfeatYMM != 0 && x&xfeatSSE == 0, "%#x", x)
		require.False(t, x&xfeatAVX512 != 0 && x&xfeatYMM == 0, "%#x", x)
		for _, g := range []uint64{xfeatMPX, xfeatAVX512, xfeatAMXTiles} {
			require.True(t, x&g == 0 || x&g == g, "%#x group %#x", x, g)
		}
	}
}

func flat(t *testing.T, n int) cputopo.Topology {
	top, err := cputopo.Flat(n)
	require.NoError(t, err)
	return top
}
