package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
)

// jobUserTree is a tree every user may traverse (t.TempDir's parent is
// 0700), with an IMAGE, a kernel and a root-only secret in it.
type jobUserTree struct{ dir, img, kernel, secret string }

func newJobUserTree(t *testing.T) jobUserTree {
	if os.Geteuid() != 0 {
		t.Skip("acting for a Slurm job's user (SLURM_JOB_UID) needs root, as hpcvmm in a Slurm step")
	}
	d := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(d), 0o755))
	require.NoError(t, os.Chmod(d, 0o755))
	tr := jobUserTree{dir: d, img: filepath.Join(d, "img"), kernel: filepath.Join(d, "bzImage"), secret: filepath.Join(d, "secret")}
	require.NoError(t, os.MkdirAll(filepath.Join(tr.img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(tr.img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(tr.kernel, boottest.BzImage(nil, 0, 0), 0o644))
	require.NoError(t, os.WriteFile(tr.secret, []byte("TOKEN=root-only\n"), 0o600))
	t.Setenv("SLURM_JOB_UID", "65534")
	return tr
}

// oneLine asserts that stderr is one line holding every want.
func oneLine(t *testing.T, stderr string, want ...string) {
	t.Helper()
	assert.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
	for _, w := range want {
		assert.Contains(t, stderr, w)
	}
}

// TestEnvFileOpenedAsTheJobUser is issue 30's defect 6: with SLURM_JOB_UID
// naming an unprivileged user, hpcvmm (root in the step) put the lines of
// a 0600 root file into COMMAND's environment. The file is now opened as
// that user, and refused with a one-line error naming it before anything
// on the host changes.
func TestEnvFileOpenedAsTheJobUser(t *testing.T) {
	tr := newJobUserTree(t)
	rc, _, errs := hpcvmm("run", "--kernel", tr.kernel, "--rootfs", tr.img, "--env-file", tr.secret, "--", "sh")
	assert.Equal(t, 2, rc)
	oneLine(t, errs, "--env-file "+tr.secret+": permission denied")
	assert.NotContains(t, errs, "root-only")
}

// TestUserNamedInputsOpenedAsTheJobUser: --kernel, --initrd and --rootfs
// that only root may read are refused for the job's user, naming the flag
// and the file.
func TestUserNamedInputsOpenedAsTheJobUser(t *testing.T) {
	tr := newJobUserTree(t)
	rc, _, errs := hpcvmm("run", "--kernel", tr.secret, "--console", "none")
	assert.Equal(t, 2, rc)
	oneLine(t, errs, "--kernel", tr.secret, "permission denied")

	rc, _, errs = hpcvmm("run", "--kernel", tr.kernel, "--initrd", tr.secret, "--console", "none")
	assert.Equal(t, 2, rc)
	oneLine(t, errs, "--initrd", tr.secret, "permission denied")

	tarball := filepath.Join(tr.dir, "img.tar")
	require.NoError(t, os.WriteFile(tarball, make([]byte, 1024), 0o600))
	rc, _, errs = hpcvmm(onKVMHost(t, []string{"run", "--kernel", tr.kernel, "--rootfs", tarball, "--", "sh"})...)
	assert.Equal(t, 2, rc)
	oneLine(t, errs, "--rootfs", tarball, "permission denied")
}
