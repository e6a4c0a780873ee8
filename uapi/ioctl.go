package uapi

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Ioctl request encoding (asm-generic/ioctl.h): dir:2 | size:14 | type:8 | nr:8.
const (
	iocNRShift   = 0
	iocTypeShift = 8
	iocSizeShift = 16
	iocDirShift  = 30

	iocNone  = 0
	iocWrite = 1
	iocRead  = 2

	// kvmio is the KVM ioctl type byte (KVMIO in linux/kvm.h).
	kvmio = 0xAE

	ioKVM   uintptr = iocNone<<iocDirShift | kvmio<<iocTypeShift
	iowKVM  uintptr = iocWrite<<iocDirShift | kvmio<<iocTypeShift
	iorKVM  uintptr = iocRead<<iocDirShift | kvmio<<iocTypeShift
	iowrKVM uintptr = (iocRead|iocWrite)<<iocDirShift | kvmio<<iocTypeShift
)

// KVM ioctl numbers. Sizes come from the Go mirrors, exactly as the C macros
// take sizeof() of the C structs; abi_test.go checks every value against the
// kernel header.
const (
	// System ioctls (/dev/kvm).
	kvmGetAPIVersion     = ioKVM // nr 0x00
	kvmCreateVM          = ioKVM | 0x01
	kvmGetMSRIndexList   = iowrKVM | unsafe.Sizeof(kvmMSRList{})<<iocSizeShift | 0x02
	kvmCheckExtension    = ioKVM | 0x03
	kvmGetVCPUMmapSize   = ioKVM | 0x04
	kvmGetSupportedCPUID = iowrKVM | unsafe.Sizeof(kvmCPUID2{})<<iocSizeShift | 0x05

	// VM ioctls.
	kvmCreateVCPU          = ioKVM | 0x41
	kvmSetUserMemoryRegion = iowKVM | unsafe.Sizeof(kvmUserspaceMemoryRegion{})<<iocSizeShift | 0x46
	kvmSetTSSAddr          = ioKVM | 0x47
	kvmSetIdentityMapAddr  = iowKVM | unsafe.Sizeof(uint64(0))<<iocSizeShift | 0x48
	kvmCreateIRQChip       = ioKVM | 0x60
	kvmIRQLine             = iowKVM | unsafe.Sizeof(kvmIRQLevel{})<<iocSizeShift | 0x61
	kvmSetGSIRouting       = iowKVM | unsafe.Sizeof(kvmIRQRouting{})<<iocSizeShift | 0x6a
	kvmIRQFD               = iowKVM | unsafe.Sizeof(kvmIRQFDArgs{})<<iocSizeShift | 0x76
	kvmCreatePIT2          = iowKVM | unsafe.Sizeof(kvmPITConfig{})<<iocSizeShift | 0x77
	kvmIOEventFD           = iowKVM | unsafe.Sizeof(kvmIOEventFDArgs{})<<iocSizeShift | 0x79
	kvmSignalMSI           = iowKVM | unsafe.Sizeof(kvmMSI{})<<iocSizeShift | 0xa5
	kvmEnableCap           = iowKVM | unsafe.Sizeof(kvmEnableCapArgs{})<<iocSizeShift | 0xa3
	kvmCreateDevice        = iowrKVM | unsafe.Sizeof(kvmCreateDeviceArgs{})<<iocSizeShift | 0xe0
	kvmSetDeviceAttr       = iowKVM | unsafe.Sizeof(DeviceAttr{})<<iocSizeShift | 0xe1
	kvmGetDeviceAttr       = iowKVM | unsafe.Sizeof(DeviceAttr{})<<iocSizeShift | 0xe2
	kvmHasDeviceAttr       = iowKVM | unsafe.Sizeof(DeviceAttr{})<<iocSizeShift | 0xe3
	kvmGetStatsFD          = ioKVM | 0xce

	// vCPU ioctls.
	kvmRun        = ioKVM | 0x80
	kvmGetRegs    = iorKVM | unsafe.Sizeof(Regs{})<<iocSizeShift | 0x81
	kvmSetRegs    = iowKVM | unsafe.Sizeof(Regs{})<<iocSizeShift | 0x82
	kvmGetSregs   = iorKVM | unsafe.Sizeof(Sregs{})<<iocSizeShift | 0x83
	kvmSetSregs   = iowKVM | unsafe.Sizeof(Sregs{})<<iocSizeShift | 0x84
	kvmGetMSRs    = iowrKVM | unsafe.Sizeof(kvmMSRs{})<<iocSizeShift | 0x88
	kvmSetMSRs    = iowKVM | unsafe.Sizeof(kvmMSRs{})<<iocSizeShift | 0x89
	kvmGetFPU     = iorKVM | unsafe.Sizeof(FPU{})<<iocSizeShift | 0x8c
	kvmSetFPU     = iowKVM | unsafe.Sizeof(FPU{})<<iocSizeShift | 0x8d
	kvmGetLAPIC   = iorKVM | unsafe.Sizeof(LAPICState{})<<iocSizeShift | 0x8e
	kvmSetLAPIC   = iowKVM | unsafe.Sizeof(LAPICState{})<<iocSizeShift | 0x8f
	kvmSetCPUID2  = iowKVM | unsafe.Sizeof(kvmCPUID2{})<<iocSizeShift | 0x90
	kvmGetCPUID2  = iowrKVM | unsafe.Sizeof(kvmCPUID2{})<<iocSizeShift | 0x91
	kvmGetMPState = iorKVM | unsafe.Sizeof(kvmMPState{})<<iocSizeShift | 0x98
	kvmSetMPState = iowKVM | unsafe.Sizeof(kvmMPState{})<<iocSizeShift | 0x99
	kvmNMI        = ioKVM | 0x9a
	kvmGetXCRs    = iorKVM | unsafe.Sizeof(kvmXCRs{})<<iocSizeShift | 0xa6
	kvmSetXCRs    = iowKVM | unsafe.Sizeof(kvmXCRs{})<<iocSizeShift | 0xa7
)

// ioctl issues a request whose argument is a plain integer, retrying EINTR:
// apart from KVM_RUN no KVM ioctl has a reason to surface an interruption,
// and Go's own preemption signal (SIGURG) can land on any thread at any time.
func ioctl(fd int, req, arg uintptr) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, arg)
		switch errno {
		case 0:
			return r, nil
		case unix.EINTR:
			continue
		default:
			return r, errno
		}
	}
}

// ioctlPtr is ioctl for requests whose argument points at Go memory. The
// pointer stays an unsafe.Pointer until the conversion inside the Syscall
// expression, which is the form the compiler keeps alive (and tracks across
// stack moves) for the duration of the call.
func ioctlPtr(fd int, req uintptr, arg unsafe.Pointer) (uintptr, error) {
	for {
		r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
		switch errno {
		case 0:
			return r, nil
		case unix.EINTR:
			continue
		default:
			return r, errno
		}
	}
}

// flexBuf allocates one 8-byte-aligned buffer holding a header H followed by
// n elements E, the shape of every C struct ending in a flexible array
// (kvm_cpuid2, kvm_msrs, kvm_irq_routing, ...). The buffer is a Go heap
// object, so it never moves while the kernel reads or writes it.
func flexBuf[H, E any](n int) (*H, []E, unsafe.Pointer) {
	var h H
	var e E
	size := unsafe.Sizeof(h) + uintptr(n)*unsafe.Sizeof(e)
	words := make([]uint64, (size+7)/8)
	base := unsafe.Pointer(&words[0])
	if n == 0 {
		// No element pointer: it would point one past the allocation.
		return (*H)(base), nil, base
	}
	elems := unsafe.Slice((*E)(unsafe.Add(base, unsafe.Sizeof(h))), n)
	return (*H)(base), elems, base
}

// heapInt32 returns a pointer to a heap copy of v. Kernel structs that carry
// a user address (kvm_device_attr.addr) hide the pointer from the compiler,
// so the pointee must not live on a goroutine stack that could move; a
// pointer returned from a non-inlined function always escapes to the heap.
//
//go:noinline
func heapInt32(v int32) *int32 {
	p := new(int32)
	*p = v
	return p
}
