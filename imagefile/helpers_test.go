package imagefile

import (
	"bytes"
	"crypto"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/apptainer/sif/v2/pkg/sif"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
)

// tool returns the path of a program the test builds images with; a
// missing one skips, or fails where HPCVMM_REQUIRE_INTEGRATION=1 (CI):
// tests/testbed-packages.sh installs it.
func tool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		testenv.SkipOrFail(t, "%s not found: install Debian's %s (tests/testbed-packages.sh does)", name, pkg)
	}
	return p
}

// tree writes a small directory tree to build images from.
func tree(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bin", "hello"), []byte("#!/bin/sh\necho hello\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data"), bytes.Repeat([]byte("hpcvmm "), 10000), 0o644))
	return dir
}

// squashfs builds a SquashFS image of a small tree with mksquashfs.
func squashfs(t testing.TB) []byte {
	t.Helper()
	mk := tool(t, "mksquashfs", "squashfs-tools")
	out := filepath.Join(t.TempDir(), "img.sqfs")
	cmd := exec.Command(mk, tree(t), out, "-noappend", "-quiet", "-no-progress", "-all-root")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "mksquashfs: %s", b)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return data
}

// erofs builds an EROFS image of a small tree with mkfs.erofs.
func erofs(t testing.TB) []byte {
	t.Helper()
	mk := tool(t, "mkfs.erofs", "erofs-utils")
	out := filepath.Join(t.TempDir(), "img.erofs")
	b, err := exec.Command(mk, "--quiet", out, tree(t)).CombinedOutput()
	require.NoError(t, err, "mkfs.erofs: %s", b)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return data
}

// sifOpts shape the SIF makeSIF writes.
type sifOpts struct {
	fs        sif.FSType
	part      sif.PartType
	arch      string
	signed    bool
	misalign  bool // a 3-byte object first and the partition unaligned
	noPrimary bool // the partition is a data partition only
}

// makeSIF wraps fs in a SIF with the sif library, as `apptainer build`
// does: the partition, optionally a signature object linked to it.
func makeSIF(t testing.TB, fs []byte, o sifOpts) []byte {
	t.Helper()
	if o.fs == 0 {
		o.fs = sif.FsSquash
	}
	if o.part == 0 {
		o.part = sif.PartPrimSys
	}
	if o.noPrimary {
		o.part = sif.PartData
	}
	if o.arch == "" {
		o.arch = "amd64"
	}
	var dis []sif.DescriptorInput
	partOpts := []sif.DescriptorInputOpt{sif.OptPartitionMetadata(o.fs, o.part, o.arch)}
	if o.misalign {
		di, err := sif.NewDescriptorInput(sif.DataGeneric, bytes.NewReader([]byte("abc")))
		require.NoError(t, err)
		dis = append(dis, di)
		partOpts = append(partOpts, sif.OptObjectAlignment(1))
	}
	di, err := sif.NewDescriptorInput(sif.DataPartition, bytes.NewReader(fs), partOpts...)
	require.NoError(t, err)
	dis = append(dis, di)
	if o.signed {
		sig, err := sif.NewDescriptorInput(sif.DataSignature, bytes.NewReader([]byte("-----BEGIN PGP SIGNATURE-----\n")),
			sif.OptSignatureMetadata(crypto.SHA256, bytes.Repeat([]byte{0xab}, 20)), sif.OptLinkedID(uint32(len(dis))))
		require.NoError(t, err)
		dis = append(dis, sig)
	}
	path := filepath.Join(t.TempDir(), "img.sif")
	f, err := sif.CreateContainerAtPath(path, sif.OptCreateWithDescriptors(dis...),
		sif.OptCreateWithTime(time.Unix(1700000000, 0)), sif.OptCreateDeterministic())
	require.NoError(t, err)
	require.NoError(t, f.UnloadContainer())
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return data
}
