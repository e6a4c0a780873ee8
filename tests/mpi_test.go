//go:build integration

package tests

import (
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

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
	return append(append(a, extra...), "--", harness.MPIApp)
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
	})
}
