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

func TestProfileSwitchPutsTheStandInsBehindTheSwitch(t *testing.T) {
	dir := t.TempDir()
	extra, err := ProfileSwitch.Prepare(dir)
	require.NoError(t, err)
	args, err := ProfileSwitch.QEMUArgs(L1Boot{Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}, "")
	require.NoError(t, err)
	args = append(args, extra...)
	iommu := slices.Index(args, "intel-iommu,intremap=on,caching-mode=on,aw-bits=48")
	rp := slices.Index(args, "pcie-root-port,id=rp1,bus=pcie.0,chassis=1,addr=07.0")
	require.GreaterOrEqual(t, iommu, 0)
	assert.Less(t, iommu, rp, "intel-iommu must precede the devices it translates")
	joined := strings.Join(args, " ")
	for _, want := range []string{"edu,bus=dn1,", "msix_qsize=8,bus=dn2", "ivshmem-plain,memdev=bar,bus=dn3", "xio3130-downstream,id=dn3,bus=up1", "-m 5G"} {
		assert.Contains(t, joined, want)
	}
	assert.Contains(t, ProfileSwitch.Cmdline, "hugepages=2")
	out, err := exec.Command("sh", "-n", "-c", ProfileSwitch.Setup).CombinedOutput()
	assert.NoError(t, err, "%s", out)
}

func TestCPUProfilesArrangeTheirCPUs(t *testing.T) {
	for p, want := range map[*Profile]string{&ProfileCores: "-smp 2,cores=2"} {
		args, err := p.QEMUArgs(L1Boot{Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}, "")
		require.NoError(t, err)
		assert.Contains(t, strings.Join(args, " "), want, p.Name)
		out, err := exec.Command("sh", "-n", "-c", p.Setup).CombinedOutput()
		assert.NoError(t, err, "%s", out)
	}
}
