package uapi

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VCPU is a virtual CPU fd plus its mmapped kvm_run. Run it from one OS
// thread (runtime.LockOSThread) so a signal sent to that thread interrupts
// KVM_RUN.
type VCPU struct {
	// ID is the vCPU id passed to KVM_CREATE_VCPU (the initial APIC ID).
	ID  int
	fd  int
	run Run
}

// errRunInterrupted is returned by Run on EINTR. It is built once so the
// kick path (a signal while in the guest) allocates nothing.
var errRunInterrupted error = fmt.Errorf("kvm: KVM_RUN interrupted: %w", unix.EINTR)

// FD returns the vCPU file descriptor.
func (c *VCPU) FD() int { return c.fd }

// Close unmaps kvm_run and closes the vCPU fd. No other goroutine may use
// c or its Run (including SetImmediateExit) during or after Close.
func (c *VCPU) Close() error {
	if c.fd < 0 {
		return nil
	}
	var errs []error
	if c.run.mem != nil {
		if err := unix.Munmap(c.run.mem); err != nil {
			errs = append(errs, fmt.Errorf("munmap kvm_run: %w", err))
		}
		c.run = Run{}
	}
	if err := unix.Close(c.fd); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	c.fd = -1
	if len(errs) > 0 {
		return fmt.Errorf("kvm: close vcpu %d: %v", c.ID, errs)
	}
	return nil
}

// Run is one KVM_RUN: it returns when the vCPU exits to userspace, with the
// reason in RunData(). An interruption (a signal, or SetImmediateExit) is
// returned as an error wrapping unix.EINTR and is deliberately not retried,
// so the caller can look for a stop request; clear immediate_exit before
// running again. Run allocates nothing on success or EINTR.
func (c *VCPU) Run() error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(c.fd), kvmRun, 0)
	switch errno {
	case 0:
		return nil
	case unix.EINTR:
		return errRunInterrupted
	default:
		return fmt.Errorf("kvm: KVM_RUN (vcpu %d): %w", c.ID, errno)
	}
}

// RunData returns the vCPU's shared kvm_run page.
func (c *VCPU) RunData() *Run { return &c.run }

// GetRegs is KVM_GET_REGS.
func (c *VCPU) GetRegs() (Regs, error) {
	var r Regs
	if _, err := ioctlPtr(c.fd, kvmGetRegs, unsafe.Pointer(&r)); err != nil {
		return Regs{}, fmt.Errorf("kvm: KVM_GET_REGS (vcpu %d): %w", c.ID, err)
	}
	return r, nil
}

// SetRegs is KVM_SET_REGS.
func (c *VCPU) SetRegs(r Regs) error {
	if _, err := ioctlPtr(c.fd, kvmSetRegs, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_REGS (vcpu %d, rip %#x): %w", c.ID, r.RIP, err)
	}
	return nil
}

// GetSregs is KVM_GET_SREGS.
func (c *VCPU) GetSregs() (Sregs, error) {
	var s Sregs
	if _, err := ioctlPtr(c.fd, kvmGetSregs, unsafe.Pointer(&s)); err != nil {
		return Sregs{}, fmt.Errorf("kvm: KVM_GET_SREGS (vcpu %d): %w", c.ID, err)
	}
	return s, nil
}

// SetSregs is KVM_SET_SREGS.
func (c *VCPU) SetSregs(s Sregs) error {
	if _, err := ioctlPtr(c.fd, kvmSetSregs, unsafe.Pointer(&s)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_SREGS (vcpu %d, cr0 %#x, cr4 %#x, efer %#x): %w", c.ID, s.CR0, s.CR4, s.EFER, err)
	}
	return nil
}

// GetFPU is KVM_GET_FPU. KVM's handler does not copy MXCSR, so FPU.MXCSR
// reads back as 0 whatever the guest's value; XSAVE state has the real one.
func (c *VCPU) GetFPU() (FPU, error) {
	var f FPU
	if _, err := ioctlPtr(c.fd, kvmGetFPU, unsafe.Pointer(&f)); err != nil {
		return FPU{}, fmt.Errorf("kvm: KVM_GET_FPU (vcpu %d): %w", c.ID, err)
	}
	return f, nil
}

// SetFPU is KVM_SET_FPU: x87 control/status/tag words, x87 and XMM
// registers. FPU.MXCSR is passed along for completeness, but KVM's
// handlers do not copy MXCSR in either direction; that is harmless for
// boot because a vCPU's reset MXCSR is already the default 0x1f80.
func (c *VCPU) SetFPU(f FPU) error {
	if _, err := ioctlPtr(c.fd, kvmSetFPU, unsafe.Pointer(&f)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_FPU (vcpu %d, fcw %#x, mxcsr %#x): %w", c.ID, f.FCW, f.MXCSR, err)
	}
	return nil
}

// CPUIDEntry is one CPUID leaf (struct kvm_cpuid_entry2 without padding).
type CPUIDEntry struct {
	Function, Index, Flags uint32
	EAX, EBX, ECX, EDX     uint32
}

// SetCPUID2 is KVM_SET_CPUID2: the CPUID leaves the guest sees. Must be
// called before the vCPU first runs.
func (c *VCPU) SetCPUID2(entries []CPUIDEntry) error {
	if len(entries) > maxCPUIDEntries {
		return fmt.Errorf("kvm: KVM_SET_CPUID2 (vcpu %d): %d entries, more than %d", c.ID, len(entries), maxCPUIDEntries)
	}
	hdr, ents, p := flexBuf[kvmCPUID2, kvmCPUIDEntry2](len(entries))
	hdr.Nent = uint32(len(entries))
	for i, e := range entries {
		ents[i] = kvmCPUIDEntry2{Function: e.Function, Index: e.Index, Flags: e.Flags,
			EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
	}
	if _, err := ioctlPtr(c.fd, kvmSetCPUID2, p); err != nil {
		return fmt.Errorf("kvm: KVM_SET_CPUID2 (vcpu %d, %d entries): %w", c.ID, len(entries), err)
	}
	return nil
}

// GetCPUID2 is KVM_GET_CPUID2: the CPUID leaves the vCPU was given (as KVM
// keeps them after KVM_SET_CPUID2), so tests can check what a guest sees.
func (c *VCPU) GetCPUID2() ([]CPUIDEntry, error) {
	for n := 256; n <= maxCPUIDEntries; n *= 2 {
		hdr, ents, p := flexBuf[kvmCPUID2, kvmCPUIDEntry2](n)
		hdr.Nent = uint32(n)
		_, err := ioctlPtr(c.fd, kvmGetCPUID2, p)
		if errors.Is(err, unix.E2BIG) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kvm: KVM_GET_CPUID2 (vcpu %d, %d entries): %w", c.ID, n, err)
		}
		out := make([]CPUIDEntry, min(int(hdr.Nent), n))
		for i := range out {
			e := &ents[i]
			out[i] = CPUIDEntry{Function: e.Function, Index: e.Index, Flags: e.Flags,
				EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
		}
		return out, nil
	}
	return nil, fmt.Errorf("kvm: KVM_GET_CPUID2 (vcpu %d): more than %d entries: %w", c.ID, maxCPUIDEntries, unix.E2BIG)
}

// MSREntry is one model-specific register (struct kvm_msr_entry).
type MSREntry struct {
	Index uint32
	Data  uint64
}

// maxMSRs bounds a KVM_GET/SET_MSRS batch (the kernel's limit is
// KVM_MAX_MSR_ENTRIES = 256 per call on older kernels).
const maxMSRs = 4096

// SetMSRs is KVM_SET_MSRS. The kernel stops at the first MSR it refuses and
// returns how many it set, so a short count is reported as an error naming
// that MSR.
func (c *VCPU) SetMSRs(entries []MSREntry) error {
	n, err := c.msrs(kvmSetMSRs, entries)
	if err != nil {
		return fmt.Errorf("kvm: KVM_SET_MSRS (vcpu %d, %d msrs): %w", c.ID, len(entries), err)
	}
	if n < len(entries) {
		e := entries[n]
		return fmt.Errorf("kvm: KVM_SET_MSRS (vcpu %d): set %d of %d msrs, MSR %#x (value %#x) was refused", c.ID, n, len(entries), e.Index, e.Data)
	}
	return nil
}

// GetMSRs is KVM_GET_MSRS: fills entries[i].Data for each entries[i].Index,
// reporting the first MSR the kernel could not read as an error.
func (c *VCPU) GetMSRs(entries []MSREntry) error {
	n, err := c.msrs(kvmGetMSRs, entries)
	if err != nil {
		return fmt.Errorf("kvm: KVM_GET_MSRS (vcpu %d, %d msrs): %w", c.ID, len(entries), err)
	}
	if n < len(entries) {
		return fmt.Errorf("kvm: KVM_GET_MSRS (vcpu %d): read %d of %d msrs, MSR %#x was refused", c.ID, n, len(entries), entries[n].Index)
	}
	return nil
}

// msrs runs KVM_GET_MSRS or KVM_SET_MSRS over entries, copying Data back
// for the ones processed, and returns the kernel's processed count.
func (c *VCPU) msrs(req uintptr, entries []MSREntry) (int, error) {
	if len(entries) > maxMSRs {
		return 0, fmt.Errorf("more than %d msrs in one call", maxMSRs)
	}
	hdr, ents, p := flexBuf[kvmMSRs, kvmMSREntry](len(entries))
	hdr.NMSRs = uint32(len(entries))
	for i, e := range entries {
		ents[i] = kvmMSREntry{Index: e.Index, Data: e.Data}
	}
	r, err := ioctlPtr(c.fd, req, p)
	if err != nil {
		return 0, err
	}
	n := min(int(r), len(entries))
	for i := range n {
		entries[i].Data = ents[i].Data
	}
	return n, nil
}

// GetLAPIC is KVM_GET_LAPIC (requires the in-kernel irqchip).
func (c *VCPU) GetLAPIC() (LAPICState, error) {
	var s LAPICState
	if _, err := ioctlPtr(c.fd, kvmGetLAPIC, unsafe.Pointer(&s)); err != nil {
		return LAPICState{}, fmt.Errorf("kvm: KVM_GET_LAPIC (vcpu %d): %w", c.ID, err)
	}
	return s, nil
}

// SetLAPIC is KVM_SET_LAPIC (requires the in-kernel irqchip).
func (c *VCPU) SetLAPIC(s LAPICState) error {
	if _, err := ioctlPtr(c.fd, kvmSetLAPIC, unsafe.Pointer(&s)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_LAPIC (vcpu %d): %w", c.ID, err)
	}
	return nil
}

// GetMPState is KVM_GET_MP_STATE (MPState* values).
func (c *VCPU) GetMPState() (uint32, error) {
	var s kvmMPState
	if _, err := ioctlPtr(c.fd, kvmGetMPState, unsafe.Pointer(&s)); err != nil {
		return 0, fmt.Errorf("kvm: KVM_GET_MP_STATE (vcpu %d): %w", c.ID, err)
	}
	return s.MPState, nil
}

// SetMPState is KVM_SET_MP_STATE, e.g. MPStateUninitialized to hold an AP
// until the BSP sends INIT/SIPI, or MPStateRunnable to start it directly.
func (c *VCPU) SetMPState(state uint32) error {
	s := kvmMPState{MPState: state}
	if _, err := ioctlPtr(c.fd, kvmSetMPState, unsafe.Pointer(&s)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_MP_STATE (vcpu %d, state %d): %w", c.ID, state, err)
	}
	return nil
}

// XCR0 is the index of XCR0 (XFEATURE_ENABLED_MASK) in KVM_GET/SET_XCRS.
const XCR0 = 0

// GetXCR0 is KVM_GET_XCRS, returning XCR0: the XSAVE state components the
// vCPU has enabled, as KVM tracks them.
func (c *VCPU) GetXCR0() (uint64, error) {
	var x kvmXCRs
	if _, err := ioctlPtr(c.fd, kvmGetXCRs, unsafe.Pointer(&x)); err != nil {
		return 0, fmt.Errorf("kvm: KVM_GET_XCRS (vcpu %d): %w", c.ID, err)
	}
	for _, r := range x.XCRs[:min(int(x.NrXCRs), kvmMaxXCRs)] {
		if r.XCR == XCR0 {
			return r.Value, nil
		}
	}
	return 0, fmt.Errorf("kvm: KVM_GET_XCRS (vcpu %d): no XCR0 among %d registers", c.ID, x.NrXCRs)
}

// SetXCR0 is KVM_SET_XCRS with XCR0 only. KVM accepts only values the
// vCPU's CPUID (leaf 0xD) allows, so call it after SetCPUID2; it also
// recomputes the XSAVE area sizes in CPUID leaf 0xD for the new value.
func (c *VCPU) SetXCR0(v uint64) error {
	x := kvmXCRs{NrXCRs: 1}
	x.XCRs[0] = kvmXCR{XCR: XCR0, Value: v}
	if _, err := ioctlPtr(c.fd, kvmSetXCRs, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_XCRS (vcpu %d, xcr0 %#x): %w", c.ID, v, err)
	}
	return nil
}

// NMI is KVM_NMI: queue a non-maskable interrupt (without an in-kernel
// LAPIC; with one, deliver NMIs through the LAPIC instead).
func (c *VCPU) NMI() error {
	if _, err := ioctl(c.fd, kvmNMI, 0); err != nil {
		return fmt.Errorf("kvm: KVM_NMI (vcpu %d): %w", c.ID, err)
	}
	return nil
}

// StatsFD is KVM_GET_STATS_FD on the vCPU: a read-only fd with its binary
// statistics (exit counts etc.). The error wraps ENOTTY or EINVAL on
// kernels without CapBinaryStatsFD.
func (c *VCPU) StatsFD() (int, error) {
	r, err := ioctl(c.fd, kvmGetStatsFD, 0)
	if err != nil {
		return -1, fmt.Errorf("kvm: KVM_GET_STATS_FD (vcpu %d): %w", c.ID, err)
	}
	return int(r), nil
}
