package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
			out := guestCPUID(hostCPUID(), i, n)
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
	out := guestCPUID(hostCPUID()[:2], 0, 1) // host table without the paravirt leaves
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
