package vmm

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/seccomp"
)

// SeccompMode selects the syscall filters Run installs (package seccomp).
type SeccompMode string

// The seccomp modes.
const (
	// SeccompOff installs no filter: the zero value, because a filter is
	// for the life of the process and a program that does more than run
	// one VM (tests, a soak loop creating VMs) would be killed by it. The
	// hpcvmm command turns it on (--seccomp, default on).
	SeccompOff SeccompMode = "off"
	// SeccompOn installs the allow-lists before the first KVM_RUN: the
	// process filter on every thread, the stricter vCPU filter on each
	// vCPU thread. A syscall outside them kills the process with SIGSYS;
	// the kernel's audit line in dmesg names it and the thread.
	SeccompOn SeccompMode = "on"
	// SeccompLog installs the same filters but lets a syscall outside them
	// run and has the kernel log it: how the missing syscalls of a new
	// setup are found.
	SeccompLog SeccompMode = "log"
)

// enabled reports whether Run installs filters, and in which mode.
func (m SeccompMode) enabled() (seccomp.Mode, bool) {
	switch m {
	case SeccompOn:
		return seccomp.Kill, true
	case SeccompLog:
		return seccomp.Log, true
	}
	return 0, false
}

// validSeccomp reports whether m is one of the modes ("" is SeccompOff).
func validSeccomp(m SeccompMode) bool {
	switch m {
	case "", SeccompOff, SeccompOn, SeccompLog:
		return true
	}
	return false
}

// installProcessFilter puts the process-wide filter on every thread (the
// Go runtime's included, by TSYNC). Run calls it after setup and before
// any vCPU thread starts: the vCPU filters stack on it, and TSYNC fails
// once a thread has a filter of its own.
func (vm *VM) installProcessFilter() error {
	mode, on := vm.cfg.Seccomp.enabled()
	if !on {
		return nil
	}
	// What the run writes after this is opened now: the filter refuses
	// opens for writing. The sockets it uses are open already (the
	// rtnetlink socket of the InfiniBand VFs' restore): the filter has no
	// socket(2), and allows requests on those alone.
	if err := vm.prepareRestore(); err != nil {
		return fmt.Errorf("vmm: open the sysfs attributes and the journal that give the devices back at the end, before the seccomp filter: %w", err)
	}
	if err := seccomp.InstallProcess(mode, vm.filterSockets()...); err != nil {
		return fmt.Errorf("vmm: %w (--seccomp=off runs without filters)", err)
	}
	vm.log.Info("seccomp: process filter on every thread; vCPU threads add their own before the first KVM_RUN",
		"mode", string(vm.cfg.Seccomp), "process_syscalls", len(seccomp.Allowed(seccomp.Process)),
		"vcpu_syscalls", len(seccomp.Allowed(seccomp.VCPU)),
		"on_violation", "SIGSYS; dmesg shows 'audit: type=1326 ... syscall=N'")
	return nil
}

// installFilter stacks the vCPU filter on the calling vCPU thread, which
// is locked to its goroutine for good (see seccomp.InstallThread).
func (v *vcpu) installFilter() error {
	mode, on := v.vm.cfg.Seccomp.enabled()
	if !on {
		return nil
	}
	if err := seccomp.InstallThread(seccomp.VCPU, mode); err != nil {
		return fmt.Errorf("vCPU %d: %w", v.index, err)
	}
	if vcpuSeccompProbe != nil {
		vcpuSeccompProbe(v.index)
	}
	return nil
}

// vcpuSeccompProbe, when non-nil, runs on each vCPU thread right after its
// filter is in place, before the first KVM_RUN. Only test builds set it
// (seccomp_probe.go, build tag integration), to make a forbidden syscall
// there and show the kill; nothing in the hpcvmm command can.
var vcpuSeccompProbe func(vcpu int)
