package uapi

import (
	"sync/atomic"
	"unsafe"
)

// kvmRunExitOffset is the offset of kvm_run's exit union.
const kvmRunExitOffset = unsafe.Sizeof(kvmRunHeader{})

// Run is a view of a vCPU's mmapped struct kvm_run. Accessors read and write
// the shared page in place and allocate nothing; the exit-union accessors
// are only meaningful for the matching ExitReason and are only read by the
// vCPU's own thread between KVM_RUN calls.
type Run struct {
	mem []byte        // the whole mapping (kvm_run, PIO data page, ...)
	hdr *kvmRunHeader // &mem[0]
}

// newRun wraps a kvm_run mapping. The caller guarantees len(mem) >=
// minRunMapping (CreateVM checks the kernel's size) and 8-byte alignment.
func newRun(mem []byte) Run {
	if len(mem) < minRunMapping {
		return Run{}
	}
	return Run{mem: mem, hdr: (*kvmRunHeader)(unsafe.Pointer(&mem[0]))}
}

// exitUnion returns a pointer to the exit union viewed as T. Every T used
// here is at most kvmRunUnionSize bytes (checked by abi_test.go), and the
// mapping is at least minRunMapping bytes, so the view never leaves it.
func exitUnion[T any](r *Run) *T {
	return (*T)(unsafe.Pointer(&r.mem[kvmRunExitOffset]))
}

// ExitReason returns kvm_run.exit_reason.
func (r *Run) ExitReason() ExitReason { return ExitReason(r.hdr.ExitReason) }

// immediateExitWord is the 32-bit word holding request_interrupt_window
// (byte 0) and immediate_exit (byte 1) on little-endian x86.
func (r *Run) immediateExitWord() *uint32 { return (*uint32)(unsafe.Pointer(r.hdr)) }

// SetImmediateExit sets or clears kvm_run.immediate_exit. Safe to call from
// another thread to kick the vCPU: with it set, a KVM_RUN that has not yet
// entered the guest returns EINTR at once, closing the race a signal alone
// would leave. The update is an atomic OR/AND on the containing word so it
// cannot clobber request_interrupt_window written by the vCPU thread.
func (r *Run) SetImmediateExit(on bool) {
	if on {
		atomic.OrUint32(r.immediateExitWord(), 1<<8)
	} else {
		atomic.AndUint32(r.immediateExitWord(), ^uint32(1<<8))
	}
}

// ImmediateExit reports whether kvm_run.immediate_exit is set.
func (r *Run) ImmediateExit() bool {
	return atomic.LoadUint32(r.immediateExitWord())&(1<<8) != 0
}

// SetRequestInterruptWindow sets kvm_run.request_interrupt_window, asking
// KVM to exit (ExitIRQWindowOpen) once the guest can take an interrupt;
// only useful without the in-kernel irqchip. vCPU thread only.
func (r *Run) SetRequestInterruptWindow(on bool) {
	if on {
		atomic.OrUint32(r.immediateExitWord(), 1)
	} else {
		atomic.AndUint32(r.immediateExitWord(), ^uint32(1))
	}
}

// ReadyForInterruptInjection returns kvm_run.ready_for_interrupt_injection.
func (r *Run) ReadyForInterruptInjection() bool { return r.hdr.ReadyForInterruptInjection != 0 }

// IFFlag returns kvm_run.if_flag, the guest's RFLAGS.IF at exit.
func (r *Run) IFFlag() bool { return r.hdr.IFFlag != 0 }

// IO decodes a KVM_EXIT_IO: the port, direction, access size in bytes, the
// repeat count (string I/O) and the size*count data bytes, which live in
// the mapping at data_offset. For an IN the caller fills data; for an OUT
// it reads it. An offset or length outside the mapping yields nil data
// rather than a panic.
func (r *Run) IO() (port uint16, isOut bool, size int, count uint32, data []byte) {
	io := exitUnion[kvmRunIO](r)
	port, isOut, size, count = io.Port, io.Direction == IOOut, int(io.Size), io.Count
	off := io.DataOffset
	n := uint64(io.Size) * uint64(io.Count) // at most 255 * (2^32-1): no overflow
	if limit := uint64(len(r.mem)); off <= limit && n <= limit-off {
		data = r.mem[off : off+n : off+n]
	}
	return port, isOut, size, count, data
}

// MMIO decodes a KVM_EXIT_MMIO: the guest-physical address, direction and
// the data bytes (len clamped to 8), which alias kvm_run so a read's value
// is written in place before the next Run.
func (r *Run) MMIO() (addr uint64, isWrite bool, data []byte) {
	m := exitUnion[kvmRunMMIO](r)
	n := min(m.Len, uint32(len(m.Data)))
	return m.PhysAddr, m.IsWrite != 0, m.Data[:n:n]
}

// InternalError decodes a KVM_EXIT_INTERNAL_ERROR: the suberror
// (InternalError*) and a copy of its ndata (clamped to 16) debug words.
func (r *Run) InternalError() (suberror uint32, data []uint64) {
	ie := exitUnion[kvmRunInternal](r)
	n := min(ie.NData, uint32(len(ie.Data)))
	return ie.Suberror, append([]uint64(nil), ie.Data[:n]...)
}

// FailEntry decodes a KVM_EXIT_FAIL_ENTRY: the hardware VM-entry failure
// reason (VMX exit reason / SVM exit code) and the host CPU it ran on.
func (r *Run) FailEntry() (hardwareReason uint64, cpu uint32) {
	f := exitUnion[kvmRunFailEntry](r)
	return f.HardwareEntryFailureReason, f.CPU
}

// HardwareExitReason decodes a KVM_EXIT_UNKNOWN: the raw hardware exit reason.
func (r *Run) HardwareExitReason() uint64 { return exitUnion[kvmRunHW](r).HardwareExitReason }

// Exception decodes a KVM_EXIT_EXCEPTION: vector and error code.
func (r *Run) Exception() (vector, errorCode uint32) {
	e := exitUnion[kvmRunEx](r)
	return e.Exception, e.ErrorCode
}

// SystemEvent decodes a KVM_EXIT_SYSTEM_EVENT: the type (SystemEvent*) and
// how many data words follow (SystemEventData).
func (r *Run) SystemEvent() (typ uint32, ndata uint32) {
	s := exitUnion[kvmRunSystemEvent](r)
	return s.Type, s.NData
}

// SystemEventData returns data word i of a KVM_EXIT_SYSTEM_EVENT, or 0 when
// i is beyond the union's 16 words.
func (r *Run) SystemEventData(i int) uint64 {
	s := exitUnion[kvmRunSystemEvent](r)
	if i < 0 || i >= len(s.Data) {
		return 0
	}
	return s.Data[i]
}
