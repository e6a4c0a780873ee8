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
	"github.com/hpcvmm/hpcvmm/vmlinux"
)

// TestOpenKernel: a bzImage with --kernel-decompress host is decompressed
// and cached on the first launch and read from the cache on the next, both
// giving a kernel to enter at its ELF entry; guest mode loads the bzImage
// as before; a vmlinux ELF is taken as is; an unsafe cache directory is
// refused naming --kernel-cache before anything is read from it.
func TestOpenKernel(t *testing.T) {
	bz := synthKernel(t)
	cacheDir := filepath.Join(t.TempDir(), "kernels")
	// A host with hardware KVM, whatever this machine's backend is.
	tr := hosttest.New(t)
	tr.KVM()
	tr.Write("sys/module/kvm_intel/parameters/nested", "Y\n")
	open := func(cfg Config) (*kernelImage, error) {
		cfg.SysfsRoot, cfg.ProcfsRoot = tr.Sys(), tr.Proc()
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		vm := &VM{cfg: cfg, log: cfg.Logger}
		return vm.openKernel()
	}
	cfg := Config{Kernel: bz, KernelCache: cacheDir}

	for _, run := range []string{"miss", "hit"} {
		ki, err := open(cfg)
		require.NoError(t, err, run)
		require.Nil(t, ki.check.ELF, "%s: the placement check before RAM uses the bzImage's footprint", run)
		k, err := ki.wait()
		require.NoError(t, err, run)
		require.NotNil(t, k.ELF, run)
		assert.Equal(t, uint64(0x1000000), k.ELF.Entry, run)
		assert.Equal(t, ki.check.Header, k.Header, "%s: the bzImage's setup header goes to the zero page", run)
		entries, err := filepath.Glob(filepath.Join(cacheDir, "*.vmlinux"))
		require.NoError(t, err)
		assert.Len(t, entries, 1, run)
	}

	ki, err := open(Config{Kernel: bz, KernelCache: cacheDir, KernelDecompress: DecompressGuest})
	require.NoError(t, err)
	k, err := ki.wait()
	require.NoError(t, err)
	assert.Nil(t, k.ELF, "guest mode enters the bzImage's decompressor")

	elfPath := filepath.Join(t.TempDir(), "vmlinux")
	elf, err := os.ReadFile("../vmlinux/testdata/vmlinux.elf")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(elfPath, elf, 0o644))
	ki, err = open(Config{Kernel: elfPath, KernelCache: "/nonexistent/never/created"})
	require.NoError(t, err)
	k, err = ki.wait()
	require.NoError(t, err)
	require.NotNil(t, k.ELF)
	assert.Equal(t, uint32(2047), k.CmdlineSize)

	unsafe := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(unsafe, 0o755))
	require.NoError(t, os.Chmod(unsafe, 0o777))
	_, err = open(Config{Kernel: bz, KernelCache: unsafe})
	var fe *FieldError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "KernelCache", fe.Field)

	// A cache entry damaged behind hpcvmm's back is decompressed again
	// and replaced.
	entries, _ := filepath.Glob(filepath.Join(cacheDir, "*.vmlinux"))
	require.Len(t, entries, 1)
	require.NoError(t, os.Chmod(entries[0], 0o644))
	require.NoError(t, os.WriteFile(entries[0], []byte("hpcvmm-vmlinux v1\nsha256 00\nsize 1\n\nx"), 0o644))
	require.NoError(t, os.Chmod(entries[0], 0o444))
	ki, err = open(cfg)
	require.NoError(t, err)
	k, err = ki.wait()
	require.NoError(t, err)
	require.NotNil(t, k.ELF)
	raw, err := os.ReadFile(entries[0])
	require.NoError(t, err)
	_, err = vmlinux.Verify(raw)
	assert.NoError(t, err, "the damaged entry was replaced")

	// A payload that does not decompress fails the launch with the
	// kernel's name and the way out.
	img, err := os.ReadFile(bz)
	require.NoError(t, err)
	img[5*512+0x80+100] ^= 0xff
	bad := filepath.Join(t.TempDir(), "bad-bzImage")
	require.NoError(t, os.WriteFile(bad, img, 0o644))
	ki, err = open(Config{Kernel: bad, KernelCache: cacheDir})
	require.NoError(t, err)
	_, err = ki.wait()
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, "Kernel", fe.Field)
	assert.ErrorContains(t, err, bad)
}
