package uapi

import "strconv"

// ExitReason is kvm_run.exit_reason (KVM_EXIT_*): why KVM_RUN returned.
type ExitReason uint32

// Exit reasons, with the kernel's numbers. Those hpcvmm does not expect on
// x86 (s390, PowerPC, RISC-V) are omitted and print as KVM_EXIT(n).
const (
	ExitUnknown       ExitReason = 0
	ExitException     ExitReason = 1
	ExitIO            ExitReason = 2
	ExitHypercall     ExitReason = 3
	ExitDebug         ExitReason = 4
	ExitHLT           ExitReason = 5
	ExitMMIO          ExitReason = 6
	ExitIRQWindowOpen ExitReason = 7
	ExitShutdown      ExitReason = 8
	ExitFailEntry     ExitReason = 9
	ExitIntr          ExitReason = 10
	ExitSetTPR        ExitReason = 11
	ExitTPRAccess     ExitReason = 12
	ExitNMI           ExitReason = 16
	ExitInternalError ExitReason = 17
	ExitSystemEvent   ExitReason = 24
	ExitIOAPICEOI     ExitReason = 26
	ExitHyperV        ExitReason = 27
	ExitX86RDMSR      ExitReason = 29
	ExitX86WRMSR      ExitReason = 30
	ExitDirtyRingFull ExitReason = 31
	ExitAPResetHold   ExitReason = 32
	ExitX86BusLock    ExitReason = 33
	ExitXen           ExitReason = 34
	ExitNotify        ExitReason = 37
)

var exitNames = [...]string{
	ExitUnknown:       "KVM_EXIT_UNKNOWN",
	ExitException:     "KVM_EXIT_EXCEPTION",
	ExitIO:            "KVM_EXIT_IO",
	ExitHypercall:     "KVM_EXIT_HYPERCALL",
	ExitDebug:         "KVM_EXIT_DEBUG",
	ExitHLT:           "KVM_EXIT_HLT",
	ExitMMIO:          "KVM_EXIT_MMIO",
	ExitIRQWindowOpen: "KVM_EXIT_IRQ_WINDOW_OPEN",
	ExitShutdown:      "KVM_EXIT_SHUTDOWN",
	ExitFailEntry:     "KVM_EXIT_FAIL_ENTRY",
	ExitIntr:          "KVM_EXIT_INTR",
	ExitSetTPR:        "KVM_EXIT_SET_TPR",
	ExitTPRAccess:     "KVM_EXIT_TPR_ACCESS",
	ExitNMI:           "KVM_EXIT_NMI",
	ExitInternalError: "KVM_EXIT_INTERNAL_ERROR",
	ExitSystemEvent:   "KVM_EXIT_SYSTEM_EVENT",
	ExitIOAPICEOI:     "KVM_EXIT_IOAPIC_EOI",
	ExitHyperV:        "KVM_EXIT_HYPERV",
	ExitX86RDMSR:      "KVM_EXIT_X86_RDMSR",
	ExitX86WRMSR:      "KVM_EXIT_X86_WRMSR",
	ExitDirtyRingFull: "KVM_EXIT_DIRTY_RING_FULL",
	ExitAPResetHold:   "KVM_EXIT_AP_RESET_HOLD",
	ExitX86BusLock:    "KVM_EXIT_X86_BUS_LOCK",
	ExitXen:           "KVM_EXIT_XEN",
	ExitNotify:        "KVM_EXIT_NOTIFY",
}

// String returns the kernel's name ("KVM_EXIT_IO"), or "KVM_EXIT(n)" for a
// reason this package does not name. It allocates only in the latter case,
// so it is safe to call on the exit path for logging known reasons.
func (e ExitReason) String() string {
	if int(e) < len(exitNames) && exitNames[e] != "" {
		return exitNames[e]
	}
	return "KVM_EXIT(" + strconv.FormatUint(uint64(e), 10) + ")"
}
