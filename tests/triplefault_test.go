//go:build integration

package tests

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestL2TripleFaultRate is issue 36's experiment: trials of two L2 guests
// started at once (the MPI scenario's shape: one vCPU each, shared mode,
// 4 KiB pages, the same stock kernel and initramfs), counting the guests
// that triple-fault, hang or boot to their end. Run it by name, once per
// L1 CPU model to compare (HPCVMM_L1_CPU, default max), e.g.
//
//	HPCVMM_L1_CPU=max,la57=off HPCVMM_TRIALS=20 HPCVMM_L1_TIMEOUT=30m HPCVMM_TEST_WHERE=l1 \
//	  go test -tags integration -timeout 40m -run '^TestL2TripleFaultRate$' ./tests/
//
// It records ok/lost/other per trial set; docs/testbed.md has the numbers.
func TestL2TripleFaultRate(t *testing.T) {
	inside := os.Getenv("HPCVMM_TEST_WHERE") == "inside"
	if !inside && os.Getenv(longEnv) != "1" && !strings.Contains(flag.Lookup("test.run").Value.String(), "TestL2TripleFaultRate") ||
		inside && !strings.Contains(flag.Lookup("test.run").Value.String(), "TestL2TripleFaultRate") {
		t.Skip("an experiment (minutes under emulation): run it by name")
	}
	harness.Run(t, harness.ProfileCores, func(t *testing.T, env *harness.Env) {
		trials, _ := strconv.Atoi(os.Getenv("HPCVMM_TRIALS"))
		if trials <= 0 {
			trials = 20
		}
		var ok, lost, other int
		for i := range trials {
			var vms [2]*harness.VMProcess
			for k := range vms {
				vms[k] = env.StartVM(t, "run",
					"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
					"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot",
					"--cpus", "1", "--memory", "256M", "--hugepages", "none")
			}
			for k, vm := range vms {
				code := vm.Wait()
				switch {
				case code == 0:
					ok++
				case strings.Contains(vm.Log(), "triple fault"):
					lost++
					t.Logf("trial %d guest %d: %s\nconsole tail:\n%s", i, k, grepLines(vm.Log(), "triple fault"), vm.ConsoleTail(3))
				default:
					other++
					t.Logf("trial %d guest %d: exit %d\n%s", i, k, code, vm.ConsoleTail(8))
				}
			}
			t.Logf("after trial %d: ok=%d lost=%d other=%d (%s)", i, ok, lost, other, time.Now().Format(time.TimeOnly))
		}
		env.Record(t, "l1_cpu", harness.L1CPUModel())
		env.Record(t, "guests", fmt.Sprintf("ok=%d lost=%d other=%d of %d", ok, lost, other, 2*trials))
	})
}
