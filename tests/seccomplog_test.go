//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/seccomp"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// seccompProbeModeEnv makes TestSeccompProbeChild install the filters in
// log mode: the probe's syscall then runs and is logged.
const seccompProbeModeEnv = "HPCVMM_SECCOMP_PROBE_MODE"

// TestSeccompLogReportsNothing (issue 23): a VM with everything the lists
// must cover after setup, run with --seccomp=log, makes no syscall outside
// them and no call an argument rule refuses: passthrough (edu with its
// MSIs programmed by the guest; the NVMe VF taken from nvme with --bind-devices,
// so the journal's restore writes sysfs after the filter), virtio-net on a
// TAP with kernel vhost-net (opened, owned and its worker placed at
// DRIVER_OK), the virtio console on stdin/stdout. The kernel's log has no
// seccomp line for the process. As a control that log mode's lines do
// reach the kernel log here, a VM built through the Go API with the test
// build's vCPU probe (unlinkat, outside the vCPU list) in log mode runs on
// and the probe's line is there, not killing.
func TestSeccompLogReportsNothing(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.EduBDF, "vfio-pci")
		setDriver(t, harness.NVMeVFBDF, "nvme")
		t.Cleanup(func() {
			setDriver(t, harness.EduBDF, "")
			setDriver(t, harness.NVMeVFBDF, "")
		})
		journalsBefore := journals(t)
		vhost := "off"
		if _, err := os.Stat("/dev/vhost-net"); err == nil {
			vhost = "on"
		}
		env.Record(t, "vhost", vhost)

		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s console=hvc0 hpcvmm.pt=edu,edu_msi hpcvmm.dma_buf=%#x memmap=1M$%#x", ptBaseCmdline, eduDMABuf, eduDMABuf),
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--gpu", harness.EduBDF, "--vf", harness.NVMeVFBDF, "--bind-devices",
			"--net", "tap=hpvsc0,vhost="+vhost,
			"--console", "virtio",
			"--seccomp", "log",
		)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
		assert.Equal(t, "none", g["pt_failed"], "guest passthrough parts that failed")
		assert.Equal(t, "8", g["msi_counted"], "edu MSIs received")
		log := vm.Log()
		f := logRecord(log, "seccomp: process filter on every thread; vCPU threads add their own before the first KVM_RUN")
		require.NotNil(t, f, "hpcvmm did not log its filters")
		assert.Equal(t, "log", f["mode"])
		if vhost == "on" {
			assert.Contains(t, log, "vhost", "hpcvmm's log names vhost-net")
		}
		assert.Equal(t, "nvme", pciDriver(harness.NVMeVFBDF), "the VF's driver after the VM (the restore ran under the filter)")
		assert.Equal(t, journalsBefore, journals(t), "host-state journals after the VM ended")

		// The audit lines are printed some time after the syscall.
		time.Sleep(2 * time.Second)
		vs, err := seccomp.KernelViolations(vm.PID())
		require.NoError(t, err)
		var names []string
		for _, v := range vs {
			names = append(names, v.String())
		}
		assert.Empty(t, vs, "seccomp lines for hpcvmm (pid %d) in the kernel log:\n%s", vm.PID(), strings.Join(names, "\n"))
		env.Record(t, "seccomp_log_lines", strconv.Itoa(len(vs)))

		// The control: log mode's lines do reach this kernel log.
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSeccompProbeChild$", "-test.v")
		cmd.Env = append(os.Environ(), seccompProbeKernelEnv+"="+env.L2Kernel(t), seccompProbeModeEnv+"=log")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "the log-mode probe child:\n%s", out)
		var probe []seccomp.Violation
		for deadline := time.Now().Add(5 * time.Second); len(probe) == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			probe, err = seccomp.KernelViolations(cmd.Process.Pid)
			require.NoError(t, err)
		}
		require.NotEmpty(t, probe, "no seccomp line for the log-mode probe child (pid %d): log mode's lines do not reach this kernel log, so the empty log above proves nothing", cmd.Process.Pid)
		assert.Equal(t, "unlinkat", probe[0].Name, "%v", probe[0])
		assert.False(t, probe[0].Killed, "%v", probe[0])
		env.Record(t, "seccomp_log_control", strings.ReplaceAll(probe[0].String(), " ", "_"))
	})
}
