// Package cpuclaim keeps VMs on one host off each other's CPUs: a VM that
// pins its vCPUs to host CPUs of its own choosing claims each CPU with an
// exclusive flock(2) on <dir>/cpus/<N>.lock, and the next VM skips the CPUs
// others hold. The kernel drops a flock when its file's last descriptor
// closes, so a VM's claims end with its process on every exit path,
// including SIGKILL, with nothing to clean up: a stale lock file is just an
// unlocked file. Lock files are opened close-on-exec, so a child (a helper
// the VMM starts) cannot keep a claim alive.
//
// Only root's and hpcvmm's user's processes can claim: the lock files
// are 0600, and a flock held by a process of any other uid (found in
// /proc/locks) does not count; the file is replaced by a fresh one
// (issue 30 item 5: any local user could flock 0644 lock files and keep
// every VM off its CPUs).
//
// The claims are advisory, between hpcvmm processes that share the run
// directory: a VM given an explicit CPU list, or a job whose cpuset a
// scheduler (Slurm) already separates from other jobs, needs none.
package cpuclaim

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Claim is a set of host CPUs this process holds. Release it when the VM
// ends (process exit releases it too).
type Claim struct {
	files map[int]*os.File
}

// CPUs returns the claimed CPUs, ascending.
func (c *Claim) CPUs() []int {
	if c == nil {
		return nil
	}
	out := make([]int, 0, len(c.files))
	for cpu := range c.files {
		out = append(out, cpu)
	}
	slices.Sort(out)
	return out
}

// Release gives every claimed CPU back. Safe on nil and more than once.
func (c *Claim) Release() {
	if c == nil {
		return
	}
	for cpu, f := range c.files {
		f.Close() // closing the last fd drops the flock
		delete(c.files, cpu)
	}
}

// Dir is the directory of the lock files under a run directory.
func Dir(runDir string) string { return filepath.Join(runDir, "cpus") }

// Take claims up to n of candidates, in their order, skipping CPUs another
// process holds, and returns the claim (possibly of fewer than n CPUs: the
// caller decides whether that is enough). The run directory's cpus
// subdirectory is created (0755) if missing; it must not be writable by
// group or others, since anyone who can create lock files there can keep
// VMs off CPUs.
func Take(runDir string, candidates []int, n int) (*Claim, error) {
	dir, err := prepareDir(runDir)
	if err != nil {
		return nil, err
	}
	c := &Claim{files: map[int]*os.File{}}
	for _, cpu := range candidates {
		if len(c.files) >= n {
			break
		}
		if _, dup := c.files[cpu]; dup || cpu < 0 {
			continue
		}
		f, ok, err := lock(dir, cpu)
		if err != nil {
			c.Release()
			return nil, err
		}
		if ok {
			c.files[cpu] = f
		}
	}
	return c, nil
}

// Held reports which of cpus some process holds a claim on now (a probe
// for `hpcvmm check`: it takes each free lock and drops it at once, so a
// VM placed in that instant may see the CPU taken and skip it).
func Held(runDir string, cpus []int) ([]int, error) {
	dir := Dir(runDir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // no VM has claimed anything yet
	}
	if err := checkDir(dir); err != nil {
		return nil, err
	}
	var held []int
	for _, cpu := range cpus {
		f, ok, err := lock(dir, cpu)
		if err != nil {
			return nil, err
		}
		if ok {
			f.Close()
		} else {
			held = append(held, cpu)
		}
	}
	return held, nil
}

func prepareDir(runDir string) (string, error) {
	dir := Dir(runDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("CPU claims: %w", err)
	}
	return dir, checkDir(dir)
}

// checkDir refuses a lock directory that is not a directory (a symlink
// included) or that group or others may write.
func checkDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("CPU claims: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("CPU claims: %s is not a directory", dir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("CPU claims: %s is writable by group or others (mode %v): anyone could keep VMs off CPUs; chmod go-w it", dir, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() && st.Uid != 0 {
		return fmt.Errorf("CPU claims: %s belongs to uid %d, neither this user nor root", dir, st.Uid)
	}
	return nil
}

// lock opens <dir>/<cpu>.lock and tries a non-blocking exclusive flock:
// ok is false when a trusted process (root's or hpcvmm's user's) holds it.
// The file is created 0600, and one of ours an older hpcvmm left readable
// is made 0600 (fchmod), so no other user can open it to flock it; a lock
// another user holds all the same (opened while it was readable) does not
// count: the file is replaced by a fresh one (replaceLock) and that is
// locked (issue 30 item 5). A lock taken on a file that is no longer the
// one at the path (replaced meanwhile) is dropped and taken again.
func lock(dir string, cpu int) (_ *os.File, ok bool, _ error) {
	path := filepath.Join(dir, strconv.Itoa(cpu)+".lock")
	for range 4 {
		f, st, err := openLock(path)
		if err != nil {
			return nil, false, err
		}
		err = flockNB(f)
		switch {
		case err == nil:
			if !stillAt(path, st) {
				f.Close() // replaced since it was opened: lock the file there now
				continue
			}
			return f, true, nil
		case errors.Is(err, unix.EWOULDBLOCK):
			f.Close()
			if trusted, known := holderTrusted(st); trusted || !known {
				return nil, false, nil
			}
			if err := replaceLock(dir, path, st); err != nil {
				// A directory hpcvmm cannot write (a user's `hpcvmm check`
				// on root's claims): the untrusted claim is no claim, but
				// neither can this process take the CPU.
				return nil, false, nil
			}
		default:
			f.Close()
			return nil, false, fmt.Errorf("CPU claims: flock %s: %w", path, err)
		}
	}
	return nil, false, fmt.Errorf("CPU claims: %s keeps being replaced while hpcvmm locks it: is another user writing %s?", path, dir)
}

// openLock opens (creating, 0600) the lock file path and makes it 0600
// when it is ours and others may read it.
func openLock(path string) (*os.File, *unix.Stat_t, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if errors.Is(err, unix.EACCES) {
		// root's lock file, opened by another user for `hpcvmm check`.
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("CPU claims: open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, nil, fmt.Errorf("CPU claims: %s is not a regular file", path)
	}
	if st.Mode&0o077 != 0 && int(st.Uid) == os.Geteuid() {
		if err := unix.Fchmod(fd, 0o600); err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("CPU claims: %s has mode %04o, and chmod 600 failed: %w", path, st.Mode&0o777, err)
		}
	}
	return f, &st, nil
}

func flockNB(f *os.File) error {
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

// stillAt reports whether path is still the file st describes.
func stillAt(path string, st *unix.Stat_t) bool {
	var now unix.Stat_t
	return unix.Lstat(path, &now) == nil && now.Dev == st.Dev && now.Ino == st.Ino
}
