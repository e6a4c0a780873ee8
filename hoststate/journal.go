// The journal file: its name and directory, its ownership checks, and how it is
// written (atomically, without replacing another's) and read back.

package hoststate

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/trustfs"
)

// file is the journal's on-disk form.
type file struct {
	PID int `json:"pid"`
	// StartTime is the process start time (clock ticks since boot, field 22
	// of /proc/<pid>/stat), so a reused PID is not mistaken for a live
	// hpcvmm.
	StartTime uint64 `json:"start_time,omitempty"`
	// SlurmJob and SlurmStep are the Slurm job and step the process ran
	// in (SLURM_JOB_ID, SLURM_STEP_ID; "" outside Slurm): a Prolog's
	// journal outlives its process, and only the job's own Epilog, or
	// anyone once Slurm no longer runs the job, may restore it.
	SlurmJob  string   `json:"slurm_job,omitempty"`
	SlurmStep string   `json:"slurm_step,omitempty"`
	Changes   []Change `json:"changes"`
}

// journalName is a fresh journal path for pid: the PID for the
// administrator, a random part so that a later process with the same PID
// (PIDs wrap, PID namespaces repeat them) gets another file.
func journalName(dir string, pid int) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return filepath.Join(dir, fmt.Sprintf("%d-%s.json", pid, hex.EncodeToString(b[:])))
}

// save writes the journal durably (temporary file, fsync, rename), or
// removes it when empty. The first save claims the journal's name
// exclusively (a rename that never replaces: another process's journal
// with the same name stays, and this one takes a new name).
//
// After PrepareRestore, a journal whose new form fits in the file is
// rewritten in place through the file opened then (rewriteInPlace), with
// no open or rename: the way a restore under the seccomp filter records
// what it could not undo.
func (j *Journal) save() error {
	if len(j.f.Changes) == 0 {
		j.dropRewrite()
		if !j.claimed {
			return nil
		}
		if err := os.Remove(j.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hoststate: remove journal %s: %w", j.path, err)
		}
		j.claimed = false
		return nil
	}
	b, err := json.MarshalIndent(j.f, "", "  ")
	if err != nil {
		return fmt.Errorf("hoststate: encode journal: %w", err)
	}
	if j.rewrite != nil && j.claimed {
		done, err := j.rewriteInPlace(b)
		if done || err != nil {
			return err
		}
	}
	if err := stateDir(j.opts.StateDir, true); err != nil {
		return err
	}
	f, err := os.CreateTemp(j.opts.StateDir, ".tmp-"+filepath.Base(j.path)+"-*")
	if err != nil {
		return fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
	case j.claimed:
		err = os.Rename(tmp, j.path)
	default:
		for try := 0; ; try++ {
			err = renameNoReplace(tmp, j.path)
			if !errors.Is(err, fs.ErrExist) || try == 8 {
				break
			}
			j.path = journalName(j.opts.StateDir, j.opts.PID)
		}
		j.claimed = err == nil
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	// The file PrepareRestore opened is no longer the journal.
	j.dropRewrite()
	return nil
}

// PrepareRestore opens the journal file for writing now, for a Restore
// that runs under a seccomp filter which refuses opens for writing and
// file creation (hpcvmm's process filter; the VM's teardown runs under
// it): when some changes cannot be undone there, Restore records the rest
// through this file instead of writing a new one. Call it after the last
// change. Without it (or when nothing is journaled) Restore writes the
// journal as every save does.
func (j *Journal) PrepareRestore() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dropRewrite()
	if !j.claimed {
		return nil
	}
	f, err := os.OpenFile(j.path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("hoststate: open journal %s for the restore: %w", j.path, err)
	}
	j.rewrite = f
	return nil
}

// dropRewrite closes the file PrepareRestore opened.
func (j *Journal) dropRewrite() {
	if j.rewrite != nil {
		j.rewrite.Close()
		j.rewrite = nil
	}
}

// rewriteInPlace writes journal b over the file PrepareRestore opened, in
// one write at offset 0 padded with spaces to the file's length (JSON
// allows trailing white space; the filter has no ftruncate), then syncs
// it. A restore only removes changes, so the new journal is never longer;
// one that is (done false) is left to save's usual path. Unlike that path
// it is not atomic against a crash of the machine in the middle of the
// write, but the default state directory is tmpfs, which a crash empties
// along with every change it records.
func (j *Journal) rewriteInPlace(b []byte) (done bool, err error) {
	fi, err := j.rewrite.Stat()
	if err != nil {
		return false, fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	size := fi.Size()
	if int64(len(b))+1 > size {
		return false, nil
	}
	buf := make([]byte, size)
	copy(buf, b)
	for i := len(b); i < len(buf)-1; i++ {
		buf[i] = ' '
	}
	buf[len(buf)-1] = '\n'
	if _, err := j.rewrite.WriteAt(buf, 0); err != nil {
		return true, fmt.Errorf("hoststate: rewrite journal %s: %w", j.path, err)
	}
	if err := j.rewrite.Sync(); err != nil {
		return true, fmt.Errorf("hoststate: rewrite journal %s: %w", j.path, err)
	}
	return true, nil
}

// renameNoReplace renames from to to unless to exists (fs.ErrExist), with
// RENAME_NOREPLACE, or a hard link and unlink where the file system lacks
// it. A name already taken on either path is kept: os.Link fails with
// EEXIST too.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if err = os.Link(from, to); err == nil {
			return os.Remove(from)
		}
		return err
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// stateDir checks the state directory: owned by root or hpcvmm's user, not
// writable by group or others, not a symbolic link (anyone who can write
// there chooses what a root `hpcvmm unbind` writes into sysfs). create
// makes it (0700) when it is missing.
func stateDir(dir string, create bool) error {
	fi, err := os.Lstat(dir)
	if create && errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("hoststate: create state directory %s: %w", dir, err)
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return fmt.Errorf("hoststate: state directory: %w", err)
	}
	return checkOwner(dir, fi, true)
}

// checkOwner refuses a state directory or journal (dir false) that is a
// symbolic link, of the wrong kind, owned by another user than root or
// hpcvmm's, or writable by group or others, with a one-line error naming
// it and the fix.
func checkOwner(path string, fi fs.FileInfo, dir bool) error {
	bad := trustfs.Check(path, fi, dir)
	if bad == nil {
		return nil
	}
	w := trustfs.Wording{
		Subject:   "hoststate: journal " + path,
		Fix:       "check the devices it names by hand, then remove it",
		OwnerRisk: ", who could have written it",
		ModeRisk:  ", who could choose what hpcvmm unbind writes as root",
		ModeFix:   "check the devices it names by hand, then chmod go-w " + path + " (or remove it)",
	}
	if dir {
		w.Subject = "hoststate: state directory " + path
		w.Fix = "chown root " + path + "; chmod go-w " + path + ", or pass another --state-dir"
		w.ModeFix = ""
	}
	return bad.Explain(w)
}

// maxJournal bounds a journal's size: a few hundred bytes per change.
const maxJournal = 1 << 20

// readJournal reads and checks the journal at path: not a symbolic link,
// owned by root or hpcvmm's user, not writable by others, parsed, and
// every change of it valid. A journal that fails is refused whole, with an
// error naming it.
func readJournal(path string) (file, error) {
	var f file
	fd, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return f, fmt.Errorf("hoststate: journal %s is a symbolic link: remove it, and check the devices by hand", path)
	}
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	if err := checkOwner(path, fi, false); err != nil {
		return f, err
	}
	b, err := io.ReadAll(io.LimitReader(fd, maxJournal+1))
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	if len(b) > maxJournal {
		return f, fmt.Errorf("hoststate: journal %s is larger than %d bytes, not one hpcvmm wrote: check the devices by hand, then remove it", path, maxJournal)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("hoststate: parse %s: %w (remove it after checking the devices by hand)", path, err)
	}
	if f.SlurmJob != "" && !slurm.ValidJobID(f.SlurmJob) {
		return f, fmt.Errorf("hoststate: journal %s: slurm_job %q is not a job ID: check the devices by hand, then remove it", path, f.SlurmJob)
	}
	for _, c := range f.Changes {
		if err := c.validate(); err != nil {
			return f, fmt.Errorf("hoststate: journal %s: %v: not what hpcvmm writes; check the devices by hand, then remove it", path, err)
		}
	}
	return f, nil
}
