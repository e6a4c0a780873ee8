package uapi

// This file mirrors the C structures of linux/kvm.h and asm/kvm.h (x86-64)
// field for field. Types the rest of hpcvmm uses directly (Regs, Sregs, FPU,
// DeviceAttr, LAPICState) are exported with exactly the kernel layout, so
// they are passed to the kernel as-is; the others are unexported and filled
// from friendlier exported types. abi_test.go verifies every size and offset.

// Regs is struct kvm_regs: the general-purpose registers of a vCPU.
type Regs struct {
	RAX, RBX, RCX, RDX uint64
	RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11   uint64
	R12, R13, R14, R15 uint64
	RIP, RFLAGS        uint64
}

// Segment is struct kvm_segment: a segment register in its descriptor-cache
// (unpacked) form, which is how KVM exposes it regardless of CPU mode.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	padding  uint8
}

// DTable is struct kvm_dtable: a descriptor-table register (GDTR/IDTR).
type DTable struct {
	Base    uint64
	Limit   uint16
	padding [3]uint16
}

// Sregs is struct kvm_sregs: segment, control and descriptor-table registers.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8                    uint64
	EFER                   uint64
	APICBase               uint64
	// InterruptBitmap has one bit per vector (KVM_NR_INTERRUPTS = 256) for
	// interrupts pending injection when no in-kernel irqchip is used.
	InterruptBitmap [4]uint64
}

// FPU is struct kvm_fpu: the legacy x87/SSE state in FXSAVE format.
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8 // abridged tag word, FXSAVE format
	pad1       uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	pad2       uint32
}

// LAPICState is struct kvm_lapic_state: the 1 KiB local-APIC register page,
// each 32-bit register at its architectural offset.
type LAPICState [1024]byte

// DeviceAttr is struct kvm_device_attr, the argument of KVM_SET_DEVICE_ATTR
// and friends. Addr is the user address of the attribute's value; see
// VM.SetDeviceAttrInt32 for the common "pointer to an int32" case.
type DeviceAttr struct {
	Flags uint32
	Group uint32
	Attr  uint64
	Addr  uint64
}

// kvmUserspaceMemoryRegion is struct kvm_userspace_memory_region.
type kvmUserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// kvmIRQLevel is struct kvm_irq_level.
type kvmIRQLevel struct {
	IRQ   uint32 // union with __s32 status
	Level uint32
}

// kvmPITConfig is struct kvm_pit_config.
type kvmPITConfig struct {
	Flags uint32
	Pad   [15]uint32
}

// kvmIRQRoutingIRQChip is struct kvm_irq_routing_irqchip.
type kvmIRQRoutingIRQChip struct {
	IRQChip uint32
	Pin     uint32
}

// kvmIRQRoutingMSI is struct kvm_irq_routing_msi.
type kvmIRQRoutingMSI struct {
	AddressLo uint32
	AddressHi uint32
	Data      uint32
	DevID     uint32 // union with pad
}

// kvmIRQRoutingEntry is struct kvm_irq_routing_entry (48 bytes): U is the
// 32-byte union, viewed as kvmIRQRoutingIRQChip or kvmIRQRoutingMSI.
type kvmIRQRoutingEntry struct {
	GSI   uint32
	Type  uint32
	Flags uint32
	Pad   uint32
	U     [8]uint32
}

// kvmIRQRouting is the header of struct kvm_irq_routing; the entries follow.
type kvmIRQRouting struct {
	Nr    uint32
	Flags uint32
}

// kvmIRQFDArgs is struct kvm_irqfd.
type kvmIRQFDArgs struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	Pad        [16]uint8
}

// kvmIOEventFDArgs is struct kvm_ioeventfd.
type kvmIOEventFDArgs struct {
	Datamatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	Pad       [36]uint8
}

// kvmMSI is struct kvm_msi.
type kvmMSI struct {
	AddressLo uint32
	AddressHi uint32
	Data      uint32
	Flags     uint32
	DevID     uint32
	Pad       [12]uint8
}

// kvmEnableCapArgs is struct kvm_enable_cap.
type kvmEnableCapArgs struct {
	Cap   uint32
	Flags uint32
	Args  [4]uint64
	Pad   [64]uint8
}

// kvmCreateDeviceArgs is struct kvm_create_device.
type kvmCreateDeviceArgs struct {
	Type  uint32
	FD    uint32
	Flags uint32
}

// kvmCPUIDEntry2 is struct kvm_cpuid_entry2.
type kvmCPUIDEntry2 struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	Padding  [3]uint32
}

// kvmCPUID2 is the header of struct kvm_cpuid2; the entries follow.
type kvmCPUID2 struct {
	Nent    uint32
	Padding uint32
}

// kvmMSREntry is struct kvm_msr_entry.
type kvmMSREntry struct {
	Index    uint32
	Reserved uint32
	Data     uint64
}

// kvmMSRs is the header of struct kvm_msrs; the entries follow.
type kvmMSRs struct {
	NMSRs uint32
	Pad   uint32
}

// kvmMSRList is the header of struct kvm_msr_list; the indices follow.
type kvmMSRList struct {
	NMSRs uint32
}

// kvmMPState is struct kvm_mp_state.
type kvmMPState struct {
	MPState uint32
}

// kvmMaxXCRs is KVM_MAX_XCRS, the capacity of struct kvm_xcrs.
const kvmMaxXCRs = 16

// kvmXCR is struct kvm_xcr: one extended control register.
type kvmXCR struct {
	XCR      uint32
	Reserved uint32
	Value    uint64
}

// kvmXCRs is struct kvm_xcrs, the argument of KVM_GET_XCRS/KVM_SET_XCRS.
type kvmXCRs struct {
	NrXCRs  uint32
	Flags   uint32
	XCRs    [kvmMaxXCRs]kvmXCR
	Padding [16]uint64
}

// kvmRunHeader is the fixed part of struct kvm_run before the exit union.
type kvmRunHeader struct {
	RequestInterruptWindow     uint8
	ImmediateExit              uint8
	Padding1                   [6]uint8
	ExitReason                 uint32
	ReadyForInterruptInjection uint8
	IFFlag                     uint8
	Flags                      uint16
	CR8                        uint64
	APICBase                   uint64
}

// kvmRunUnionSize is the size of kvm_run's exit union (its char padding[256]
// member), the space every exit view below must fit in.
const kvmRunUnionSize = 256

// kvmRunHW is kvm_run.hw (KVM_EXIT_UNKNOWN).
type kvmRunHW struct {
	HardwareExitReason uint64
}

// kvmRunFailEntry is kvm_run.fail_entry (KVM_EXIT_FAIL_ENTRY).
type kvmRunFailEntry struct {
	HardwareEntryFailureReason uint64
	CPU                        uint32
}

// kvmRunEx is kvm_run.ex (KVM_EXIT_EXCEPTION).
type kvmRunEx struct {
	Exception uint32
	ErrorCode uint32
}

// kvmRunIO is kvm_run.io (KVM_EXIT_IO).
type kvmRunIO struct {
	Direction  uint8
	Size       uint8
	Port       uint16
	Count      uint32
	DataOffset uint64
}

// kvmRunMMIO is kvm_run.mmio (KVM_EXIT_MMIO).
type kvmRunMMIO struct {
	PhysAddr uint64
	Data     [8]uint8
	Len      uint32
	IsWrite  uint8
}

// kvmRunInternal is kvm_run.internal (KVM_EXIT_INTERNAL_ERROR).
type kvmRunInternal struct {
	Suberror uint32
	NData    uint32
	Data     [16]uint64
}

// kvmRunSystemEvent is kvm_run.system_event (KVM_EXIT_SYSTEM_EVENT).
type kvmRunSystemEvent struct {
	Type  uint32
	NData uint32
	Data  [16]uint64 // union with __u64 flags
}

// Constants from linux/kvm.h and asm/kvm.h used with the calls above.
const (
	// APIVersion is the only KVM API version there has ever been
	// (KVM_API_VERSION); anything else means a broken or foreign /dev/kvm.
	APIVersion = 12

	// MemLogDirtyPages and MemReadonly are UserspaceMemoryRegion.Flags.
	MemLogDirtyPages = 1 << 0
	MemReadonly      = 1 << 1

	// PITSpeakerDummy (KVM_PIT_SPEAKER_DUMMY) makes the in-kernel PIT also
	// serve port 0x61, so the guest's PIT calibration loop never exits.
	PITSpeakerDummy = 1

	// IRQChipPICMaster, IRQChipPICSlave and IRQChipIOAPIC are
	// IRQRoutingEntry.IRQChip.Chip values.
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2

	// IRQRoutingIRQChip and IRQRoutingMSI are IRQRoutingEntry.Type values.
	IRQRoutingIRQChip = 1
	IRQRoutingMSI     = 2

	// IRQFDFlagDeassign and IRQFDFlagResample are kvm_irqfd flags.
	IRQFDFlagDeassign = 1 << 0
	IRQFDFlagResample = 1 << 1

	// IOEventFDFlagDatamatch, IOEventFDFlagPIO and IOEventFDFlagDeassign are
	// IOEventFD.Flags values.
	IOEventFDFlagDatamatch = 1 << 0
	IOEventFDFlagPIO       = 1 << 1
	IOEventFDFlagDeassign  = 1 << 2

	// MSIValidDevID (KVM_MSI_VALID_DEVID) marks MSI.DevID / a routing
	// entry's DevID as meaningful.
	MSIValidDevID = 1 << 0

	// DeviceVFIO is KVM_DEV_TYPE_VFIO, the kvm-vfio pseudo device that
	// tells KVM which VFIO groups the VM uses (for coherent DMA/NoSnoop).
	DeviceVFIO = 4
	// DeviceAttrVFIOGroup is KVM_DEV_VFIO_GROUP; VFIOGroupAdd and
	// VFIOGroupDel are its attributes, whose value is an int32 group fd.
	DeviceAttrVFIOGroup = 1
	VFIOGroupAdd        = 1
	VFIOGroupDel        = 2

	// CPUIDFlagSignificantIndex (KVM_CPUID_FLAG_SIGNIFCANT_INDEX) marks
	// CPUID leaves whose sub-leaf (ECX) selects the result.
	CPUIDFlagSignificantIndex = 1 << 0

	// X86DisableExitsMWait, X86DisableExitsHLT, X86DisableExitsPause and
	// X86DisableExitsCState are the argument bits of CapX86DisableExits.
	X86DisableExitsMWait  = 1 << 0
	X86DisableExitsHLT    = 1 << 1
	X86DisableExitsPause  = 1 << 2
	X86DisableExitsCState = 1 << 3

	// KVMHintsRealtime is 1 << KVM_HINTS_REALTIME, the bit of the KVM
	// paravirt feature leaf (0x40000001) EDX that tells the guest its vCPUs
	// are never preempted: Linux then polls in idle instead of halting
	// (haltpoll), and uses native spinlocks instead of paravirt ones.
	KVMHintsRealtime = 1 << 0

	// X2APICAPIUse32BitIDs and X2APICAPIDisableBroadcastQuirk are the
	// argument bits of CapX2APICAPI: MSI routes carry destination bits
	// 31:8 in address_hi, and 0xff is an ordinary x2APIC ID, not a
	// broadcast.
	X2APICAPIUse32BitIDs           = 1 << 0
	X2APICAPIDisableBroadcastQuirk = 1 << 1

	// IOIn and IOOut are kvm_run.io.direction values.
	IOIn  = 0
	IOOut = 1

	// System event types (Run.SystemEvent).
	SystemEventShutdown = 1
	SystemEventReset    = 2
	SystemEventCrash    = 3
	SystemEventWakeup   = 4
	SystemEventSuspend  = 5

	// Internal-error suberrors (Run.InternalError).
	InternalErrorEmulation  = 1
	InternalErrorSimulEx    = 2
	InternalErrorDeliveryEv = 3
	InternalErrorUnexpected = 4
)

// MP states (KVM_MP_STATE_*), for VCPU.SetMPState / GetMPState.
const (
	MPStateRunnable      = 0
	MPStateUninitialized = 1
	MPStateInitReceived  = 2
	MPStateHalted        = 3
	MPStateSIPIReceived  = 4
)
