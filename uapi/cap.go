package uapi

import "strconv"

// Cap is a KVM capability number (KVM_CAP_*), the argument of
// KVM_CHECK_EXTENSION and KVM_ENABLE_CAP.
type Cap uint32

// Capabilities hpcvmm checks for or enables, with the kernel's numbers.
const (
	CapIRQChip            Cap = 0   // in-kernel PIC/IOAPIC/LAPIC
	CapUserMemory         Cap = 3   // KVM_SET_USER_MEMORY_REGION
	CapSetTSSAddr         Cap = 4   // KVM_SET_TSS_ADDR
	CapExtCPUID           Cap = 7   // KVM_SET_CPUID2 / KVM_GET_SUPPORTED_CPUID
	CapNrVCPUs            Cap = 9   // recommended vCPUs per VM
	CapMPState            Cap = 14  // KVM_GET/SET_MP_STATE
	CapIRQRouting         Cap = 25  // KVM_SET_GSI_ROUTING
	CapIRQFD              Cap = 32  // KVM_IRQFD
	CapPIT2               Cap = 33  // KVM_CREATE_PIT2
	CapIOEventFD          Cap = 36  // KVM_IOEVENTFD
	CapSetIdentityMapAddr Cap = 37  // KVM_SET_IDENTITY_MAP_ADDR
	CapVCPUEvents         Cap = 41  // KVM_GET/SET_VCPU_EVENTS
	CapMaxVCPUs           Cap = 66  // maximum vCPUs per VM
	CapSignalMSI          Cap = 77  // KVM_SIGNAL_MSI
	CapReadonlyMem        Cap = 81  // KVM_MEM_READONLY memory slots
	CapDeviceCtrl         Cap = 89  // KVM_CREATE_DEVICE
	CapSplitIRQChip       Cap = 121 // LAPIC in kernel, PIC/IOAPIC in userspace
	CapMaxVCPUID          Cap = 128 // largest vCPU id (APIC ID) + 1
	CapX2APICAPI          Cap = 129 // 32-bit APIC IDs in MSI routes and x2APIC state
	CapImmediateExit      Cap = 136 // kvm_run.immediate_exit
	CapX86DisableExits    Cap = 143 // let the guest run HLT/PAUSE/MWAIT natively
	CapHaltPoll           Cap = 182 // per-VM halt-polling interval (ns)
	CapBinaryStatsFD      Cap = 203 // KVM_GET_STATS_FD
)

var capNames = map[Cap]string{
	CapIRQChip:            "KVM_CAP_IRQCHIP",
	CapUserMemory:         "KVM_CAP_USER_MEMORY",
	CapSetTSSAddr:         "KVM_CAP_SET_TSS_ADDR",
	CapExtCPUID:           "KVM_CAP_EXT_CPUID",
	CapNrVCPUs:            "KVM_CAP_NR_VCPUS",
	CapMPState:            "KVM_CAP_MP_STATE",
	CapIRQRouting:         "KVM_CAP_IRQ_ROUTING",
	CapReadonlyMem:        "KVM_CAP_READONLY_MEM",
	CapIRQFD:              "KVM_CAP_IRQFD",
	CapPIT2:               "KVM_CAP_PIT2",
	CapIOEventFD:          "KVM_CAP_IOEVENTFD",
	CapSetIdentityMapAddr: "KVM_CAP_SET_IDENTITY_MAP_ADDR",
	CapVCPUEvents:         "KVM_CAP_VCPU_EVENTS",
	CapMaxVCPUs:           "KVM_CAP_MAX_VCPUS",
	CapSignalMSI:          "KVM_CAP_SIGNAL_MSI",
	CapDeviceCtrl:         "KVM_CAP_DEVICE_CTRL",
	CapSplitIRQChip:       "KVM_CAP_SPLIT_IRQCHIP",
	CapMaxVCPUID:          "KVM_CAP_MAX_VCPU_ID",
	CapX2APICAPI:          "KVM_CAP_X2APIC_API",
	CapImmediateExit:      "KVM_CAP_IMMEDIATE_EXIT",
	CapX86DisableExits:    "KVM_CAP_X86_DISABLE_EXITS",
	CapHaltPoll:           "KVM_CAP_HALT_POLL",
	CapBinaryStatsFD:      "KVM_CAP_BINARY_STATS_FD",
}

// String returns the kernel's name for c ("KVM_CAP_IRQFD"), or
// "KVM_CAP(n)" for a number this package does not name.
func (c Cap) String() string {
	if n, ok := capNames[c]; ok {
		return n
	}
	return "KVM_CAP(" + strconv.FormatUint(uint64(c), 10) + ")"
}
