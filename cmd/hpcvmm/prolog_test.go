package main

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/slurm"
)

// prologNode is slurmCLINode as the Prolog of job 3 on n2 sees it: run by
// slurmd (SLURM_SCRIPT_CONTEXT), SLURM_JOB_GPUS set, no nic variable (the
// nic plugin sets none there), squeue's record of the job: one gpu, no nic.
func prologNode(t *testing.T, job string) *slurmCLINode {
	n := newSlurmCLINode(t)
	delete(n.vars, "SLURM_STEP_GPUS")
	delete(n.vars, "SLURM_STEP_NICS")
	n.vars["SLURM_JOB_ID"] = job
	n.vars["SLURMD_NODENAME"] = "n2"
	n.vars["SLURM_SCRIPT_CONTEXT"] = "prolog_slurmd"
	if job == "3" {
		n.vars["SLURM_JOB_GPUS"] = "0"
	} else {
		n.vars["SLURMD_NODENAME"] = "n1"
	}
	return n
}

func (n *slurmCLINode) prologEnv(t *testing.T) *slurm.Env {
	out, err := os.ReadFile("../../slurm/testdata/squeue-json-22.05-hostile-names.json")
	require.NoError(t, err)
	e := n.env()
	e.Squeue = func(string) ([]byte, error) { return out, nil }
	return e
}

// charDevs makes DIR/vfio/<group> root:root 0600 character devices, as udev
// leaves a group file.
func charDevs(t *testing.T, groups ...int) string {
	if os.Geteuid() != 0 {
		t.Skip("making device nodes and handing them over needs root (as the Prolog runs)")
	}
	dev := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dev, "vfio"), 0o755))
	for _, g := range groups {
		require.NoError(t, unix.Mknod(filepath.Join(dev, "vfio", strconv.Itoa(g)), unix.S_IFCHR|0o600, int(unix.Mkdev(511, uint32(g)))))
	}
	return dev
}

func ownerUID(t *testing.T, path string) uint32 {
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(path, &st))
	return st.Uid
}

// TestPrologJobWithoutNIC: the documented Prolog line (--if-any --owner
// --gpu slurm --vf slurm,guid=auto,link=enable) for a job that holds a GPU
// and no nic succeeds, and hands exactly the GPU's VFIO group to the job's
// user: the node's other group (another job's nic) stays root's. Without
// --if-any the same job is refused, as the old Prolog was (exit 2 under
// set -e drained the node).
func TestPrologJobWithoutNIC(t *testing.T) {
	n := prologNode(t, "3")
	args := bindRequest{owner: "65534", ifAny: true}
	args.p.GPUs = []string{"slurm"}
	args.p.VFs = []string{"slurm,guid=auto,link=enable"}

	strict := args
	strict.ifAny = false
	_, err := planBind(strict, n.prologEnv(t), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "node n2 has no nic in this job (GRES=gpu:1(IDX:0))")

	var log bytes.Buffer
	pl, err := planBind(args, n.prologEnv(t), slog.New(slog.NewTextHandler(&log, nil)))
	require.NoError(t, err)
	assert.Equal(t, "[0000:17:00.0]", planBDFs(pl))
	assert.Equal(t, []int{12}, pl.groups, "the GPU's group only")
	assert.Contains(t, log.String(), "no NICs in this job on this node")

	dev := charDevs(t, 12, 40)
	j := hoststate.Open(hoststate.Options{StateDir: t.TempDir(), SysfsRoot: n.tree.Sys(), DevRoot: dev,
		Getenv: func(k string) string { return n.vars[k] },
		WriteFile: func(p string, _ []byte) error {
			t.Errorf("a sysfs write %s: the GPU is on vfio-pci already", p)
			return nil
		}})
	var out bytes.Buffer
	require.NoError(t, applyBind(pl, j, dev, &out))
	assert.Contains(t, out.String(), "/vfio/12 handed to nobody (uid 65534)")
	assert.Equal(t, uint32(65534), ownerUID(t, filepath.Join(dev, "vfio/12")))
	assert.Equal(t, uint32(0), ownerUID(t, filepath.Join(dev, "vfio/40")), "another job's group stays root's")

	// The Epilog (same job) gives it back.
	rep, err := hoststate.RestoreStale(hoststate.Options{StateDir: filepath.Dir(j.Path()), SysfsRoot: n.tree.Sys(), DevRoot: dev,
		Getenv: func(k string) string { return n.vars[k] }})
	require.NoError(t, err)
	assert.Len(t, rep.Restored, 1)
	assert.Equal(t, uint32(0), ownerUID(t, filepath.Join(dev, "vfio/12")))
}

// TestPrologJobWithoutGRES: a job that holds no GRES at all binds nothing
// and succeeds with --if-any; --tap without --owner and a bad --tap option
// are refused before anything changes.
func TestPrologJobWithoutGRES(t *testing.T) {
	n := prologNode(t, "1")
	args := bindRequest{owner: "65534", ifAny: true}
	args.p.GPUs = []string{"slurm"}
	args.p.VFs = []string{"slurm,guid=auto,link=enable"}
	pl, err := planBind(args, n.prologEnv(t), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	assert.Empty(t, pl.bdfs)
	assert.Empty(t, pl.groups)
	var out bytes.Buffer
	require.NoError(t, applyBind(pl, hoststate.Open(hoststate.Options{StateDir: t.TempDir()}), "/dev", &out))
	assert.Contains(t, out.String(), "nothing to bind")

	_, err = planBind(bindRequest{taps: []string{"j1"}}, n.prologEnv(t), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, "--tap j1 needs --owner USER")
	_, err = planBind(bindRequest{owner: "65534", taps: []string{"j1,queues=2"}}, n.prologEnv(t), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, `--tap j1,queues=2: "queues=2": the only option is bridge=BRIDGE`)
	_, err = planBind(bindRequest{owner: "no-such-user-hpcvmm", taps: []string{"j1"}}, n.prologEnv(t), slog.New(slog.DiscardHandler))
	assert.ErrorContains(t, err, `--owner "no-such-user-hpcvmm": no such user`)
}

func planBDFs(pl *bindPlan) string {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, d := range pl.bdfs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(d.String())
	}
	b.WriteByte(']')
	return b.String()
}
