package cpuclaim

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// flockEnv names, in a child run as another user, the lock file it opens
// read-only and flocks, holding it until its stdin closes.
const flockEnv = "CPUCLAIM_TEST_FLOCK"

func TestMain(m *testing.M) {
	if p := os.Getenv(flockEnv); p != "" {
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)
		}
		fmt.Printf("RESULT flock=%v\n", err)
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // hold until the parent is done
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// holdAs starts uid 65534 flocking path; it returns what the child
// reported ("<nil>" when it holds the lock) and a function that ends it.
func holdAs(t *testing.T, path string) (string, func()) {
	cmd := testenv.CommandAs(t, testenv.Nobody, testenv.Nobody, flockEnv+"="+path)
	in, err := cmd.StdinPipe()
	require.NoError(t, err)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, line)
	return strings.TrimPrefix(strings.TrimSpace(line), "RESULT flock="), func() { in.Close(); _ = cmd.Wait() }
}

// Issue 30 item 5: lock files were 0644 and a read-only flock counted as a
// claim, so any local user held hpcvmm's CPUs: Held reported them taken,
// Take got none (auto-mode VMs fell back to shared, dedicated refused).
// Before the fix uid 65534 held CPU 0 against root. Now a lock file is
// created 0600 (that user cannot open it), one an older hpcvmm left 0644
// is made 0600, and a claim whose holder is neither root nor hpcvmm's user
// does not count: the file is replaced and the CPU taken.
func TestForeignUserCannotHoldAClaim(t *testing.T) {
	run := testenv.SharedDir(t)
	c, err := Take(run, []int{0, 1}, 2)
	require.NoError(t, err)
	c.Release()
	lock0 := filepath.Join(Dir(run), "0.lock")
	fi, err := os.Lstat(lock0)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "a new lock file is 0600")

	// A new lock file: the other user cannot even open it.
	got, done := holdAs(t, lock0)
	done()
	assert.Equal(t, "permission denied", got)

	// A lock file an older hpcvmm left 0644: the other user opens it and
	// holds the flock before hpcvmm looks again.
	require.NoError(t, os.Chmod(lock0, 0o644))
	got, done = holdAs(t, lock0)
	defer done()
	require.Equal(t, "<nil>", got, "the stand-in attacker holds the old lock file")
	held, err := Held(run, []int{0, 1})
	require.NoError(t, err)
	assert.Empty(t, held, "a claim by uid 65534 counts")
	mine, err := Take(run, []int{0, 1}, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, mine.CPUs(), "Take skipped the CPU uid 65534 flocked")
	// The claim is hpcvmm's now, against itself too.
	held, err = Held(run, []int{0, 1})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, held)
	mine.Release()
	fi, err = os.Lstat(lock0)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o600), fi.Mode().Perm(), "the old lock file is 0600 again")
}

// holderTrusted reads the holder's pid from /proc/locks and its effective
// uid from its status; a holder it cannot tell leaves the claim counting.
func TestHolderTrusted(t *testing.T) {
	defer func(p string) { procRoot = p }(procRoot)
	procRoot = t.TempDir()
	st := &unix.Stat_t{Dev: unix.Mkdev(0xfd, 1), Ino: 5678}
	write := func(name, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(procRoot, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(procRoot, name), []byte(s), 0o644))
	}
	write("locks", "1: POSIX  ADVISORY  WRITE 10 fd:01:5678 0 EOF\n2: FLOCK  ADVISORY  WRITE 20 fd:01:5678 0 EOF\n3: FLOCK  ADVISORY  WRITE 30 fd:01:9 0 EOF\n")
	write("20/status", "Name:\tx\nUid:\t0\t65534\t65534\t65534\n")
	trusted, known := holderTrusted(st)
	assert.True(t, known)
	assert.False(t, trusted, "effective uid 65534")
	write("20/status", fmt.Sprintf("Uid:\t65534\t%d\t0\t0\n", os.Geteuid()))
	trusted, known = holderTrusted(st)
	assert.True(t, known && trusted, "hpcvmm's own uid")
	require.NoError(t, os.Remove(filepath.Join(procRoot, "20/status")))
	_, known = holderTrusted(st)
	assert.False(t, known, "a holder whose status is gone")
	_, known = holderTrusted(&unix.Stat_t{Dev: unix.Mkdev(0xfd, 1), Ino: 1})
	assert.False(t, known, "no lock on that inode")
}
