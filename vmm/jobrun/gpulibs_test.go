package jobrun

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/jobproto"
)

// fixtureDriverHost is gpudriver's fake H200 host (module 580.159.04) and
// its ldconfig -p.
func fixtureDriverHost(t *testing.T) gpudriver.Options {
	root, err := filepath.Abs("../../gpudriver/testdata/host")
	require.NoError(t, err)
	b, err := os.ReadFile("../../gpudriver/testdata/ldconfig-p.txt")
	require.NoError(t, err)
	cache, err := gpudriver.ParseLdconfig(b)
	require.NoError(t, err)
	return gpudriver.Options{Root: root, Cache: cache}
}

// TestJobDriver: a --rootfs job with an NVIDIA GPU gets the fixture host's
// driver: the libraries of the module's version with their soname and
// development links, the programs, mounted read-only at the driver's two
// directories on the ports after the binds'; COMMAND may be one of the
// programs. --gpu-libs=off, no GPU, or an --initrd without --gpu-libs=on
// give none; too many binds for the ports is the user's error (2).
func TestJobDriver(t *testing.T) {
	find := fixtureDriverHost(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	spec := &job.Spec{GPUs: 1}
	d, err := jobDriver(GPULibsDefault, true, find, spec, 2, log)
	require.NoError(t, err)
	require.NotNil(t, d)
	defer d.Close()
	assert.Equal(t, "580.159.04", d.version)
	libs := d.lib.Names()
	for _, n := range []string{"libcuda.so.580.159.04", "libcuda.so.1", "libcuda.so", "libnvidia-ml.so.580.159.04", "libnvidia-ml.so.1", "libnvidia-nvvm.so.4", "libGLX_nvidia.so.0"} {
		assert.Contains(t, libs, n)
	}
	for _, n := range libs {
		assert.False(t, strings.HasPrefix(n, "libcudart") || strings.Contains(n, "580.95.05") || strings.HasPrefix(n, "libOpenCL"), "%s: not the driver's (toolkit, compat, ICD loader)", n)
	}
	assert.Equal(t, []string{"nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nvidia-debugdump", "nvidia-persistenced", "nvidia-smi"}, d.bin.Names())
	assert.True(t, d.provides("nvidia-smi"))
	assert.False(t, d.provides("sh"))
	assert.Equal(t, []jobproto.Mount{
		{Port: "org.hpcvmm.9p.2", Target: "/.hpcvmm/driver/lib", ReadOnly: true, MSize: DefaultBindMSize, Cache: DefaultBindCache},
		{Port: "org.hpcvmm.9p.3", Target: "/.hpcvmm/driver/bin", ReadOnly: true, MSize: DefaultBindMSize, Cache: DefaultBindCache},
	}, d.mounts(2, DefaultBindMSize, DefaultBindCache))

	var none *driverFiles
	assert.False(t, none.provides("nvidia-smi"))
	assert.Empty(t, none.mounts(0, DefaultBindMSize, DefaultBindCache))
	none.Close()
	for name, c := range map[string]struct {
		mode  GPULibs
		image bool
		gpus  uint32
	}{
		"off":               {GPULibsOff, true, 1},
		"no GPU":            {GPULibsDefault, true, 0},
		"initrd by default": {GPULibsDefault, false, 1},
	} {
		d, err := jobDriver(c.mode, c.image, find, &job.Spec{GPUs: c.gpus}, 0, log)
		require.NoError(t, err, name)
		assert.Nil(t, d, name)
	}
	d2, err := jobDriver(GPULibsOn, false, find, spec, 0, log)
	require.NoError(t, err)
	require.NotNil(t, d2, "--initrd with --gpu-libs=on")
	d2.Close()

	_, err = jobDriver(GPULibsDefault, true, find, spec, 9, log)
	require.ErrorContains(t, err, "take 2 of the 10 ports binds share, and the job has 9 binds")
	assert.Equal(t, Input, classify(err, Input).Kind)
}

// TestJobDriverHostErrors: a library of another version than the loaded
// module, and no module loaded, are the host's fault (3), one line each,
// before boot.
func TestJobDriverHostErrors(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/lib/libcuda.so.580.159.04"), []byte("x"), 0o644))
	require.NoError(t, os.Symlink("libcuda.so.580.159.04", filepath.Join(root, "usr/lib/libcuda.so.1")))
	cache := []gpudriver.CacheEntry{{Name: "libcuda.so.1", Path: "/usr/lib/libcuda.so.1", Libc6: true, Arch: "x86-64"}}
	find := gpudriver.Options{Root: root, Cache: cache}
	spec := &job.Spec{GPUs: 1}

	_, err := jobDriver(GPULibsDefault, true, find, spec, 0, log)
	require.ErrorContains(t, err, "the NVIDIA kernel module is not loaded")
	assert.Equal(t, Host, classify(err, Input).Kind)
	assert.NotContains(t, err.Error(), "\n")

	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/module/nvidia"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sys/module/nvidia/version"), []byte("535.104.05\n"), 0o444))
	_, err = jobDriver(GPULibsDefault, true, find, spec, 0, log)
	var me *gpudriver.MismatchError
	require.True(t, errors.As(err, &me), "%v", err)
	assert.Equal(t, Host, classify(err, Input).Kind)
	msg := err.Error()
	assert.NotContains(t, msg, "\n")
	assert.Contains(t, msg, "module is version 535.104.05 but its libraries are version 580.159.04")
	assert.Contains(t, msg, "--gpu-libs=off")
}
