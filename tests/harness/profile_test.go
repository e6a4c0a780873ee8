package harness

import (
	"os"
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

// TestProfileSlurmSharesPassthroughDevices: the slurm profile boots the
// passthrough profile's machine (same QEMU devices, kernel parameters and
// device setup, not a copy that could drift), with two vCPUs (one per
// slurmd node), and only it has an image of its own.
func TestProfileSlurmSharesPassthroughDevices(t *testing.T) {
	b := L1Boot{QEMU: "q", Kernel: "k", Initrd: "i", ConsolePath: "c", ResultsPath: "r"}
	pt, err := ProfilePassthrough.QEMUArgs(b, "")
	require.NoError(t, err)
	sl, err := ProfileSlurm.QEMUArgs(b, "")
	require.NoError(t, err)
	for i := range pt {
		pt[i] = strings.ReplaceAll(pt[i], "hpcvmm.profile=passthrough", "hpcvmm.profile=slurm")
		if i > 0 && pt[i-1] == "-smp" {
			assert.Equal(t, "1", pt[i], "the passthrough profile's vCPUs")
			pt[i] = "2"
		}
	}
	assert.Equal(t, pt, sl)
	assert.True(t, strings.HasPrefix(ProfileSlurm.Setup, passthroughSetup), "the slurm setup starts with the passthrough one")
	assert.Contains(t, ProfileSlurm.Setup, ". "+l1SlurmCluster)
	assert.True(t, ProfileSlurm.ownImage())
	assert.False(t, ProfileBasic.ownImage())
	assert.False(t, ProfilePassthrough.ownImage())
	assert.Error(t, ProfileSlurm.HostReady(), "auto mode runs the Slurm scenarios in L1")
}

// TestAddSlurm packs the installed Debian Slurm into an image: daemons,
// clients, munge, the plugins the cluster's slurm.conf and cgroup.conf
// name, their libraries and the cluster script.
func TestAddSlurm(t *testing.T) {
	if _, err := os.Stat("/usr/sbin/slurmd"); err != nil {
		t.Skipf("Slurm is not installed here (tests/testbed-packages.sh installs it): %v", err)
	}
	im := NewImage()
	require.NoError(t, addSlurm(im))
	for _, p := range []string{
		"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd", "/usr/sbin/munged", "/usr/bin/srun", "/usr/bin/sbatch",
		slurmPluginDir + "/libslurmfull.so", slurmPluginDir + "/auth_munge.so", slurmPluginDir + "/proctrack_cgroup.so",
		slurmPluginDir + "/task_cgroup.so", slurmPluginDir + "/cgroup_v1.so", slurmPluginDir + "/select_cons_tres.so",
		slurmPluginDir + "/gres_gpu.so", slurmPluginDir + "/gres_nic.so",
		"/lib64/ld-linux-x86-64.so.2", l1SlurmCluster,
	} {
		assert.True(t, im.Has(p), p)
	}
	var munge bool
	for p := range im.entries {
		munge = munge || strings.Contains(p, "libmunge.so")
	}
	assert.True(t, munge, "libmunge (auth_munge's library) is packed")
}
