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
	idx, err := JobGRESIndices(out, "3", "n2", "gpu")
	require.NoError(t, err)
	assert.Equal(t, []int{0}, idx)
	_, err = JobGRESIndices(out, "3", "n1", "gpu")
	assert.ErrorContains(t, err, "job 3 does not run on node n1")
	_, err = JobGRESIndices(out, "1", "n1", "nic")
	assert.EqualError(t, err, "node n1 has no nic in this job (the job holds no GRES)")
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
	text, err := os.ReadFile("testdata/scontrol-22.05-hostile-name-job2.txt")
	require.NoError(t, err)
	env.Scontrol = func(string) (string, error) { return string(text), nil }
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
