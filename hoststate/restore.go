// Undoing: a journal's changes in reverse, by this process (Restore) or for a
// process that died (RestoreStale).

package hoststate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/slurm"
)

// undo gives c's device back: off any driver it is on now (unless that is
// the original), driver_override restored, reprobed so the original driver
// binds, explicitly bound if the probe picked nothing.
func (j *Journal) undo(c Change) error {
	return undoChange(j.opts, c)
}

func undoChange(o Options, c Change) error {
	if err := c.validate(); err != nil {
		return fmt.Errorf("hoststate: restore %s %q: %w; nothing done", c.Kind, c.BDF, err)
	}
	switch c.Kind {
	case KindIBVF:
		return undoIBVF(o, c)
	case KindVFIOOwner:
		return undoVFIOOwner(o, c)
	case KindTAP:
		return undoTAP(c)
	}
	if c.Kind != KindPCIBind {
		return fmt.Errorf("hoststate: cannot undo change of unknown kind %q (journal from a newer hpcvmm?)", c.Kind)
	}
	w := o.WriteFile
	dir := filepath.Join(o.SysfsRoot, "bus/pci/devices", c.BDF)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("hoststate: restore %s: device gone (%w); nothing to undo", c.BDF, err)
	}
	cur, err := currentDriver(o.SysfsRoot, c.BDF)
	if err != nil {
		return err
	}
	if cur != "" && !validDriver(cur) {
		return fmt.Errorf("hoststate: restore %s: its driver link names %q, not a driver", c.BDF, cur)
	}
	if cur != "" && cur != c.OriginalDriver {
		if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers", cur, "unbind"), []byte(c.BDF)); err != nil {
			return fmt.Errorf("hoststate: restore %s: unbind from %s: %w", c.BDF, cur, err)
		}
	}
	// Writing a newline clears driver_override.
	ov := c.OriginalOverride
	if ov == "" {
		ov = "\n"
	}
	if err := w(filepath.Join(dir, "driver_override"), []byte(ov)); err != nil {
		return fmt.Errorf("hoststate: restore %s: reset driver_override: %w", c.BDF, err)
	}
	if c.OriginalDriver == "" || cur == c.OriginalDriver {
		return nil
	}
	if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers_probe"), []byte(c.BDF)); err != nil {
		return fmt.Errorf("hoststate: restore %s: reprobe: %w", c.BDF, err)
	}
	if now, _ := currentDriver(o.SysfsRoot, c.BDF); now == c.OriginalDriver {
		return nil
	}
	if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers", c.OriginalDriver, "bind"), []byte(c.BDF)); err != nil {
		return fmt.Errorf("hoststate: restore %s: bind to %s: %w", c.BDF, c.OriginalDriver, err)
	}
	if now, _ := currentDriver(o.SysfsRoot, c.BDF); now != c.OriginalDriver {
		return fmt.Errorf("hoststate: restore %s: still not on %s after bind; bind it by hand: echo %s > /sys/bus/pci/drivers/%s/bind", c.BDF, c.OriginalDriver, c.BDF, c.OriginalDriver)
	}
	return nil
}

// Restore undoes every recorded change, newest first. Changes that could
// not be undone stay in the journal (so `hpcvmm unbind` can retry) and are
// reported together, in one error that names the journal. Under a seccomp
// filter that refuses write-opens, call PrepareRestore before it goes on.
func (j *Journal) Restore() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	defer j.dropRewrite()
	var errs []error
	var left []Change
	for i := len(j.f.Changes) - 1; i >= 0; i-- {
		c := j.f.Changes[i]
		if err := j.undo(c); err != nil {
			errs = append(errs, err)
			left = append([]Change{c}, left...)
		}
	}
	j.f.Changes = left
	if err := j.save(); err != nil {
		errs = append(errs, err)
	} else if len(left) > 0 {
		errs = append(errs, fmt.Errorf("hoststate: %d change(s) not undone stay in journal %s: hpcvmm unbind retries them", len(left), j.path))
	}
	return errors.Join(errs...)
}

// startTime reads field 22 (starttime) of /proc/<pid>/stat.
func startTime(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses; the
	// fields after it start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("hoststate: malformed %s/%d/stat", proc, pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("hoststate: short %s/%d/stat", proc, pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the journal's process still runs (same PID and,
// when recorded, same start time).
func alive(o Options, f file) bool {
	if f.PID <= 0 {
		return false
	}
	if err := syscall.Kill(f.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	st, err := startTime(o.ProcRoot, f.PID)
	if err != nil {
		// Signal 0 succeeded but procfs is unreadable (different procfs
		// root in a test): trust the signal.
		return true
	}
	return f.StartTime == 0 || st == f.StartTime
}

// StaleReport says what RestoreStale did.
type StaleReport struct {
	// Restored are the changes undone.
	Restored []Change
	// Skipped names journals left alone and why: their hpcvmm still runs,
	// their Slurm job still runs (or Slurm could not say), or they belong
	// to another job than the Epilog's.
	Skipped []string
}

// RestoreStale undoes the changes recorded by hpcvmm processes that no
// longer run (killed, crashed, or a Prolog's `hpcvmm bind`), for `hpcvmm
// unbind`. With bdfs, only changes to those PCI functions are undone; the
// rest stay journaled. Journals of live processes (other than this one)
// are never touched. With SLURM_JOB_ID set (the job's Epilog), only that
// job's journals are undone; without, a journal of a Slurm job is undone
// only once Slurm says the job no longer runs (Options.JobRunning).
// Journals and a state directory that someone else could have written are
// refused (checkOwner), and so is a journal whose contents are not what
// hpcvmm writes (Change.validate), before anything is changed for it.
func RestoreStale(opts Options, bdfs ...host.BDF) (StaleReport, error) {
	opts.fill()
	var rep StaleReport
	if err := stateDir(opts.StateDir, false); errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	} else if err != nil {
		return rep, err
	}
	// One restore at a time: two Epilogs on a node (two jobs ending, or
	// the nodes of one job that share a host) would otherwise undo the
	// same journal twice, and the second find its TAP or file gone midway.
	unlock, err := lockStateDir(opts.StateDir)
	if err != nil {
		return rep, err
	}
	defer unlock()
	ents, err := os.ReadDir(opts.StateDir)
	if err != nil {
		return rep, fmt.Errorf("hoststate: list %s: %w", opts.StateDir, err)
	}
	want := map[string]bool{}
	for _, b := range bdfs {
		want[b.String()] = true
	}
	epilog := opts.Getenv("SLURM_JOB_ID")
	if !slurm.ValidJobID(epilog) {
		epilog = ""
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			removeStaleTemp(opts.StateDir, e.Name())
			continue
		}
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(opts.StateDir, e.Name())
		f, err := readJournal(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // its hpcvmm restored and removed it since the listing
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f.PID != opts.PID && alive(opts, f) {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s (hpcvmm pid %d still running)", path, f.PID))
			continue
		}
		if why := keep(opts, epilog, f); why != "" {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s (%s)", path, why))
			continue
		}
		j := &Journal{opts: opts, path: path, claimed: true, f: f}
		var left []Change
		for i := len(f.Changes) - 1; i >= 0; i-- {
			c := f.Changes[i]
			if len(want) > 0 && !want[c.BDF] {
				left = append([]Change{c}, left...)
				continue
			}
			if err := undoChange(opts, c); err != nil {
				errs = append(errs, fmt.Errorf("%w (journal %s)", err, path))
				left = append([]Change{c}, left...)
				continue
			}
			rep.Restored = append(rep.Restored, c)
		}
		j.f.Changes = left
		if err := j.save(); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}

// lockStateDir takes an exclusive flock(2) on the state directory for one
// RestoreStale, waiting for another to finish, and returns its release.
func lockStateDir(dir string) (func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hoststate: open state directory %s to lock it: %w", dir, err)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("hoststate: lock state directory %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// removeStaleTemp removes a journal's temporary file (".tmp-<pid>-…", see
// save) once its process is gone: an hpcvmm killed between writing it and
// renaming it into place. Such a file never recorded a change that was
// made, since a change is made only after its journal is in place.
func removeStaleTemp(dir, name string) {
	pidStr, _, ok := strings.Cut(strings.TrimPrefix(name, ".tmp-"), "-")
	pid, err := strconv.Atoi(pidStr)
	if !ok || err != nil || pid <= 0 {
		return
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		_ = os.Remove(filepath.Join(dir, name))
	}
}

// keep says why journal f must be left alone for now, "" when it may be
// restored: in job epilog's Epilog, unless it is that job's; outside a job,
// while the Slurm job it records still runs or Slurm cannot say.
func keep(o Options, epilog string, f file) string {
	if epilog != "" {
		if f.SlurmJob == epilog {
			return ""
		}
		if f.SlurmJob == "" {
			return fmt.Sprintf("not of Slurm job %s; hpcvmm unbind outside a job restores it", epilog)
		}
		return fmt.Sprintf("Slurm job %s's, not job %s's; its own Epilog restores it", f.SlurmJob, epilog)
	}
	if f.SlurmJob == "" {
		return ""
	}
	running, err := o.JobRunning(f.SlurmJob)
	if err != nil {
		return fmt.Sprintf("cannot tell whether Slurm job %s still runs: %v; its Epilog, or hpcvmm unbind once Slurm answers, restores it", f.SlurmJob, err)
	}
	if running {
		return fmt.Sprintf("Slurm job %s still runs; its Epilog restores it", f.SlurmJob)
	}
	return ""
}
