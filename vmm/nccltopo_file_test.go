package vmm

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
