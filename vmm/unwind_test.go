package vmm

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// unwindTAP names the TAP the unwinding test has New create.
const unwindTAP = "hpuw"

// synthKernel writes a minimal bzImage (64-bit boot protocol 2.15, the same
// shape boot's tests use) that New parses and loads; it never runs. Its
// compressed payload (payload_offset/payload_length) is the xz fixture of
// package vmlinux, a small ELF, so host decompression works on it too.
func synthKernel(t *testing.T) string {
	payload, err := os.ReadFile("../vmlinux/testdata/payload.xz")
	if err != nil {
		t.Fatal(err)
	}
	const payloadOffset = 0x80
	protected := make([]byte, payloadOffset+len(payload))
	copy(protected[payloadOffset:], payload)
	img := boottest.BzImage(protected, payloadOffset, uint32(len(payload)))
	p := filepath.Join(t.TempDir(), "bzImage")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var errInjected = errors.New("injected setup failure")

// TestNewUnwindsEveryPartialSetup builds a VM once to learn New's setup
// steps, then fails New after each step in turn (the faultHook seam) and
// checks that every fd, file/anon_inode mapping, TAP and goroutine New took
// is given back. It needs a usable /dev/kvm (kvm_pvm suffices: nothing
// runs) and, for the virtio-net steps, root and /dev/net/tun. The
// passthrough steps (VFIO container, device files, driver bindings) need
// devices bound to vfio-pci and are covered by
// TestAddPassthroughFilesClosesEveryFileOnFailure and the integration suite.
func TestNewUnwindsEveryPartialSetup(t *testing.T) {
	sys, err := uapi.OpenKVM()
	if err != nil {
		testenv.SkipOrFail(t, "no usable /dev/kvm: %v", err)
	}
	sys.Close()
	tr := hosttest.New(t)
	tr.KVM()
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.Node(0, "0-1", 8<<30)

	cfg := DefaultConfig()
	cfg.Kernel = synthKernel(t)
	// Host decompression (the default): its goroutine and cache files
	// are part of what each partial setup must give back.
	cfg.KernelCache = filepath.Join(t.TempDir(), "kernels")
	cfg.Cmdline = "console=ttyS0"
	cfg.CPUs = 2
	cfg.Memory = 64 << 20
	cfg.HugePages = guestmem.Page4K
	cfg.NUMANode = -1
	cfg.Stdout = io.Discard
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.SysfsRoot, cfg.ProcfsRoot = tr.Sys(), tr.Proc()
	// A read-only image (pmem): its file, mappings and memslots are
	// given back too.
	image := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(image, make([]byte, 3<<20+100), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.PMEM = PMEMConfig{Path: image, Size: 3<<20 + 100}

	withTAP := os.Geteuid() == 0
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		withTAP = false
	}
	if withTAP {
		cfg.Nets = []NetConfig{{TAP: unwindTAP + "0", Queues: 2, Vhost: VhostOff}}
	}

	t.Cleanup(func() { faultHook = nil })
	run := func() {
		// A full build first: it names the steps, and warms up what the
		// runtime opens once per process (the netpoller's epoll fd).
		var steps []string
		var mu sync.Mutex // New reports steps from its concurrent branches
		faultHook = func(step string) error {
			mu.Lock()
			defer mu.Unlock()
			steps = append(steps, step)
			return nil
		}
		vm, err := New(cfg)
		if !assert.NoError(t, err, "the full build must succeed for the steps to mean anything") {
			return
		}
		assert.NoError(t, vm.Close())
		faultHook = nil
		assert.Contains(t, steps, "create vCPU 1")
		assert.Contains(t, steps, "image memslots")
		if withTAP {
			assert.Contains(t, steps, "virtio-net "+unwindTAP+"0")
		}

		// Two passes: the failure as it falls, and the failure while
		// every other step New runs is held at its end (waiting until
		// the failure happened, or briefly where it never comes), so a
		// failure in one of New's concurrent branches meets the others
		// mid-way with their resources taken.
		for _, holdOthers := range []bool{false, true} {
			for _, step := range steps {
				before, err := testenv.Snapshot(testenv.Watch{})
				if !assert.NoError(t, err) {
					return
				}
				failed := make(chan struct{})
				var once sync.Once
				faultHook = func(s string) error {
					if s == step {
						once.Do(func() { close(failed) })
						return errInjected
					}
					if holdOthers {
						select {
						case <-failed:
						case <-time.After(5 * time.Millisecond):
						}
					}
					return nil
				}
				vm, err := New(cfg)
				faultHook = nil
				if !assert.ErrorIs(t, err, errInjected, "step %q (others held: %v)", step, holdOthers) {
					if vm != nil {
						vm.Close()
					}
					continue
				}
				assert.NotContains(t, err.Error(), errDependencyFailed.Error(), "New reports the failure, not the steps that waited for it")
				assert.Nil(t, vm)
				after, err := testenv.Snapshot(testenv.Watch{})
				deadline := time.Now().Add(2 * time.Second)
				for err == nil && after.Goroutines > before.Goroutines && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond) // exiting workers
					after, err = testenv.Snapshot(testenv.Watch{})
				}
				if !assert.NoError(t, err) {
					return
				}
				assert.Equal(t, before.FDs, after.FDs, "open fds after a failure at %q (others held: %v)", step, holdOthers)
				assert.Equal(t, before.FileMaps, after.FileMaps, "mappings after a failure at %q (others held: %v)", step, holdOthers)
				assert.Equal(t, before.Links, after.Links, "network interfaces (the TAP) after a failure at %q (others held: %v)", step, holdOthers)
				assert.Equal(t, before.Goroutines, after.Goroutines, "goroutines after a failure at %q (others held: %v)", step, holdOthers)
			}
		}
		t.Logf("injected a failure after each of %d setup steps: %s", len(steps), strings.Join(steps, ", "))
	}
	if !withTAP {
		t.Log("not root or no /dev/net/tun: the virtio-net steps are not exercised")
		run()
		return
	}
	if err := hosttest.InOwnNetns(run); err != nil {
		t.Fatalf("unshare(CLONE_NEWNET) as root: %v", err)
	}
}
