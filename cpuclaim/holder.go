package cpuclaim

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// procRoot is where holderTrusted reads /proc (a variable for tests).
var procRoot = "/proc"

// holderTrusted reports whether the flock on the file st describes is held
// by a process of root or of hpcvmm's user (trusted), from /proc/locks and
// the holder's /proc/PID/status. known is false when no holder could be
// told (the lock is gone, or its holder lives in another PID namespace):
// the claim is then left to count, as before this check.
func holderTrusted(st *unix.Stat_t) (trusted, known bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, "locks"))
	if err != nil {
		return false, false
	}
	// "1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF": the holder's pid,
	// then the file's device (major:minor, hex) and inode.
	want := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 || f[1] != "FLOCK" || f[5] != want {
			continue
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil || pid <= 0 {
			return false, false
		}
		uid, ok := processUID(pid)
		if !ok {
			return false, false
		}
		return uid == 0 || uid == os.Geteuid(), true
	}
	return false, false
}

// processUID is pid's effective uid.
func processUID(pid int) (int, bool) {
	b, err := os.ReadFile(filepath.Join(procRoot, strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(rest)
			if len(f) < 2 {
				return 0, false
			}
			uid, err := strconv.Atoi(f[1])
			return uid, err == nil
		}
	}
	return 0, false
}

// replaceLock puts a fresh 0600 lock file at path in place of the file st
// describes, whose flock an untrusted process holds. It runs under an
// exclusive flock on the directory, so two hpcvmm processes never both
// replace one file, and only if path is still that file; lock then locks
// the new file like any other.
func replaceLock(dir, path string, st *unix.Stat_t) error {
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Flock(dfd, unix.LOCK_EX); err != nil {
		return err
	}
	if !stillAt(path, st) {
		return nil // replaced by another process already
	}
	tmp, err := os.CreateTemp(dir, ".new-*.lock")
	if err != nil {
		return err
	}
	tmp.Close()
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return nil
}
