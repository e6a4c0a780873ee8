package uapi

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// arch_prctl codes for the guest permission of dynamically enabled XSAVE
// features (asm/prctl.h, Linux 5.17+).
const (
	ArchGetXCompGuestPerm = 0x1024 // ARCH_GET_XCOMP_GUEST_PERM
	ArchReqXCompGuestPerm = 0x1025 // ARCH_REQ_XCOMP_GUEST_PERM
)

// XFeatureXTileData is XFEATURE_XTILEDATA, the XSAVE state component of AMX
// tile data (8 KiB): the one dynamically enabled feature so far. The kernel
// does not export the enum to userspace headers (it is in
// arch/x86/include/asm/fpu/types.h), so the ABI test checks it through the
// Intel SDM's numbering only: component 18 (XCR0 bit 18).
const XFeatureXTileData = 18

// RequestGuestXCompPerm is arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM, feature):
// permission for this process's KVM guests to use the dynamically enabled
// XSAVE feature (and every feature below it that needs permission). KVM
// reports such a feature in KVM_GET_SUPPORTED_CPUID only to a process
// that holds the permission, and the permission must be in place before
// the first vCPU is created. The error wraps EINVAL on kernels or CPUs
// without the feature and EPERM when a seccomp filter or the sigaltstack
// size refuses it.
func RequestGuestXCompPerm(feature int) error {
	if _, _, e := unix.RawSyscall(unix.SYS_ARCH_PRCTL, ArchReqXCompGuestPerm, uintptr(feature), 0); e != 0 {
		return fmt.Errorf("arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM, %d): %w", feature, e)
	}
	return nil
}

// GuestXCompPerm is arch_prctl(ARCH_GET_XCOMP_GUEST_PERM): the XSAVE
// feature bitmap this process's guests may use.
func GuestXCompPerm() (uint64, error) {
	var mask uint64
	if _, _, e := unix.RawSyscall(unix.SYS_ARCH_PRCTL, ArchGetXCompGuestPerm, uintptr(unsafe.Pointer(&mask)), 0); e != 0 {
		return 0, fmt.Errorf("arch_prctl(ARCH_GET_XCOMP_GUEST_PERM): %w", e)
	}
	return mask, nil
}
