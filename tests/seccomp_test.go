//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/seccomp"
	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// seccompProbeKernelEnv tells TestSeccompProbeChild, run in a child of the
// test binary, which kernel to build its VM with; without it that test
// does nothing.
const seccompProbeKernelEnv = "HPCVMM_SECCOMP_PROBE_KERNEL"

// TestForbiddenSyscallOnVCPUThreadKills runs a VM through the Go API, with
// the filters on and the test build's probe making unlinkat (allowed by the
// process filter, not by the vCPU one) on the vCPU thread before its first
// KVM_RUN, in a child process: the child dies of SIGSYS, and the kernel's
// audit line names the syscall and the vcpu0 thread.
func TestForbiddenSyscallOnVCPUThreadKills(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSeccompProbeChild$", "-test.v")
		cmd.Env = append(os.Environ(), seccompProbeKernelEnv+"="+env.L2Kernel(t))
		out, _ := cmd.CombinedOutput()
		ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
		require.True(t, ok)
		require.True(t, ws.Signaled(), "the child was not killed by a signal (%v):\n%s", cmd.ProcessState, out)
		require.Equal(t, syscall.SIGSYS, ws.Signal(), "the child's signal:\n%s", out)
		assert.Contains(t, string(out), "seccomp: process filter on every thread", "the child's log")
		assert.NotContains(t, string(out), "INFO first KVM_RUN", "the child's log: the probe runs before it")

		var vs []seccomp.Violation
		for deadline := time.Now().Add(5 * time.Second); len(vs) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var err error
			vs, err = seccomp.KernelViolations(cmd.Process.Pid)
			require.NoError(t, err)
		}
		require.NotEmpty(t, vs, "no seccomp audit line for pid %d in the kernel log", cmd.Process.Pid)
		assert.Equal(t, seccomp.Name(vmm.SeccompProbeSyscall), vs[0].Name, "%v", vs[0])
		assert.Equal(t, "vcpu0", vs[0].Comm, "%v", vs[0])
		assert.True(t, vs[0].Killed, "%v", vs[0])
		env.Record(t, "seccomp_violation", strings.ReplaceAll(vs[0].String(), " ", "_"))
	})
}

// TestSeccompProbeChild is the child of TestForbiddenSyscallOnVCPUThreadKills:
// it returns at once unless that test started it.
func TestSeccompProbeChild(t *testing.T) {
	kernel := os.Getenv(seccompProbeKernelEnv)
	if kernel == "" {
		return
	}
	cfg := vmm.DefaultConfig()
	cfg.Kernel, cfg.Cmdline = kernel, "console=ttyS0 reboot=k panic=-1"
	cfg.Memory, cfg.HugePages, cfg.Console = 128<<20, guestmem.Page4K, vmm.ConsoleNone
	cfg.Seccomp = vmm.SeccompOn
	if os.Getenv(seccompProbeModeEnv) == "log" {
		// TestSeccompLogReportsNothing's control: the probe's syscall
		// runs, is logged, and the VM goes on to its end.
		cfg.Seccomp = vmm.SeccompLog
	}
	vmm.SetVCPUSeccompProbe()
	vm, err := vmm.New(cfg)
	require.NoError(t, err)
	defer vm.Close()
	err = vm.Run(context.Background())
	if cfg.Seccomp == vmm.SeccompLog {
		return // however the kernel without an initrd ended
	}
	t.Fatalf("Run returned (%v): the probe's syscall on the vCPU thread did not kill the process", err)
}

// requireAllThreadsFiltered checks, while hpcvmm runs, that every one of
// its threads is under a seccomp filter (Seccomp: 2 in its status) and
// that its vCPU threads carry the stacked vCPU filter as well.
func requireAllThreadsFiltered(t *testing.T, env *harness.Env, pid int) {
	t.Helper()
	threads, err := seccomp.Threads("/proc", pid)
	require.NoError(t, err)
	require.NotEmpty(t, threads)
	vcpus := 0
	for _, th := range threads {
		assert.Equal(t, 2, th.Mode, "Seccomp: of thread %d (%s) in /proc/%d/task", th.TID, th.Comm, pid)
		want := 1
		if strings.HasPrefix(th.Comm, "vcpu") {
			want, vcpus = 2, vcpus+1
		}
		assert.Equal(t, want, th.Filters, "Seccomp_filters: of thread %d (%s)", th.TID, th.Comm)
	}
	env.Record(t, "seccomp_filtered_threads", fmt.Sprintf("%d_of_%d_(%d_vcpu)", len(threads), len(threads), vcpus))
}
