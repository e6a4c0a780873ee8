package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/slurm"
)

// slurmCLINode is a Slurm node as `hpcvmm run` sees it inside a job step:
// two NUMA nodes, a GPU on node 0 in IOMMU group 12, an InfiniBand PF with
// a VF in group 40, gres.conf declaring both by their VFIO group files,
// and the variables srun --gres=gpu:1,nic:1 --mem=8192 sets.
type slurmCLINode struct {
	tree *hosttest.Tree
	vars map[string]string
}

func newSlurmCLINode(t *testing.T) *slurmCLINode {
	tr := hosttest.New(t)
	tr.Node(0, "0-7", 64<<30)
	tr.Node(1, "8-15", 64<<30)
	for _, d := range []hosttest.Device{
		{BDF: "0000:17:00.0", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 12},
		{BDF: "0000:41:00.0", Vendor: 0x15b3, DeviceID: 0x101b, Class: 0x020700, Driver: "mlx5_core", NUMANode: 0, IOMMUGroup: 30},
		{BDF: "0000:41:00.1", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 40},
	} {
		tr.AddDevice(d)
	}
	tr.LinkVF("0000:41:00.0", "0000:41:00.1", 0)
	tr.VFIOGroupFile(12)
	tr.VFIOGroupFile(40)
	tr.Write("etc/slurm/slurm.conf", "ClusterName=c1\n")
	tr.Write("etc/slurm/gres.conf", "# by VFIO group\nName=gpu File=/dev/vfio/12\nName=nic File=/dev/vfio/40\n")
	return &slurmCLINode{tree: tr, vars: map[string]string{
		"SLURM_JOB_ID":       "77",
		"SLURM_CLUSTER_NAME": "c1",
		"SLURMD_NODENAME":    "n1",
		"SLURM_CONF":         filepath.Join(tr.Root, "etc/slurm/slurm.conf"),
		"SLURM_STEP_GPUS":    "0",
		"SLURM_STEP_NICS":    "mlx4_40", // as gres_nic.c writes it
		"SLURM_MEM_PER_NODE": "8192",
	}}
}

func (n *slurmCLINode) env() *slurm.Env {
	return &slurm.Env{
		LookupEnv: func(k string) (string, bool) { v, ok := n.vars[k]; return v, ok },
		Hostname:  func() (string, error) { return "unused", nil },
		Host:      n.tree.Host(),
		DevDir:    n.tree.Dev(),
	}
}

// applyArgs parses `hpcvmm run` flags and applies Slurm with the step
// allowed to run on allowed; it returns the flags and the log.
func (n *slurmCLINode) applyArgs(t *testing.T, allowed []int, args ...string) (*runFlags, string, error) {
	t.Helper()
	c, f := newRunCommand()
	require.NoError(t, c.fs.Parse(args))
	var log bytes.Buffer
	err := applySlurm(&f.cfg, c.fs, n.env(), func() ([]int, error) { return allowed, nil }, slog.New(slog.NewTextHandler(&log, nil)))
	return f, log.String(), err
}

// TestRunSlurmStep: --gpu slurm --vf slurm without --cpus, --cpu-list or
// --memory: the step's GPU and VF by their gres.conf files, vCPUs on the
// step's CPUs of the devices' NUMA node, guest RAM from --mem less the
// headroom in whole hugepages, the GUID seed from cluster, job and node.
func TestRunSlurmStep(t *testing.T) {
	n := newSlurmCLINode(t)
	f, log, err := n.applyArgs(t, []int{2, 3, 9}, "--gpu", "slurm", "--vf", "slurm", "--hugepages", "2M")
	require.NoError(t, err)
	p := f.cfg.Passthrough
	assert.Equal(t, []string{"0000:17:00.0"}, p.GPUs)
	assert.Equal(t, []string{"0000:41:00.1"}, p.VFs, "the nic group's VF becomes --vf")
	assert.Equal(t, []int{2, 3}, f.cfg.CPUList, "the step's CPUs on node 0, where the GPU is (CPU 9 is on node 1)")
	assert.Equal(t, 2, f.cfg.CPUs)
	total := uint64(8192) << 20
	head := total*slurm.HeadroomPercent/100 + slurm.HeadroomFixed
	assert.Equal(t, (total-head)/(2<<20)*(2<<20), f.cfg.Memory, "8192 MiB less 5%% and 256 MiB, in 2 MiB pages")
	assert.Equal(t, ibvf.Seed{Cluster: "c1", Job: "77", Node: "n1"}, p.GUIDSeed)
	assert.Contains(t, log, `msg="GPUs from Slurm" slurm="SLURM_STEP_GPUS=0" vfio_groups=12 functions=1`)
	assert.Contains(t, log, `msg="NICs from Slurm" slurm="SLURM_STEP_NICS=mlx4_40" vfio_groups=40 functions=1`)
	assert.Contains(t, log, `msg="vCPUs on the CPUs Slurm gave the step" cpus=2-3`)
	assert.Contains(t, log, `msg="guest RAM from Slurm" slurm="SLURM_MEM_PER_NODE=8192" memory=7526M`)

	// Given flags win: --cpu-list and --memory stay as given, --cpus
	// takes the first of the step's CPUs.
	f, _, err = n.applyArgs(t, []int{2, 3, 9}, "--gpu", "slurm", "--cpu-list", "4-5", "--memory", "1G")
	require.NoError(t, err)
	assert.Equal(t, []int{4, 5}, f.cfg.CPUList)
	assert.Equal(t, uint64(1<<30), f.cfg.Memory)
	f, _, err = n.applyArgs(t, []int{2, 3, 9}, "--gpu", "slurm", "--cpus", "1")
	require.NoError(t, err)
	assert.Equal(t, []int{2}, f.cfg.CPUList)

	// Outside a job the flags of a plain run apply: named devices stay.
	delete(n.vars, "SLURM_JOB_ID")
	f, _, err = n.applyArgs(t, []int{0}, "--gpu", "0000:17:00.0")
	require.NoError(t, err)
	assert.Equal(t, []string{"0000:17:00.0"}, f.cfg.Passthrough.GPUs)
	assert.Nil(t, f.cfg.CPUList)
}

// TestRunSlurmErrors: each mistake is reported with what Slurm gave and
// what to do, before anything on the host changes.
func TestRunSlurmErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vars    map[string]string // "" deletes
		allowed []int
		args    []string
		want    []string
	}{
		{"not in a job", map[string]string{"SLURM_JOB_ID": ""}, []int{0}, []string{"--gpu", "slurm"},
			[]string{"--gpu slurm: slurm: --gpu slurm needs a Slurm job, and SLURM_JOB_ID is not set", "srun"}},
		{"step without nic", map[string]string{"SLURM_STEP_NICS": ""}, []int{2}, []string{"--vf", "slurm"},
			[]string{"--vf slurm: slurm: Slurm gave this job no nic", "--gres=nic:N"}},
		{"gpu slurm with options", nil, []int{2}, []string{"--gpu", "slurm,clique=1"},
			[]string{"--gpu slurm takes no options"}},
		{"nic list in a foreign form", map[string]string{"SLURM_STEP_NICS": "mlx5_40"}, []int{2}, []string{"--vf", "slurm"},
			[]string{"SLURM_STEP_NICS=mlx5_40", "want numbers"}},
		{"more vCPUs than the step has", nil, []int{2, 3}, []string{"--gpu", "slurm", "--cpus", "3"},
			[]string{"--cpus 3: the step may use 2 CPUs here (2-3", "srun -c 3"}},
		{"no CPU near the devices", nil, []int{9}, []string{"--gpu", "slurm"},
			[]string{"--cpu-list (from Slurm)", "CPUs 9", "none of them on NUMA node 0"}},
		{"memory below the headroom", map[string]string{"SLURM_MEM_PER_NODE": "256"}, []int{2}, []string{"--gpu", "slurm"},
			[]string{"--memory (from Slurm)", "SLURM_MEM_PER_NODE=256", "request more with --mem"}},
		{"no gres.conf", map[string]string{"SLURM_CONF": "/nonexistent/slurm.conf"}, []int{2}, []string{"--gpu", "slurm"},
			[]string{"SLURM_STEP_GPUS=0 is set but there is no gres.conf at /nonexistent/gres.conf"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newSlurmCLINode(t)
			for k, v := range tc.vars {
				if v == "" {
					delete(n.vars, k)
				} else {
					n.vars[k] = v
				}
			}
			_, _, err := n.applyArgs(t, tc.allowed, tc.args...)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestRunSlurmCLI: `hpcvmm run --gpu slurm` outside a job exits 2 with the
// reason on one line, before any host change.
func TestRunSlurmCLI(t *testing.T) {
	t.Setenv("SLURM_JOB_ID", "")
	require.NoError(t, os.Unsetenv("SLURM_JOB_ID"))
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	require.NoError(t, os.WriteFile(kernel, []byte("not a kernel"), 0o644))
	var out, errb bytes.Buffer
	rc := runRun([]string{"--kernel", kernel, "--gpu", "slurm"}, nil, &out, &errb)
	assert.Equal(t, 2, rc)
	assert.Equal(t, "hpcvmm run: --gpu slurm: slurm: --gpu slurm needs a Slurm job, and SLURM_JOB_ID is not set: run hpcvmm with srun or in an sbatch script, or name the devices (--gpu BDF)\n", errb.String())
	assert.Empty(t, out.String())
}
