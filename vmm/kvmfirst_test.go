package vmm

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// hardwareKVMHost is a host tree with hardware KVM (kvm_intel), whatever
// this machine's backend is: tests of the kernel step, which refuses a
// kvm_pvm host before it decompresses anything, run on it.
func hardwareKVMHost(t *testing.T) (sysRoot, procRoot string) {
	tr := hosttest.New(t)
	tr.KVM()
	tr.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	return tr.Sys(), tr.Proc()
}

// TestKVMBackendRefusedBeforeDecompression: on a kvm_pvm host (which boots
// no stock kernel) a bzImage to decompress is refused with preflight's KVM
// report before the decompression starts: nothing is written to the kernel
// cache. Bad input still comes first: an unsafe cache directory is named.
func TestKVMBackendRefusedBeforeDecompression(t *testing.T) {
	tr := hosttest.New(t)
	tr.KVM()
	tr.Write("sys/module/kvm_pvm/parameters/placeholder", "\n")
	cacheDir := filepath.Join(t.TempDir(), "kernels")
	cfg := Config{Kernel: synthKernel(t), KernelCache: cacheDir, SysfsRoot: tr.Sys(), ProcfsRoot: tr.Proc(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	vm := &VM{cfg: cfg, log: cfg.Logger}
	_, err := vm.openKernel()
	var pe *PreflightError
	require.ErrorAs(t, err, &pe)
	assert.ErrorContains(t, err, "kvm_pvm")
	entries, _ := os.ReadDir(cacheDir)
	assert.Empty(t, entries, "no decompressed kernel cached")

	unsafe := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(unsafe, 0o755))
	require.NoError(t, os.Chmod(unsafe, 0o777))
	vm.cfg.KernelCache = unsafe
	_, err = vm.openKernel()
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "KernelCache", fe.Field)
}

// TestCheckHost: CheckHost gives New's errors for what needs only cfg and
// the host (input as a FieldError, a host that cannot run the VM as a
// PreflightError) and nil where the host can, reading no initrd.
func TestCheckHost(t *testing.T) {
	tree := func(kvm bool) *hosttest.Tree {
		tr := hosttest.New(t)
		tr.Node(0, "0-3", 8<<30)
		tr.CPUInfo(46)
		tr.Interrupts(true)
		if kvm {
			tr.KVM()
			tr.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
		}
		return tr
	}
	cfg := func(tr *hosttest.Tree) Config {
		c := DefaultConfig()
		c.Kernel, c.Memory, c.HugePages, c.SysfsRoot, c.ProcfsRoot = synthKernel(t), 256<<20, guestmem.Page4K, tr.Sys(), tr.Proc()
		return c
	}
	ready := tree(true)
	require.NoError(t, CheckHost(cfg(ready)))

	c := cfg(tree(false))
	var pe *PreflightError
	require.ErrorAs(t, CheckHost(c), &pe)
	assert.ErrorContains(t, pe, "does not exist: KVM is not available")

	c = cfg(ready)
	c.Memory = 64 << 30 // more than the node has
	var fe *FieldError
	require.ErrorAs(t, CheckHost(c), &fe)
	assert.Equal(t, "Memory", fe.Field)

	c = cfg(ready)
	c.Passthrough.GPUs = []string{"0000:00:09.0"} // not on this host
	require.ErrorAs(t, CheckHost(c), &pe)
}
