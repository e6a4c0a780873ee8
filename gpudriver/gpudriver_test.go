package gpudriver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The fake host root (testdata/mkroot.sh): the files and links of the real
// H200 host's ldconfig -p (testdata/ldconfig-p.txt), module 580.159.04.
const (
	hostRoot      = "testdata/host"
	fixtureModule = "580.159.04"
)

func fixtureCache(t testing.TB) []CacheEntry {
	t.Helper()
	b, err := os.ReadFile("testdata/ldconfig-p.txt")
	require.NoError(t, err)
	c, err := ParseLdconfig(b)
	require.NoError(t, err)
	return c
}

// fixtureLibraries are the driver's libraries the fixture host's loader
// finds: its /usr/local/nvidia/lib64 tree, which the cache lists before
// /lib's copies; every one of the module's version.
var fixtureLibraries = []string{
	"libvdpau_nvidia.so", "libnvoptix.so", "libnvidia-tls.so", "libnvidia-rtcore.so",
	"libnvidia-ptxjitcompiler.so", "libnvidia-pkcs11-openssl3.so", "libnvidia-opticalflow.so",
	"libnvidia-opencl.so", "libnvidia-nvvm.so", "libnvidia-ml.so", "libnvidia-gpucomp.so",
	"libnvidia-glvkspirv.so", "libnvidia-glsi.so", "libnvidia-glcore.so", "libnvidia-fbc.so",
	"libnvidia-encode.so", "libnvidia-eglcore.so", "libnvidia-cfg.so", "libnvidia-allocator.so",
	"libnvcuvid.so", "libcudadebugger.so", "libcuda.so", "libGLX_nvidia.so", "libGLESv2_nvidia.so",
	"libGLESv1_CM_nvidia.so", "libEGL_nvidia.so",
}

func files(d *Driver) []string {
	var out []string
	for _, l := range d.Libraries {
		out = append(out, l.File)
	}
	return out
}

func TestFindFixture(t *testing.T) {
	d, err := Find(Options{Root: hostRoot, Cache: fixtureCache(t)})
	require.NoError(t, err)
	require.Equal(t, fixtureModule, d.Version)
	var want []string
	for _, n := range fixtureLibraries {
		want = append(want, "/usr/local/nvidia/lib64/"+n+"."+fixtureModule)
	}
	require.Equal(t, want, files(d))
	for _, l := range d.Libraries {
		require.True(t, l.Is64, l.File)
		require.NotContains(t, l.File, "/usr/local/cuda")
	}
	require.Equal(t, []string{"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so"}, d.Libraries[21].Links)
	require.Equal(t, []string{"/usr/local/nvidia/lib64/libnvidia-tls.so"}, d.Libraries[2].Links,
		"libnvidia-tls.so.580.159.04 is its own cache name: only the development link is a link")
	require.Equal(t, []string{"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump", "/usr/bin/nvidia-persistenced",
		"/usr/bin/nvidia-cuda-mps-control", "/usr/bin/nvidia-cuda-mps-server"}, d.Binaries)
}

// TestFindLeavesOutToolkitAndCompat32: the CUDA toolkit's forward-
// compatibility libcuda (driver 580.95.05, finds.txt), listed first in the
// cache as on a host whose ld.so.conf names the compat directory, is
// never taken (taking it would be a version mismatch); the i386 libcuda
// only with Compat32.
func TestFindLeavesOutToolkitAndCompat32(t *testing.T) {
	extra, err := ParseLdconfig([]byte("3 libs found in cache `/etc/ld.so.cache'\n" +
		"\tlibcuda.so.1 (libc6,x86-64) => /usr/local/cuda-13.0/compat/libcuda.so.1\n" +
		"\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1\n" +
		"\tlibcuda.so (libc6,x86-64) => /usr/local/cuda/targets/x86_64-linux/lib/stubs/libcuda.so\n"))
	require.NoError(t, err)
	require.False(t, extra[1].Is64())
	cache := append(extra, fixtureCache(t)...)

	d, err := Find(Options{Root: hostRoot, Cache: cache})
	require.NoError(t, err)
	require.Len(t, d.Libraries, len(fixtureLibraries))
	for _, f := range files(d) {
		require.True(t, strings.HasPrefix(f, "/usr/local/nvidia/lib64/"), f)
	}

	d, err = Find(Options{Root: hostRoot, Cache: cache, Compat32: true})
	require.NoError(t, err)
	require.Len(t, d.Libraries, len(fixtureLibraries)+1)
	require.Equal(t, Library{File: "/usr/lib/i386-linux-gnu/libcuda.so." + fixtureModule,
		Links: []string{"/usr/lib/i386-linux-gnu/libcuda.so.1"}}, d.Libraries[0])

	require.True(t, toolkitPath("/usr/local/cuda-13.0/compat/libcuda.so.1"))
	require.True(t, toolkitPath("/opt/x/stubs/libcuda.so"))
	require.False(t, toolkitPath("/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
}

// fakeHost makes a root whose module is version module and whose loader
// cache maps libcuda.so.1 to libcuda.so.lib.
func fakeHost(t *testing.T, module, lib string) (string, []CacheEntry) {
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "libcuda.so."+lib), []byte("fake"), 0o644))
	require.NoError(t, os.Symlink("libcuda.so."+lib, filepath.Join(dir, "libcuda.so.1")))
	if module != "" {
		require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/module/nvidia"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "sys/module/nvidia/version"), []byte(module+"\n"), 0o444))
	}
	return root, []CacheEntry{{Name: "libcuda.so.1", Path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", Libc6: true, Arch: "x86-64"}}
}

func TestFindRefusesMismatch(t *testing.T) {
	root, cache := fakeHost(t, fixtureModule, "575.57.08")
	_, err := Find(Options{Root: root, Cache: cache})
	var mm *MismatchError
	require.ErrorAs(t, err, &mm)
	require.Equal(t, MismatchError{Module: fixtureModule, Library: "575.57.08",
		Link: "/usr/lib/x86_64-linux-gnu/libcuda.so.1", File: "/usr/lib/x86_64-linux-gnu/libcuda.so.575.57.08"}, *mm)
	msg := err.Error()
	require.NotContains(t, msg, "\n")
	require.Contains(t, msg, "kernel module is version 580.159.04 but its libraries are version 575.57.08")
	require.Contains(t, msg, "install the driver user space of version 580.159.04")

	// The same host with the module of the libraries' version is fine.
	root, cache = fakeHost(t, "575.57.08", "575.57.08")
	d, err := Find(Options{Root: root, Cache: cache})
	require.NoError(t, err)
	require.Equal(t, "575.57.08", d.Version, "read from /sys/module/nvidia/version")
	require.Empty(t, d.Binaries)

	root, cache = fakeHost(t, "", fixtureModule)
	_, err = Find(Options{Root: root, Cache: cache})
	require.ErrorContains(t, err, "the NVIDIA kernel module is not loaded")
	require.ErrorIs(t, err, ErrNotLoaded)

	root, _ = fakeHost(t, fixtureModule, fixtureModule)
	_, err = Find(Options{Root: root, Cache: []CacheEntry{}})
	require.ErrorContains(t, err, "no libcuda.so of driver 580.159.04")
	_, err = Find(Options{Root: root})
	require.ErrorContains(t, err, "run ldconfig", "no /etc/ld.so.cache")
}

func TestModuleVersion(t *testing.T) {
	v, err := ModuleVersion(hostRoot)
	require.NoError(t, err)
	require.Equal(t, fixtureModule, v)
	v, err = ParseVersion([]byte("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0\n"))
	require.NoError(t, err)
	require.Equal(t, "535.104.05", v)
	_, err = ParseVersion([]byte("NVRM version: NVIDIA UNIX Kernel Module for x86_64  unknown\nGCC version: 15.3.0\n"))
	require.Error(t, err, "the GCC line's version is not the driver's")
	for s, want := range map[string]bool{"580.159.04": true, "470.82.01": true, "96.43": true,
		"1.1.0": false, "4": false, "13.0": true, "580.159.04.1": false, "580.x": false, "": false} {
		require.Equal(t, want, IsDriverVersion(s), s)
	}
}

// TestResolveInStaysBeneathRoot: absolute and ".." targets are taken from
// the root, never from the real "/".
func TestResolveInStaysBeneathRoot(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/passwd"), nil, 0o644))
	require.NoError(t, os.Symlink("../../../../../etc/passwd", filepath.Join(root, "up")))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(root, "abs")))
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(root, "gone")))
	require.NoError(t, os.Symlink("loop", filepath.Join(root, "loop")))
	for _, p := range []string{"/up", "/abs", "/../../etc/passwd"} {
		got, err := ResolveIn(root, p)
		require.NoError(t, err, p)
		require.Equal(t, "/etc/passwd", got, p)
	}
	_, err := ResolveIn(root, "/gone")
	require.True(t, errors.Is(err, os.ErrNotExist), "the host's /etc/shadow is not looked at: %v", err)
	_, err = ResolveIn(root, "/loop")
	require.ErrorContains(t, err, "symbolic links")
	_, err = ResolveIn(root, "up")
	require.ErrorContains(t, err, "not an absolute path")

	got, err := ResolveIn(hostRoot, "/lib/libcuda.so.1")
	require.NoError(t, err)
	require.Equal(t, "/usr/lib/libcuda.so."+fixtureModule, got, "merged /usr: /lib is a link to usr/lib")
}
