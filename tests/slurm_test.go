//go:build integration

package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The Slurm scenarios run in harness.ProfileSlurm's L1: a real Slurm
// cluster on loopback (Debian's munged, slurmctld and two slurmd, n1 and
// n2, with ConstrainDevices=yes on cgroup v1) whose gres.conf declares edu
// as gpu and the NVMe VF as nic by their /dev/vfio/<group> files. hpcvmm
// runs as the job step, as a site would run it.

// nvmeOffKiBSlurm is where the Slurm scenario writes in the NVMe namespace.
const nvmeOffKiBSlurm = 6144

// slurmTimeout bounds one srun or sbatch: an L2 boot inside L1 takes tens
// of seconds of emulated time, two of them at once more; on a
// loaded machine L1 has measured minutes for prefaulting 1 GiB (by L1's
// clock, which then ran fast: its TSC calibration was off). It stays well
// under the L1 boot's own limit (l1Timeout, 15m for the profile's five
// scenarios) and the stall watchdog's 8 minutes without L1 output, so that
// a step that hangs is stopped and its output printed while L1 still runs.
const slurmTimeout = 6 * time.Minute

// slurmOutput is one finished srun/sbatch.
type slurmOutput struct {
	stdout, stderr string
	code           int
}

// runSlurm runs a Slurm client command (srun, sbatch) with a timeout and
// returns its output; stdin is /dev/null.
func runSlurm(t *testing.T, timeout time.Duration, name string, args ...string) slurmOutput {
	t.Helper()
	return runSlurmWith(t, timeout, nil, name, args...)
}

// runSlurmWith is runSlurm with setup applied to the command before it
// starts (its user, directory, environment).
func runSlurmWith(t *testing.T, timeout time.Duration, setup func(*exec.Cmd), name string, args ...string) slurmOutput {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if setup != nil {
		setup(cmd)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	// srun forwards SIGTERM to the step, which stops hpcvmm cleanly.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 20 * time.Second
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %v after %v", name, strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond))
	require.NoError(t, ctx.Err(), "%s did not finish within %v\nstdout tail:\n%s\nstderr tail:\n%s", name, timeout, harness.Tail(out.String(), 30), harness.Tail(errb.String(), 30))
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	return slurmOutput{stdout: out.String(), stderr: errb.String(), code: code}
}

// vfioGroupOf returns the IOMMU group of bdf in L1.
func vfioGroupOf(t *testing.T, bdf string) string {
	t.Helper()
	l, err := os.Readlink("/sys/bus/pci/devices/" + bdf + "/iommu_group")
	require.NoError(t, err)
	return filepath.Base(l)
}

// slurmLogs returns the tails of the cluster's logs, for failures.
func slurmLogs() string {
	var b strings.Builder
	for _, f := range []string{"/var/log/slurm/slurmctld.log", "/var/log/slurm/slurmd-n1.log", "/var/log/slurm/slurmd-n2.log"} {
		data, _ := os.ReadFile(f)
		fmt.Fprintf(&b, "--- %s ---\n%s\n", f, harness.Tail(string(data), 15))
	}
	return b.String()
}

// TestSlurmPassthrough: `srun --gres=gpu:1,nic:1 hpcvmm run --gpu slurm
// --vf slurm` with neither --memory nor --cpus: hpcvmm takes edu and the
// NVMe VF from the step's GRES (SLURM_STEP_GPUS index through gres.conf,
// SLURM_STEP_NICS device number), its CPUs from the step's affinity and
// guest RAM from --mem less the headroom; inside L2 edu's DMA round trip
// returns what was written and the stock nvme driver's I/O on the VF reads
// back equal; outside L1 the data is in the disk image behind the VF.
func TestSlurmPassthrough(t *testing.T) {
	harness.RunOuter(t, harness.ProfileSlurm, func(t *testing.T, env *harness.Env) {
		gpuGroup, nicGroup := vfioGroupOf(t, harness.EduBDF), vfioGroupOf(t, harness.NVMeVFBDF)
		start := time.Now()
		var o slurmOutput
		for attempt := 1; ; attempt++ {
			o = runSlurm(t, slurmTimeout, "srun", "--gres=gpu:1,nic:1", "--mem=2048", "--time=20",
				env.HPCVMM(t), "run",
				"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
				"--cmdline", fmt.Sprintf("%s hpcvmm.pt=edu,nvme hpcvmm.dma_buf=%#x memmap=1M$%#x hpcvmm.nvme_off_kib=%d hpcvmm.nvme_kib=%d",
					ptBaseCmdline, eduDMABuf, eduDMABuf, nvmeOffKiBSlurm, nvmeKiB),
				"--hugepages", "1G", "--gpu", "slurm", "--vf", "slurm", "--cpu-mode", harness.TestbedCPUMode,
			)
			if !lostToEmulator(t, env, o.code != 0, o.stderr, attempt) {
				break
			}
		}
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		log := o.stderr
		require.Equal(t, 0, o.code, "srun exit status\n--- hpcvmm log and srun errors ---\n%s\n--- L2 console tail ---\n%s\n%s",
			harness.Tail(log, 40), harness.Tail(o.stdout, 30), slurmLogs())

		// What hpcvmm took from Slurm.
		gpus := logRecord(log, "GPUs from Slurm")
		require.NotNil(t, gpus, "hpcvmm did not log the GPUs from Slurm:\n%s", harness.Tail(log, 30))
		assert.Equal(t, "SLURM_STEP_GPUS=0", gpus["slurm"], "the step's gpu index (the first Name=gpu of gres.conf)")
		assert.Equal(t, gpuGroup, gpus["vfio_groups"], "edu's VFIO group")
		nics := logRecord(log, "NICs from Slurm")
		require.NotNil(t, nics, "hpcvmm did not log the NICs from Slurm")
		assert.Equal(t, "SLURM_STEP_NICS=mlx4_"+nicGroup, nics["slurm"], "the step's nic, gres_nic.c's prefix and File='s number")
		assert.Equal(t, nicGroup, nics["vfio_groups"], "the VF's VFIO group")
		cpus := logRecord(log, "vCPUs on the CPUs Slurm gave the step")
		require.NotNil(t, cpus)
		assert.Contains(t, []string{"0", "1"}, cpus["cpus"], "the step's one CPU (each node has one of L1's two)")
		mem := logRecord(log, "guest RAM from Slurm")
		require.NotNil(t, mem, "hpcvmm log:\n%s", harness.Tail(log, 30))
		// A bare srun exports no SLURM_MEM_PER_NODE (sbatch and salloc
		// do): the job's memory comes from squeue --json.
		assert.Regexp(t, `^squeue --json --jobs [0-9]+: memory_per_node=2048$`, mem["slurm"])
		assert.Equal(t, "1G", mem["memory"], "2048 MiB less 5%% and 256 MiB, in whole 1 GiB pages")
		for _, k := range []string{"slurm", "vfio_groups"} {
			env.Record(t, "gpu_"+k, gpus[k])
			env.Record(t, "nic_"+k, nics[k])
		}
		env.Record(t, "guest_memory", mem["memory"])

		// Inside L2: both devices found and used.
		g, bad := harness.ParseGuestResults(o.stdout)
		assert.Empty(t, bad, "malformed guest result lines")
		require.Contains(t, o.stdout, "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish:\n%s", harness.Tail(o.stdout, 30))
		assert.Equal(t, "0x010000ed", g["edu_id"], "edu id register read through BAR0")
		assert.Equal(t, "1", g["dma_done"], "both DMA transfers completed")
		assert.Equal(t, "16", g["dma_words_matching"], "words of edu's DMA round trip equal to what was written")
		assert.Equal(t, "none", g["pt_failed"], "guest passthrough parts that failed")
		assertNVMeGuest(t, env, g)
		env.Record(t, "dma_words_matching", g["dma_words_matching"])
		env.Record(t, "nvme_sha256", g["nvme_written_sha256"])
		assertOneContainerAndMapPerRegion(t, env, log, 2)
		assert.Equal(t, "vfio-pci", pciDriver(harness.EduBDF))
		assert.Equal(t, "vfio-pci", pciDriver(harness.NVMeVFBDF))
	}, func(t *testing.T, o harness.Outer) {
		assertDiskHolds(t, o, nvmeOffKiBSlurm)
	})
}

// TestSlurmDeviceConstraint: Slurm's device cgroup, not hpcvmm, keeps a
// job from the VF it was not given, and hpcvmm says so.
//
//   - a job without the nic GRES: Slurm sets no SLURM_*_NICS, and hpcvmm
//     says it was given no nic and how to ask for one;
//   - a step given only the gpu inside a job that holds the nic (the job's
//     SLURM_JOB_NICS reaches the step, its own SLURM_STEP_NICS does not):
//     opening the VF's group fails with EPERM from the step's device
//     cgroup, shown by a plain open(2) in the same kind of step, and hpcvmm
//     reports that EPERM with the variable that named the group; with the
//     VF named by its address (--vf BDF) preflight's open of the group
//     meets the same refusal and names the device cgroup.
//
// Nothing on L1 changes: both devices stay on vfio-pci.
func TestSlurmDeviceConstraint(t *testing.T) {
	harness.Run(t, harness.ProfileSlurm, func(t *testing.T, env *harness.Env) {
		nicGroup := vfioGroupOf(t, harness.NVMeVFBDF)
		// The Slurm profile exists only in L1: its guests run in the test
		// bed's CPU mode (harness.TestbedCPUMode says why).
		vmArgs := []string{env.HPCVMM(t), "run", "--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--hugepages", "1G", "--cpu-mode", harness.TestbedCPUMode, "--gpu", "slurm", "--vf", "slurm"}

		t.Run("job without nic", func(t *testing.T) {
			o := runSlurm(t, slurmTimeout, "srun", append([]string{"--gres=gpu:1", "--mem=2048", "--time=20"}, vmArgs...)...)
			assert.NotEqual(t, 0, o.code, "hpcvmm ran without the nic it was asked for")
			want := "slurm: Slurm gave this job no nic: neither SLURM_STEP_NICS nor SLURM_JOB_NICS is set; request them with --gres=nic:N"
			assert.Contains(t, o.stderr, want)
			env.Record(t, "message", firstLineWith(o.stderr, "no nic"))
		})

		t.Run("step without nic", func(t *testing.T) {
			dir := t.TempDir()
			script := filepath.Join(dir, "job.sh")
			out := filepath.Join(dir, "job.out")
			group := "/dev/vfio/" + nicGroup
			body := fmt.Sprintf(`#!/bin/sh
echo "job SLURM_JOB_NICS=$SLURM_JOB_NICS"
srun --gres=gpu:1 sh -c 'echo "step SLURM_STEP_NICS=${SLURM_STEP_NICS-unset}"; if (exec 3<>%[1]s); then echo "open %[1]s: ok"; else echo "open %[1]s: failed"; fi' 2>&1
srun --gres=gpu:1 %[2]s 2>&1
echo "hpcvmm exit $?"
srun --gres=gpu:1 %[3]s 2>&1
echo "hpcvmm with the VF named exit $?"
`, group, shellArgs(vmArgs), shellArgs(append(vmArgs[:len(vmArgs)-4:len(vmArgs)-4], "--gpu", "slurm", "--vf", harness.NVMeVFBDF)))
			require.NoError(t, os.WriteFile(script, []byte(body), 0o755))
			o := runSlurm(t, slurmTimeout, "sbatch", "--wait", "--gres=gpu:1,nic:1", "--mem=2048", "--time=20", "-o", out, script)
			data, err := os.ReadFile(out)
			require.NoError(t, err, "sbatch: %s %s\n%s", o.stdout, o.stderr, slurmLogs())
			job := string(data)
			t.Logf("job output:\n%s", job)
			assert.Contains(t, job, "job SLURM_JOB_NICS=mlx4_"+nicGroup, "the job holds the VF")
			assert.Contains(t, job, "step SLURM_STEP_NICS=unset", "the step was not given it")
			assert.Contains(t, job, "Operation not permitted", "open(2) of the VF's group in the step (the shell's error)")
			assert.Contains(t, job, "open "+group+": failed")
			want := fmt.Sprintf("slurm: SLURM_JOB_NICS=mlx4_%[1]s gives /dev/vfio/%[1]s, but this job's device cgroup does not let it open /dev/vfio/%[1]s (EPERM)", nicGroup)
			assert.Contains(t, job, want)
			assert.NotContains(t, job, "hpcvmm exit 0")
			env.Record(t, "message", firstLineWith(job, "(EPERM)"))
			// The VF named by its address: preflight's open of the group
			// meets the same cgroup, and says so before guest RAM is
			// reserved (neither run got that far).
			assert.Contains(t, job, "vfio-open "+harness.NVMeVFBDF+": "+group+": this process's device cgroup does not let it open the group (EPERM)")
			assert.NotContains(t, job, "hpcvmm with the VF named exit 0")
			assert.NotContains(t, job, "guest RAM ready", "a refused group is found before guest RAM is prefaulted")
			env.Record(t, "message_named_vf", firstLineWith(job, "vfio-open"))
		})
		assert.Equal(t, "vfio-pci", pciDriver(harness.EduBDF))
		assert.Equal(t, "vfio-pci", pciDriver(harness.NVMeVFBDF))
	})
}

// lostToEmulator reports whether a failed run lost its L2 guest to a triple
// fault in early boot (issue 36: seen in the nested test bed only, under
// QEMU's TCG emulation of nested SVM; docs/testbed.md) and may run again:
// at most emulatedBootAttempts runs, each lost one recorded.
func lostToEmulator(t *testing.T, env *harness.Env, failed bool, log string, attempt int) bool {
	t.Helper()
	if !failed || !strings.Contains(log, "guest triple fault") || attempt >= emulatedBootAttempts {
		return false
	}
	t.Logf("run %d lost its L2 guest to a triple fault in early boot; running it again", attempt)
	env.Record(t, fmt.Sprintf("lost_run_%d", attempt), "KVM_EXIT_SHUTDOWN")
	return true
}

// TestSlurmTwoNodes: `sbatch -N2` runs one VM per node (n1 and n2, each
// through srun --ntasks-per-node=1 as an MPI job would start its ranks);
// each VM's TAP is on the one L1 bridge, and the two guests ping each
// other and pass a line over TCP: the MPI bootstrap path. Guest RAM comes
// from each node's --mem.
func TestSlurmTwoNodes(t *testing.T) {
	harness.Run(t, harness.ProfileSlurm, func(t *testing.T, env *harness.Env) {
		dir := t.TempDir()
		node := filepath.Join(dir, "node.sh")
		body := fmt.Sprintf(`#!/bin/sh
# One VM per node: rank 0 listens, rank 1 sends.
# hpcvmm creates the TAP (and removes it when it exits); the script puts it
# on the bridge the other node's TAP is on, as a site's network setup would.
id=$SLURM_NODEID
tap=hpvsl$id
if [ "$id" = 0 ]; then addr=10.78.0.11 peer=10.78.0.12 tcp=listen:7001; else addr=10.78.0.12 peer=10.78.0.11 tcp=send:7001; fi
%[2]s --cmdline "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=net hpcvmm.net_addr=$addr hpcvmm.net_peer=$peer hpcvmm.net_wait=240 hpcvmm.net_tcp=$tcp" \
	--net tap=$tap,mac=02:68:70:00:01:1$id >%[3]s/console.$id 2>%[3]s/log.$id &
pid=$!
i=0
until [ -e /sys/class/net/$tap ]; do
	i=$((i + 1))
	{ [ $i -le 1200 ] && kill -0 $pid 2>/dev/null; } || break
	sleep 0.1
done
ip link set $tap master %[1]s && echo "node $SLURMD_NODENAME: $tap on %[1]s"
wait $pid
rc=$?
echo "node $SLURMD_NODENAME id $id hpcvmm exit $rc"
# The other guest waits up to 240 s for its peer: end the job instead.
[ $rc -eq 0 ] || scancel $SLURM_JOB_ID
exit $rc
`, harness.SlurmBridge, shellArgs(env.VMArgs([]string{env.HPCVMM(t), "run", "--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t), "--hugepages", "1G"})), dir)
		require.NoError(t, os.WriteFile(node, []byte(body), 0o755))
		out := filepath.Join(dir, "job.out")
		start := time.Now()
		var o slurmOutput
		for attempt := 1; ; attempt++ {
			o = runSlurm(t, slurmTimeout, "sbatch", "--wait", "-N2", "--mem=2048", "--time=20", "-o", out,
				"--wrap", "srun -N2 --ntasks-per-node=1 "+node)
			var logs string
			for id := range 2 {
				b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("log.%d", id)))
				logs += string(b)
			}
			if !lostToEmulator(t, env, o.code != 0, logs, attempt) {
				break
			}
		}
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		job, _ := os.ReadFile(out)
		t.Logf("sbatch: exit %d %s %s\njob output:\n%s", o.code, o.stdout, o.stderr, job)
		assert.Equal(t, 0, o.code, "sbatch --wait exit status (the job's)\n%s", slurmLogs())
		assert.Contains(t, string(job), "node n1: hpvsl0 on "+harness.SlurmBridge)
		assert.Contains(t, string(job), "node n2: hpvsl1 on "+harness.SlurmBridge)
		assert.Contains(t, string(job), "node n1 id 0 hpcvmm exit 0")
		assert.Contains(t, string(job), "node n2 id 1 hpcvmm exit 0")

		var gs [2]map[string]string
		for id := range 2 {
			con, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("console.%d", id)))
			require.NoError(t, err)
			log, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("log.%d", id)))
			require.NoError(t, err)
			g, bad := harness.ParseGuestResults(string(con))
			assert.Empty(t, bad)
			gs[id] = g
			if !assert.Contains(t, string(con), "HPCVMM-GUEST-MARKER done", "guest %d did not finish", id) {
				t.Logf("--- console %d ---\n%s\n--- log %d ---\n%s", id, harness.Tail(string(con), 30), id, harness.Tail(string(log), 30))
			}
			assert.Equal(t, "virtio_net", g["net_eth0_driver"], "guest %d", id)
			assert.Equal(t, "ok", g["net_ping"], "guest %d pings the other", id)
			mem := logRecord(string(log), "guest RAM from Slurm")
			if assert.NotNil(t, mem, "node %d: guest RAM not from Slurm", id) {
				assert.Equal(t, "SLURM_MEM_PER_NODE=2048", mem["slurm"])
			}
			env.Record(t, fmt.Sprintf("guest%d_peer_up_uptime", id), g["net_peer_up_uptime"])
		}
		assert.Equal(t, "hello-from-10.78.0.12", gs[0]["net_tcp_received"], "the line rank 1 sent, as rank 0 received it over TCP")
		assert.Equal(t, "hello-from-10.78.0.12", gs[1]["net_tcp_sent"])
		env.Record(t, "tcp_received", gs[0]["net_tcp_received"])
	})
}

// shellArgs quotes args for a POSIX shell script.
func shellArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}

// firstLineWith returns the first line of s containing sub.
func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
