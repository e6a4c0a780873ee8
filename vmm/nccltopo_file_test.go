package vmm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// TestNCCLTopoFileDoesNotFollowSymlinks is issue 23's defect 9a: hpcvmm,
// as root, wrote --nccl-topo through a symlink planted at the path (a
// user's /etc/ld.so.preload). The file is now written beside the path and
// renamed over it: the symlink is replaced, its target untouched.
func TestNCCLTopoFileDoesNotFollowSymlinks(t *testing.T) {
	vm := topologyVM(t, switchTree(t), TopologyHost)
	require.NoError(t, vm.addPorts())
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("precious\n"), 0o600))
	file := filepath.Join(dir, "topo.xml")
	require.NoError(t, os.Symlink(victim, file))
	vm.cfg.NCCLTopoFile = file
	require.NoError(t, vm.writeNCCLTopology([]uapi.CPUIDEntry{}))

	v, err := os.ReadFile(victim)
	require.NoError(t, err)
	assert.Equal(t, "precious\n", string(v), "the symlink's target is untouched")
	fi, err := os.Lstat(file)
	require.NoError(t, err)
	assert.True(t, fi.Mode().IsRegular(), "the symlink was replaced by the file")
	assert.Equal(t, os.FileMode(0o644), fi.Mode().Perm())
	x, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Contains(t, string(x), "<system ")
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "no temporary file left behind")

	// A directory at the path: an error, nothing left behind.
	vm.cfg.NCCLTopoFile = dir
	assert.ErrorContains(t, vm.writeNCCLTopology(nil), "NCCL topology file")
	ents, err = os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 2)
}

// TestNCCLTopoFileWrittenAsTheUser is issue 30's defect 6 for --nccl-topo:
// hpcvmm running as root for a job's user (asuser) replaced any file named,
// /etc/passwd included. It is now created and renamed into place with that
// user's rights: a root-owned file in a directory the user cannot write is
// refused and left alone, and a file the user may write becomes the user's.
func TestNCCLTopoFileWrittenAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("acting for another user needs root (as hpcvmm in a Slurm step)")
	}
	nobody := &asuser.User{UID: 65534, GID: 65534, Name: "nobody"}
	vm := topologyVM(t, switchTree(t), TopologyHost)
	require.NoError(t, vm.addPorts())
	vm.cfg.ActingFor = nobody
	dir := t.TempDir()
	require.NoError(t, os.Chmod(filepath.Dir(dir), 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	root := filepath.Join(dir, "passwd")
	require.NoError(t, os.WriteFile(root, []byte("root:x:0:0\n"), 0o644))
	vm.cfg.NCCLTopoFile = root
	assert.ErrorContains(t, vm.writeNCCLTopology(nil), "permission denied")
	b, err := os.ReadFile(root)
	require.NoError(t, err)
	assert.Equal(t, "root:x:0:0\n", string(b), "root's file untouched")

	mine := filepath.Join(t.TempDir(), "topo.xml")
	require.NoError(t, os.Chmod(filepath.Dir(mine), 0o777))
	require.NoError(t, os.Chmod(filepath.Dir(filepath.Dir(mine)), 0o755))
	vm.cfg.NCCLTopoFile = mine
	require.NoError(t, vm.writeNCCLTopology(nil))
	var st unix.Stat_t
	require.NoError(t, unix.Stat(mine, &st))
	assert.Equal(t, uint32(65534), st.Uid, "created as the user")
}
