package testenv

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// Tests of what another local user can do (read a cache, flock a lock
// file) or of hpcvmm run by an unprivileged user need a process with that
// user's uid: the test binary run again as the user. go test keeps its
// binaries in a 0700 directory, so the binary is copied first into a
// directory every user may enter.

// Nobody is the unprivileged uid and gid the tests act as (the "nobody"
// user of Debian and most distributions).
const Nobody = 65534

// SharedDir returns a new directory under the system's temporary directory
// that every user may enter and list (0755, owned by the test's user),
// removed when the test ends. t.TempDir's parent is 0700, so files a
// second uid must reach live here.
func SharedDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "hpcvmm-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// RunAs runs the test binary as uid:gid (no supplementary groups) with env
// (KEY=VALUE) added to the environment and no tests selected, so a
// TestMain that calls RunChild (or looks at env itself) runs the child's
// part. It returns the child's combined output and its error (an
// *exec.ExitError for a non-zero exit). It skips, or fails under
// HPCVMM_REQUIRE_INTEGRATION=1, when the test does not run as root: only
// root can start a process as another user.
func RunAs(t testing.TB, uid, gid uint32, env ...string) (string, error) {
	t.Helper()
	out, err := CommandAs(t, uid, gid, env...).CombinedOutput()
	return string(out), err
}

// CommandAs is RunAs's command, not started: for a child that must run
// beside the test (hold a lock while the test looks).
func CommandAs(t testing.TB, uid, gid uint32, env ...string) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		SkipOrFail(t, "needs root to start a process as uid %d", uid)
	}
	bin := filepath.Join(SharedDir(t), "test.bin")
	if err := copyExecutable(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	return cmd
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
