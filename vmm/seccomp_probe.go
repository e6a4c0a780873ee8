//go:build integration

package vmm

import "golang.org/x/sys/unix"

// SeccompProbeSyscall is the syscall SetVCPUSeccompProbe makes: unlinkat of
// a path that does not exist, allowed by the process filter (the journal's
// teardown removes files) but not on a vCPU thread, so only the stacked
// vCPU filter can stop it, and harmless should it run.
const SeccompProbeSyscall = unix.SYS_UNLINKAT

// SetVCPUSeccompProbe makes each vCPU thread of VMs run afterwards call
// unlinkat right after its seccomp filter is installed, before its first
// KVM_RUN: with Config.Seccomp on, the process dies of SIGSYS there. It
// exists only in integration test builds (build tag integration), so the
// hpcvmm command has no way to trigger it.
func SetVCPUSeccompProbe() {
	vcpuSeccompProbe = func(int) {
		_ = unix.Unlinkat(unix.AT_FDCWD, "/nonexistent-hpcvmm-seccomp-probe", 0)
	}
}
