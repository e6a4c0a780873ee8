package harness

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProfileBasicQEMUArgs(t *testing.T) {
	b := L1Boot{Kernel: "/boot/vmlinuz-x", Initrd: "/c/l1.cpio", ConsolePath: "/r/con.log", ResultsPath: "/r/res.txt"}
	args, err := ProfileBasic.QEMUArgs(b, "Zm9v")
	require.NoError(t, err)
	joined := strings.Join(args, " ")
	for _, want := range []string{
		"-accel tcg", "-machine q35", "-cpu max", "-m 5G", "-smp 1", "-no-reboot",
		"-kernel /boot/vmlinuz-x", "-initrd /c/l1.cpio",
		"-serial file:/r/con.log -serial file:/r/res.txt", // ttyS0 console, ttyS1 results, in that order
	} {
		assert.Contains(t, joined, want)
	}
	i := slices.Index(args, "-append")
	require.GreaterOrEqual(t, i, 0)
	cmdline := strings.Fields(args[i+1])
	for _, want := range []string{"console=ttyS0", "panic=-1", "hpcvmm.profile=basic", "hpcvmm.run=Zm9v", "hugepagesz=1G", "hugepages=2"} {
		assert.Contains(t, cmdline, want)
	}

	b.CPUs = 2
	args, err = ProfileBasic.QEMUArgs(b, "")
	require.NoError(t, err)
	assert.Contains(t, strings.Join(args, " "), "-smp 2", "HPCVMM_L1_SMP override")
	assert.NotContains(t, strings.Join(args, " "), "hpcvmm.run=")
}

func TestProfileDevicesAppended(t *testing.T) {
	p := ProfileBasic
	p.Name = "edu"
	p.Devices = []string{"-device", "edu,addr=04.0"}
	args, err := p.QEMUArgs(L1Boot{Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}, "")
	require.NoError(t, err)
	assert.Equal(t, []string{"-device", "edu,addr=04.0"}, args[len(args)-2:])
}

func TestProfileValidate(t *testing.T) {
	for name, mut := range map[string]func(*Profile){
		"empty name": func(p *Profile) { p.Name = "" },
		"space":      func(p *Profile) { p.Name = "a b" },
		"no machine": func(p *Profile) { p.Machine = "" },
		"no memory":  func(p *Profile) { p.Memory = "" },
		"zero cpus":  func(p *Profile) { p.CPUs = 0 },
	} {
		p := ProfileBasic
		mut(&p)
		assert.Error(t, p.Validate(), name)
	}
	_, err := ProfileBasic.QEMUArgs(L1Boot{ConsolePath: "/a,b/c", ResultsPath: "r"}, "")
	assert.ErrorContains(t, err, "HPCVMM_TEST_CACHE", "a comma would break QEMU's file: syntax")
}

func TestProfilesHaveUniqueNamesAndScripts(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Profiles {
		require.NoError(t, p.Validate())
		assert.False(t, seen[p.Name], "duplicate profile %s", p.Name)
		seen[p.Name] = true
	}
	assert.Len(t, profileScripts(), len(Profiles))
}

func TestRunConfigQuoting(t *testing.T) {
	cfg := runConfig(`^TestA$|it's`, "", 90*time.Second)
	assert.Equal(t, "HPCVMM_RUN='^TestA$|it'\\''s'\nHPCVMM_SKIP=''\nHPCVMM_TIMEOUT='1m30s'\n", cfg)
}
