package slurm

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// slurmNode is a node as a site sets it up: two GPUs (one with its audio
// function and a bridge in its IOMMU group), an InfiniBand PF with two VFs,
// each group declared in gres.conf by its /dev/vfio file.
type slurmNode struct {
	tree *hosttest.Tree
	conf string // SLURM_CONF
	env  map[string]string
}

func newSlurmNode(t *testing.T, gres string) *slurmNode {
	tr := hosttest.New(t)
	tr.Node(0, "0-7", 64<<30)
	tr.Node(1, "8-15", 64<<30)
	for _, d := range []hosttest.Device{
		{BDF: "0000:16:00.0", Vendor: 0x10b5, DeviceID: 0x8747, Class: 0x060400, Driver: "pcieport", NUMANode: 0, IOMMUGroup: 12},
		{BDF: "0000:17:00.0", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 12},
		{BDF: "0000:17:00.1", Vendor: 0x10de, DeviceID: 0x22a3, Class: 0x040300, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 12},
		{BDF: "0000:65:00.0", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", NUMANode: 1, IOMMUGroup: 13},
		{BDF: "0000:41:00.0", Vendor: 0x15b3, DeviceID: 0x101b, Class: 0x020700, Driver: "mlx5_core", NUMANode: 0, IOMMUGroup: 30},
		{BDF: "0000:41:00.1", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 40},
		{BDF: "0000:41:00.2", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 41},
	} {
		tr.AddDevice(d)
	}
	tr.LinkVF("0000:41:00.0", "0000:41:00.1", 0)
	tr.LinkVF("0000:41:00.0", "0000:41:00.2", 1)
	for _, g := range []int{12, 13, 40, 41} {
		tr.VFIOGroupFile(g)
	}
	tr.Write("etc/slurm/slurm.conf", "ClusterName=test\n")
	tr.Write("etc/slurm/gres.conf", gres)
	return &slurmNode{tree: tr, conf: filepath.Join(tr.Root, "etc/slurm/slurm.conf"), env: map[string]string{
		"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "n1", "SLURM_CONF": filepath.Join(tr.Root, "etc/slurm/slurm.conf"),
	}}
}

func (n *slurmNode) Env() *Env {
	return &Env{
		LookupEnv: func(k string) (string, bool) { v, ok := n.env[k]; return v, ok },
		Hostname:  func() (string, error) { return "unused", nil },
		Host:      n.tree.Host(),
		DevDir:    n.tree.Dev(),
	}
}

const nodeGres = `# n1: GPUs in groups 12 and 13, VFs in 40 and 41
NodeName=n1 Name=gpu File=/dev/vfio/[12-13]
NodeName=n1 Name=nic File=/dev/vfio/40,/dev/vfio/41
NodeName=n2 Name=gpu File=/dev/vfio/[80-81]
`

func TestResolveStepDevices(t *testing.T) {
	n := newSlurmNode(t, nodeGres)
	// srun --gres=gpu:1,nic:1 on a node where the job holds GPU index 1
	// and the second VF: the step variables win over the job's.
	n.env["SLURM_JOB_GPUS"] = "0,1"
	n.env["SLURM_STEP_GPUS"] = "1"
	n.env["SLURM_STEP_NICS"] = "mlx4_41"     // as gres_nic.c writes it (Slurm 22.05.8, observed in L1)
	n.env["SLURM_STEP_GRES"] = "gpu:1,nic:1" // counts only: not what hpcvmm reads
	gpus, err := n.Env().Resolve(GPU)
	require.NoError(t, err)
	assert.Equal(t, "SLURM_STEP_GPUS=1", gpus.Source)
	assert.Equal(t, []int{13}, gpus.Groups)
	assert.Equal(t, []host.BDF{mustBDF(t, "0000:65:00.0")}, gpus.Functions)

	nics, err := n.Env().Resolve(NIC)
	require.NoError(t, err)
	assert.Equal(t, "SLURM_STEP_NICS=mlx4_41", nics.Source)
	assert.Equal(t, []int{41}, nics.Groups)
	assert.Equal(t, []host.BDF{mustBDF(t, "0000:41:00.2")}, nics.Functions)

	// Both VFs, and the plain form of the list.
	for _, v := range []string{"mlx4_40,mlx4_41", "40,41"} {
		n.env["SLURM_STEP_NICS"] = v
		nics, err = n.Env().Resolve(NIC)
		require.NoError(t, err, v)
		assert.Equal(t, []int{40, 41}, nics.Groups, v)
	}

	// The batch script: the job's variables; the bridge in group 12 stays
	// behind, the GPU's audio function goes with it.
	delete(n.env, "SLURM_STEP_GPUS")
	gpus, err = n.Env().Resolve(GPU)
	require.NoError(t, err)
	assert.Equal(t, []int{12, 13}, gpus.Groups)
	assert.Equal(t, []host.BDF{mustBDF(t, "0000:17:00.0"), mustBDF(t, "0000:17:00.1"), mustBDF(t, "0000:65:00.0")}, gpus.Functions)
}

func TestResolveErrors(t *testing.T) {
	for _, tc := range []struct {
		name     string
		gres     string
		env      map[string]string
		gresName string
		want     []string
	}{
		{"not in slurm", nodeGres, map[string]string{"SLURM_JOB_ID": ""}, GPU, []string{"SLURM_JOB_ID is not set", "srun"}},
		{"no gpus given", nodeGres, nil, GPU, []string{"no gpu", "SLURM_STEP_GPUS nor SLURM_JOB_GPUS", "--gres=gpu:N"}},
		{"index beyond gres.conf", nodeGres, map[string]string{"SLURM_STEP_GPUS": "2"}, GPU, []string{"SLURM_STEP_GPUS=2", "no gpu index 2", "index 0 = /dev/vfio/12, index 1 = /dev/vfio/13"}},
		{"nic dev num not declared", nodeGres, map[string]string{"SLURM_STEP_NICS": "1"}, NIC, []string{"SLURM_STEP_NICS=1", "device number"}},
		{"no such gres on node", "NodeName=n2 Name=gpu File=/dev/vfio/12\nName=nic Count=2\n", map[string]string{"SLURM_STEP_NICS": "0"}, NIC, []string{"declares no Name=nic", "for node n1", "line 2 has Name=nic with Count= but no File="}},
		{"not a vfio group", "Name=gpu File=/dev/nvidia[0-1]\n", map[string]string{"SLURM_STEP_GPUS": "1"}, GPU, []string{"SLURM_STEP_GPUS=1 gives /dev/nvidia1", "line 1", "is not a VFIO group"}},
		{"group not on host", "Name=gpu File=/dev/vfio/77\n", map[string]string{"SLURM_STEP_GPUS": "0"}, GPU, []string{"/dev/vfio/77 does not exist", "bind them"}},
		{"nic list mixing forms", nodeGres, map[string]string{"SLURM_STEP_NICS": "mlx4_40,41"}, NIC, []string{`SLURM_STEP_NICS=mlx4_40,41`, `item "41" lacks the "mlx4_"`}},
		{"garbage variable", nodeGres, map[string]string{"SLURM_STEP_GPUS": "(null)"}, GPU, []string{`SLURM_STEP_GPUS=(null)`, "want numbers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newSlurmNode(t, tc.gres)
			for k, v := range tc.env {
				if v == "" {
					delete(n.env, k)
				} else {
					n.env[k] = v
				}
			}
			_, err := n.Env().Resolve(tc.gresName)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			// Only a job that holds none of the GRES is ErrNoGRES (what
			// hpcvmm bind --if-any skips); a mismatch stays an error.
			assert.Equal(t, tc.name == "no gpus given", errors.Is(err, ErrNoGRES), "errors.Is(ErrNoGRES)")
		})
	}
}

func TestResolveWithoutGresConf(t *testing.T) {
	n := newSlurmNode(t, nodeGres)
	require.NoError(t, os.Remove(filepath.Join(n.tree.Root, "etc/slurm/gres.conf")))
	n.env["SLURM_STEP_GPUS"] = "0"
	_, err := n.Env().Resolve(GPU)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "SLURM_STEP_GPUS=0 is set but there is no gres.conf at "+filepath.Join(n.tree.Root, "etc/slurm/gres.conf"))
	assert.ErrorIs(t, err, ErrNodeSetup, "a node without gres.conf is the node's fault")
}

func TestGroupOpenErrors(t *testing.T) {
	d := Device{Name: NIC, File: "/dev/vfio/41"}
	err := groupOpenError(unix.EPERM, "/dev/vfio/41", d, "SLURM_STEP_NICS=41")
	assert.Contains(t, err.Error(), "SLURM_STEP_NICS=41 gives /dev/vfio/41, but this job's device cgroup does not let it open /dev/vfio/41 (EPERM)")
	assert.Contains(t, err.Error(), "--gres=nic:N")
	assert.Contains(t, groupOpenError(unix.EACCES, "/dev/vfio/41", d, "x").Error(), "chown")
	assert.Contains(t, groupOpenError(unix.EBUSY, "/dev/vfio/41", d, "x").Error(), "another process")
	assert.True(t, errors.Is(groupOpenError(unix.EIO, "/dev/vfio/41", d, "x"), unix.EIO))
	// The node's fault or the request's: what hpcvmm's exit status says.
	assert.NotErrorIs(t, err, ErrNodeSetup, "EPERM: the job was not given the device")
	for _, e := range []unix.Errno{unix.ENOENT, unix.EACCES, unix.EBUSY} {
		assert.ErrorIs(t, groupOpenError(e, "/dev/vfio/41", d, "x"), ErrNodeSetup, "%v", e)
	}
}

func TestResolveInPrologUsesSqueue(t *testing.T) {
	n := newSlurmNode(t, nodeGres)
	n.env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
	n.env["SLURM_JOB_GPUS"] = "0"
	// The Prolog runs before the devices are bound: no group files.
	n.tree.Remove("dev/vfio")
	env := n.Env()
	var asked string
	env.Squeue = func(id string) ([]byte, error) {
		asked = id
		return []byte(`{"jobs":[{"job_id":76,"nodes":"n1","gres_detail":["nic:2(IDX:0-1)"]},{"job_id":77,"name":"vm","nodes":"n[1-2]","gres_detail":["gpu:1(IDX:0),nic:1(IDX:1)","gpu:1(IDX:0),nic:1(IDX:0)"]}]}`), nil
	}
	gpus, err := env.Resolve(GPU)
	require.NoError(t, err)
	assert.Equal(t, []int{12}, gpus.Groups)
	nics, err := env.Resolve(NIC)
	require.NoError(t, err)
	assert.Equal(t, "77", asked)
	assert.Equal(t, []int{41}, nics.Groups, "IDX counts gres.conf lines, like the gpu indices")
}

func TestJobGRESIndices(t *testing.T) {
	out := []byte(`{"jobs":[{"job_id":5,"nodes":"n[1-3]","gres_detail":["gpu:h100:2(IDX:0,2),nic:2(IDX:0-1)","gpu:1(IDX:3)","gpu:1(IDX:3),nic(CNT:1)"]}]}`)
	idx, err := JobGRESIndices(out, "5", "n1", "gpu")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 2}, idx)
	idx, err = JobGRESIndices(out, "5", "n1", "nic")
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, idx)
	idx, err = JobGRESIndices(out, "5", "n2", "gpu")
	require.NoError(t, err)
	assert.Equal(t, []int{3}, idx)
	_, err = JobGRESIndices(out, "5", "n3", "nic")
	assert.ErrorContains(t, err, "node n3 has no nic in this job")
	_, err = JobGRESIndices(out, "5", "n9", "gpu")
	assert.ErrorContains(t, err, "job 5 does not run on node n9")
	_, err = JobGRESIndices([]byte(`{"jobs":[{"job_id":5,"nodes":"n[1-3]","gres_detail":["gpu:1(IDX:3)"]}]}`), "5", "n1", "gpu")
	assert.ErrorContains(t, err, "1 gres_detail entries for 3 nodes")
	_, err = JobGRESIndices([]byte("JobId=5 JobName=x\n"), "5", "n1", "gpu")
	assert.ErrorContains(t, err, "not squeue's JSON")
	_, err = JobGRESIndices(out, "x", "n1", "gpu")
	assert.ErrorContains(t, err, "SLURM_JOB_ID")
}

func TestGuestMemory(t *testing.T) {
	env := func(kv map[string]string) *Env {
		return &Env{LookupEnv: func(k string) (string, bool) { v, ok := kv[k]; return v, ok }}
	}
	// 64 GiB for the job: 5% (3.2 GiB) + 256 MiB stay with hpcvmm; the rest
	// rounded down to 1 GiB pages.
	b, src, ok, err := env(map[string]string{"SLURM_MEM_PER_NODE": "65536"}).GuestMemory(8, 1<<30)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "SLURM_MEM_PER_NODE=65536", src)
	assert.Equal(t, uint64(60)<<30, b)
	// Per CPU: the job's CPUs on the node, not the step's.
	b, src, ok, err = env(map[string]string{"SLURM_MEM_PER_CPU": "4096", "SLURM_CPUS_ON_NODE": "4"}).GuestMemory(2, 2<<20)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Contains(t, src, "x 4 CPUs")
	total := uint64(16) << 30
	assert.Equal(t, (total-total/20-256<<20)/(2<<20)*(2<<20), b)
	_, _, ok, err = env(nil).GuestMemory(1, 4096)
	require.NoError(t, err)
	assert.False(t, ok, "no Slurm memory: the caller's default stays")
	_, _, _, err = env(map[string]string{"SLURM_MEM_PER_NODE": "200"}).GuestMemory(1, 4096)
	assert.ErrorContains(t, err, "leaves nothing for the guest")
	_, _, _, err = env(map[string]string{"SLURM_MEM_PER_NODE": "lots"}).GuestMemory(1, 4096)
	assert.ErrorContains(t, err, "SLURM_MEM_PER_NODE")
}

func TestNodeCPUs(t *testing.T) {
	n := newSlurmNode(t, nodeGres)
	h := n.tree.Host()
	cpus, node, err := NodeCPUs([]int{2, 3, 9, 10, 11}, h, -1)
	require.NoError(t, err)
	assert.Equal(t, 1, node, "most of the allowed CPUs")
	assert.Equal(t, []int{9, 10, 11}, cpus)
	cpus, _, err = NodeCPUs([]int{2, 3, 9, 10, 11}, h, 0)
	require.NoError(t, err)
	assert.Equal(t, []int{2, 3}, cpus)
	_, _, err = NodeCPUs([]int{9}, h, 0)
	assert.ErrorContains(t, err, "CPUs 9 (sched_getaffinity), none of them on NUMA node 0")
}

func TestAllowedCPUs(t *testing.T) {
	cpus, err := AllowedCPUs()
	require.NoError(t, err)
	require.NotEmpty(t, cpus)
	var set unix.CPUSet
	require.NoError(t, unix.SchedGetaffinity(0, &set))
	assert.Equal(t, set.Count(), len(cpus))
}

func mustBDF(t *testing.T, s string) host.BDF {
	b, err := host.ParseBDF(s)
	require.NoError(t, err)
	return b
}

// squeueRecord is `squeue --json` output listing job 76 (no memory) and
// job 77 with the given memory fields (the rest of its JSON record).
func squeueRecord(fields string) []byte {
	return []byte(`{"meta":{},"errors":[],"jobs":[{"job_id":76,"memory_per_node":4096,"memory_per_cpu":null},{"job_id":77,"name":"j",` + fields + `}]}`)
}

func TestJobMemory(t *testing.T) {
	for fields, want := range map[string]JobMem{
		// openapi v0.0.38 (Slurm 22.05.8, as captured in
		// testdata/squeue-json-22.05-hostile-mem.json): a number or null.
		`"memory_per_node":2048,"memory_per_cpu":null`: {MiB: 2048},
		`"memory_per_node":null,"memory_per_cpu":700`:  {MiB: 700, PerCPU: true},
		// the data_parser of Slurm 23.02 and later: {set, infinite, number}.
		`"memory_per_node":{"set":true,"infinite":false,"number":1536},"memory_per_cpu":{"set":false,"infinite":false,"number":0}`: {MiB: 1536},
		`"memory_per_node":{"set":false,"infinite":false,"number":0},"memory_per_cpu":{"set":true,"infinite":false,"number":700}`:  {MiB: 700, PerCPU: true},
		// none requested, no default: no size.
		`"memory_per_node":null,"memory_per_cpu":null`:                                        {},
		`"memory_per_node":0,"memory_per_cpu":null`:                                           {},
		`"memory_per_node":{"set":true,"infinite":true,"number":0},"memory_per_cpu":null`:     {},
		`"memory_per_node":{"set":false,"infinite":false,"number":999},"memory_per_cpu":null`: {},
		`"comment":""`: {}, // no memory fields at all
	} {
		m, err := JobMemory(squeueRecord(fields), "77")
		require.NoError(t, err, fields)
		assert.Equal(t, want, m, fields)
	}
	assert.Equal(t, "memory_per_node=2048", JobMem{MiB: 2048}.String())
	assert.Equal(t, "memory_per_cpu=700", JobMem{MiB: 700, PerCPU: true}.String())
	for fields, msg := range map[string]string{
		`"memory_per_node":"2G"`:                         "2G",
		`"memory_per_node":-1`:                           "-1 is not an unsigned integer",
		`"memory_per_node":1.5`:                          "1.5 is not an unsigned integer",
		`"memory_per_cpu":1e3`:                           "1e3 is not an unsigned integer",
		`"memory_per_cpu":{"set":true,"number":-5}`:      "number",
		`"memory_per_node":2048,"memory_per_cpu":700`:    "job 77 has both memory_per_node=2048 and memory_per_cpu=700",
		`"job_id":77`:                                    "job 77 is listed twice",
		`"memory_per_node":18446744073709551616`:         "is not an unsigned integer",
		`"memory_per_node":[2048]`:                       "2048",
		`"memory_per_node":{"set":true,"number":"2048"}`: "number",
	} {
		out := squeueRecord(fields)
		if fields == `"job_id":77` {
			out = []byte(`{"jobs":[{"job_id":77},{"job_id":77}]}`)
		}
		_, err := JobMemory(out, "77")
		assert.ErrorContains(t, err, msg, fields)
	}
	_, err := JobMemory(squeueRecord(`"memory_per_node":2048`), "78")
	assert.EqualError(t, err, "job 78 is not in squeue's list (has it ended?)")
	_, err = JobMemory([]byte("JobId=77 MinMemoryNode=2G"), "77")
	assert.ErrorContains(t, err, "not squeue's JSON")
	_, err = JobMemory(squeueRecord(`"memory_per_node":2048`), "77\n")
	assert.ErrorContains(t, err, "is not a number")
}

func TestGuestMemoryFromSqueue(t *testing.T) {
	n := newSlurmNode(t, nodeGres)
	env := n.Env()
	env.Squeue = func(id string) ([]byte, error) {
		require.Equal(t, "77", id)
		return squeueRecord(`"memory_per_node":2048,"memory_per_cpu":null`), nil
	}
	b, src, ok, err := env.GuestMemory(1, 1<<30)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "squeue --json --jobs 77: memory_per_node=2048", src)
	assert.Equal(t, uint64(1<<30), b, "2048 MiB less 5% and 256 MiB, in 1 GiB pages")

	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_node":null,"memory_per_cpu":700`), nil }
	n.env["SLURM_CPUS_ON_NODE"] = "4"
	b, src, ok, err = env.GuestMemory(1, 4096)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, "squeue --json --jobs 77: memory_per_cpu=700 x 4 CPUs", src)
	assert.Equal(t, uint64(2800<<20-(2800<<20)*5/100-256<<20)/4096*4096, b)

	// No memory requested and no default: the caller keeps its own.
	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_node":null,"memory_per_cpu":null`), nil }
	_, _, ok, err = env.GuestMemory(1, 4096)
	require.NoError(t, err)
	assert.False(t, ok)

	// Too little for the headroom, and sizes past 64-bit arithmetic.
	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_node":256`), nil }
	_, _, _, err = env.GuestMemory(1, 4096)
	assert.EqualError(t, err, "slurm: squeue --json --jobs 77: memory_per_node=256 MiB leaves nothing for the guest after hpcvmm's headroom (5% + 256 MiB): request more with --mem, or give --memory")
	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_node":18446744073709551615`), nil }
	_, _, _, err = env.GuestMemory(1, 4096)
	assert.ErrorContains(t, err, "is more than an exbibyte, not a memory size: give --memory")
	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_cpu":4611686018427387904`), nil }
	_, _, _, err = env.GuestMemory(1, 4096)
	assert.EqualError(t, err, "slurm: squeue --json --jobs 77: memory_per_cpu=4611686018427387904 x 4 CPUs is not a memory size: give --memory")

	env.Squeue = func(string) ([]byte, error) { return squeueRecord(`"memory_per_node":"2G"`), nil }
	_, _, _, err = env.GuestMemory(1, 4096)
	assert.ErrorContains(t, err, "slurm: `squeue --json --jobs 77`: not squeue's JSON")
	assert.ErrorContains(t, err, ": give --memory")

	env.Squeue = func(string) ([]byte, error) { return nil, errors.New("exit status 1") }
	_, _, _, err = env.GuestMemory(1, 4096)
	assert.ErrorContains(t, err, "neither SLURM_MEM_PER_NODE nor SLURM_MEM_PER_CPU is set and `squeue --json --jobs 77` failed (exit status 1): give --memory")
}
