// Package cpuclaim keeps VMs on one host off each other's CPUs: a VM that
// pins its vCPUs to host CPUs of its own choosing claims each CPU with an
// exclusive flock(2) on <dir>/cpus/<N>.lock, and the next VM skips the CPUs
// others hold. The kernel drops a flock when its file's last descriptor
// closes, so a VM's claims end with its process on every exit path,
// including SIGKILL, with nothing to clean up: a stale lock file is just an
// unlocked file. Lock files are opened close-on-exec, so a child (a helper
// the VMM starts) cannot keep a claim alive.
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
// ok is false when another process holds it.
func lock(dir string, cpu int) (_ *os.File, ok bool, _ error) {
	path := filepath.Join(dir, strconv.Itoa(cpu)+".lock")
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o644)
	if errors.Is(err, unix.EACCES) {
		// A lock file another user created: read access is enough to flock.
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	}
	if err != nil {
		return nil, false, fmt.Errorf("CPU claims: open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, false, fmt.Errorf("CPU claims: %s is not a regular file", path)
	}
	for {
		err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return f, true, nil
	case errors.Is(err, unix.EWOULDBLOCK):
		f.Close()
		return nil, false, nil
	default:
		f.Close()
		return nil, false, fmt.Errorf("CPU claims: flock %s: %w", path, err)
	}
}
