//go:build integration

package tests

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/vmmtest"
)

// soakPTCyclesEnv sets TestSoakPassthrough's number of cycles (default
// soakPTCycles).
const soakPTCyclesEnv = "HPCVMM_SOAK_PT_CYCLES"

// soakPTCycles is the default number of TestSoakPassthrough's cycles: each
// one binds edu, opens a VFIO container, DMA-maps guest RAM through L1's
// emulated IOMMU and prefaults 64 MiB under TCG, about a second or more.
const soakPTCycles = 25

// reserve2M makes sure L1 has at least n free 2 MiB hugepages (the
// profiles reserve only 1 GiB ones) and puts the pool back to its size
// when t ends.
func reserve2M(t *testing.T, n uint64) {
	t.Helper()
	const pool = "/sys/kernel/mm/hugepages/hugepages-2048kB/"
	total, free := readUintFile(t, pool+"nr_hugepages"), readUintFile(t, pool+"free_hugepages")
	if free >= n {
		return
	}
	writeSysfs(t, pool+"nr_hugepages", strconv.FormatUint(total+n-free, 10))
	t.Cleanup(func() { writeSysfs(t, pool+"nr_hugepages", strconv.FormatUint(total, 10)) })
	require.GreaterOrEqual(t, readUintFile(t, pool+"free_hugepages"), n, "free 2 MiB hugepages after raising the pool")
}

// TestSoakPassthrough is TestSoakCreateRunDestroy (package vmm) with a
// passed-through device, inside the nested test bed: soakPTCycles times a
// VM with edu (--gpu, --bind-devices: rebound from no driver to vfio-pci for the
// VM and back), a virtio-net on a TAP and the virtio-console, on 2 MiB
// hugepages, is created, run and closed through the Go API. Each run's
// guest finds edu on bus 0 and reads its identification and liveness
// registers through the BAR (a memslot onto the real device). Afterwards
// the process holds exactly the fds (none on /dev/vfio: the container,
// and with it every IOMMU mapping, is gone), file mappings, interfaces
// and goroutines it held before; edu is back on no driver, no journal is
// left, the free hugepages are as before, and the Go heap and
// /proc/self/maps are within the bounds of the unit soak.
func TestSoakPassthrough(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.EduBDF, "")
		cycles := soakPTCycles
		if s := os.Getenv(soakPTCyclesEnv); s != "" {
			var err error
			cycles, err = strconv.Atoi(s)
			require.NoError(t, err, "%s=%q", soakPTCyclesEnv, s)
		}
		reserve2M(t, 32)
		kernel, err := vmmtest.Kernel(t.TempDir())
		require.NoError(t, err)
		cfg := vmm.DefaultConfig()
		cfg.Kernel, cfg.Cmdline = kernel, "console=ttyS0"
		// The synthetic bzImage is its own 64-bit entry, with no compressed
		// payload to unpack on the host.
		cfg.KernelDecompress = vmm.DecompressGuest
		cfg.Memory, cfg.HugePages = 64<<20, guestmem.Page2M
		cfg.Console, cfg.Topology = vmm.ConsoleVirtio, vmm.TopologyFlat
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.Nets = []vmm.NetConfig{{TAP: "hpsoak0", Vhost: vmm.VhostAuto}}
		cfg.Passthrough = vmm.PassthroughConfig{GPUs: []string{harness.EduBDF}, Bind: true}
		check := func(g vmmtest.GuestReport) error {
			if !g.Edu || g.EduID != vmmtest.EduID || g.EduLiveness != vmmtest.EduLivenessReadback {
				return fmt.Errorf("edu through its BAR: found %v, id %#x (want %#x), liveness %#x (want %#x); bus 0: %v",
					g.Edu, g.EduID, vmmtest.EduID, g.EduLiveness, vmmtest.EduLivenessReadback, g.Devices)
			}
			return nil
		}
		var res vmmtest.SoakResult
		done := make(chan struct{})
		go func() {
			defer close(done)
			runtime.LockOSThread() // never unlocked: the namespace dies with the thread
			if err = unix.Unshare(unix.CLONE_NEWNET); err != nil {
				return
			}
			res, err = vmmtest.Soak(cfg, vmmtest.SoakOptions{
				Cycles: cycles, Warmup: 2, Check: check, Every: max(cycles/5, 1),
				Watch: testenv.Watch{BDFs: []string{harness.EduBDF}, JournalDir: journalDir},
			})
		}()
		<-done
		require.NoError(t, err)
		t.Logf("%d cycles in %v; before: %s", res.Cycles, res.Elapsed.Round(time.Millisecond), res.Before)
		t.Logf("after: %s; peaks fds=%d maps=%d heap=%d", res.After, res.MaxFDs, res.MaxMaps, res.MaxHeap)
		assert.Empty(t, testenv.Leaks(res.Before, res.After, testenv.Bounds{Heap: 1 << 20, Maps: 32}), "after %d cycles", cycles)
		assert.Zero(t, res.After.VFIOFDs, "fds on /dev/vfio after the last VM")
		assert.Equal(t, "", res.After.Drivers[harness.EduBDF], "edu's driver after the soak")
		env.Record(t, "soak_cycles", strconv.Itoa(res.Cycles))
		env.Record(t, "soak_ms", strconv.FormatInt(res.Elapsed.Milliseconds(), 10))
		env.Record(t, "soak_before", strings.ReplaceAll(res.Before.String(), " ", ","))
		env.Record(t, "soak_after", strings.ReplaceAll(res.After.String(), " ", ","))
	})
}

// signalBootsEnv sets TestBootsWithSignals' number of boots; the default
// keeps CI's suite within its time (every kind of stop happens in the
// first ten), the long run is HPCVMM_SIGNAL_BOOTS=20.
const (
	signalBootsEnv     = "HPCVMM_SIGNAL_BOOTS"
	defaultSignalBoots = 10
)

// TestBootsWithSignals boots the stock L2 guest 10 (HPCVMM_SIGNAL_BOOTS) times in a row with
// hpcvmm, each with edu passed through (--bind-devices from no driver) and a
// virtio-net on a TAP, on 2 MiB hugepages, and stops some of them with
// SIGTERM or SIGKILL (alternating) at different points: during setup
// (0.3 to 1.5 s after start: before or after edu is bound and guest RAM
// DMA-mapped), 2 s into the guest kernel, once its /init runs; every
// fifth boots to the end. After SIGKILL `hpcvmm unbind` restores what the journal
// recorded; after SIGTERM or a full boot hpcvmm restored it itself. After
// each boot edu is on no driver again, no journal is left, the TAP is
// gone and the free hugepages are as before. It has an L1 boot of its own
// (harness.ProfileSignals: the passthrough test bed).
func TestBootsWithSignals(t *testing.T) {
	harness.Run(t, harness.ProfileSignals, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.EduBDF, "")
		reserve2M(t, 128)
		// Twenty L2 boots on a loaded machine: a full boot took up to
		// 2.5 min of L1 time, which the default limit per VM only just
		// covers.
		t.Setenv("HPCVMM_VM_TIMEOUT", "8m")
		w := testenv.Watch{BDFs: []string{harness.EduBDF}, JournalDir: journalDir}
		before, err := testenv.Snapshot(w)
		require.NoError(t, err)
		boots := defaultSignalBoots
		if s := os.Getenv(signalBootsEnv); s != "" {
			n, err := strconv.Atoi(s)
			require.NoError(t, err, "%s=%q", signalBootsEnv, s)
			boots = n
		}
		// Full boots (a whole L2 boot under nested TCG is the costly
		// part) every fifth; signals alternate, mostly early, so the
		// scenario's wall time stays reasonable.
		plan := func(i int) (stage string, sig syscall.Signal) {
			sig = syscall.SIGTERM
			if i%2 == 1 {
				sig = syscall.SIGKILL
			}
			switch {
			case i%5 == 0:
				return "full", 0
			case i == 8 || i == 13:
				return "init", sig
			case i%5 == 1 || i%5 == 3:
				return "setup", sig
			}
			return "kernel", sig
		}
		var counts = map[string]int{}
		for i := 0; i < boots; i++ {
			stage, sig := plan(i)
			what := stage
			if stage != "full" {
				what = fmt.Sprintf("%s-at-%s", strings.ToLower(unix.SignalName(sig)), stage)
			}
			ok := t.Run(fmt.Sprintf("%02d-%s", i, what), func(t *testing.T) {
				// A fresh network namespace per boot (the subtest's
				// goroutine's thread; hpcvmm inherits it): its TAP
				// appears there and nowhere else.
				inPrivateNetns(t)
				links, err := testenv.Snapshot(testenv.Watch{})
				require.NoError(t, err)
				start := time.Now()
				vm := env.StartVM(t, "run",
					"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
					"--cmdline", "console=ttyS0 quiet reboot=k panic=-1 hpcvmm.scenario=boot",
					"--cpus", "1", "--memory", "256M", "--hugepages", "2M",
					"--gpu", harness.EduBDF, "--bind-devices", "--net", "tap=hpboot0",
				)
				switch stage {
				case "setup":
					// During hpcvmm's setup: before or after it bound edu
					// and DMA-mapped guest RAM, depending on the boot.
					time.Sleep(time.Duration(300+400*(i%4)) * time.Millisecond)
				case "kernel":
					// quiet keeps the kernel's own lines off the console
					// (each character is an exit, costly under TCG), so
					// the kernel is known to run from hpcvmm's log.
					deadline := time.Now().Add(3 * time.Minute)
					for !strings.Contains(vm.Log(), "first KVM_RUN") {
						require.False(t, vm.Exited(), "hpcvmm exited before the guest ran")
						require.True(t, time.Now().Before(deadline), "the guest never ran")
						time.Sleep(100 * time.Millisecond)
					}
					time.Sleep(2 * time.Second)
				case "init":
					_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER init-started", 3*time.Minute)
					require.True(t, ok, "the guest's /init never started")
				}
				code := 0
				if stage == "full" {
					code = vm.Wait()
					require.Equal(t, 0, code, "hpcvmm exit status of a full boot")
					require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done")
				} else {
					if vm.Exited() {
						t.Fatalf("hpcvmm exited before the %s signal", stage)
					}
					require.NoError(t, syscall.Kill(vm.PID(), sig))
					code = vm.Wait()
				}
				restored := "itself"
				if sig == syscall.SIGKILL && stage != "full" {
					// The journal survives SIGKILL; the admin's command
					// (or the next hpcvmm run) restores from it.
					out, err := exec.Command(env.HPCVMM(t), "unbind", harness.EduBDF).CombinedOutput()
					require.NoError(t, err, "hpcvmm unbind after SIGKILL:\n%s", out)
					restored = "hpcvmm unbind: " + strings.Join(strings.Fields(string(out)), " ")
				}
				after, err := testenv.Snapshot(w)
				require.NoError(t, err)
				assert.Equal(t, before.Drivers, after.Drivers, "edu's driver")
				assert.Equal(t, before.Journals, after.Journals, "journals in %s", journalDir)
				assert.Equal(t, links.Links, after.Links, "network interfaces (the TAP)")
				assert.Equal(t, before.HugePagesFree, after.HugePagesFree, "free hugepages")
				counts[what]++
				t.Logf("boot %d (%s): exit %d after %v; restored by %s", i, what, code, time.Since(start).Round(time.Millisecond), restored)
				env.Record(t, fmt.Sprintf("boot_%02d", i), fmt.Sprintf("%s,exit=%d,ms=%d", what, code, time.Since(start).Milliseconds()))
			})
			if !ok {
				break // the host is no longer as before: the next boots would measure the wrong thing
			}
		}
		t.Logf("boots by kind: %v", counts)
	})
}
