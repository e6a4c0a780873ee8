//go:build integration

package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// TestSlurmJobAsUser (issue 37): a job of an unprivileged user under Slurm
// with docs/slurm.md's Prolog and Epilog, holding no gpu and no nic GRES.
// srun runs as harness.SlurmUser (in the kvm group /dev/kvm is given to;
// 2 MiB hugepages reserved by root beforehand), in a directory of that user
// holding in.txt:
//
//   - `srun hpcvmm run --rootfs BUSYBOX -- sh -c 'cat in.txt > out.txt; id
//     -u; ls -ln out.txt'` exits 0, out.txt is on the host with in.txt's
//     content and owned by the user, and the guest printed the user's uid;
//   - a job whose step opens the TAP the Prolog made for the user (--net
//     tap=NAME): during the job the TAP exists, is the user's and is on the
//     bridge, the guest's interface has the MAC given, and hpcvmm leaves
//     the TAP behind;
//
// and after each job the Epilog removed the Prolog's TAP and journal, and
// the node is idle, not drained (the Prolog succeeded for a job without
// nic or gpu).
func TestSlurmJobAsUser(t *testing.T) {
	harness.Run(t, harness.ProfileSlurm, func(t *testing.T, env *harness.Env) {
		if env.Where() != harness.WhereInside {
			t.Skip("the Slurm cluster exists only in the slurm profile's L1")
		}
		root := busyboxRootfs(t)
		// The user reads it too (t.TempDir's parent is 0700).
		require.NoError(t, os.Chmod(filepath.Dir(root), 0o755))
		require.NoError(t, os.Chmod(root, 0o755))
		reserveHugePages2M(t, 160) // 256M of guest RAM is 128 pages

		dir, err := os.MkdirTemp("/tmp", "hpcvmm-slurmuser-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		require.NoError(t, os.Chmod(dir, 0o755))
		require.NoError(t, os.Chown(dir, harness.SlurmUID, harness.SlurmUID))
		in := "input deck " + time.Now().Format(time.RFC3339Nano) + "\n"
		require.NoError(t, os.WriteFile(filepath.Join(dir, "in.txt"), []byte(in), 0o644))

		run := []string{env.HPCVMM(t), "run", "--kernel", env.L2Kernel(t), "--rootfs", root,
			"--cpus", "1", "--memory", "256M", "--hugepages", "2M", "--cpu-mode", harness.TestbedCPUMode}
		srun := []string{"-v", "-N1", "-w", "n1", "--mem=1024", "--time=10"}
		uid := strconv.Itoa(harness.SlurmUID)

		t.Run("files", func(t *testing.T) {
			start := time.Now()
			o := runSlurmWith(t, slurmTimeout, asSlurmUser(dir), "srun", append(append(srun, run...),
				"--", "sh", "-c", "cat in.txt > out.txt; id -u; ls -ln out.txt")...)
			env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
			job := srunJobID(t, o.stderr)
			require.Equal(t, 0, o.code, "srun as %s: exit status\n--- stderr ---\n%s\n--- stdout ---\n%s\n%s", harness.SlurmUser, harness.Tail(o.stderr, 40), o.stdout, slurmLogs())
			lines := strings.Split(strings.TrimSpace(o.stdout), "\n")
			require.Len(t, lines, 2, "stdout:\n%s", o.stdout)
			assert.Equal(t, uid, lines[0], "the guest's COMMAND ran as the job's user")
			assert.Regexp(t, `^-\S+\s+\d+\s+`+uid+`\s+`+uid+`\s+`+itoa(len(in))+`\s.*out.txt$`, lines[1], "the guest sees out.txt as the user's")
			b, err := os.ReadFile(filepath.Join(dir, "out.txt"))
			require.NoError(t, err, "out.txt on the host")
			assert.Equal(t, in, string(b), "out.txt holds in.txt's content")
			st, err := os.Stat(filepath.Join(dir, "out.txt"))
			require.NoError(t, err)
			assert.Equal(t, uint32(harness.SlurmUID), st.Sys().(*syscall.Stat_t).Uid, "out.txt on the host is the user's")
			assert.Equal(t, uint32(harness.SlurmUID), st.Sys().(*syscall.Stat_t).Gid)
			assertEpilogDone(t, job, "n1")
		})

		t.Run("prolog-tap", func(t *testing.T) {
			const mac = "02:68:70:00:03:01"
			script := `tap=hpvm$SLURM_JOB_ID$SLURMD_NODENAME
echo "job=$SLURM_JOB_ID tap=$tap owner=$(cat /sys/class/net/$tap/owner) master=$(basename "$(readlink /sys/class/net/$tap/master)")"
"$@" --net "tap=$tap,bridge=` + harness.SlurmBridge + `,mac=` + mac + `" -- sh -c 'cat /sys/class/net/*/address'
echo "hpcvmm exit $?"
echo "after owner=$(cat /sys/class/net/$tap/owner)"
`
			o := runSlurmWith(t, slurmTimeout, asSlurmUser(dir), "srun", append(append(srun, "sh", "-c", script, "step"), run...)...)
			t.Logf("step output:\n%s", o.stdout)
			job := srunJobID(t, o.stderr)
			require.Equal(t, 0, o.code, "srun as %s: exit status\n--- stderr ---\n%s\n%s", harness.SlurmUser, harness.Tail(o.stderr, 40), slurmLogs())
			tap := harness.SlurmTAP(job, "n1")
			assert.Contains(t, o.stdout, "job="+job+" tap="+tap+" owner="+uid+" master="+harness.SlurmBridge+"\n",
				"the Prolog made the job's user a TAP on the bridge")
			require.Contains(t, o.stdout, "hpcvmm exit 0\n", "hpcvmm as %s on the Prolog's TAP\n--- stderr ---\n%s", harness.SlurmUser, harness.Tail(o.stderr, 40))
			assert.Contains(t, o.stdout, mac+"\n", "the guest's interface is the TAP's, with the MAC given")
			assert.Contains(t, o.stdout, "after owner="+uid+"\n", "hpcvmm left the TAP for the Epilog")
			assertEpilogDone(t, job, "n1")
		})
	})
}

// asSlurmUser makes a command run as harness.SlurmUser in dir, with the
// environment a login shell of the user would give srun (which passes it
// on to the step: HOME is where hpcvmm keeps the user's cache).
func asSlurmUser(dir string) func(*exec.Cmd) {
	return func(cmd *exec.Cmd) {
		cmd.Dir = dir
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/" + harness.SlurmUser,
			"USER=" + harness.SlurmUser, "LOGNAME=" + harness.SlurmUser}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
			Uid: harness.SlurmUID, Gid: harness.SlurmUID, Groups: []uint32{harness.SlurmKVMGID}}}
	}
}

// srunJobID is the job ID `srun -v` reports ("srun: jobid 12: nodes(1):...").
func srunJobID(t *testing.T, stderr string) string {
	t.Helper()
	m := regexp.MustCompile(`srun: jobid ([0-9]+): nodes`).FindStringSubmatch(stderr)
	require.NotNil(t, m, "srun -v reported no job ID:\n%s", harness.Tail(stderr, 30))
	return m[1]
}

// assertEpilogDone waits (bounded) for job's Epilog on node: the Prolog's
// TAP gone, no journal of the job left in /run/hpcvmm, and the node idle.
// A Prolog or Epilog that failed drains the node instead.
func assertEpilogDone(t *testing.T, job, node string) {
	t.Helper()
	tap := harness.SlurmTAP(job, node)
	deadline := time.Now().Add(2 * time.Minute)
	var state, journals string
	var tapErr error
	for {
		_, tapErr = netlink.LinkByName(tap)
		journals = jobJournals(t, job)
		out, _ := exec.Command("sinfo", "-h", "-N", "-n", node, "-o", "%t").Output()
		state = strings.TrimSpace(string(out))
		if tapErr != nil && journals == "" && state == "idle" || strings.Contains(state, "drain") || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	show, _ := exec.Command("scontrol", "show", "node", node).CombinedOutput()
	require.Equal(t, "idle", state, "node %s after job %s (not drained: the Prolog and Epilog succeeded)\n%s\n%s", node, job, show, slurmLogs())
	assert.Error(t, tapErr, "the Epilog deleted the Prolog's TAP %s", tap)
	assert.Empty(t, journals, "the Epilog restored and removed job %s's journals", job)
}

// jobJournals lists the journals in /run/hpcvmm that record Slurm job job.
func jobJournals(t *testing.T, job string) string {
	t.Helper()
	ents, err := os.ReadDir("/run/hpcvmm")
	require.NoError(t, err)
	var left []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/run/hpcvmm", e.Name()))
		if err == nil && strings.Contains(string(b), `"slurm_job": "`+job+`"`) {
			left = append(left, e.Name()+": "+string(b))
		}
	}
	return strings.Join(left, "\n")
}

// reserveHugePages2M has root reserve n more 2 MiB hugepages for the
// scenario (as a node's administrator does before jobs), given back after.
func reserveHugePages2M(t *testing.T, n int) {
	t.Helper()
	const p = "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"
	read := func() int {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		v, err := strconv.Atoi(strings.TrimSpace(string(b)))
		require.NoError(t, err)
		return v
	}
	before := read()
	require.NoError(t, os.WriteFile(p, []byte(strconv.Itoa(before+n)), 0o644))
	t.Cleanup(func() { _ = os.WriteFile(p, []byte(strconv.Itoa(before)), 0o644) })
	require.Equal(t, before+n, read(), "2 MiB hugepages reserved in L1")
}
