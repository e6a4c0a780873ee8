//go:build integration

package tests

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestL2TripleFaultRate is issue 36's experiment: trials of two L2 guests
// started at once (the MPI scenario's shape: one vCPU each, 256 MiB of 4
// KiB pages, the same stock kernel and initramfs, the boot scenario that
// powers off at its end), each trial once with hpcvmm (shared CPU mode)
// and once with QEMU (-accel kvm -cpu host, q35) as the control, in one
// L1 boot; each guest counted as done (the scenario's last marker), lost
// to a triple fault (hpcvmm: its KVM_EXIT_SHUTDOWN report; QEMU with
// -no-reboot: exited without the marker and without a kernel panic or
// reboot message), or hung (no end within 150 s; a boot takes 20-40 s). Run it by name,
// once per L1 CPU model or accelerator to compare (HPCVMM_L1_CPU, default
// max; HPCVMM_L1_ACCEL, default tcg), e.g.
//
//	HPCVMM_L1_CPU=max,la57=off HPCVMM_TRIALS=20 HPCVMM_L1_TIMEOUT=40m HPCVMM_TEST_WHERE=l1 \
//	  go test -tags integration -timeout 45m -run '^TestL2TripleFaultRate$' ./tests/
//
// docs/testbed.md has the numbers.
func TestL2TripleFaultRate(t *testing.T) {
	if !strings.Contains(flag.Lookup("test.run").Value.String(), "TestL2TripleFaultRate") {
		t.Skip("an experiment (minutes under emulation): run it by name")
	}
	harness.Run(t, harness.ProfileTripleFault, func(t *testing.T, env *harness.Env) {
		trials, _ := strconv.Atoi(os.Getenv("HPCVMM_TRIALS"))
		if trials <= 0 {
			trials = 20
		}
		const cmdline = "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot"
		const limit = 150 * time.Second
		counts := map[string]map[string]int{"hpcvmm": {}, "qemu": {}}
		for i := range trials {
			// hpcvmm: two at once.
			var vms [2]*harness.VMProcess
			for k := range vms {
				vms[k] = env.StartVM(t, "run", "--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
					"--cmdline", cmdline, "--cpus", "1", "--memory", "256M", "--hugepages", "none")
			}
			// A boot takes 20-40 s here: one not ended after limit is
			// hung, and is killed before the harness's own VM timeout
			// (which would fail the experiment).
			deadline := time.Now().Add(limit)
			for (!vms[0].Exited() || !vms[1].Exited()) && time.Now().Before(deadline) {
				time.Sleep(200 * time.Millisecond)
			}
			var killed [2]bool
			for k, vm := range vms {
				if !vm.Exited() {
					killed[k] = true
					_ = syscall.Kill(vm.PID(), syscall.SIGKILL)
				}
			}
			for k, vm := range vms {
				code := vm.Wait()
				out := "hung"
				switch {
				case killed[k]:
					t.Logf("trial %d hpcvmm guest %d: no end within %v\n%s", i, k, limit, vm.ConsoleTail(4))
				case code == 0 && strings.Contains(vm.Console(), "HPCVMM-GUEST-MARKER done"):
					out = "done"
				case strings.Contains(vm.Log(), "triple fault"):
					out = "triple-fault"
					t.Logf("trial %d hpcvmm guest %d: %s\nconsole tail:\n%s", i, k, grepLines(vm.Log(), "triple fault"), vm.ConsoleTail(3))
				default:
					out = "other"
					t.Logf("trial %d hpcvmm guest %d: exit %d\n%s", i, k, code, vm.ConsoleTail(8))
				}
				counts["hpcvmm"][out]++
			}
			// QEMU: two at once, the same guest.
			var wg sync.WaitGroup
			var outs [2]string
			for k := range outs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					outs[k] = runQEMUGuest(t, env, cmdline, limit, i, k)
				}()
			}
			wg.Wait()
			for _, o := range outs {
				counts["qemu"][o]++
			}
			t.Logf("after trial %d: hpcvmm %v qemu %v (%s)", i, counts["hpcvmm"], counts["qemu"], time.Now().Format(time.TimeOnly))
		}
		env.Record(t, "l1_cpu", harness.L1CPUModel())
		env.Record(t, "l1_accel", harness.L1Accel())
		for _, v := range []string{"hpcvmm", "qemu"} {
			c := counts[v]
			env.Record(t, v, fmt.Sprintf("done=%d triple_fault=%d hung=%d other=%d of %d", c["done"], c["triple-fault"], c["hung"], c["other"], 2*trials))
		}
	})
}

// runQEMUGuest boots the test bed's L2 guest under QEMU with KVM and says
// how it ended: done, triple-fault, hung or other.
func runQEMUGuest(t *testing.T, env *harness.Env, cmdline string, limit time.Duration, trial, k int) string {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, harness.L1QEMU, "-accel", "kvm", "-M", "q35", "-cpu", "host", "-smp", "1", "-m", "256M",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-serial", "stdio",
		"-kernel", env.L2Kernel(t), "-initrd", env.L2Initrd(t), "-append", cmdline)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	console := out.String()
	switch {
	case ctx.Err() != nil:
		t.Logf("trial %d qemu guest %d: no end\n%s", trial, k, harness.Tail(console, 4))
		return "hung"
	case err == nil && strings.Contains(console, "HPCVMM-GUEST-MARKER done"):
		return "done"
	case err == nil && !strings.Contains(console, "Kernel panic") && !strings.Contains(console, "reboot: Restarting"):
		// -no-reboot: QEMU exits on the guest's reset; a reset the
		// kernel did not ask for is a triple fault.
		t.Logf("trial %d qemu guest %d: reset without a panic or reboot (triple fault)\n%s", trial, k, harness.Tail(console, 3))
		return "triple-fault"
	default:
		t.Logf("trial %d qemu guest %d: %v\n%s", trial, k, err, harness.Tail(console, 8))
		return "other"
	}
}
