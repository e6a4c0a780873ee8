package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRunOnADirectory prepares and measures a small run on a temporary
// directory: every line is there, and only the prepared file is left.
func TestRunOnADirectory(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, prepareRead(dir, 3, &out))
	assert.Equal(t, "fsbench prepared bytes=3145728\n", out.String())
	mi := filepath.Join(t.TempDir(), "mountinfo")
	require.NoError(t, os.WriteFile(mi, []byte(
		"22 1 0:21 / / rw,relatime - rootfs rootfs rw\n"+
			"40 22 0:40 / "+dir+" rw,nosuid,nodev,relatime - 9p hpcvmm rw,access=user,trans=fd,rfd=3,wfd=3,msize=131072,cache=mmap\n"), 0o644))
	out.Reset()
	require.NoError(t, run(dir, params{readMiB: 3, writeMiB: 2, files: 5}, mi, &out))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 7, out.String())
	assert.Equal(t, "fsbench mount fstype=9p source=hpcvmm options=rw,nosuid,nodev,relatime,rw,access=user,trans=fd,rfd=3,wfd=3,msize=131072,cache=mmap", lines[0])
	assert.Regexp(t, `^fsbench read bytes=3145728 ns=[1-9][0-9]* mib_s=[0-9.]+$`, lines[1])
	assert.Regexp(t, `^fsbench write bytes=2097152 ns=[1-9][0-9]* mib_s=[0-9.]+$`, lines[2])
	assert.Regexp(t, `^fsbench create files=5 bytes=4096 ns=[1-9][0-9]*$`, lines[3])
	assert.Regexp(t, `^fsbench stat files=5 ns=[1-9][0-9]*$`, lines[4])
	assert.Regexp(t, `^fsbench meta files=5 ns=[1-9][0-9]*$`, lines[5])
	assert.Equal(t, "fsbench done", lines[6])
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, left, 1, "the write and the small files are removed")
	assert.Equal(t, readName, left[0].Name())
}

// TestReadChecksThePreparedFile: a read of the wrong size or of a file
// whose MiB are out of order is an error, never a number.
func TestReadChecksThePreparedFile(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, prepareRead(dir, 2, &bytes.Buffer{}))
	var out bytes.Buffer
	err := run(dir, params{readMiB: 3, writeMiB: 1, files: 1}, "/nonexistent", &out)
	assert.ErrorContains(t, err, "want 3145728 (-read-mib 3)")
	assert.Contains(t, out.String(), "fstype=unknown", "a missing mountinfo is reported, not fatal")

	path := filepath.Join(dir, readName)
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	b[chunk] = 7 // MiB 1 claims to be MiB 7
	require.NoError(t, os.WriteFile(path, b, 0o644))
	err = run(dir, params{readMiB: 2, writeMiB: 1, files: 1}, "/nonexistent", &bytes.Buffer{})
	assert.ErrorContains(t, err, "MiB 1 holds MiB 7's index")

	require.NoError(t, os.Remove(path))
	err = run(dir, params{readMiB: 2, writeMiB: 1, files: 1}, "/nonexistent", &bytes.Buffer{})
	assert.ErrorContains(t, err, "made by fsbench -prepare")
	assert.Error(t, run(dir, params{readMiB: 0, writeMiB: 1, files: 1}, "/nonexistent", &bytes.Buffer{}))
	assert.Error(t, prepareRead(dir, 0, &bytes.Buffer{}))
}

func TestMountOf(t *testing.T) {
	mi := filepath.Join(t.TempDir(), "mountinfo")
	require.NoError(t, os.WriteFile(mi, []byte(
		"22 1 0:21 / / rw - rootfs rootfs rw\n"+
			"30 22 0:30 / /da rw - tmpfs tmpfs rw\n"+
			"40 22 0:40 / /data rw shared:1 - 9p data rw,msize=512000,cache=mmap\n"+
			"41 22 0:41 / /with\\040space rw - tmpfs t rw\n"+
			"garbage\n"), 0o644))
	m, err := mountOf(mi, "/data")
	require.NoError(t, err)
	assert.Equal(t, mount{point: "/data", fstype: "9p", source: "data", options: "rw,rw,msize=512000,cache=mmap"}, m)
	m, err = mountOf(mi, "/data/sub")
	require.NoError(t, err)
	assert.Equal(t, "9p", m.fstype)
	m, err = mountOf(mi, "/datax")
	require.NoError(t, err)
	assert.Equal(t, "rootfs", m.fstype, "/da is not a parent of /datax")
	m, err = mountOf(mi, "/with space/x")
	require.NoError(t, err)
	assert.Equal(t, "tmpfs", m.fstype)
	assert.Equal(t, `a\0`, unescapeOctal(`a\0`), "a cut escape stays as it is")
}
