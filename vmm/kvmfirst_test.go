package vmm

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
