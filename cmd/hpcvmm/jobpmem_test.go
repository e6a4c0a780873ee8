package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/apptainer/sif/v2/pkg/sif"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
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
