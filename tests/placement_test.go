//go:build integration

package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestGuestRAMOnHugepagesAndPinnedVCPUs boots a guest on 1 GiB hugepages
// bound to node 0 and checks, from the host side while the guest runs, that
// the guest RAM mapping is backed by 1 GiB pages bound to the node, that
// the pool lost exactly the guest's pages (and got them back after), and
// that every vCPU thread's affinity is the requested CPU and that every
// thread runs under hpcvmm's seccomp filters; from inside the
// guest, that it booted with the RAM and CPUs it was given.
func TestGuestRAMOnHugepagesAndPinnedVCPUs(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		const pool = "/sys/kernel/mm/hugepages/hugepages-1048576kB/"
		if _, err := os.Stat(pool); err != nil {
			t.Fatalf("no 1 GiB hugepage pool on this host (%v): the profile reserves hugepagesz=1G hugepages=2", err)
		}
		before := readHugeState(t)
		require.GreaterOrEqual(t, before.free1G, uint64(1), "need one free 1 GiB page (profile reserves 2)")

		cpus, err := onlineCPUs()
		require.NoError(t, err)
		const vcpus = 2
		want := make([]int, vcpus)
		for i := range want {
			want[i] = cpus[i%len(cpus)]
		}
		cpuList := host.FormatCPUList(cpus)

		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot hpcvmm.hold=15",
			"--cpus", strconv.Itoa(vcpus), "--memory", "1G", "--hugepages", "1G",
			"--numa-node", "0", "--cpu-list", cpuList,
		)
		_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER holding", 3*time.Minute)
		require.True(t, ok, "the guest's /init never reached its hold")

		// Host side, while the guest holds.
		m, found := findGuestRAM(t, vm.PID())
		require.True(t, found, "no hpcvmm-guest-ram mapping in /proc/%d/smaps", vm.PID())
		assert.Equal(t, uint64(1<<20), m.sizeKiB, "guest RAM mapping size (KiB)")
		assert.Equal(t, uint64(1<<20), m.kernelPageKiB, "guest RAM page size (KiB) in smaps")
		assert.Equal(t, "bind:0", m.numaPolicy, "NUMA policy of the guest RAM mapping (numa_maps)")
		assert.Equal(t, uint64(1), m.nodePages["N0"], "1 GiB pages of guest RAM on node 0 (numa_maps)")
		during := readHugeState(t)
		assert.Equal(t, before.free1G-1, during.free1G, "free 1 GiB pages while the guest runs")
		env.Record(t, "smaps_kernel_page_kib", strconv.FormatUint(m.kernelPageKiB, 10))
		env.Record(t, "numa_policy", m.numaPolicy)

		threads := vcpuThreads(t, vm.PID())
		require.Len(t, threads, vcpus, "vCPU threads named vcpuN in /proc/%d/task", vm.PID())
		for i := 0; i < vcpus; i++ {
			got := affinity(t, threads[i])
			assert.Equal(t, []int{want[i]}, got, "affinity of vcpu%d (thread %d)", i, threads[i])
			env.Record(t, fmt.Sprintf("vcpu%d_affinity", i), host.FormatCPUList(got))
		}

		requireAllThreadsFiltered(t, env, vm.PID())

		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		g := vm.GuestResults()
		assert.Equal(t, strconv.Itoa(vcpus), g["cpus_online"])
		memKiB, _ := strconv.Atoi(g["memtotal_kib"])
		assert.Greater(t, memKiB, 1<<20*3/4, "guest MemTotal of a 1 GiB guest")

		after := readHugeState(t)
		assert.Equal(t, before, after, "hugepages after the VM ended")
	})
}

func onlineCPUs() ([]int, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, err
	}
	return host.ParseCPUList(strings.TrimSpace(string(b)))
}

// TestBadInputIsRejectedBeforeTheHostChanges runs hpcvmm with each kind of
// bad input and checks the error names the input and what to do, the exit
// status is README's (2 for invalid input, 1 for a host that cannot run the
// VM), and no hugepages stay reserved or in use.
func TestBadInputIsRejectedBeforeTheHostChanges(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		kernel, initrd := env.L2Kernel(t), env.L2Initrd(t)
		dir := t.TempDir()
		notKernel := filepath.Join(dir, "not-a-kernel")
		require.NoError(t, os.WriteFile(notKernel, make([]byte, 64<<10), 0o644))
		bigInitrd := filepath.Join(dir, "big-initrd")
		require.NoError(t, os.WriteFile(bigInitrd, make([]byte, 100<<20), 0o644))
		free1G := readHugeState(t).free1G

		// Exit status 2 for invalid input; 1 for a host that cannot run the
		// VM (too few hugepages: a preflight failure, as hpcvmm check says).
		cases := []struct {
			name string
			args []string
			want []string
			code int
		}{
			{"not a bzImage", []string{"--kernel", notKernel}, []string{"--kernel", "not a bzImage"}, 2},
			{"missing kernel", []string{"--kernel", "/nonexistent/vmlinuz"}, []string{"--kernel", "/nonexistent/vmlinuz does not exist"}, 2},
			{"missing initrd", []string{"--kernel", kernel, "--initrd", "/nonexistent/initrd"}, []string{"--initrd", "does not exist"}, 2},
			{"initrd too large for RAM", []string{"--kernel", kernel, "--initrd", bigInitrd, "--memory", "128M", "--hugepages", "none"}, []string{"--initrd", "does not fit", "--memory"}, 2},
			{"memory not a page multiple", []string{"--kernel", kernel, "--memory", "1536M", "--hugepages", "1G"}, []string{"--memory", "not a multiple of the 1G page size"}, 2},
			{"zero cpus", []string{"--kernel", kernel, "--cpus", "0"}, []string{"--cpus", "at least 1"}, 2},
			{"too many cpus", []string{"--kernel", kernel, "--cpus", "4096"}, []string{"--cpus", "at most"}, 2},
			{"unknown node", []string{"--kernel", kernel, "--numa-node", "7", "--hugepages", "none", "--memory", "256M"}, []string{"--numa-node", "node 7 is not online"}, 2},
			{"more memory than the node has", []string{"--kernel", kernel, "--memory", "100T", "--hugepages", "2M"}, []string{"--memory", "100T is more than", "no 2M hugepage pool there can ever hold it"}, 2},
			{"not enough hugepages", []string{"--kernel", kernel, "--memory", fmt.Sprintf("%dG", free1G+1), "--hugepages", "1G"},
				[]string{fmt.Sprintf("%d of the pool's", free1G), fmt.Sprintf("VM needs %d", free1G+1), "hugepages-1048576kB/nr_hugepages"}, 3},
			{"negative prefault workers", []string{"--kernel", kernel, "--prefault-workers", "-1"}, []string{"--prefault-workers", "want 1 or more"}, 2},
			{"more prefault workers than the node's CPUs", []string{"--kernel", kernel, "--prefault-workers", "1000"}, []string{"--prefault-workers", "1000 workers: more than", "pass at most"}, 2},
			{"bad page size", []string{"--kernel", kernel, "--hugepages", "3M"}, []string{"--hugepages", "3M"}, 2},
			{"bad size", []string{"--kernel", kernel, "--memory", "lots"}, []string{"--memory", "lots"}, 2},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				before := readHugeState(t)
				args := append([]string{"run", "--initrd", initrd}, tc.args...)
				vm := env.StartVM(t, args...)
				code := vm.Wait()
				assert.Equal(t, tc.code, code, "exit status")
				for _, w := range tc.want {
					assert.Contains(t, vm.Log(), w)
				}
				assert.NotContains(t, vm.Log(), "first KVM_RUN", "a VM ran despite bad input")
				assert.Equal(t, before, readHugeState(t), "hugepages after the rejected run")
			})
		}
	})
}

// TestSIGTERMStopsTheVMAndReleasesItsHugepages stops a running guest with
// SIGTERM. This guest does not act on the ACPI power button the signal
// presses, so after --shutdown-timeout hpcvmm stops it hard: it exits 1
// saying the guest did not shut down, and the 1 GiB page its guest RAM
// held is free again.
func TestSIGTERMStopsTheVMAndReleasesItsHugepages(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		before := readHugeState(t)
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot hpcvmm.hold=600",
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G", "--console", "none",
			"--shutdown-timeout", "5s",
		)
		_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER holding", 3*time.Minute)
		require.True(t, ok, "the guest never reached its hold")
		assert.Equal(t, before.free1G-1, readHugeState(t).free1G, "the running guest holds one 1 GiB page")

		require.NoError(t, syscall.Kill(vm.PID(), syscall.SIGTERM))
		code := vm.Wait()
		assert.Equal(t, 1, code, "exit status after SIGTERM")
		assert.Contains(t, vm.Log(), "did not shut down within --shutdown-timeout 5s after terminated", "hpcvmm says the guest did not shut down")
		assert.Equal(t, before, readHugeState(t), "hugepages after hpcvmm stopped")
	})
}
