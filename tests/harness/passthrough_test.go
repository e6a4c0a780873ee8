package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfilePassthroughQEMUArgs(t *testing.T) {
	args, err := ProfilePassthrough.QEMUArgs(L1Boot{Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}, "")
	require.NoError(t, err)
	joined := strings.Join(args, " ")
	assert.Contains(t, joined, "-machine q35,kernel-irqchip=split")
	iommu := slices.Index(args, "intel-iommu,intremap=on,caching-mode=on,aw-bits=48")
	edu := slices.Index(args, "edu,addr=04.0,dma_mask=0xffffffffffffffff")
	require.GreaterOrEqual(t, iommu, 0)
	assert.Less(t, iommu, edu, "intel-iommu must precede the devices it translates")
	assert.Contains(t, joined, "q35-pcihost.pci-hole64-size=256G")
	cmdline := strings.Fields(args[slices.Index(args, "-append")+1])
	assert.Contains(t, cmdline, "intel_iommu=on")
	assert.Contains(t, cmdline, "hugepages=4")
}

func TestPreparePassthrough(t *testing.T) {
	dir := t.TempDir()
	extra, err := ProfilePassthrough.Prepare(dir)
	require.NoError(t, err)
	joined := strings.Join(extra, " ")
	disk, bar := filepath.Join(dir, PassthroughDiskFile), filepath.Join(dir, PassthroughBARFile)
	assert.Contains(t, joined, "file="+disk+",if=none,id=nvm,format=raw")
	assert.Contains(t, joined, "memory-backend-file,id=bar,size=68719476736,mem-path="+bar+",share=on,prealloc=off")
	assert.Contains(t, joined, "ivshmem-plain,memdev=bar,addr=06.0")
	assert.Contains(t, joined, "sriov_max_vfs=2")
	for path, size := range map[string]int64{disk: NVMeDiskSize, bar: IvshmemBARSize} {
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, size, st.Size(), path)
	}

	_, err = ProfilePassthrough.Prepare("/tmp/a,b")
	assert.ErrorContains(t, err, "HPCVMM_TEST_CACHE")
}

func TestPassthroughSetupIsValidShell(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to syntax-check the L1 setup")
	}
	out, err := exec.Command(sh, "-n", "-c", ProfilePassthrough.Setup).CombinedOutput()
	assert.NoError(t, err, "%s", out)
}
