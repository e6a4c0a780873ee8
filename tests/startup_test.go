//go:build integration

package tests

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// TestStartupTimeline boots a guest with the NVMe VF passed through (its
// VFIO open resets it: a function-level reset, as a GPU's) and reads
// hpcvmm's start-up timeline from `--log-level debug`: every setup step
// with its start and duration, their sum (what a serial start-up costs),
// the longest step, and process start → first KVM_RUN. Overlapped steps
// must make the first KVM_RUN come before the sum of the steps: with the
// steps run one after another it cannot.
func TestStartupTimeline(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.NVMeVFBDF, "vfio-pci")
		t.Cleanup(func() { setDriver(t, harness.NVMeVFBDF, "") })

		vm := env.StartVM(t, "run", "--log-level", "debug",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=boot",
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--vf", harness.NVMeVFBDF,
		)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
		log := vm.Log()

		var spans []span
		var sum time.Duration
		for _, r := range logRecords(log, "setup step") {
			at, err1 := time.ParseDuration(r["at"])
			took, err2 := time.ParseDuration(r["took"])
			require.NoError(t, err1, "setup step %q: at=%q", r["step"], r["at"])
			require.NoError(t, err2, "setup step %q: took=%q", r["step"], r["took"])
			spans = append(spans, span{r["step"], at, took})
			sum += took
		}
		require.NotEmpty(t, spans, "no \"setup step\" lines at --log-level debug")
		sort.SliceStable(spans, func(i, j int) bool { return spans[i].at < spans[j].at })
		var names []string
		var longest span
		var b strings.Builder
		for _, s := range spans {
			names = append(names, s.name)
			if s.took > longest.took {
				longest = s
			}
			fmt.Fprintf(&b, "  %-24s start %9.3f ms  took %9.3f ms\n", s.name, ms(s.at), ms(s.took))
		}
		for _, want := range []string{"guest RAM", "KVM VM", "vCPUs", "VFIO open and reset", "DMA-map guest RAM", "load kernel"} {
			assert.True(t, slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, want) }),
				"setup step %q missing from the timeline %q", want, names)
		}
		tl := logRecord(log, "start-up timeline")
		require.NotNil(t, tl, "no \"start-up timeline\" line")
		first := logRecord(log, "first KVM_RUN")
		require.NotNil(t, first, "no \"first KVM_RUN\" line")
		firstRun, err := time.ParseDuration(first["since_start"])
		require.NoError(t, err)
		t.Logf("start-up timeline (process start = 0):\n%s  sum of steps %.3f ms, longest step %q %.3f ms, first KVM_RUN %.3f ms",
			b.String(), ms(sum), longest.name, ms(longest.took), ms(firstRun))
		env.Record(t, "startup_sum_of_steps_ms", fmt.Sprintf("%.3f", ms(sum)))
		env.Record(t, "startup_longest_step", longest.name)
		env.Record(t, "startup_longest_step_ms", fmt.Sprintf("%.3f", ms(longest.took)))
		env.Record(t, "first_kvm_run_since_start_ms", fmt.Sprintf("%.3f", ms(firstRun)))
		for _, s := range spans {
			env.Record(t, "step "+s.name, fmt.Sprintf("start=%.3fms took=%.3fms", ms(s.at), ms(s.took)))
		}
		assert.GreaterOrEqual(t, firstRun, longest.took, "the first KVM_RUN cannot come before the longest step ended")
		// The overlap itself: the device's open and reset ran while guest
		// RAM was being prefaulted, and the time to the first KVM_RUN
		// came in below the sum of the steps by at least that overlap.
		ram, open := find(spans, "guest RAM"), find(spans, "VFIO open and reset")
		require.NotNil(t, ram)
		require.NotNil(t, open)
		assert.True(t, open.at < ram.at+ram.took && ram.at < open.at+open.took,
			"VFIO open and reset [%v, %v] did not overlap the prefault [%v, %v]", open.at, open.at+open.took, ram.at, ram.at+ram.took)
		overlap := min(open.at+open.took, ram.at+ram.took) - max(open.at, ram.at)
		env.Record(t, "startup_vfio_open_overlapping_prefault_ms", fmt.Sprintf("%.3f", ms(overlap)))
	})
}

// span is one setup step of hpcvmm's start-up timeline.
type span struct {
	name     string
	at, took time.Duration
}

// find returns the first span whose name starts with prefix, or nil.
func find(spans []span, prefix string) *span {
	for i := range spans {
		if strings.HasPrefix(spans[i].name, prefix) {
			return &spans[i]
		}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// TestStartupUnwindsPassthrough fails vmm.New after each of its setup steps
// in turn with the NVMe VF passed through and taken from no driver with
// Bind, so the steps only a real VFIO device has (the driver binding, the
// VFIO container, the device's open and reset, the DMA mapping) are
// covered, each also while New's other branch (the prefault) is held
// mid-way. After every failure the process holds no fd, mapping or
// goroutine more than before, and the VF is back on no driver.
func TestStartupUnwindsPassthrough(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.NVMeVFBDF, "")
		t.Cleanup(func() { setDriver(t, harness.NVMeVFBDF, "") })
		cfg := vmm.DefaultConfig()
		cfg.Kernel = env.L2Kernel(t)
		cfg.Cmdline = "console=ttyS0"
		cfg.CPUs = 1
		cfg.Memory = 128 << 20 // the stock kernel needs 80 MiB of low RAM
		cfg.HugePages = guestmem.Page4K
		cfg.Stdout = io.Discard
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		cfg.Passthrough.VFs = []string{harness.NVMeVFBDF}
		cfg.Passthrough.Bind = true
		cfg.Passthrough.StateDir = t.TempDir()

		var mu sync.Mutex
		var steps []string
		vmm.SetSetupFaultHook(func(s string) error {
			mu.Lock()
			defer mu.Unlock()
			steps = append(steps, s)
			return nil
		})
		t.Cleanup(func() { vmm.SetSetupFaultHook(nil) })
		vm, err := vmm.New(cfg)
		require.NoError(t, err, "the full build must succeed for the steps to mean anything")
		assert.Equal(t, "vfio-pci", pciDriver(harness.NVMeVFBDF), "--bind-devices took the VF")
		require.NoError(t, vm.Close())
		assert.Equal(t, "", pciDriver(harness.NVMeVFBDF), "the VF back on no driver after Close")
		vmm.SetSetupFaultHook(nil)
		for _, want := range []string{"bind devices", "VFIO container", "KVM-VFIO device", "open " + harness.NVMeVFBDF, "DMA-map guest RAM", "guest RAM"} {
			assert.Contains(t, steps, want)
		}

		for _, hold := range []bool{false, true} {
			for _, step := range steps {
				before := processResources(t)
				failed := make(chan struct{})
				var once sync.Once
				vmm.SetSetupFaultHook(func(s string) error {
					if s == step {
						once.Do(func() { close(failed) })
						return errInjectedSetup
					}
					if hold {
						select {
						case <-failed:
						case <-time.After(5 * time.Millisecond):
						}
					}
					return nil
				})
				vm, err := vmm.New(cfg)
				vmm.SetSetupFaultHook(nil)
				if !assert.ErrorIs(t, err, errInjectedSetup, "step %q (others held: %v)", step, hold) {
					if vm != nil {
						vm.Close()
					}
					continue
				}
				after := processResources(t)
				for deadline := time.Now().Add(2 * time.Second); after.goroutines > before.goroutines && time.Now().Before(deadline); {
					time.Sleep(10 * time.Millisecond)
					after = processResources(t)
				}
				assert.Equal(t, before.fds, after.fds, "fds after a failure at %q (others held: %v)", step, hold)
				assert.Equal(t, before.maps, after.maps, "mappings after a failure at %q (others held: %v)", step, hold)
				assert.Equal(t, before.goroutines, after.goroutines, "goroutines after a failure at %q (others held: %v)", step, hold)
				assert.Equal(t, "", pciDriver(harness.NVMeVFBDF), "the VF's driver after a failure at %q (others held: %v)", step, hold)
			}
		}
		env.Record(t, "unwind_steps", strings.Join(steps, ", "))
	})
}

var errInjectedSetup = errors.New("injected setup failure")

// resources is what a half-built VM could leak from this process.
type resources struct {
	fds, maps  []string
	goroutines int
}

// processResources lists /proc/self/fd targets, the file- and
// anon_inode-backed mappings (guest RAM's memfd, kvm_run, VFIO BARs) and
// the goroutine count.
func processResources(t *testing.T) resources {
	t.Helper()
	var r resources
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			r.fds = append(r.fds, target)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for _, line := range strings.Split(string(maps), "\n") {
		if f := strings.Fields(line); len(f) >= 6 && !strings.HasPrefix(f[5], "[") {
			r.maps = append(r.maps, strings.Join(f[5:], " "))
		}
	}
	sort.Strings(r.fds)
	sort.Strings(r.maps)
	r.goroutines = runtime.NumGoroutine()
	return r
}
