//go:build integration

package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The MPI scenarios (issue 25) run in harness.ProfileSlurm's L1: its two
// slurmd nodes, n1 and n2, start one rank each. With hpcvmm, each rank is
// `hpcvmm run --rootfs` of the MPI rootfs (tests/guest/mpiapp built by
// Debian's mpicc, MPICH 4 over UCX, with its libraries): srun --mpi=pmi2
// gives hpcvmm the task's PMI socket, which hpcvmm relays into the guest,
// where the agent gives the program a PMI_FD of its own; the two guests
// reach each other over TAPs on the cluster's bridge, one address per rank
// from ip=…+rank. The program is unchanged and started as srun starts any
// program.

// mpiRankLine matches the program's one line per rank.
var mpiRankLine = regexp.MustCompile(`(?m)^rank=(\d+) size=(\d+) host=(\S+) sum=(\d+) token=(\d+)$`)

// mpiRanks returns each rank's line without its host field, sorted by rank.
func mpiRanks(out string) []string {
	var lines []string
	for _, m := range mpiRankLine.FindAllStringSubmatch(out, -1) {
		lines = append(lines, "rank="+m[1]+" size="+m[2]+" sum="+m[4]+" token="+m[5])
	}
	sort.Strings(lines)
	return lines
}

// mpiVMArgs is srun's command line for one VM per rank.
func mpiVMArgs(t *testing.T, env *harness.Env, extra ...string) []string {
	a := []string{"--mpi=pmi2", "-N2", "--ntasks-per-node=1", "--mem=2048", "--time=20",
		env.HPCVMM(t), "run", "--kernel", env.L2Kernel(t), "--cpus", "1", "--memory", "512M", "--hugepages", "none",
		"--rootfs", harness.MPIRoot,
		"--net", "tap=hpvmpi+rank,bridge=" + harness.SlurmBridge + ",ip=10.78.0.20/24+rank"}
	return env.VMArgs(append(append(a, extra...), "--", harness.MPIApp))
}

// TestMPIAcrossVMs: `srun --mpi=pmi2 -N2 --ntasks-per-node=1 hpcvmm run
// --rootfs R --net … -- /mpi_app` prints both ranks' lines with size=2,
// the allreduce's sum and the token back at rank 0, and srun exits 0; the
// same program under srun without hpcvmm (the control) prints the same;
// with rank 1 told to exit 3, srun's exit status is 3.
func TestMPIAcrossVMs(t *testing.T) {
	harness.Run(t, harness.ProfileSlurm, func(t *testing.T, env *harness.Env) {
		want := []string{"rank=0 size=2 sum=1 token=2", "rank=1 size=2 sum=1 token=0"}

		o := runSlurm(t, slurmTimeout, "srun", mpiVMArgs(t, env)...)
		t.Logf("srun (VMs) stdout:\n%s", o.stdout)
		require.Equal(t, 0, o.code, "srun exit status\n--- srun stderr (hpcvmm's logs) ---\n%s\n%s", harness.Tail(o.stderr, 60), slurmLogs())
		assert.Equal(t, want, mpiRanks(o.stdout), "both ranks' lines")
		assert.Contains(t, o.stderr, "PMI: relaying srun's PMI socket into the guest", "hpcvmm saw srun's PMI_FD")
		for _, tap := range []string{"hpvmpi0", "hpvmpi1"} {
			_, err := netlink.LinkByName(tap)
			assert.Error(t, err, "%s: the TAP hpcvmm created is gone", tap)
		}
		env.Record(t, "vm_ranks", strings.Join(mpiRanks(o.stdout), ";"))

		// The control: the same program, srun, no VM.
		n := runSlurm(t, slurmTimeout, "srun", "--mpi=pmi2", "-N2", "--ntasks-per-node=1", "--mem=2048", "--time=20",
			"--export=ALL,LD_LIBRARY_PATH="+harness.MPILibraryPath, harness.MPIRoot+harness.MPIApp)
		t.Logf("srun (native) stdout:\n%s", n.stdout)
		require.Equal(t, 0, n.code, "native srun exit status\n%s\n%s", n.stderr, slurmLogs())
		assert.Equal(t, want, mpiRanks(n.stdout), "the control prints the same")
		assert.Equal(t, mpiRanks(n.stdout), mpiRanks(o.stdout), "in VMs as natively")

		// A rank that fails: srun reports its status as for a native job.
		f := runSlurm(t, slurmTimeout, "srun", mpiVMArgs(t, env, "--env", "MPI_APP_EXIT_RANK=1", "--env", "MPI_APP_EXIT_CODE=3")...)
		t.Logf("srun (rank 1 exits 3): exit %d\n%s", f.code, harness.Tail(f.stderr, 10))
		assert.Equal(t, 3, f.code, "srun's exit status is the failed rank's")
		assert.Equal(t, want, mpiRanks(f.stdout), "both ranks still printed before rank 1 exited")
		env.Record(t, "failed_rank_srun_exit", strconv.Itoa(f.code))

		t.Run("scancel", func(t *testing.T) { mpiScancel(t, env) })
	})
}

// mpiScancel: scancel of a running two-VM MPI job. Slurm's SIGTERM reaches
// each hpcvmm, which passes it to its rank inside the guest: both ranks
// print that they got it and exit, both VMs power off and hpcvmm exits
// before Slurm's KillWait (30 s in the test cluster) would SIGKILL it, and
// neither rank's TAP is left behind.
func mpiScancel(t *testing.T, env *harness.Env) {
	ctx, cancel := context.WithTimeout(context.Background(), slurmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "srun", append([]string{"--job-name=mpihold"}, mpiVMArgs(t, env, "--env", "MPI_APP_HOLD=1")...)...)
	var out, errb testenv.LockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	deadline := time.Now().Add(5 * time.Minute)
	for strings.Count(out.String(), " holding") < 2 {
		select {
		case err := <-done:
			t.Fatalf("srun ended (%v) before both ranks held\nstdout:\n%s\nstderr:\n%s", err, out.String(), harness.Tail(errb.String(), 40))
		case <-time.After(500 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "both ranks never held\nstdout:\n%s\nstderr:\n%s", out.String(), harness.Tail(errb.String(), 40))
	}
	id, err := exec.Command("squeue", "-h", "-n", "mpihold", "-o", "%i").Output()
	require.NoError(t, err, "squeue")
	job := strings.TrimSpace(string(id))
	require.NotEmpty(t, job, "squeue found no job mpihold")

	start := time.Now()
	o, err := exec.Command("scancel", job).CombinedOutput()
	require.NoError(t, err, "scancel %s: %s", job, o)
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("srun still running 3 minutes after scancel\nstdout:\n%s\nstderr:\n%s", out.String(), harness.Tail(errb.String(), 40))
	}
	took := time.Since(start)
	t.Logf("scancel %s: srun ended %v later\nstdout:\n%s\nstderr tail:\n%s", job, took.Round(time.Millisecond), out.String(), harness.Tail(errb.String(), 20))
	env.Record(t, "scancel_to_srun_exit_ms", strconv.FormatInt(took.Milliseconds(), 10))
	for _, r := range []string{"rank=0 got SIGTERM", "rank=1 got SIGTERM"} {
		assert.Contains(t, out.String(), r, "the SIGTERM reached the rank in its VM")
	}
	assert.Less(t, took, 30*time.Second, "every VM ended before Slurm's KillWait (SIGKILL)")
	for _, tap := range []string{"hpvmpi0", "hpvmpi1"} {
		_, err := netlink.LinkByName(tap)
		assert.Error(t, err, "%s: the TAP hpcvmm created is gone", tap)
	}
	assert.Empty(t, hpcvmmRuns(), "no hpcvmm run left")
}

// hpcvmmRuns lists the PIDs of the hpcvmm run processes alive in L1.
func hpcvmmRuns() []string {
	var pids []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if len(args) > 1 && filepath.Base(args[0]) == "hpcvmm" && args[1] == "run" {
			pids = append(pids, filepath.Base(filepath.Dir(f)))
		}
	}
	return pids
}
