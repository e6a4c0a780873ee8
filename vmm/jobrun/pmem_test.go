package jobrun

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun/jobruntest"
)

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
		"kernel/crypto/crc32c_generic.ko":    "",
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
	agentBin, cache, mods := jobruntest.Agent(t, ProbeAnswer()), t.TempDir(), pmemModuleTree(t)
	config := func(fs imagefile.FSType) (initramfs.Config, func()) {
		tree, cleanup, err := emptyTree()
		require.NoError(t, err)
		return initramfs.Config{Image: tree, Agent: agentBin, Release: "6.1.0-test", HostModules: mods,
			Modules: append(jobModules(false, nil), pmemModules(fs)...), CacheDir: cache, GuestMemory: 256 << 20}, cleanup
	}
	cfg, cleanup := config(imagefile.SquashFS)
	res, err := lookupOrBuild(cfg, nil, nil, log)
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
	hit, err := lookupOrBuild(again, nil, nil, log)
	require.NoError(t, err)
	assert.True(t, hit.Hit, "the next launch, of any image, hits")
	assert.Equal(t, res.Key, hit.Key)

	ero, cleanup2 := config(imagefile.EROFS)
	defer cleanup2()
	_, err = lookupOrBuild(ero, nil, nil, log)
	var unknown *kmodules.UnknownModuleError
	require.ErrorAs(t, err, &unknown, "the fixture kernel has no erofs")
	assert.Equal(t, "erofs", unknown.Name)
}
