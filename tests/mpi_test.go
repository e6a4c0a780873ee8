//go:build integration

package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
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

		o := mpiSrun(t, env, "mpi", mpiVMArgs(t, env))
		t.Logf("srun (VMs) stdout:\n%s", o.stdout)
		require.Equal(t, 0, o.code, "srun exit status\n--- srun stderr (hpcvmm's logs) ---\n%s\n%s", harness.Tail(o.stderr, 60), slurmLogs())
		assert.Equal(t, want, mpiRanks(o.stdout), "both ranks' lines")
		assert.Contains(t, o.stderr, "PMI: relaying srun's PMI socket into the guest", "hpcvmm saw srun's PMI_FD")
		for _, tap := range []string{"hpvmpi0", "hpvmpi1"} {
			_, err := netlink.LinkByName(tap)
			assert.Error(t, err, "%s: the TAP hpcvmm created is gone", tap)
		}
		env.Record(t, "vm_ranks", strings.Join(mpiRanks(o.stdout), ";"))
		// Each node's step has a CPU of its own (tests/l1/slurm-cluster.sh).
		var stepCPUs []string
		for _, m := range regexp.MustCompile(`msg="vCPUs on the CPUs Slurm gave the step" cpus=(\S+)`).FindAllStringSubmatch(o.stderr, -1) {
			stepCPUs = append(stepCPUs, m[1])
		}
		sort.Strings(stepCPUs)
		env.Record(t, "step_cpus", strings.Join(stepCPUs, ";"))
		assert.Equal(t, []string{"0", "1"}, stepCPUs, "the two ranks' vCPUs on L1's two CPUs, one each")

		// The control: the same program, srun, no VM.
		n := runSlurm(t, slurmTimeout, "srun", "--mpi=pmi2", "-N2", "--ntasks-per-node=1", "--mem=2048", "--time=20",
			"--export=ALL,LD_LIBRARY_PATH="+harness.MPILibraryPath, harness.MPIRoot+harness.MPIApp)
		t.Logf("srun (native) stdout:\n%s", n.stdout)
		require.Equal(t, 0, n.code, "native srun exit status\n%s\n%s", n.stderr, slurmLogs())
		assert.Equal(t, want, mpiRanks(n.stdout), "the control prints the same")
		assert.Equal(t, mpiRanks(n.stdout), mpiRanks(o.stdout), "in VMs as natively")

		// A rank that fails: srun reports its status as for a native job.
		f := mpiSrun(t, env, "mpiexit3", mpiVMArgs(t, env, "--env", "MPI_APP_EXIT_RANK=1", "--env", "MPI_APP_EXIT_CODE=3"))
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
	const name = "mpihold"
	var j *mpiJob
	for attempt := 1; ; attempt++ {
		j = startMPIJob(t, name, mpiVMArgs(t, env, "--env", "MPI_APP_HOLD=1"))
		held := j.waitFor(func() bool { return strings.Count(j.out.String(), " holding") == 2 }, 5*time.Minute)
		if held {
			break
		}
		require.True(t, j.lost() && attempt < mpiAttempts, "both ranks never held\nstdout:\n%s\nstderr:\n%s", j.out.String(), harness.Tail(j.errb.String(), 40))
		j.retry(t, env, attempt)
	}
	id, err := exec.Command("squeue", "-h", "-n", name, "-o", "%i").Output()
	require.NoError(t, err, "squeue")
	job := strings.TrimSpace(string(id))
	require.NotEmpty(t, job, "squeue found no job %s", name)

	start := time.Now()
	o, err := exec.Command("scancel", job).CombinedOutput()
	require.NoError(t, err, "scancel %s: %s", job, o)
	select {
	case <-j.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("srun still running 3 minutes after scancel\nstdout:\n%s\nstderr:\n%s", j.out.String(), harness.Tail(j.errb.String(), 40))
	}
	took := time.Since(start)
	t.Logf("scancel %s: srun ended %v later\nstdout:\n%s\nstderr tail:\n%s", job, took.Round(time.Millisecond), j.out.String(), harness.Tail(j.errb.String(), 20))
	env.Record(t, "scancel_to_srun_exit_ms", strconv.FormatInt(took.Milliseconds(), 10))
	for _, r := range []string{"rank=0 got SIGTERM", "rank=1 got SIGTERM"} {
		assert.Contains(t, j.out.String(), r, "the SIGTERM reached the rank in its VM")
	}
	assert.Less(t, took, 30*time.Second, "every VM ended before Slurm's KillWait (SIGKILL)")
	for _, tap := range []string{"hpvmpi0", "hpvmpi1"} {
		_, err := netlink.LinkByName(tap)
		assert.Error(t, err, "%s: the TAP hpcvmm created is gone", tap)
	}
	assert.Empty(t, hpcvmmRuns(), "no hpcvmm run left")
}

// mpiAttempts bounds the runs of one MPI job whose guest the emulator lost.
// An L2 guest that triple-faults in early boot (QEMU's TCG emulation of
// nested SVM; docs/testbed.md) ends its hpcvmm before the rank's PMI
// client spoke, and Slurm 22.05's mpi/pmi2 plugin then dies on the empty
// PMI socket ("invalid PMI1 init command: `'", "fatal: this is impossible"),
// leaving srun waiting for ever: such a run is cancelled, recorded and run
// again, as is a run that hung (mpiSrun).
const mpiAttempts = 3

// mpiJob is one srun of the MPI scenarios, running.
type mpiJob struct {
	name      string
	out, errb testenv.LockedBuffer
	done      chan struct{} // closed when srun has exited
	code      int           // srun's exit status, once done
}

// startMPIJob starts `srun --job-name=name args...`.
func startMPIJob(t *testing.T, name string, args []string) *mpiJob {
	t.Helper()
	j := &mpiJob{name: name, done: make(chan struct{})}
	cmd := exec.Command("srun", append([]string{"--job-name=" + name}, args...)...)
	cmd.Stdout, cmd.Stderr = &j.out, &j.errb
	require.NoError(t, cmd.Start())
	go func() {
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			j.code = ee.ExitCode()
		} else if err != nil {
			j.code = -1
		}
		close(j.done)
	}()
	t.Cleanup(func() { // a failed test leaves no job behind
		select {
		case <-j.done:
		default:
			_ = exec.Command("scancel", "-n", name).Run()
			select {
			case <-j.done:
			case <-time.After(time.Minute):
			}
		}
	})
	return j
}

// lost reports whether a guest of the job triple-faulted.
func (j *mpiJob) lost() bool { return strings.Contains(j.errb.String(), "KVM_EXIT_SHUTDOWN") }

// waitFor waits until cond holds (true), srun ends, a guest is lost or
// limit passes (false).
func (j *mpiJob) waitFor(cond func() bool, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		select {
		case <-j.done:
			return cond()
		case <-time.After(500 * time.Millisecond):
		}
		if j.lost() || time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// retry cancels a job whose guest was lost and records it.
func (j *mpiJob) retry(t *testing.T, env *harness.Env, attempt int) {
	t.Logf("%s: run %d lost a guest to the emulator (triple fault); cancelling it and running the job again\n%s", j.name, attempt, harness.Tail(j.errb.String(), 12))
	env.Record(t, fmt.Sprintf("%s_lost_run_%d", j.name, attempt), "KVM_EXIT_SHUTDOWN")
	_ = exec.Command("scancel", "-n", j.name).Run()
	select {
	case <-j.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("%s: srun still running 2 minutes after scancel", j.name)
	}
}

// mpiSrun runs an MPI job of VMs to its end (within mpiTimeout), again
// when the emulator lost one of its guests or the job hung (mpiAttempts).
// A hung run first has each hpcvmm print its goroutines (dumpHpcvmmRuns),
// so the log shows where it waited.
func mpiSrun(t *testing.T, env *harness.Env, name string, args []string) slurmOutput {
	t.Helper()
	for attempt := 1; ; attempt++ {
		j := startMPIJob(t, name, args)
		ended := j.waitFor(func() bool {
			select {
			case <-j.done:
				return true
			default:
				return false
			}
		}, mpiTimeout)
		if ended && !(j.lost() && attempt < mpiAttempts) {
			return slurmOutput{stdout: j.out.String(), stderr: j.errb.String(), code: j.code}
		}
		if !ended && !j.lost() {
			dumpHpcvmmRuns(t, j)
			env.Record(t, fmt.Sprintf("%s_hung_run_%d", name, attempt), "no end within "+mpiTimeout.String())
			if attempt == mpiAttempts {
				_ = exec.Command("scancel", "-n", name).Run()
				t.Fatalf("srun %s did not finish within %v, %d times\nstdout tail:\n%s\nstderr tail:\n%s\n%s", name, mpiTimeout, attempt,
					harness.Tail(j.out.String(), 30), harness.Tail(j.errb.String(), 40), slurmLogs())
			}
			t.Logf("%s: run %d did not end within %v (the stacks above); cancelling it and running the job again", name, attempt, mpiTimeout)
			_ = exec.Command("scancel", "-n", name).Run()
			select {
			case <-j.done:
			case <-time.After(2 * time.Minute):
				t.Fatalf("%s: srun still running 2 minutes after scancel", name)
			}
			continue
		}
		if attempt == mpiAttempts {
			_ = exec.Command("scancel", "-n", name).Run()
			t.Fatalf("srun %s lost a guest in each of %d runs\nstderr tail:\n%s", name, attempt, harness.Tail(j.errb.String(), 40))
		}
		j.retry(t, env, attempt)
	}
}

// mpiTimeout bounds one run of an MPI job of two VMs: 31 to 47 s each in
// a local L1 (2026-11-27), so four minutes leave room for a slower CI
// machine while a hung run (seen in CI and once locally, cause not yet
// known: issue 36) costs less than slurmTimeout's six.
const mpiTimeout = 4 * time.Minute

// dumpHpcvmmRuns asks each hpcvmm run still alive for its goroutines
// (SIGQUIT: the Go runtime prints every stack on stderr and exits), so a
// hung job shows where each VMM waited, and logs what they printed.
func dumpHpcvmmRuns(t *testing.T, j *mpiJob) {
	pids := hpcvmmRuns()
	for _, p := range pids {
		if pid, err := strconv.Atoi(p); err == nil {
			_ = syscall.Kill(pid, syscall.SIGQUIT)
		}
	}
	if len(pids) == 0 {
		return
	}
	time.Sleep(5 * time.Second)
	t.Logf("%s: hung; the stacks of hpcvmm run %v (SIGQUIT):\n%s", j.name, pids, harness.Tail(j.errb.String(), 400))
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
