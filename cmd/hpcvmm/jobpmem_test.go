package main

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/apptainer/sif/v2/pkg/sif"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/kmodules"
)

// squashfsImage builds a SquashFS IMAGE with /bin/sh with mksquashfs; a
// missing mksquashfs fails where HPCVMM_REQUIRE_INTEGRATION=1 (CI:
// tests/testbed-packages.sh installs squashfs-tools).
func squashfsImage(t *testing.T) string {
	mk, err := exec.LookPath("mksquashfs")
	if err != nil {
		testenv.SkipOrFail(t, "mksquashfs not found: install Debian's squashfs-tools (tests/testbed-packages.sh does)")
	}
	tree := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(tree, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tree, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	out := filepath.Join(t.TempDir(), "img.sqfs")
	b, err := exec.Command(mk, tree, out, "-noappend", "-quiet", "-no-progress", "-all-root").CombinedOutput()
	require.NoError(t, err, "mksquashfs: %s", b)
	return out
}

// sifImage wraps a SquashFS file in a SIF whose system partition has
// file system fs.
func sifImage(t *testing.T, squashfs string, fs sif.FSType) string {
	data, err := os.ReadFile(squashfs)
	require.NoError(t, err)
	di, err := sif.NewDescriptorInput(sif.DataPartition, bytes.NewReader(data), sif.OptPartitionMetadata(fs, sif.PartPrimSys, "amd64"))
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "img.sif")
	f, err := sif.CreateContainerAtPath(p, sif.OptCreateWithDescriptors(di), sif.OptCreateDeterministic())
	require.NoError(t, err)
	require.NoError(t, f.UnloadContainer())
	return p
}

// TestPMEMJobInputErrors: a SquashFS or SIF IMAGE hpcvmm cannot map is the
// user's error before boot, on one line naming --rootfs IMAGE once; a
// good one takes the pmem path (here it stops at the kernel, whose
// release the initramfs of the modules needs).
func TestPMEMJobInputErrors(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	sq := squashfsImage(t)
	data, err := os.ReadFile(sq)
	require.NoError(t, err)
	cut := filepath.Join(t.TempDir(), "cut.sqfs")
	used := binary.LittleEndian.Uint64(data[40:]) // bytes_used
	require.NoError(t, os.WriteFile(cut, data[:used-1], 0o644))
	kernel := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kernel, []byte("not a kernel"), 0o644))
	for _, c := range []struct {
		image string
		want  []string
	}{
		{cut, []string{"--rootfs " + cut + ": SquashFS says it uses", "truncated or corrupt; copy or build it again"}},
		{sifImage(t, sq, sif.FsEncryptedSquashfs), []string{"encrypted", "hpcvmm cannot decrypt it"}},
		{sifImage(t, sq, sif.FsExt3), []string{"EXT3"}},
		{sq, []string{"--kernel " + kernel + ": its release"}},
		{sifImage(t, sq, sif.FsSquash), []string{"--kernel " + kernel + ": its release"}},
	} {
		code, _, errOut := hpcvmm(onKVMHost(t, []string{"run", "--kernel", kernel, "--rootfs", c.image, "--", "sh"})...)
		assert.Equal(t, 2, code, "%s: %s", c.image, errOut)
		for _, w := range c.want {
			assert.Contains(t, errOut, w, c.image)
		}
		assert.Equal(t, 1, strings.Count(errOut, "hpcvmm run:"), "one line: %s", errOut)
		assert.LessOrEqual(t, strings.Count(errOut, c.image), 1, "IMAGE named once at most: %s", errOut)
	}
}

// pmemModuleTree is the kmodules fixture's kernel (6.1.0-test) with the
// pmem path's modules added, laid out as Debian ships them (nd_pmem needs
// nd_btt, both need libnvdimm).
func pmemModuleTree(t *testing.T) string {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(fixtureModuleTree(t))))
	dir := filepath.Join(root, "6.1.0-test")
	ko, err := os.ReadFile(filepath.Join(dir, "kernel/net/core/failover.ko"))
	require.NoError(t, err)
	deps := map[string]string{
		"kernel/drivers/nvdimm/libnvdimm.ko": "",
		"kernel/drivers/nvdimm/nd_btt.ko":    "kernel/drivers/nvdimm/libnvdimm.ko",
		"kernel/drivers/nvdimm/nd_e820.ko":   "kernel/drivers/nvdimm/libnvdimm.ko",
		"kernel/drivers/nvdimm/nd_pmem.ko":   "kernel/drivers/nvdimm/nd_btt.ko kernel/drivers/nvdimm/libnvdimm.ko",
		"kernel/fs/squashfs/squashfs.ko":     "",
		"kernel/fs/overlayfs/overlay.ko":     "",
	}
	f, err := os.OpenFile(filepath.Join(dir, "modules.dep"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	defer f.Close()
	for mod, dep := range deps {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(mod)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, mod), ko, 0o644))
		_, err := io.WriteString(f, strings.TrimSpace(mod+": "+dep)+"\n")
		require.NoError(t, err)
	}
	return root
}

// TestPMEMInitrd: a pmem job's initramfs holds the agent and the modules,
// the pmem modules after their dependencies, nothing of IMAGE; it is one
// cache entry per kernel release and module set, hit by the next launch
// whatever its image, and a missing file-system module is the kernel's
// lack, named.
func TestPMEMInitrd(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	agentBin, cache, mods := staticAgent(t), t.TempDir(), pmemModuleTree(t)
	config := func(fs imagefile.FSType) (initramfs.Config, func()) {
		tree, cleanup, err := emptyTree()
		require.NoError(t, err)
		return initramfs.Config{Image: tree, Agent: agentBin, Release: "6.1.0-test", HostModules: mods,
			Modules: append(jobModules(false, nil), pmemModules(fs)...), CacheDir: cache, GuestMemory: 256 << 20}, cleanup
	}
	cfg, cleanup := config(imagefile.SquashFS)
	res, err := lookupOrBuild(cfg, nil, log)
	cleanup()
	require.NoError(t, err)
	require.False(t, res.Hit)
	at := func(m string) int {
		i := slices.Index(res.Modules, m)
		require.GreaterOrEqual(t, i, 0, "%s in %v", m, res.Modules)
		return i
	}
	assert.Less(t, at("libnvdimm"), at("nd_e820"))
	assert.Less(t, at("nd_btt"), at("nd_pmem"))
	assert.Less(t, at("nd_e820"), at("squashfs"))
	assert.Less(t, at("squashfs"), at("overlay"))
	assert.Contains(t, res.Modules, "virtio_console", "the job's own modules stay")
	st, err := os.Stat(agentBin)
	require.NoError(t, err)
	assert.Less(t, res.Unpacked, st.Size()+64<<10+int64(len(res.Modules))*8<<10, "agent and modules only")

	again, cleanup := config(imagefile.SquashFS)
	defer cleanup()
	hit, err := lookupOrBuild(again, nil, log)
	require.NoError(t, err)
	assert.True(t, hit.Hit, "the next launch, of any image, hits")
	assert.Equal(t, res.Key, hit.Key)

	ero, cleanup2 := config(imagefile.EROFS)
	defer cleanup2()
	_, err = lookupOrBuild(ero, nil, log)
	var unknown *kmodules.UnknownModuleError
	require.ErrorAs(t, err, &unknown, "the fixture kernel has no erofs")
	assert.Equal(t, "erofs", unknown.Name)
}
