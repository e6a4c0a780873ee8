//go:build integration

package tests

import (
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestBootStockKernel boots Debian's unmodified linux-image-amd64 with
// `hpcvmm run` on real KVM, with 1 and 4 vCPUs, and checks from inside the
// guest that every vCPU came online, that the guest sees the RAM it was
// given, that the stock modules load, and that the guest's reboot ends
// hpcvmm with exit status 0.
func TestBootStockKernel(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		const memMiB = 512
		for _, cpus := range []int{1, 4} {
			t.Run(fmt.Sprintf("cpus=%d", cpus), func(t *testing.T) {
				start := time.Now()
				vm := env.StartVM(t, "run",
					"--kernel", env.L2Kernel(t),
					"--initrd", env.L2Initrd(t),
					"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot",
					"--cpus", strconv.Itoa(cpus),
					"--memory", fmt.Sprintf("%dM", memMiB),
					"--hugepages", "none",
				)
				_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER init-started", 3*time.Minute)
				require.True(t, ok, "the guest's /init never started")
				env.Record(t, "init_started_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))

				require.Equal(t, 0, vm.Wait(), "hpcvmm exit status after the guest rebooted")
				env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))

				g := vm.GuestResults()
				require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
				assert.Equal(t, strconv.Itoa(cpus), g["cpus_online"], "online CPUs seen by the guest (list %q)", g["cpus_online_list"])
				assert.Equal(t, strconv.Itoa(cpus), g["nproc"])
				assert.Equal(t, "none", g["modules_failed"], "stock kernel modules that failed to load in the guest")

				memKiB, err := strconv.Atoi(g["memtotal_kib"])
				require.NoError(t, err, "memtotal_kib=%q", g["memtotal_kib"])
				// MemTotal excludes the kernel image, reserved ranges and
				// the initramfs, but never exceeds the RAM given, and a
				// 512 MiB guest keeps well over three quarters of it.
				assert.LessOrEqual(t, memKiB, memMiB*1024, "guest MemTotal above the configured RAM")
				assert.Greater(t, memKiB, memMiB*1024*3/4, "guest MemTotal far below the configured RAM")
				env.Record(t, "cpus_online", g["cpus_online"])
				env.Record(t, "memtotal_kib", g["memtotal_kib"])
				env.Record(t, "guest_uptime_at_init", g["uptime"])
			})
		}
	})
}
