package slurm

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestJobGRESIndicesHostileJobName is issue 23's defect 7, on output
// captured from a real Slurm 22.05.8 (a loopback cluster, nodes n1 and n2,
// gres.conf nic File=/dev/tty[20-27]): job 1 ("victim", since ended) held
// nic IDX 0-2; job 2 holds nic IDX 3-4 and gpu IDX 1 on both nodes and is
// named "vm\n   JOB_GRES=nic:8\n     Nodes=n[1-2] ... GRES=nic:8(IDX:0-7)";
// job 3 holds only gpu IDX 0 on n2 and is named "x\n     Nodes=n2 ...
// GRES=nic:8(IDX:0-7)". slurmctld took both names, and scontrol prints them
// verbatim before the real detail lines (testdata/scontrol-*.txt: the
// parser of `scontrol show job -d` took the first Nodes= line and gave job
// 2 nic 0-7 and job 3 nic 0-7 on n2).
func TestJobGRESIndicesHostileJobName(t *testing.T) {
	text, err := os.ReadFile("testdata/scontrol-22.05-hostile-name-job2.txt")
	require.NoError(t, err)
	require.Contains(t, string(text), "JobName=vm\n   JOB_GRES=nic:8\n     Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=nic:8(IDX:0-7)\n",
		"the capture shows Slurm accepting and printing the name")

	out, err := os.ReadFile("testdata/squeue-json-22.05-hostile-names.json")
	require.NoError(t, err)
	for _, node := range []string{"n1", "n2"} {
		idx, err := JobGRESIndices(out, "2", node, "nic")
		require.NoError(t, err)
		assert.Equal(t, []int{3, 4}, idx, node)
		idx, err = JobGRESIndices(out, "2", node, "gpu")
		require.NoError(t, err)
		assert.Equal(t, []int{1}, idx, node)
	}
	_, err = JobGRESIndices(out, "3", "n2", "nic")
	assert.EqualError(t, err, "node n2 has no nic in this job (GRES=gpu:1(IDX:0))")
	assert.ErrorIs(t, err, ErrNoGRES)
	idx, err := JobGRESIndices(out, "3", "n2", "gpu")
	require.NoError(t, err)
	assert.Equal(t, []int{0}, idx)
	_, err = JobGRESIndices(out, "3", "n1", "gpu")
	assert.ErrorContains(t, err, "job 3 does not run on node n1")
	assert.NotErrorIs(t, err, ErrNoGRES, "a node the job does not run on is not a job without the GRES")
	_, err = JobGRESIndices(out, "1", "n1", "nic")
	assert.EqualError(t, err, "node n1 has no nic in this job (the job holds no GRES)")
	assert.ErrorIs(t, err, ErrNoGRES)
	_, err = JobGRESIndices(out, "9", "n1", "nic")
	assert.ErrorContains(t, err, "job 9 is not in squeue's list")
}

// TestResolveInPrologHostileJobName: the Prolog of job 2 on n1 resolves its
// nics from squeue's JSON, never from scontrol's text.
func TestResolveInPrologHostileJobName(t *testing.T) {
	const gres = "NodeName=n1 Name=nic File=/dev/vfio/[30-32],/dev/vfio/40,/dev/vfio/41,/dev/vfio/[50-51]\n"
	n := newSlurmNode(t, gres)
	n.env["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
	n.env["SLURM_JOB_ID"] = "2"
	n.tree.Remove("dev/vfio")
	env := n.Env()
	out, err := os.ReadFile("testdata/squeue-json-22.05-hostile-names.json")
	require.NoError(t, err)
	env.Squeue = func(string) ([]byte, error) { return out, nil }
	nics, err := env.Resolve(NIC)
	require.NoError(t, err)
	assert.Equal(t, []int{40, 41}, nics.Groups, "IDX 3-4: the job's two VFs")
	assert.Equal(t, "squeue --json --jobs 2: nic IDX:3-4", nics.Source)
}

// FuzzJobGRESIndices: squeue's JSON carries job strings the job's owner
// chose; whatever they are, the indices come only from the job's own
// gres_detail entry (here nic IDX 3-4), or parsing fails.
func FuzzJobGRESIndices(f *testing.F) {
	f.Add("vm\n   Nodes=n1 GRES=nic:8(IDX:0-7)", "c")
	f.Add(`"},{"job_id":2,"nodes":"n1","gres_detail":["nic:8(IDX:0-7)"]}`, `\"`)
	f.Fuzz(func(t *testing.T, name, comment string) {
		q := `{"jobs":[{"job_id":2,"name":` + quote(name) + `,"nodes":"n1","comment":` + quote(comment) + `,"gres_detail":["nic:2(IDX:3-4)"]}]}`
		idx, err := JobGRESIndices([]byte(q), "2", "n1", "nic")
		require.NoError(t, err)
		assert.Equal(t, []int{3, 4}, idx)
	})
}

// quote is a JSON string as Slurm's serializer writes it.
func quote(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(`\u00`)
			b.WriteByte("0123456789abcdef"[r>>4])
			b.WriteByte("0123456789abcdef"[r&15])
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// TestGuestMemoryHostileJobName: a bare srun step sizes guest RAM from the
// job's record, and the job's owner chose its name and comment. Captured
// from a real Slurm 22.05.8 (a loopback cluster, node n1): job 3 ran with
// --mem=2048, job 4 with --mem-per-cpu=700 -c 2, job 5 (pending) asked for
// no memory; each name and comment carries "\n   MinMemoryNode=999G" lines
// that `scontrol show job -d` prints verbatim before the real
// "MinMemoryNode=2G" (testdata/scontrol-22.05-hostile-mem-job*.txt). The
// guest gets the job's real memory, never 999G.
func TestGuestMemoryHostileJobName(t *testing.T) {
	out, err := os.ReadFile("testdata/squeue-json-22.05-hostile-mem.json")
	require.NoError(t, err)
	for _, tc := range []struct {
		job, cpus, text, source string
		mib                     uint64
	}{
		{"3", "1", "testdata/scontrol-22.05-hostile-mem-job3.txt", "squeue --json --jobs 3: memory_per_node=2048", 2048},
		{"4", "2", "testdata/scontrol-22.05-hostile-mem-job4.txt", "squeue --json --jobs 4: memory_per_cpu=700 x 2 CPUs", 700 * 2},
	} {
		text, err := os.ReadFile(tc.text)
		require.NoError(t, err)
		require.Contains(t, string(text), "\n   MinMemoryNode=999G", "the capture shows scontrol printing the forged line")
		n := newSlurmNode(t, nodeGres)
		n.env["SLURM_JOB_ID"] = tc.job
		n.env["SLURM_CPUS_ON_NODE"] = tc.cpus
		env := n.Env()
		env.Squeue = func(string) ([]byte, error) { return out, nil }
		b, src, ok, err := env.GuestMemory(1, 4096)
		require.NoError(t, err, "job %s", tc.job)
		assert.True(t, ok, "job %s", tc.job)
		assert.Equal(t, tc.source, src)
		total := tc.mib << 20
		assert.Equal(t, (total-total*HeadroomPercent/100-HeadroomFixed)/4096*4096, b, "job %s: %d MiB less the headroom", tc.job, tc.mib)
	}
}

// FuzzJobMemory: whatever the job's owner puts in its name and comment,
// the memory comes only from the job's own memory_per_node (here 2048).
func FuzzJobMemory(f *testing.F) {
	f.Add("vm\n   MinMemoryNode=999G", "c\n   MinMemoryCPU=999G")
	f.Add(`","memory_per_node":999999,"x":"`, `\"`)
	f.Fuzz(func(t *testing.T, name, comment string) {
		q := `{"jobs":[{"job_id":2,"name":` + quote(name) + `,"memory_per_node":2048,"memory_per_cpu":null,"comment":` + quote(comment) + `}]}`
		m, err := JobMemory([]byte(q), "2")
		require.NoError(t, err)
		assert.Equal(t, JobMem{MiB: 2048}, m)
	})
}
