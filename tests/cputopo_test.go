//go:build integration

package tests

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestCPUTopologyCores pins a 2-vCPU guest to L1's two CPUs, which are two
// single-thread cores of one package (-smp 2,cores=2): with the default
// --topology host the guest reports two cores of one thread each in one
// package. The SMT counterpart (vCPUs on two threads of one core) cannot
// run in this test bed: L1 never sees SMT siblings (docs/testbed.md), so
// the thread mapping is covered by cputopo's unit tests against the H100
// capture's lscpu and synthetic hosts.
func TestCPUTopologyCores(t *testing.T) {
	harness.Run(t, harness.ProfileCores, func(t *testing.T, env *harness.Env) {
		require.Equal(t, "0", l1Siblings(t, env), "L1's cpu0 thread siblings (-smp 2,cores=2)")
		g := runCPUTopoGuest(t, env)
		assert.Equal(t, "1", g["threads_per_core"], "threads per core in the guest (cpu0's thread_siblings_list)")
		assert.Equal(t, "2", g["cores"], "distinct (package, core_id) pairs in the guest")
		assert.Equal(t, "1", g["packages"], "packages in the guest")
	})
}

// l1Siblings records L1's own CPU topology and returns cpu0's
// thread_siblings_list.
func l1Siblings(t *testing.T, env *harness.Env) string {
	t.Helper()
	var topo []string
	for _, c := range []string{"cpu0", "cpu1"} {
		d := "/sys/devices/system/cpu/" + c + "/topology/"
		topo = append(topo, c+":pkg"+sysfsAttr(d, "physical_package_id")+":core"+sysfsAttr(d, "core_id")+":sib"+sysfsAttr(d, "thread_siblings_list"))
	}
	env.Record(t, "l1_cpu_topology", strings.Join(topo, ","))
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "flags") {
				f := strings.Fields(l)
				env.Record(t, "l1_flag_topoext", strconv.FormatBool(containsWord(f, "topoext")))
				env.Record(t, "l1_flag_ht", strconv.FormatBool(containsWord(f, "ht")))
				break
			}
		}
	}
	return sysfsAttr("/sys/devices/system/cpu/cpu0/topology", "thread_siblings_list")
}

func containsWord(ws []string, w string) bool {
	for _, x := range ws {
		if x == w {
			return true
		}
	}
	return false
}

// runCPUTopoGuest boots a 2-vCPU guest pinned to L1's CPUs 0 and 1 with
// the default --topology host and returns its cputopo results.
func runCPUTopoGuest(t *testing.T, env *harness.Env) map[string]string {
	t.Helper()
	start := time.Now()
	vm := env.StartVM(t, "run",
		"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
		"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=cputopo",
		"--cpus", "2", "--cpu-list", "0,1", "--memory", "512M", "--hugepages", "none",
	)
	require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
	env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
	g := vm.GuestResults()
	if r := logRecord(vm.Log(), "guest CPU topology mirrors the host's"); r != nil {
		env.Record(t, "hpcvmm_apic_ids", r["apic_ids"])
		env.Record(t, "hpcvmm_threads_per_core", r["threads_per_core"])
	}
	for _, k := range []string{"cpu_topology", "cpus_online", "threads_per_core", "cores", "packages", "cpuinfo_siblings", "cpuinfo_cpu_cores", "cpu_vendor", "cpu_flag_ht", "cpu_flag_topoext"} {
		env.Record(t, k, g[k])
	}
	return g
}
