package uapi

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// abiItem is one fact checked against the C headers: a C expression and the
// value the Go side believes it has.
type abiItem struct {
	c     string
	goVal uint64
}

func size(cType string, goSize uintptr) abiItem {
	return abiItem{"sizeof(" + cType + ")", uint64(goSize)}
}

func off(cType, field string, goOff uintptr) abiItem {
	return abiItem{"offsetof(" + cType + ", " + field + ")", uint64(goOff)}
}

func val(cExpr string, goVal uint64) abiItem { return abiItem{cExpr, goVal} }

// abiItems lists every struct size, field offset, ioctl number and constant
// the package mirrors.
func abiItems() []abiItem {
	const (
		run   = "struct kvm_run"
		regs  = "struct kvm_regs"
		seg   = "struct kvm_segment"
		dt    = "struct kvm_dtable"
		sregs = "struct kvm_sregs"
		fpu   = "struct kvm_fpu"
		rte   = "struct kvm_irq_routing_entry"
	)
	x := kvmRunExitOffset
	var s Sregs
	var r Regs
	var sg Segment
	var d DTable
	var f FPU
	var e kvmIRQRoutingEntry
	items := []abiItem{
		// struct kvm_run header and exit views.
		off(run, "request_interrupt_window", unsafe.Offsetof(kvmRunHeader{}.RequestInterruptWindow)),
		off(run, "immediate_exit", unsafe.Offsetof(kvmRunHeader{}.ImmediateExit)),
		off(run, "exit_reason", unsafe.Offsetof(kvmRunHeader{}.ExitReason)),
		off(run, "ready_for_interrupt_injection", unsafe.Offsetof(kvmRunHeader{}.ReadyForInterruptInjection)),
		off(run, "if_flag", unsafe.Offsetof(kvmRunHeader{}.IFFlag)),
		off(run, "flags", unsafe.Offsetof(kvmRunHeader{}.Flags)),
		off(run, "cr8", unsafe.Offsetof(kvmRunHeader{}.CR8)),
		off(run, "apic_base", unsafe.Offsetof(kvmRunHeader{}.APICBase)),
		off(run, "hw", x),
		val("sizeof(((struct kvm_run *)0)->padding)", kvmRunUnionSize),
		off(run, "hw.hardware_exit_reason", x+unsafe.Offsetof(kvmRunHW{}.HardwareExitReason)),
		off(run, "fail_entry.hardware_entry_failure_reason", x+unsafe.Offsetof(kvmRunFailEntry{}.HardwareEntryFailureReason)),
		off(run, "fail_entry.cpu", x+unsafe.Offsetof(kvmRunFailEntry{}.CPU)),
		val("sizeof(((struct kvm_run *)0)->fail_entry)", uint64(unsafe.Sizeof(kvmRunFailEntry{}))),
		off(run, "ex.exception", x+unsafe.Offsetof(kvmRunEx{}.Exception)),
		off(run, "ex.error_code", x+unsafe.Offsetof(kvmRunEx{}.ErrorCode)),
		off(run, "io.direction", x+unsafe.Offsetof(kvmRunIO{}.Direction)),
		off(run, "io.size", x+unsafe.Offsetof(kvmRunIO{}.Size)),
		off(run, "io.port", x+unsafe.Offsetof(kvmRunIO{}.Port)),
		off(run, "io.count", x+unsafe.Offsetof(kvmRunIO{}.Count)),
		off(run, "io.data_offset", x+unsafe.Offsetof(kvmRunIO{}.DataOffset)),
		val("sizeof(((struct kvm_run *)0)->io)", uint64(unsafe.Sizeof(kvmRunIO{}))),
		off(run, "mmio.phys_addr", x+unsafe.Offsetof(kvmRunMMIO{}.PhysAddr)),
		off(run, "mmio.data", x+unsafe.Offsetof(kvmRunMMIO{}.Data)),
		off(run, "mmio.len", x+unsafe.Offsetof(kvmRunMMIO{}.Len)),
		off(run, "mmio.is_write", x+unsafe.Offsetof(kvmRunMMIO{}.IsWrite)),
		val("sizeof(((struct kvm_run *)0)->mmio)", uint64(unsafe.Sizeof(kvmRunMMIO{}))),
		off(run, "internal.suberror", x+unsafe.Offsetof(kvmRunInternal{}.Suberror)),
		off(run, "internal.ndata", x+unsafe.Offsetof(kvmRunInternal{}.NData)),
		off(run, "internal.data", x+unsafe.Offsetof(kvmRunInternal{}.Data)),
		val("sizeof(((struct kvm_run *)0)->internal)", uint64(unsafe.Sizeof(kvmRunInternal{}))),
		off(run, "system_event.type", x+unsafe.Offsetof(kvmRunSystemEvent{}.Type)),
		off(run, "system_event.ndata", x+unsafe.Offsetof(kvmRunSystemEvent{}.NData)),
		off(run, "system_event.data", x+unsafe.Offsetof(kvmRunSystemEvent{}.Data)),
		val("sizeof(((struct kvm_run *)0)->system_event)", uint64(unsafe.Sizeof(kvmRunSystemEvent{}))),

		// struct kvm_regs.
		size(regs, unsafe.Sizeof(r)),
		off(regs, "rax", unsafe.Offsetof(r.RAX)), off(regs, "rbx", unsafe.Offsetof(r.RBX)),
		off(regs, "rcx", unsafe.Offsetof(r.RCX)), off(regs, "rdx", unsafe.Offsetof(r.RDX)),
		off(regs, "rsi", unsafe.Offsetof(r.RSI)), off(regs, "rdi", unsafe.Offsetof(r.RDI)),
		off(regs, "rsp", unsafe.Offsetof(r.RSP)), off(regs, "rbp", unsafe.Offsetof(r.RBP)),
		off(regs, "r8", unsafe.Offsetof(r.R8)), off(regs, "r9", unsafe.Offsetof(r.R9)),
		off(regs, "r10", unsafe.Offsetof(r.R10)), off(regs, "r11", unsafe.Offsetof(r.R11)),
		off(regs, "r12", unsafe.Offsetof(r.R12)), off(regs, "r13", unsafe.Offsetof(r.R13)),
		off(regs, "r14", unsafe.Offsetof(r.R14)), off(regs, "r15", unsafe.Offsetof(r.R15)),
		off(regs, "rip", unsafe.Offsetof(r.RIP)), off(regs, "rflags", unsafe.Offsetof(r.RFLAGS)),

		// struct kvm_segment, kvm_dtable, kvm_sregs.
		size(seg, unsafe.Sizeof(sg)),
		off(seg, "base", unsafe.Offsetof(sg.Base)), off(seg, "limit", unsafe.Offsetof(sg.Limit)),
		off(seg, "selector", unsafe.Offsetof(sg.Selector)), off(seg, "type", unsafe.Offsetof(sg.Type)),
		off(seg, "present", unsafe.Offsetof(sg.Present)), off(seg, "dpl", unsafe.Offsetof(sg.DPL)),
		off(seg, "db", unsafe.Offsetof(sg.DB)), off(seg, "s", unsafe.Offsetof(sg.S)),
		off(seg, "l", unsafe.Offsetof(sg.L)), off(seg, "g", unsafe.Offsetof(sg.G)),
		off(seg, "avl", unsafe.Offsetof(sg.AVL)), off(seg, "unusable", unsafe.Offsetof(sg.Unusable)),
		off(seg, "padding", unsafe.Offsetof(sg.padding)),
		size(dt, unsafe.Sizeof(d)),
		off(dt, "base", unsafe.Offsetof(d.Base)), off(dt, "limit", unsafe.Offsetof(d.Limit)),
		off(dt, "padding", unsafe.Offsetof(d.padding)),
		size(sregs, unsafe.Sizeof(s)),
		off(sregs, "cs", unsafe.Offsetof(s.CS)), off(sregs, "ds", unsafe.Offsetof(s.DS)),
		off(sregs, "es", unsafe.Offsetof(s.ES)), off(sregs, "fs", unsafe.Offsetof(s.FS)),
		off(sregs, "gs", unsafe.Offsetof(s.GS)), off(sregs, "ss", unsafe.Offsetof(s.SS)),
		off(sregs, "tr", unsafe.Offsetof(s.TR)), off(sregs, "ldt", unsafe.Offsetof(s.LDT)),
		off(sregs, "gdt", unsafe.Offsetof(s.GDT)), off(sregs, "idt", unsafe.Offsetof(s.IDT)),
		off(sregs, "cr0", unsafe.Offsetof(s.CR0)), off(sregs, "cr2", unsafe.Offsetof(s.CR2)),
		off(sregs, "cr3", unsafe.Offsetof(s.CR3)), off(sregs, "cr4", unsafe.Offsetof(s.CR4)),
		off(sregs, "cr8", unsafe.Offsetof(s.CR8)), off(sregs, "efer", unsafe.Offsetof(s.EFER)),
		off(sregs, "apic_base", unsafe.Offsetof(s.APICBase)),
		off(sregs, "interrupt_bitmap", unsafe.Offsetof(s.InterruptBitmap)),
		val("sizeof(((struct kvm_sregs *)0)->interrupt_bitmap)", uint64(unsafe.Sizeof(s.InterruptBitmap))),

		// struct kvm_fpu.
		size(fpu, unsafe.Sizeof(f)),
		off(fpu, "fpr", unsafe.Offsetof(f.FPR)), off(fpu, "fcw", unsafe.Offsetof(f.FCW)),
		off(fpu, "fsw", unsafe.Offsetof(f.FSW)), off(fpu, "ftwx", unsafe.Offsetof(f.FTWX)),
		off(fpu, "pad1", unsafe.Offsetof(f.pad1)), off(fpu, "last_opcode", unsafe.Offsetof(f.LastOpcode)),
		off(fpu, "last_ip", unsafe.Offsetof(f.LastIP)), off(fpu, "last_dp", unsafe.Offsetof(f.LastDP)),
		off(fpu, "xmm", unsafe.Offsetof(f.XMM)), off(fpu, "mxcsr", unsafe.Offsetof(f.MXCSR)),
		off(fpu, "pad2", unsafe.Offsetof(f.pad2)),

		// struct kvm_lapic_state, kvm_device_attr.
		size("struct kvm_lapic_state", unsafe.Sizeof(LAPICState{})),
		size("struct kvm_device_attr", unsafe.Sizeof(DeviceAttr{})),
		off("struct kvm_device_attr", "flags", unsafe.Offsetof(DeviceAttr{}.Flags)),
		off("struct kvm_device_attr", "group", unsafe.Offsetof(DeviceAttr{}.Group)),
		off("struct kvm_device_attr", "attr", unsafe.Offsetof(DeviceAttr{}.Attr)),
		off("struct kvm_device_attr", "addr", unsafe.Offsetof(DeviceAttr{}.Addr)),

		// struct kvm_userspace_memory_region.
		size("struct kvm_userspace_memory_region", unsafe.Sizeof(kvmUserspaceMemoryRegion{})),
		off("struct kvm_userspace_memory_region", "slot", unsafe.Offsetof(kvmUserspaceMemoryRegion{}.Slot)),
		off("struct kvm_userspace_memory_region", "flags", unsafe.Offsetof(kvmUserspaceMemoryRegion{}.Flags)),
		off("struct kvm_userspace_memory_region", "guest_phys_addr", unsafe.Offsetof(kvmUserspaceMemoryRegion{}.GuestPhysAddr)),
		off("struct kvm_userspace_memory_region", "memory_size", unsafe.Offsetof(kvmUserspaceMemoryRegion{}.MemorySize)),
		off("struct kvm_userspace_memory_region", "userspace_addr", unsafe.Offsetof(kvmUserspaceMemoryRegion{}.UserspaceAddr)),

		// struct kvm_irq_level, kvm_pit_config.
		size("struct kvm_irq_level", unsafe.Sizeof(kvmIRQLevel{})),
		off("struct kvm_irq_level", "irq", unsafe.Offsetof(kvmIRQLevel{}.IRQ)),
		off("struct kvm_irq_level", "level", unsafe.Offsetof(kvmIRQLevel{}.Level)),
		size("struct kvm_pit_config", unsafe.Sizeof(kvmPITConfig{})),
		off("struct kvm_pit_config", "flags", unsafe.Offsetof(kvmPITConfig{}.Flags)),

		// struct kvm_irq_routing and its entry (48 bytes, union at 16).
		size("struct kvm_irq_routing", unsafe.Sizeof(kvmIRQRouting{})),
		off("struct kvm_irq_routing", "nr", unsafe.Offsetof(kvmIRQRouting{}.Nr)),
		off("struct kvm_irq_routing", "flags", unsafe.Offsetof(kvmIRQRouting{}.Flags)),
		off("struct kvm_irq_routing", "entries", unsafe.Sizeof(kvmIRQRouting{})),
		size(rte, unsafe.Sizeof(e)),
		off(rte, "gsi", unsafe.Offsetof(e.GSI)), off(rte, "type", unsafe.Offsetof(e.Type)),
		off(rte, "flags", unsafe.Offsetof(e.Flags)), off(rte, "pad", unsafe.Offsetof(e.Pad)),
		off(rte, "u", unsafe.Offsetof(e.U)),
		val("sizeof(((struct kvm_irq_routing_entry *)0)->u)", uint64(unsafe.Sizeof(e.U))),
		off(rte, "u.irqchip.irqchip", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingIRQChip{}.IRQChip)),
		off(rte, "u.irqchip.pin", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingIRQChip{}.Pin)),
		off(rte, "u.msi.address_lo", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingMSI{}.AddressLo)),
		off(rte, "u.msi.address_hi", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingMSI{}.AddressHi)),
		off(rte, "u.msi.data", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingMSI{}.Data)),
		off(rte, "u.msi.devid", unsafe.Offsetof(e.U)+unsafe.Offsetof(kvmIRQRoutingMSI{}.DevID)),
		size("struct kvm_irq_routing_irqchip", unsafe.Sizeof(kvmIRQRoutingIRQChip{})),
		size("struct kvm_irq_routing_msi", unsafe.Sizeof(kvmIRQRoutingMSI{})),

		// struct kvm_irqfd (32), kvm_ioeventfd (64), kvm_msi (32).
		size("struct kvm_irqfd", unsafe.Sizeof(kvmIRQFDArgs{})),
		off("struct kvm_irqfd", "fd", unsafe.Offsetof(kvmIRQFDArgs{}.FD)),
		off("struct kvm_irqfd", "gsi", unsafe.Offsetof(kvmIRQFDArgs{}.GSI)),
		off("struct kvm_irqfd", "flags", unsafe.Offsetof(kvmIRQFDArgs{}.Flags)),
		off("struct kvm_irqfd", "resamplefd", unsafe.Offsetof(kvmIRQFDArgs{}.ResampleFD)),
		off("struct kvm_irqfd", "pad", unsafe.Offsetof(kvmIRQFDArgs{}.Pad)),
		size("struct kvm_ioeventfd", unsafe.Sizeof(kvmIOEventFDArgs{})),
		off("struct kvm_ioeventfd", "datamatch", unsafe.Offsetof(kvmIOEventFDArgs{}.Datamatch)),
		off("struct kvm_ioeventfd", "addr", unsafe.Offsetof(kvmIOEventFDArgs{}.Addr)),
		off("struct kvm_ioeventfd", "len", unsafe.Offsetof(kvmIOEventFDArgs{}.Len)),
		off("struct kvm_ioeventfd", "fd", unsafe.Offsetof(kvmIOEventFDArgs{}.FD)),
		off("struct kvm_ioeventfd", "flags", unsafe.Offsetof(kvmIOEventFDArgs{}.Flags)),
		off("struct kvm_ioeventfd", "pad", unsafe.Offsetof(kvmIOEventFDArgs{}.Pad)),
		size("struct kvm_msi", unsafe.Sizeof(kvmMSI{})),
		off("struct kvm_msi", "address_lo", unsafe.Offsetof(kvmMSI{}.AddressLo)),
		off("struct kvm_msi", "address_hi", unsafe.Offsetof(kvmMSI{}.AddressHi)),
		off("struct kvm_msi", "data", unsafe.Offsetof(kvmMSI{}.Data)),
		off("struct kvm_msi", "flags", unsafe.Offsetof(kvmMSI{}.Flags)),
		off("struct kvm_msi", "devid", unsafe.Offsetof(kvmMSI{}.DevID)),

		// struct kvm_enable_cap, kvm_create_device, kvm_mp_state.
		size("struct kvm_enable_cap", unsafe.Sizeof(kvmEnableCapArgs{})),
		off("struct kvm_enable_cap", "cap", unsafe.Offsetof(kvmEnableCapArgs{}.Cap)),
		off("struct kvm_enable_cap", "flags", unsafe.Offsetof(kvmEnableCapArgs{}.Flags)),
		off("struct kvm_enable_cap", "args", unsafe.Offsetof(kvmEnableCapArgs{}.Args)),
		off("struct kvm_enable_cap", "pad", unsafe.Offsetof(kvmEnableCapArgs{}.Pad)),
		size("struct kvm_create_device", unsafe.Sizeof(kvmCreateDeviceArgs{})),
		off("struct kvm_create_device", "type", unsafe.Offsetof(kvmCreateDeviceArgs{}.Type)),
		off("struct kvm_create_device", "fd", unsafe.Offsetof(kvmCreateDeviceArgs{}.FD)),
		off("struct kvm_create_device", "flags", unsafe.Offsetof(kvmCreateDeviceArgs{}.Flags)),
		size("struct kvm_mp_state", unsafe.Sizeof(kvmMPState{})),
		size("struct kvm_xcr", unsafe.Sizeof(kvmXCR{})),
		off("struct kvm_xcr", "value", unsafe.Offsetof(kvmXCR{}.Value)),
		size("struct kvm_xcrs", unsafe.Sizeof(kvmXCRs{})),
		off("struct kvm_xcrs", "xcrs", unsafe.Offsetof(kvmXCRs{}.XCRs)),
		off("struct kvm_xcrs", "padding", unsafe.Offsetof(kvmXCRs{}.Padding)),
		val("KVM_MAX_XCRS", kvmMaxXCRs),

		// CPUID and MSR arrays.
		size("struct kvm_cpuid_entry2", unsafe.Sizeof(kvmCPUIDEntry2{})),
		off("struct kvm_cpuid_entry2", "function", unsafe.Offsetof(kvmCPUIDEntry2{}.Function)),
		off("struct kvm_cpuid_entry2", "index", unsafe.Offsetof(kvmCPUIDEntry2{}.Index)),
		off("struct kvm_cpuid_entry2", "flags", unsafe.Offsetof(kvmCPUIDEntry2{}.Flags)),
		off("struct kvm_cpuid_entry2", "eax", unsafe.Offsetof(kvmCPUIDEntry2{}.EAX)),
		off("struct kvm_cpuid_entry2", "ebx", unsafe.Offsetof(kvmCPUIDEntry2{}.EBX)),
		off("struct kvm_cpuid_entry2", "ecx", unsafe.Offsetof(kvmCPUIDEntry2{}.ECX)),
		off("struct kvm_cpuid_entry2", "edx", unsafe.Offsetof(kvmCPUIDEntry2{}.EDX)),
		off("struct kvm_cpuid_entry2", "padding", unsafe.Offsetof(kvmCPUIDEntry2{}.Padding)),
		size("struct kvm_cpuid2", unsafe.Sizeof(kvmCPUID2{})),
		off("struct kvm_cpuid2", "nent", unsafe.Offsetof(kvmCPUID2{}.Nent)),
		off("struct kvm_cpuid2", "entries", unsafe.Sizeof(kvmCPUID2{})),
		size("struct kvm_msr_entry", unsafe.Sizeof(kvmMSREntry{})),
		off("struct kvm_msr_entry", "index", unsafe.Offsetof(kvmMSREntry{}.Index)),
		off("struct kvm_msr_entry", "reserved", unsafe.Offsetof(kvmMSREntry{}.Reserved)),
		off("struct kvm_msr_entry", "data", unsafe.Offsetof(kvmMSREntry{}.Data)),
		size("struct kvm_msrs", unsafe.Sizeof(kvmMSRs{})),
		off("struct kvm_msrs", "nmsrs", unsafe.Offsetof(kvmMSRs{}.NMSRs)),
		off("struct kvm_msrs", "entries", unsafe.Sizeof(kvmMSRs{})),
		size("struct kvm_msr_list", unsafe.Sizeof(kvmMSRList{})),
		off("struct kvm_msr_list", "indices", unsafe.Sizeof(kvmMSRList{})),

		// Ioctl numbers.
		val("KVM_GET_API_VERSION", uint64(kvmGetAPIVersion)),
		val("KVM_CREATE_VM", uint64(kvmCreateVM)),
		val("KVM_GET_MSR_INDEX_LIST", uint64(kvmGetMSRIndexList)),
		val("KVM_CHECK_EXTENSION", uint64(kvmCheckExtension)),
		val("KVM_GET_VCPU_MMAP_SIZE", uint64(kvmGetVCPUMmapSize)),
		val("KVM_GET_SUPPORTED_CPUID", uint64(kvmGetSupportedCPUID)),
		val("KVM_CREATE_VCPU", uint64(kvmCreateVCPU)),
		val("KVM_SET_USER_MEMORY_REGION", uint64(kvmSetUserMemoryRegion)),
		val("KVM_SET_TSS_ADDR", uint64(kvmSetTSSAddr)),
		val("KVM_SET_IDENTITY_MAP_ADDR", uint64(kvmSetIdentityMapAddr)),
		val("KVM_CREATE_IRQCHIP", uint64(kvmCreateIRQChip)),
		val("KVM_IRQ_LINE", uint64(kvmIRQLine)),
		val("KVM_SET_GSI_ROUTING", uint64(kvmSetGSIRouting)),
		val("KVM_IRQFD", uint64(kvmIRQFD)),
		val("KVM_CREATE_PIT2", uint64(kvmCreatePIT2)),
		val("KVM_IOEVENTFD", uint64(kvmIOEventFD)),
		val("KVM_SIGNAL_MSI", uint64(kvmSignalMSI)),
		val("KVM_ENABLE_CAP", uint64(kvmEnableCap)),
		val("KVM_CREATE_DEVICE", uint64(kvmCreateDevice)),
		val("KVM_SET_DEVICE_ATTR", uint64(kvmSetDeviceAttr)),
		val("KVM_GET_DEVICE_ATTR", uint64(kvmGetDeviceAttr)),
		val("KVM_HAS_DEVICE_ATTR", uint64(kvmHasDeviceAttr)),
		val("KVM_GET_STATS_FD", uint64(kvmGetStatsFD)),
		val("KVM_RUN", uint64(kvmRun)),
		val("KVM_GET_REGS", uint64(kvmGetRegs)),
		val("KVM_SET_REGS", uint64(kvmSetRegs)),
		val("KVM_GET_SREGS", uint64(kvmGetSregs)),
		val("KVM_SET_SREGS", uint64(kvmSetSregs)),
		val("KVM_GET_MSRS", uint64(kvmGetMSRs)),
		val("KVM_SET_MSRS", uint64(kvmSetMSRs)),
		val("KVM_GET_FPU", uint64(kvmGetFPU)),
		val("KVM_SET_FPU", uint64(kvmSetFPU)),
		val("KVM_GET_LAPIC", uint64(kvmGetLAPIC)),
		val("KVM_SET_LAPIC", uint64(kvmSetLAPIC)),
		val("KVM_SET_CPUID2", uint64(kvmSetCPUID2)),
		val("KVM_GET_CPUID2", uint64(kvmGetCPUID2)),
		val("KVM_GET_MP_STATE", uint64(kvmGetMPState)),
		val("KVM_SET_MP_STATE", uint64(kvmSetMPState)),
		val("KVM_NMI", uint64(kvmNMI)),
		val("KVM_GET_XCRS", uint64(kvmGetXCRs)),
		val("KVM_SET_XCRS", uint64(kvmSetXCRs)),

		// Constants.
		val("KVM_API_VERSION", APIVersion),
		val("KVM_MEM_LOG_DIRTY_PAGES", MemLogDirtyPages),
		val("KVM_MEM_READONLY", MemReadonly),
		val("KVM_PIT_SPEAKER_DUMMY", PITSpeakerDummy),
		val("KVM_IRQCHIP_PIC_MASTER", IRQChipPICMaster),
		val("KVM_IRQCHIP_PIC_SLAVE", IRQChipPICSlave),
		val("KVM_IRQCHIP_IOAPIC", IRQChipIOAPIC),
		val("KVM_IRQ_ROUTING_IRQCHIP", IRQRoutingIRQChip),
		val("KVM_IRQ_ROUTING_MSI", IRQRoutingMSI),
		val("KVM_IRQFD_FLAG_DEASSIGN", IRQFDFlagDeassign),
		val("KVM_IRQFD_FLAG_RESAMPLE", IRQFDFlagResample),
		val("KVM_IOEVENTFD_FLAG_DATAMATCH", IOEventFDFlagDatamatch),
		val("KVM_IOEVENTFD_FLAG_PIO", IOEventFDFlagPIO),
		val("KVM_IOEVENTFD_FLAG_DEASSIGN", IOEventFDFlagDeassign),
		val("KVM_MSI_VALID_DEVID", MSIValidDevID),
		val("KVM_DEV_TYPE_VFIO", DeviceVFIO),
		val("KVM_DEV_VFIO_GROUP", DeviceAttrVFIOGroup),
		val("KVM_DEV_VFIO_GROUP_ADD", VFIOGroupAdd),
		val("KVM_DEV_VFIO_GROUP_DEL", VFIOGroupDel),
		val("KVM_CPUID_FLAG_SIGNIFCANT_INDEX", CPUIDFlagSignificantIndex),
		val("KVM_X86_DISABLE_EXITS_MWAIT", X86DisableExitsMWait),
		val("KVM_X2APIC_API_USE_32BIT_IDS", X2APICAPIUse32BitIDs),
		val("KVM_X2APIC_API_DISABLE_BROADCAST_QUIRK", X2APICAPIDisableBroadcastQuirk),
		val("KVM_X86_DISABLE_EXITS_HLT", X86DisableExitsHLT),
		val("KVM_X86_DISABLE_EXITS_PAUSE", X86DisableExitsPause),
		val("KVM_X86_DISABLE_EXITS_CSTATE", X86DisableExitsCState),
		val("KVM_EXIT_IO_IN", IOIn),
		val("KVM_EXIT_IO_OUT", IOOut),
		val("KVM_SYSTEM_EVENT_SHUTDOWN", SystemEventShutdown),
		val("KVM_SYSTEM_EVENT_RESET", SystemEventReset),
		val("KVM_SYSTEM_EVENT_CRASH", SystemEventCrash),
		val("KVM_SYSTEM_EVENT_WAKEUP", SystemEventWakeup),
		val("KVM_SYSTEM_EVENT_SUSPEND", SystemEventSuspend),
		val("KVM_INTERNAL_ERROR_EMULATION", InternalErrorEmulation),
		val("KVM_INTERNAL_ERROR_SIMUL_EX", InternalErrorSimulEx),
		val("KVM_INTERNAL_ERROR_DELIVERY_EV", InternalErrorDeliveryEv),
		val("KVM_INTERNAL_ERROR_UNEXPECTED_EXIT_REASON", InternalErrorUnexpected),
		val("KVM_MP_STATE_RUNNABLE", MPStateRunnable),
		val("KVM_MP_STATE_UNINITIALIZED", MPStateUninitialized),
		val("KVM_MP_STATE_INIT_RECEIVED", MPStateInitReceived),
		val("KVM_MP_STATE_HALTED", MPStateHalted),
		val("KVM_MP_STATE_SIPI_RECEIVED", MPStateSIPIReceived),
		val("MPOL_DEFAULT", MPolDefault),
		val("MPOL_PREFERRED", MPolPreferred),
		val("MPOL_BIND", MPolBind),
		val("MPOL_INTERLEAVE", MPolInterleave),
		val("MPOL_LOCAL", MPolLocal),
		val("MPOL_MF_STRICT", MPolMFStrict),
		val("MPOL_MF_MOVE", MPolMFMove),
		val("MPOL_MF_MOVE_ALL", MPolMFMoveAll),
	}
	// Every named capability and exit reason: this checks the names that
	// String() prints are real macros as well as their numbers.
	var named []abiItem
	for c, name := range capNames {
		named = append(named, val(name, uint64(c)))
	}
	for e, name := range exitNames {
		if name != "" {
			named = append(named, val(name, uint64(e)))
		}
	}
	sort.Slice(named, func(i, j int) bool { return named[i].c < named[j].c })
	items = append(items, vfioABIItems()...)
	return append(items, named...)
}

// TestABIConformance compiles a C program that prints every abiItem's C
// expression against the system headers and compares it with the Go value.
func TestABIConformance(t *testing.T) {
	n := checkABI(t, []string{"linux/kvm.h", "linux/mempolicy.h", "linux/vfio.h"}, abiItems())
	t.Logf("checked %d sizes, offsets, ioctl numbers and constants against the kernel headers", n)
}

// TestABIConformanceX86 checks the x86-only constants: the KVM paravirt
// feature hints and the arch_prctl codes of the XSAVE guest permission.
func TestABIConformanceX86(t *testing.T) {
	n := checkABI(t, []string{"linux/kvm.h", "asm/kvm_para.h", "asm/prctl.h"}, []abiItem{
		val("1 << KVM_HINTS_REALTIME", KVMHintsRealtime),
		val("ARCH_GET_XCOMP_GUEST_PERM", ArchGetXCompGuestPerm),
		val("ARCH_REQ_XCOMP_GUEST_PERM", ArchReqXCompGuestPerm),
	})
	t.Logf("checked %d x86 constants against the kernel headers", n)
}

// checkABI compiles, with gcc, a C program including headers (below
// /usr/include) that prints each item's C expression, runs it, and asserts
// every Go value equals the C one. It skips only when gcc or a header is
// missing, and returns the number of items checked.
func checkABI(t *testing.T, headers []string, items []abiItem) int {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		t.Skip("gcc not found: cannot compile the C side of the ABI check")
	}
	for _, h := range headers {
		// asm/ headers live in the multiarch directory on Debian.
		_, err := os.Stat(filepath.Join("/usr/include", h))
		if _, err2 := os.Stat(filepath.Join("/usr/include/x86_64-linux-gnu", h)); err != nil && err2 == nil {
			err = nil
		}
		if err != nil {
			t.Skipf("kernel uapi header missing (%v): install linux-libc-dev", err)
		}
	}
	var src bytes.Buffer
	src.WriteString("#include <stddef.h>\n#include <stdio.h>\n#include <sys/socket.h>\n")
	for _, h := range headers {
		fmt.Fprintf(&src, "#include <%s>\n", h)
	}
	src.WriteString("\nint main(void) {\n")
	for i, it := range items {
		fmt.Fprintf(&src, "\tprintf(\"%d %%llu\\n\", (unsigned long long)(%s));\n", i, it.c)
	}
	src.WriteString("\treturn 0;\n}\n")

	dir := t.TempDir()
	cFile, bin := filepath.Join(dir, "abi.c"), filepath.Join(dir, "abi")
	require.NoError(t, os.WriteFile(cFile, src.Bytes(), 0o644))
	out, err := exec.Command(gcc, "-std=gnu11", "-Wall", "-Werror", "-o", bin, cFile).CombinedOutput()
	require.NoError(t, err, "gcc failed (an unknown macro or field means the Go table names something the header lacks):\n%s", out)
	out, err = exec.Command(bin).Output()
	require.NoError(t, err)

	cVals := make(map[int]uint64, len(items))
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		idx, v, ok := strings.Cut(sc.Text(), " ")
		require.True(t, ok, "bad line %q", sc.Text())
		i, err := strconv.Atoi(idx)
		require.NoError(t, err)
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err)
		cVals[i] = n
	}
	require.Len(t, cVals, len(items), "C program printed a different number of values")
	for i, it := range items {
		assert.Equal(t, cVals[i], it.goVal, "%s: C says %d (%#x), Go says %d (%#x)", it.c, cVals[i], cVals[i], it.goVal, it.goVal)
	}
	return len(items)
}
