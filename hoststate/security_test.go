package hoststate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/ibvf"
)

// deadPID returns the PID of a process that has exited.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// env is an environment for Options.Getenv.
func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

// TestEpilogRestoresOnlyItsOwnJob: two jobs share a node. Each Prolog runs
// `hpcvmm bind` (which exits at once, so its journal's process is gone) for
// its own device; job A's Epilog (SLURM_JOB_ID=100, `hpcvmm unbind` without
// arguments) gives A's device back and leaves B's bound, also after a
// killed hpcvmm of A; an administrator's `hpcvmm unbind` outside any job
// leaves B's device alone while Slurm says B runs, and while Slurm cannot
// be asked; B's Epilog then gives B's device back.
func TestEpilogRestoresOnlyItsOwnJob(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", "nvme", "nvme")     // job A's
	k.addDevice("0000:00:06.0", "e1000e", "e1000e") // job B's
	k.addDevice("0000:00:07.0", "nvme", "nvme")     // a killed hpcvmm outside Slurm
	state := t.TempDir()
	running := map[string]bool{"100": true, "200": true} // A completing (its Epilog runs), B running
	var slurmErr error
	asked := map[string]int{}
	opts := func(pid int, kv ...string) Options {
		o := k.opts(t, state, pid)
		o.Getenv = env(kv...)
		o.JobRunning = func(job string) (bool, error) {
			asked[job]++
			return running[job], slurmErr
		}
		return o
	}

	prologA := Open(opts(deadPID(t), "SLURM_JOB_ID", "100"))
	require.NoError(t, prologA.Bind(mustBDF(t, "0000:00:05.0")))
	prologB := Open(opts(deadPID(t), "SLURM_JOB_ID", "200"))
	require.NoError(t, prologB.Bind(mustBDF(t, "0000:00:06.0")))
	manual := Open(opts(deadPID(t)))
	require.NoError(t, manual.Bind(mustBDF(t, "0000:00:07.0")))

	var f file
	b, err := os.ReadFile(prologB.Path())
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &f))
	assert.Equal(t, "200", f.SlurmJob, "the journal records the job")

	// Job A's Epilog.
	rep, err := RestoreStale(opts(os.Getpid(), "SLURM_JOB_ID", "100"))
	require.NoError(t, err)
	assert.Equal(t, []Change{{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme"}}, rep.Restored)
	assert.Equal(t, "nvme", k.driver("0000:00:05.0"))
	assert.Equal(t, VFIODriver, k.driver("0000:00:06.0"), "job B's device stays on vfio-pci")
	assert.Equal(t, VFIODriver, k.driver("0000:00:07.0"), "an Epilog restores its own job's journals only")
	assert.NoFileExists(t, prologA.Path())
	assert.FileExists(t, prologB.Path())

	// An administrator's `hpcvmm unbind` while Slurm cannot be asked, then
	// while B runs: B's journal is left alone, the job-less one restored.
	slurmErr = errors.New("squeue: slurm_load_jobs error: Unable to contact slurm controller")
	rep, err = RestoreStale(opts(os.Getpid()))
	require.NoError(t, err)
	assert.Equal(t, VFIODriver, k.driver("0000:00:06.0"), "whether B runs is unknown: left alone")
	require.NotEmpty(t, rep.Skipped)
	assert.Contains(t, strings.Join(rep.Skipped, "\n"), "200")
	slurmErr = nil
	rep, err = RestoreStale(opts(os.Getpid()))
	require.NoError(t, err)
	assert.Equal(t, VFIODriver, k.driver("0000:00:06.0"), "B still runs: left alone")
	assert.Equal(t, "nvme", k.driver("0000:00:07.0"), "the killed hpcvmm outside Slurm is restored")
	assert.Contains(t, strings.Join(rep.Skipped, "\n"), "job 200")
	assert.Positive(t, asked["200"])
	assert.Zero(t, asked["100"], "an Epilog does not ask whether its own job runs")

	// Job B's Epilog.
	running["200"] = true // completing
	rep, err = RestoreStale(opts(os.Getpid(), "SLURM_JOB_ID", "200"))
	require.NoError(t, err)
	assert.Len(t, rep.Restored, 1)
	assert.Equal(t, "e1000e", k.driver("0000:00:06.0"))
	assert.NoFileExists(t, prologB.Path())
}

// TestJobOfAGoneJobIsRestoredOutsideAnEpilog: a journal of a job Slurm no
// longer knows (its Epilog failed) is restored by the next `hpcvmm unbind`
// outside a job, but never by another job's Epilog.
func TestJobOfAGoneJobIsRestoredOutsideAnEpilog(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", "nvme", "nvme")
	state := t.TempDir()
	o := k.opts(t, state, deadPID(t))
	o.Getenv = env("SLURM_JOB_ID", "300", "SLURM_STEP_ID", "0")
	j := Open(o)
	require.NoError(t, j.Bind(mustBDF(t, "0000:00:05.0")))
	var f file
	b, err := os.ReadFile(j.Path())
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &f))
	assert.Equal(t, "300", f.SlurmJob)
	assert.Equal(t, "0", f.SlurmStep)
	gone := func(string) (bool, error) { return false, nil }

	other := k.opts(t, state, os.Getpid())
	other.Getenv, other.JobRunning = env("SLURM_JOB_ID", "301"), gone
	rep, err := RestoreStale(other)
	require.NoError(t, err)
	assert.Empty(t, rep.Restored)

	admin := k.opts(t, state, os.Getpid())
	admin.Getenv, admin.JobRunning = env(), gone
	rep, err = RestoreStale(admin)
	require.NoError(t, err)
	require.Len(t, rep.Restored, 1)
	assert.Equal(t, "nvme", k.driver("0000:00:05.0"))
}

// TestJournalOfACrashedRunSurvivesALaterRunWithItsPID: an hpcvmm killed
// with its device on vfio-pci leaves its journal; a later hpcvmm given the
// same PID (another PID namespace, or PIDs wrapped) binds and restores its
// own device without touching that journal, which `hpcvmm unbind` then
// restores.
func TestJournalOfACrashedRunSurvivesALaterRunWithItsPID(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", "nvme", "nvme")
	k.addDevice("0000:00:06.0", "e1000e", "e1000e")
	state := t.TempDir()
	pid := deadPID(t)

	crashed := Open(k.opts(t, state, pid))
	require.NoError(t, crashed.Bind(mustBDF(t, "0000:00:05.0")))
	later := Open(k.opts(t, state, pid))
	require.NoError(t, later.Bind(mustBDF(t, "0000:00:06.0")))
	assert.NotEqual(t, crashed.Path(), later.Path())
	require.NoError(t, later.Restore())
	assert.Equal(t, "e1000e", k.driver("0000:00:06.0"))
	require.FileExists(t, crashed.Path(), "the crashed run's journal survives")

	rep, err := RestoreStale(k.opts(t, state, os.Getpid()))
	require.NoError(t, err)
	assert.Equal(t, []Change{{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme"}}, rep.Restored)
	assert.Equal(t, "nvme", k.driver("0000:00:05.0"))
}

// refuseNetlink fails the test on any netlink call.
type refuseNetlink struct{ t *testing.T }

func (r refuseNetlink) Identity(netdev string, vf int) (ibvf.Identity, error) {
	r.t.Errorf("netlink read of %s VF %d", netdev, vf)
	return ibvf.Identity{}, errors.New("refused")
}
func (r refuseNetlink) SetNodeGUID(netdev string, vf int, _ ibvf.GUID) error {
	r.t.Errorf("netlink write to %s VF %d", netdev, vf)
	return errors.New("refused")
}
func (r refuseNetlink) SetPortGUID(netdev string, vf int, _ ibvf.GUID) error {
	r.t.Errorf("netlink write to %s VF %d", netdev, vf)
	return errors.New("refused")
}
func (r refuseNetlink) SetLinkState(netdev string, vf int, _ ibvf.LinkState) error {
	r.t.Errorf("netlink write to %s VF %d", netdev, vf)
	return errors.New("refused")
}

// writeJournal writes a journal file as another program (or user) could.
func writeJournal(t *testing.T, dir, name string, f file) string {
	t.Helper()
	b, err := json.Marshal(f)
	require.NoError(t, err)
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

// TestRestoreRefusesJournalPathsOutsideSysfs: BDFs, driver names and
// overrides from a journal become sysfs path parts and written values; any
// that is not a canonical PCI address or a driver name is refused, naming
// the journal, before anything is written.
func TestRestoreRefusesJournalPathsOutsideSysfs(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", VFIODriver, "nvme")
	for _, c := range []Change{
		{Kind: KindPCIBind, BDF: "../../../../victim", OriginalDriver: "nvme"},
		{Kind: KindPCIBind, BDF: "0000:00:05.0/../../../../../victim", OriginalDriver: "nvme"},
		{Kind: KindPCIBind, BDF: "00:05.0", OriginalDriver: "nvme"},
		{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "../../../../victim"},
		{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme", OriginalOverride: "../../x"},
		{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme", OriginalOverride: "nvme\nvfio-pci"},
		{Kind: KindIBVF, BDF: "0000:00:05.0", IBVF: &IBVFChange{PF: "0000:00:04.0", Netdev: "../ib0", VFIndex: 0, SetLink: true}},
		{Kind: KindIBVF, BDF: "0000:00:05.0", IBVF: &IBVFChange{PF: "0000:00:04.0", Netdev: "ib0", VFIndex: -1, SetLink: true}},
	} {
		state := t.TempDir()
		path := writeJournal(t, state, "1-0.json", file{PID: deadPID(t), Changes: []Change{c}})
		var writes []string
		o := k.opts(t, state, os.Getpid())
		o.WriteFile = func(p string, _ []byte) error { writes = append(writes, p); return nil }
		o.Netlink = refuseNetlink{t}
		rep, err := RestoreStale(o)
		require.Error(t, err, "%+v", c)
		assert.Contains(t, err.Error(), path, "%+v", c)
		assert.Empty(t, writes, "%+v: nothing written", c)
		assert.Empty(t, rep.Restored)
		assert.FileExists(t, path, "%+v: kept for the administrator", c)
	}
}

// TestWriteAttrDoesNotFollowSymlinks: the sysfs attribute write refuses a
// symbolic link in place of the attribute.
func TestWriteAttrDoesNotFollowSymlinks(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "core_pattern")
	require.NoError(t, os.WriteFile(target, []byte("core\n"), 0o644))
	link := filepath.Join(dir, "driver_override")
	require.NoError(t, os.Symlink(target, link))
	err := writeAttr(link, []byte("|/tmp/x"))
	require.Error(t, err)
	b, err := os.ReadFile(target)
	require.NoError(t, err)
	assert.Equal(t, "core\n", string(b))
}

// TestLooseStateDirectoryAndJournalsAreRefused: a state directory or a
// journal that someone other than root or hpcvmm's user could have
// written is refused with a one-line error naming it and the fix, before
// anything is changed.
func TestLooseStateDirectoryAndJournalsAreRefused(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", "nvme", "nvme")
	var writes []string
	opts := func(state string) Options {
		o := k.opts(t, state, os.Getpid())
		o.WriteFile = func(p string, _ []byte) error { writes = append(writes, p); return nil }
		return o
	}
	good := Change{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme"}

	loose := t.TempDir()
	require.NoError(t, os.Chmod(loose, 0o777))
	writeJournal(t, loose, "1-0.json", file{PID: deadPID(t), Changes: []Change{good}})
	_, err := RestoreStale(opts(loose))
	require.Error(t, err)
	assert.Contains(t, err.Error(), loose)
	assert.Contains(t, err.Error(), "chmod go-w")
	assert.NotContains(t, err.Error(), "\n")
	err = Open(opts(loose)).Bind(mustBDF(t, "0000:00:05.0"))
	require.Error(t, err)
	assert.Contains(t, err.Error(), loose)
	assert.Empty(t, writes)

	state := t.TempDir()
	p := writeJournal(t, state, "1-0.json", file{PID: deadPID(t), Changes: []Change{good}})
	require.NoError(t, os.Chmod(p, 0o666))
	_, err = RestoreStale(opts(state))
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Empty(t, writes)

	if os.Geteuid() == 0 {
		require.NoError(t, os.Chmod(p, 0o600))
		require.NoError(t, os.Chown(p, 4242, -1))
		_, err = RestoreStale(opts(state))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "uid 4242")
		assert.Empty(t, writes)

		other := filepath.Join(t.TempDir(), "other")
		require.NoError(t, os.Mkdir(other, 0o700))
		require.NoError(t, os.Chown(other, 4242, -1))
		_, err = RestoreStale(opts(other))
		require.Error(t, err)
		assert.Contains(t, err.Error(), other)
	}

	// A symbolic link in place of a journal is refused too.
	sl := t.TempDir()
	require.NoError(t, os.Symlink(p, filepath.Join(sl, "2-0.json")))
	_, err = RestoreStale(opts(sl))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "symbolic link")
	assert.Empty(t, writes)
}

// TestRestoreStaleRemovesTemporaryFilesOfGoneProcesses: a journal's
// temporary file left by an hpcvmm killed while saving is removed once its
// process is gone, and kept while it runs.
func TestRestoreStaleRemovesTemporaryFilesOfGoneProcesses(t *testing.T) {
	k := newKernel(t)
	state := t.TempDir()
	gone := filepath.Join(state, fmt.Sprintf(".tmp-%d-00112233aabbccdd.json-123", deadPID(t)))
	live := filepath.Join(state, fmt.Sprintf(".tmp-%d-00112233aabbccdd.json-456", os.Getppid()))
	for _, p := range []string{gone, live} {
		require.NoError(t, os.WriteFile(p, []byte("{"), 0o600))
	}
	_, err := RestoreStale(k.opts(t, state, os.Getpid()))
	require.NoError(t, err)
	assert.NoFileExists(t, gone)
	assert.FileExists(t, live)
}

// TestConcurrentEpilogsRestoreOnce: two Epilogs of one job on one host (the
// nodes of a multi-node job that share it, or an Epilog racing an
// administrator's hpcvmm unbind) undo its journals once: the second
// RestoreStale waits for the first and then finds nothing left, instead of
// undoing the same changes again or failing on a journal removed under it.
// A journal whose hpcvmm removed it after the listing is skipped, not an
// error (which would fail the Epilog and drain the node).
func TestConcurrentEpilogsRestoreOnce(t *testing.T) {
	k := newKernel(t)
	k.loadDriver(VFIODriver)
	k.addDevice("0000:00:05.0", "nvme", "nvme")
	k.addDevice("0000:00:06.0", "nvme", "nvme")
	state := t.TempDir()
	opts := func(pid int) Options {
		o := k.opts(t, state, pid)
		o.Getenv = env("SLURM_JOB_ID", "100")
		return o
	}
	for i, bdf := range []string{"0000:00:05.0", "0000:00:06.0"} {
		j := Open(opts(deadPID(t)))
		require.NoError(t, j.Bind(mustBDF(t, bdf)))
		// Names that fix the listing's order: 1-….json first.
		require.NoError(t, os.Rename(j.Path(), filepath.Join(state, fmt.Sprintf("%d-journal.json", i+1))))
	}
	// A live hpcvmm's journal (this process) that it restores and removes
	// itself while the Epilog works on the first journal.
	live := Open(opts(os.Getpid()))
	live.f.Changes = []Change{{Kind: KindPCIBind, BDF: "0000:00:05.0", OriginalDriver: "nvme"}}
	require.NoError(t, live.save())
	require.NoError(t, os.Rename(live.Path(), filepath.Join(state, "3-live.json")))

	second := make(chan error, 1)
	var secondRep StaleReport
	started := false
	k.before = func(string) {
		if started {
			return
		}
		started = true
		require.NoError(t, os.Remove(filepath.Join(state, "3-live.json")))
		go func() {
			var err error
			secondRep, err = RestoreStale(opts(os.Getpid() + 1))
			second <- err
		}()
		select {
		case err := <-second:
			t.Errorf("a second restore ran while the first was undoing (err %v)", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	rep, err := RestoreStale(opts(os.Getpid() + 1))
	require.NoError(t, err, "the removed journal is no error")
	assert.Len(t, rep.Restored, 2, "both journals of the job")
	require.NoError(t, <-second)
	assert.Empty(t, secondRep.Restored, "nothing undone twice")
	assert.Empty(t, secondRep.Skipped)
	assert.Equal(t, "nvme", k.driver("0000:00:05.0"))
	assert.Equal(t, "nvme", k.driver("0000:00:06.0"))
	ents, err := os.ReadDir(state)
	require.NoError(t, err)
	assert.Empty(t, ents, "every journal gone")
}
