package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/cputopo"
)

func TestExtendedDestination(t *testing.T) {
	// Linux's MSI address for APIC ID 0x1ab with the extended destination
	// ID: bits 19:12 = 0xab, bits 11:5 = 0x01.
	lo, hi := extendedDestination(0xfee00000|0xab<<12|0x01<<5|0x8, 0)
	assert.Equal(t, uint32(0xfee00000|0xab<<12|0x8), lo, "bits 11:5 cleared, redirection hint kept")
	assert.Equal(t, uint32(0x100), hi, "destination bits 14:8 in address_hi 31:8")
	lo, hi = extendedDestination(0xfee01000, 0)
	assert.Equal(t, uint32(0xfee01000), lo, "an 8-bit destination is left alone")
	assert.Zero(t, hi)
	_, hi = extendedDestination(0xfee00000|0x7f<<5, 0)
	assert.Equal(t, uint32(0x7f00), hi, "APIC ID 32512")
}

func TestRouterTranslatesOnlyWithExtDestID(t *testing.T) {
	for _, ext := range []bool{false, true} {
		f := &recordingVM{}
		r := newIRQRouter(f)
		r.extDestID = ext
		gsi, err := r.AllocGSI()
		require.NoError(t, err)
		require.NoError(t, r.SetMSIRoute(gsi, 0xfee00000|0x01<<5, 0, 0x41))
		r.mu.Lock()
		e := r.msi[gsi]
		r.mu.Unlock()
		if ext {
			assert.Equal(t, uint32(0xfee00000), e.MSI.AddressLo)
			assert.Equal(t, uint32(0x100), e.MSI.AddressHi)
		} else {
			assert.Equal(t, uint32(0xfee00020), e.MSI.AddressLo, "without the feature the guest never sets these bits; passed as is")
		}
	}
}

func TestGuestCPUIDOffersExtDestID(t *testing.T) {
	top, err := cputopo.WithAPICIDs([]uint32{0, 256})
	require.NoError(t, err)
	for _, ext := range []bool{false, true} {
		out := guestCPUID(hostCPUID(), top, 1, cpuidOptions{extDestID: ext})
		kf, ok := find(out, leafKVMFeatures, 0)
		require.True(t, ok)
		assert.Equal(t, ext, kf.EAX&kvmFeatureMSIExtDestID != 0)
		core, ok := find(out, leafTopology, 1)
		require.True(t, ok)
		assert.Equal(t, uint32(256), core.EDX, "x2APIC ID of vCPU 1")
	}
}

func TestIRQAffinityForLargeAPICIDs(t *testing.T) {
	top, err := cputopo.WithAPICIDs([]uint32{0, 300, 7})
	require.NoError(t, err)
	vm := &VM{topology: top}
	assert.Equal(t, "console=ttyS0 irqaffinity=0,2", vm.withIRQAffinity("console=ttyS0"))
	assert.Equal(t, "irqaffinity=1", vm.withIRQAffinity("irqaffinity=1"), "the user's choice stays")
	vm.topology, _ = cputopo.Flat(4)
	assert.Equal(t, "quiet", vm.withIRQAffinity("quiet"), "no x2APIC-only vCPUs: unchanged")
}

func TestX2APICBaseMSR(t *testing.T) {
	assert.Equal(t, uint64(0xfee00d00), x2APICBaseMSR(true).Data, "enabled, x2APIC, BSP")
	assert.Equal(t, uint64(0xfee00c00), x2APICBaseMSR(false).Data)
	assert.Equal(t, uint32(0x1b), x2APICBaseMSR(false).Index)
}
