package vmm

import (
	"bytes"
	"compress/gzip"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
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
	sys, proc := hardwareKVMHost(t)
	open := func(cfg Config) (*kernelImage, error) {
		cfg.SysfsRoot, cfg.ProcfsRoot = sys, proc
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

// TestKernelCacheKeepsTheBzImageItHashed: a user who can write the kernel
// file rewrites it between the cache key's hash and the decompression (a
// root launch racing that user, driven here by the kernelKeyed seam). The
// entry cached under the genuine bzImage's key must still be the genuine
// vmlinux, or every later VM booting the genuine bzImage on the node would
// run the user's kernel; the launch itself boots the bytes it hashed.
func TestKernelCacheKeepsTheBzImageItHashed(t *testing.T) {
	elf, err := os.ReadFile("../vmlinux/testdata/vmlinux.elf")
	require.NoError(t, err)
	evilELF := bytes.Clone(elf)
	evilELF[0x1000+64] ^= 0xff // a byte of the PT_LOAD segment's code
	bzOf := func(vmlinux []byte) []byte {
		var gz bytes.Buffer
		// Stored blocks: the two payloads have the same length, so the
		// rewrite changes only the kernel, not the header's payload_length.
		w, err := gzip.NewWriterLevel(&gz, gzip.NoCompression)
		require.NoError(t, err)
		_, err = w.Write(vmlinux)
		require.NoError(t, err)
		require.NoError(t, w.Close())
		const payloadOffset = 0x80
		protected := make([]byte, payloadOffset+gz.Len())
		copy(protected[payloadOffset:], gz.Bytes())
		return boottest.BzImage(protected, payloadOffset, uint32(gz.Len()))
	}
	genuine, evil := bzOf(elf), bzOf(evilELF)
	require.Len(t, evil, len(genuine), "the rewrite keeps the file's size")
	path := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(path, genuine, 0o644))

	rewrites := 0
	kernelKeyed = func() {
		rewrites++
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		require.NoError(t, err)
		_, err = f.WriteAt(evil, 0)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	t.Cleanup(func() { kernelKeyed = nil })

	cacheDir := filepath.Join(t.TempDir(), "kernels")
	cfg := Config{Kernel: path, KernelCache: cacheDir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cfg.SysfsRoot, cfg.ProcfsRoot = hardwareKVMHost(t)
	vm := &VM{cfg: cfg, log: cfg.Logger}
	ki, err := vm.openKernel()
	require.NoError(t, err)
	k, err := ki.wait()
	require.NoError(t, err)
	require.Equal(t, 1, rewrites, "the file was rewritten between hashing and decompressing")
	require.NotNil(t, k.ELF)
	seg := k.ELF.Segments[0].Data
	assert.True(t, bytes.Equal(elf[0x1000:0x1000+len(seg)], seg), "the launch boots the bytes it hashed")
	ki.release()

	c, err := vmlinux.OpenCache(cacheDir, 0)
	require.NoError(t, err)
	e, err := c.Get(vmlinux.KeyOf(genuine))
	require.NoError(t, err)
	defer e.Close()
	assert.True(t, bytes.Equal(elf, e.Bytes()), "the entry under the genuine bzImage's key is the genuine vmlinux")
}
