package vmm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// exitCounterSlots bounds the per-reason exit counters; KVM's exit reasons
// are small integers (below 64 on every kernel hpcvmm supports).
const exitCounterSlots = 64

// vcpu is one virtual CPU and the OS thread that runs it.
type vcpu struct {
	index   int
	hostCPU int // host CPU the thread is pinned to
	cpu     *uapi.VCPU
	run     *uapi.Run
	vm      *VM

	tid     atomic.Int32 // OS thread id while running, 0 before/after
	entered atomic.Bool  // true once the first KVM_RUN was issued

	// exits counts exits by KVM exit reason. Only the vCPU's own thread
	// writes it; it is read after the thread has finished.
	exits [exitCounterSlots]uint64
	// recent are its last exits, for the report of a triple fault; the
	// same thread writes it.
	recent recentExits
}

// errGuestReset ends Run without error: the guest asked for a reset
// (i8042 pulse or KVM_SYSTEM_EVENT_RESET), which for hpcvmm means the guest
// is done, like a reboot of a one-shot job.
var errGuestReset = errors.New("guest reset")

// errGuestPoweroff ends Run without error: the guest powered off.
var errGuestPoweroff = errors.New("guest powered off")

// errStopped is the reason when the VM was stopped from outside (context
// cancelled, signal).
var errStopped = errors.New("stopped")

// loop runs the vCPU on the calling goroutine's locked OS thread until the
// VM stops. It returns the reason this vCPU stopped the VM, or nil when it
// stopped because another vCPU or the host asked.
func (v *vcpu) loop() error {
	runtime.LockOSThread()
	// The thread is never unlocked: a thread whose affinity was changed
	// must not go back to the scheduler's pool (the runtime destroys it
	// when the goroutine exits while locked).
	var set unix.CPUSet
	set.Set(v.hostCPU)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("vCPU %d: pin to host CPU %d: sched_setaffinity: %w", v.index, v.hostCPU, err)
	}
	tid := unix.Gettid()
	v.tid.Store(int32(tid))
	defer v.tid.Store(0)
	// Name the thread so top, perf and the tests can tell vCPU threads
	// from the Go runtime's; a failure only costs that convenience. By
	// prctl, not by writing /proc/self/task/TID/comm: the process filter
	// is on already and refuses write-opens.
	_ = uapi.SetThreadName("vcpu" + strconv.Itoa(v.index))
	// The vCPU filter goes on here, once the thread is pinned and named
	// and before the first KVM_RUN; the thread stays locked until it
	// exits, so no other goroutine ever runs under it.
	if err := v.installFilter(); err != nil {
		return err
	}
	vm := v.vm
	if vm.stopping.Load() {
		return nil
	}
	if v.index == 0 {
		vm.noteFirstRun()
	}
	v.entered.Store(true)
	for {
		err := v.cpu.Run()
		if err != nil {
			if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
				// A signal (Go's preemption SIGURG, or our kick) or
				// immediate_exit: the guest state is intact.
				if vm.stopping.Load() {
					return nil
				}
				continue
			}
			// EFAULT: KVM found no host page behind a memslot,
			// as when the read-only image's file was truncated
			// under the running VM (pmem.go). The guest cannot
			// go on; Run says why (VM.guestMemoryFault).
			return fmt.Errorf("vCPU %d: %w", v.index, err)
		}
		reason := v.run.ExitReason()
		if uint32(reason) < exitCounterSlots {
			v.exits[reason]++
		}
		if stop := v.handleExit(reason); stop != nil {
			return stop
		}
		if vm.stopping.Load() {
			return nil
		}
	}
}

// handleExit services one exit. It must not allocate on the I/O and MMIO
// paths: they run once per guest device access. It returns non-nil to stop
// the VM.
func (v *vcpu) handleExit(reason uapi.ExitReason) error {
	vm := v.vm
	if reason != uapi.ExitIO && reason != uapi.ExitMMIO {
		v.recent.note(reason, 0, false, 0) // those two note their address below
	}
	switch reason {
	case uapi.ExitIO:
		port, isOut, size, count, data := v.run.IO()
		v.recent.note(reason, uint64(port), isOut, size)
		if size <= 0 || len(data) < size*int(count) {
			return fmt.Errorf("vCPU %d: malformed KVM_EXIT_IO (port %#x size %d count %d)", v.index, port, size, count)
		}
		for i := 0; i < int(count); i++ {
			chunk := data[i*size : (i+1)*size]
			if isOut {
				if !vm.dev.pio.Write(uint64(port), chunk) {
					vm.dev.unhandledPIO.Access(uint64(port), chunk, true)
				}
			} else if !vm.dev.pio.Read(uint64(port), chunk) {
				vm.dev.unhandledPIO.Access(uint64(port), chunk, false)
			}
		}
	case uapi.ExitMMIO:
		addr, isWrite, data := v.run.MMIO()
		v.recent.note(reason, addr, isWrite, len(data))
		if isWrite {
			if !vm.dev.mmio.Write(addr, data) {
				vm.dev.unhandledMMIO.Access(addr, data, true)
			}
		} else if !vm.dev.mmio.Read(addr, data) {
			vm.dev.unhandledMMIO.Access(addr, data, false)
		}
	case uapi.ExitHLT:
		// With the in-kernel LAPIC, HLT is handled inside KVM; an exit
		// here means the guest halted with no way to wake up.
		return fmt.Errorf("vCPU %d halted with interrupts disabled (KVM_EXIT_HLT)", v.index)
	case uapi.ExitShutdown:
		return fmt.Errorf("vCPU %d: guest triple fault (KVM_EXIT_SHUTDOWN)%s; %s; %s", v.index, v.shutdownSuffix(), v.recent.String(), traceHint)
	case uapi.ExitSystemEvent:
		typ, _ := v.run.SystemEvent()
		switch typ {
		case uapi.SystemEventShutdown:
			return errGuestPoweroff
		case uapi.SystemEventReset:
			return errGuestReset
		default:
			return fmt.Errorf("vCPU %d: KVM system event %d", v.index, typ)
		}
	case uapi.ExitFailEntry:
		hw, cpu := v.run.FailEntry()
		return fmt.Errorf("vCPU %d: KVM could not enter the guest (KVM_EXIT_FAIL_ENTRY, hardware reason %#x, host CPU %d)", v.index, hw, cpu)
	case uapi.ExitInternalError:
		sub, data := v.run.InternalError()
		return fmt.Errorf("vCPU %d: KVM internal error (suberror %d, data %#x)%s", v.index, sub, data, v.ripSuffix())
	case uapi.ExitIntr:
		// A signal arrived during the run; nothing to do.
	case uapi.ExitIRQWindowOpen:
		// Not requested by hpcvmm (the irqchip is in the kernel).
	default:
		return fmt.Errorf("vCPU %d: unexpected KVM exit %v%s", v.index, reason, v.ripSuffix())
	}
	return nil
}

// traceHint says how to see what userspace cannot: the exception that
// became a triple fault is handled inside KVM, so only the host's KVM
// trace events show it (and which guest RIP raised it), on any host.
const traceHint = "the host's KVM trace events show the faults that led to it: perf record -e kvm:kvm_exit -e kvm:kvm_inj_exception -e kvm:kvm_entry -p <hpcvmm pid>, then perf script (docs/running.md, \"A guest that triple-faults\")"

// resetVectorRIP is the RIP of a vCPU in its power-on state (CS base
// 0xffff0000 + 0xfff0).
const resetVectorRIP = 0xfff0

// shutdownSuffix describes where the guest was at a triple fault. KVM on
// AMD reinitialises the vCPU on a shutdown intercept (the VMCB is undefined
// after it), so there the registers read back are the reset values and
// the faulting RIP is gone; the message says so rather than report the
// reset vector as if the guest had failed there.
func (v *vcpu) shutdownSuffix() string {
	regs, err := v.cpu.GetRegs()
	if err != nil {
		return ""
	}
	if regs.RIP == resetVectorRIP {
		return " (registers already reset by KVM, as on AMD hosts: the faulting RIP is lost)"
	}
	return fmt.Sprintf(" at RIP %#x", regs.RIP)
}

// ripSuffix describes where the guest was, for fatal-exit messages.
func (v *vcpu) ripSuffix() string {
	regs, err := v.cpu.GetRegs()
	if err != nil {
		return ""
	}
	return fmt.Sprintf(" at RIP %#x", regs.RIP)
}

// kick forces the vCPU out of KVM_RUN: immediate_exit makes a KVM_RUN
// that has not started yet return at once, and SIGURG interrupts one in
// progress. SIGURG is the signal the Go runtime itself uses for preemption,
// so it is already handled on every thread and harmless.
func (v *vcpu) kick() {
	v.run.SetImmediateExit(true)
	if tid := v.tid.Load(); tid != 0 {
		_ = unix.Tgkill(unix.Getpid(), int(tid), unix.SIGURG)
	}
}

// lapic register offsets and the delivery modes Linux expects on the local
// interrupt pins of a PC: LINT0 wired to the 8259's ExtINT, LINT1 to NMI.
const (
	lapicLVT0         = 0x350
	lapicLVT1         = 0x360
	lapicDeliveryMask = 0x700
	lapicDeliveryExt  = 0x700
	lapicDeliveryNMI  = 0x400
)

func setLocalInterruptPins(c *uapi.VCPU) error {
	st, err := c.GetLAPIC()
	if err != nil {
		return err
	}
	lvt0 := binary.LittleEndian.Uint32(st[lapicLVT0:])
	lvt1 := binary.LittleEndian.Uint32(st[lapicLVT1:])
	binary.LittleEndian.PutUint32(st[lapicLVT0:], lvt0&^lapicDeliveryMask|lapicDeliveryExt)
	binary.LittleEndian.PutUint32(st[lapicLVT1:], lvt1&^lapicDeliveryMask|lapicDeliveryNMI)
	return c.SetLAPIC(st)
}
