package vmm

import (
	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// CPUID leaves and bits hpcvmm adjusts. Everything else is passed through
// from KVM_GET_SUPPORTED_CPUID: the guest gets the host CPU's features as far
// as KVM can virtualise them, which is what HPC codes tuned for the host's
// vector units need.
const (
	leafFeatures         = 0x1
	leafCacheParams      = 0x4
	leafTopology         = 0xb
	leafTopologyV2       = 0x1f
	leafKVMSignature     = 0x40000000
	leafKVMFeatures      = 0x40000001
	leafExtFeatures      = 0x80000001
	leafAddressSizes     = 0x80000008
	leafAMDCacheTopology = 0x8000001d
	leafAMDTopologyExt   = 0x8000001e

	featECXHypervisor = 1 << 31
	// kvmFeatureMSIExtDestID is KVM_FEATURE_MSI_EXT_DEST_ID in leaf
	// 0x40000001 EAX.
	kvmFeatureMSIExtDestID = 1 << 15
	featEDXHTT             = 1 << 28
	extECXCmpLegacy        = 1 << 1

	topoLevelSMT  = 1
	topoLevelCore = 2

	cpuidFlagSignificantIndex = 1
)

// cpuidOptions are the per-VM choices guestCPUID applies.
type cpuidOptions struct {
	// extDestID adds KVM_FEATURE_MSI_EXT_DEST_ID to the KVM feature leaf:
	// the guest may then address MSIs (and IOAPIC entries) to APIC IDs up
	// to 32767 without interrupt remapping; the VMM translates
	// (irqRouter).
	extDestID bool
	// realtime sets KVM_HINTS_REALTIME (leaf 0x40000001 EDX): the vCPUs
	// are dedicated, never preempted, so Linux polls in idle (haltpoll
	// cpuidle) and uses native spinlocks (dedicated CPU mode).
	realtime bool
}

// kvmSignature is "KVMKVMKVM\0\0\0" as the three registers of leaf 0x40000000;
// Linux looks for it to enable kvm-clock and the other paravirt features.
var kvmSignature = [3]uint32{0x4b4d564b, 0x564b4d56, 0x0000004d}

// guestCPUID returns the CPUID table for vCPU index of topology top. The
// topology leaves (0x1, 0x4, 0xB, 0x1F and AMD's 0x80000008, 0x8000001D,
// 0x8000001E) all describe top's APIC ID layout (package cputopo), so
// Linux's topology code, which cross-checks them, sees the same threads,
// cores, shared caches and packages as MADT/SRAT. The host's physical
// address width (0x80000008 EAX) is passed through unchanged: the 64-bit PCI
// window for large BARs is sized from it.
//
// Every other leaf is KVM's: the XSAVE leaf 0xD and leaf 7 with whatever
// dynamic features (AMX) KVM reports to a process holding their guest
// permission (requestGuestXSAVE), and the PMU leaf 0xA as KVM reports it.
func guestCPUID(supported []uapi.CPUIDEntry, top cputopo.Topology, index int, opt cpuidOptions) []uapi.CPUIDEntry {
	v := top.VCPUs[index]
	apicID := v.APICID
	pkgShift := top.PackageShift()
	logical := uint32(top.LogicalPerPackage())
	// cacheSharing is leaf 4/0x8000001D EAX[25:14] for a cache of level:
	// one core's threads below the last level, the LLC domain at it.
	cacheSharing := func(eax uint32) uint32 {
		shift := top.ThreadBits
		if (eax>>5)&0x7 >= 3 {
			shift = top.LLCShift()
		}
		return eax&^(0xfff<<14) | (1<<shift-1)<<14
	}
	out := make([]uapi.CPUIDEntry, 0, len(supported)+6)
	haveSignature := false
	for _, e := range supported {
		switch e.Function {
		case leafFeatures:
			e.EBX = e.EBX&0x0000ffff | apicID<<24 | min(logical, 255)<<16
			e.ECX |= featECXHypervisor
			if logical > 1 {
				e.EDX |= featEDXHTT
			} else {
				e.EDX &^= featEDXHTT
			}
		case leafCacheParams:
			if e.EAX&0x1f == 0 { // no cache at this subleaf
				break
			}
			e.EAX = cacheSharing(e.EAX&^(0x3f<<26) | (1<<(pkgShift-top.ThreadBits)-1)<<26)
		case leafTopology, leafTopologyV2:
			continue // rebuilt below
		case leafKVMFeatures:
			if opt.extDestID {
				e.EAX |= kvmFeatureMSIExtDestID
			}
			if opt.realtime {
				e.EDX |= uapi.KVMHintsRealtime
			}
		case leafKVMSignature:
			haveSignature = true
			e.EBX, e.ECX, e.EDX = kvmSignature[0], kvmSignature[1], kvmSignature[2]
			e.EAX = max(e.EAX, leafKVMFeatures)
		case leafExtFeatures:
			if logical > 1 {
				e.ECX |= extECXCmpLegacy
			}
		case leafAddressSizes:
			e.ECX = e.ECX&^0xf0ff | uint32(pkgShift)<<12 | (logical-1)&0xff
		case leafAMDCacheTopology:
			if e.EAX&0x1f == 0 {
				break
			}
			e.EAX = cacheSharing(e.EAX)
		case leafAMDTopologyExt:
			e.EAX = apicID
			// Core (compute unit) ID and threads per core - 1; node ID:
			// the guest package.
			e.EBX = e.EBX&^0xffff | (apicID>>top.ThreadBits)&0xff | uint32(top.ThreadsPerCore-1)<<8
			e.ECX = e.ECX&^0xff | uint32(v.Package)&0xff
		}
		out = append(out, e)
	}
	maxBasic := uint32(0)
	for _, e := range supported {
		if e.Function == 0 {
			maxBasic = e.EAX
		}
	}
	for _, leaf := range []uint32{leafTopology, leafTopologyV2} {
		if maxBasic < leaf || !hasLeaf(supported, leaf) {
			continue
		}
		out = append(out,
			uapi.CPUIDEntry{Function: leaf, Index: 0, Flags: cpuidFlagSignificantIndex,
				EAX: uint32(top.ThreadBits), EBX: uint32(top.ThreadsPerCore), ECX: topoLevelSMT << 8, EDX: apicID},
			uapi.CPUIDEntry{Function: leaf, Index: 1, Flags: cpuidFlagSignificantIndex,
				EAX: uint32(pkgShift), EBX: logical, ECX: 1 | topoLevelCore<<8, EDX: apicID},
			uapi.CPUIDEntry{Function: leaf, Index: 2, Flags: cpuidFlagSignificantIndex,
				EAX: 0, EBX: 0, ECX: 2, EDX: apicID},
		)
	}
	if !haveSignature {
		out = append(out,
			uapi.CPUIDEntry{Function: leafKVMSignature, EAX: leafKVMFeatures,
				EBX: kvmSignature[0], ECX: kvmSignature[1], EDX: kvmSignature[2]})
	}
	return out
}

func hasLeaf(entries []uapi.CPUIDEntry, leaf uint32) bool {
	for _, e := range entries {
		if e.Function == leaf {
			return true
		}
	}
	return false
}

// physAddrBits reads the host's physical address width from the supported
// CPUID table (leaf 0x80000008 EAX[7:0]); 36 when the leaf is missing, the
// architectural minimum.
func physAddrBits(supported []uapi.CPUIDEntry) int {
	for _, e := range supported {
		if e.Function == leafAddressSizes {
			if b := int(e.EAX & 0xff); b > 0 {
				return b
			}
		}
	}
	return 36
}

// CPUID bits and XSAVE state components (XCR0 bits) guestXCR0 looks at.
const (
	leafXSave = 0xd

	featEDXFPU     = 1 << 0  // leaf 1 EDX
	featEDXSSE     = 1 << 25 // leaf 1 EDX
	featECXXSave   = 1 << 26 // leaf 1 ECX
	featECXAVX     = 1 << 28 // leaf 1 ECX
	ext7EBXMPX     = 1 << 14 // leaf 7.0 EBX
	ext7EBXAVX512F = 1 << 16 // leaf 7.0 EBX
	ext7ECXPKU     = 1 << 3  // leaf 7.0 ECX
	ext7EDXAMXTile = 1 << 24 // leaf 7.0 EDX

	xfeatFP       = 1 << 0
	xfeatSSE      = 1 << 1
	xfeatYMM      = 1 << 2
	xfeatMPX      = 1<<3 | 1<<4        // BNDREGS, BNDCSR
	xfeatAVX512   = 1<<5 | 1<<6 | 1<<7 // opmask, ZMM_Hi256, Hi16_ZMM
	xfeatPKRU     = 1 << 9
	xfeatAMXTiles = 1<<17 | 1<<18 // XTILE_CFG, XTILE_DATA
)

// guestXCR0 returns the XCR0 value every vCPU starts with: the user XSAVE
// state components of the vCPU's CPUID leaf 0xD whose feature the CPUID
// also announces, which is the value Linux writes into XCR0 itself
// (fpu__init_cpu_xstate), or 0 when the guest has no XSAVE.
//
// Why not the architectural reset value 1: KVM derives the XSAVE area size
// the guest reads from CPUID 0xD.0 EBX from the XCR0 it tracks, and it
// tracks the guest's own XSETBV only when the CPU intercepts XSETBV. QEMU's
// TCG does not intercept it for a nested guest (the test bed's L1), so
// there KVM kept XCR0 = 1, Linux read a 576-byte area for its 0x207
// features, printed "XSAVE consistency problem: size 2696 != kernel_size
// 576" and ran without XSAVE, while KVM kept reloading XCR0 = 1 under it
// at every VM entry. Starting with the value the guest will write makes
// both views agree from the first instruction; where XSETBV is
// intercepted (all hardware KVM) the guest's own write replaces it anyway,
// and before the guest sets CR4.OSXSAVE XCR0 has no effect.
func guestXCR0(cpuid []uapi.CPUIDEntry) uint64 {
	var l1, l7, xsave uapi.CPUIDEntry
	var haveXSave bool
	for _, e := range cpuid {
		switch {
		case e.Function == leafFeatures:
			l1 = e
		case e.Function == 7 && e.Index == 0:
			l7 = e
		case e.Function == leafXSave && e.Index == 0:
			xsave, haveXSave = e, true
		}
	}
	if !haveXSave || l1.ECX&featECXXSave == 0 || l1.EDX&featEDXFPU == 0 {
		return 0
	}
	xcr0 := uint64(xsave.EDX)<<32 | uint64(xsave.EAX)
	drop := func(ok bool, mask uint64) {
		if !ok {
			xcr0 &^= mask
		}
	}
	drop(l1.EDX&featEDXSSE != 0, xfeatSSE)
	drop(l1.ECX&featECXAVX != 0, xfeatYMM)
	drop(l7.EBX&ext7EBXMPX != 0, xfeatMPX)
	drop(l7.EBX&ext7EBXAVX512F != 0, xfeatAVX512)
	drop(l7.ECX&ext7ECXPKU != 0, xfeatPKRU)
	drop(l7.EDX&ext7EDXAMXTile != 0, xfeatAMXTiles)
	// The dependencies KVM_SET_XCRS (like XSETBV) enforces: x87 always,
	// YMM only with SSE, AVX-512 only with YMM, and the MPX, AVX-512 and
	// AMX groups all or nothing.
	xcr0 |= xfeatFP
	drop(xcr0&xfeatSSE != 0, xfeatYMM)
	drop(xcr0&xfeatYMM != 0, xfeatAVX512)
	for _, group := range []uint64{xfeatMPX, xfeatAVX512, xfeatAMXTiles} {
		drop(xcr0&group == group, group)
	}
	return xcr0
}

// MSRs every vCPU starts with, the architectural reset values Linux
// expects to find (the same set other direct-boot VMMs program): syscall
// MSRs cleared, fast strings on, MTRRs enabled with write-back as the
// default type so guest RAM is cacheable before Linux programs the MTRRs.
const (
	msrIA32SysenterCS  = 0x174
	msrIA32SysenterESP = 0x175
	msrIA32SysenterEIP = 0x176
	msrIA32TSC         = 0x10
	msrIA32MiscEnable  = 0x1a0
	msrMTRRDefType     = 0x2ff
	msrSTAR            = 0xc0000081
	msrLSTAR           = 0xc0000082
	msrCSTAR           = 0xc0000083
	msrSyscallMask     = 0xc0000084
	msrKernelGSBase    = 0xc0000102

	miscEnableFastString = 1 << 0
	mtrrEnable           = 1 << 11
	mtrrTypeWriteBack    = 6
)

func bootMSRs() []uapi.MSREntry {
	return []uapi.MSREntry{
		{Index: msrIA32SysenterCS}, {Index: msrIA32SysenterESP}, {Index: msrIA32SysenterEIP},
		{Index: msrSTAR}, {Index: msrCSTAR}, {Index: msrKernelGSBase}, {Index: msrSyscallMask}, {Index: msrLSTAR},
		{Index: msrIA32TSC},
		{Index: msrIA32MiscEnable, Data: miscEnableFastString},
		{Index: msrMTRRDefType, Data: mtrrEnable | mtrrTypeWriteBack},
	}
}
