package seccomp

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// fsCases are the FileServer filter's cases: each runs in a child under
// the filter in a directory the parent made (argFileEnv's parent holds
// "dir/" and "file"); forbidden ones must not return.
var fsCases = []struct {
	name      string
	forbidden bool
	syscall   string
	run       func(dir string) error
}{
	{"allowed", false, "", fsAllowedWork},
	{"openat", true, "openat", func(dir string) error {
		fd, err := unix.Open(filepath.Join(dir, "file"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		return fmt.Errorf("openat returned (%d, %v)", fd, err)
	}},
	{"linkat-follow", true, "linkat", func(dir string) error {
		err := unix.Linkat(unix.AT_FDCWD, filepath.Join(dir, "file"), unix.AT_FDCWD, filepath.Join(dir, "l"), unix.AT_SYMLINK_FOLLOW)
		return fmt.Errorf("linkat(AT_SYMLINK_FOLLOW) returned (%v)", err)
	}},
	{"linkat-empty-path", true, "linkat", func(dir string) error {
		err := unix.Linkat(0, "", unix.AT_FDCWD, filepath.Join(dir, "l"), unix.AT_EMPTY_PATH)
		return fmt.Errorf("linkat(AT_EMPTY_PATH) returned (%v)", err)
	}},
	{"mknodat", true, "mknodat", func(dir string) error {
		err := unix.Mknodat(unix.AT_FDCWD, filepath.Join(dir, "fifo"), unix.S_IFIFO|0o600, 0)
		return fmt.Errorf("mknodat returned (%v)", err)
	}},
	{"socket", true, "socket", func(string) error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		return fmt.Errorf("socket returned (%d, %v)", fd, err)
	}},
	{"ioctl", true, "ioctl", func(string) error {
		_, err := unix.IoctlGetTermios(2, unix.TCGETS)
		return fmt.Errorf("ioctl returned (%v)", err)
	}},
	{"execve", true, "execve", func(string) error {
		err := unix.Exec("/bin/true", []string{"true"}, nil)
		return fmt.Errorf("execve returned (%v)", err)
	}},
	{"mmap-exec", true, "mmap", func(string) error {
		b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_EXEC, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err == nil {
			unix.Munmap(b)
		}
		return fmt.Errorf("PROT_EXEC mmap returned (%v)", err)
	}},
	{"kill-other", true, "kill", func(string) error {
		pid, err := otherPID()
		if err != nil {
			return err
		}
		return fmt.Errorf("kill of another process returned (%v)", unix.Kill(pid, unix.SIGTERM))
	}},
	{"fcntl-setfl", true, "fcntl", func(string) error {
		_, err := unix.FcntlInt(2, unix.F_SETFL, unix.O_NONBLOCK)
		return fmt.Errorf("fcntl(F_SETFL) returned (%v)", err)
	}},
	{"ptrace", true, "ptrace", func(string) error {
		pid, err := otherPID()
		if err != nil {
			return err
		}
		return fmt.Errorf("ptrace returned (%v)", unix.PtraceAttach(pid))
	}},
}

// fsAllowedWork is what the file server does under its filter: the Go
// runtime's work without /proc, and each file call of package ninep with
// the arguments it uses.
func fsAllowedWork(dir string) error {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond)
			b := make([][]byte, 0, 64)
			for range 64 {
				b = append(b, make([]byte, 64<<10))
			}
			_ = b
		}()
	}
	wg.Wait()
	runtime.GC()
	how := unix.OpenHow{Flags: unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_DIRECTORY}
	dfd, err := unix.Openat2(unix.AT_FDCWD, dir, &how)
	if err != nil {
		return fmt.Errorf("openat2: %w", err)
	}
	how = unix.OpenHow{Flags: unix.O_RDWR | unix.O_CREAT | unix.O_EXCL | unix.O_NOFOLLOW | unix.O_CLOEXEC, Mode: 0o600, Resolve: unix.RESOLVE_BENEATH}
	fd, err := unix.Openat2(dfd, "new", &how)
	if err != nil {
		return fmt.Errorf("openat2 create: %w", err)
	}
	steps := []struct {
		what string
		err  error
	}{
		{"pwrite", func() error { _, err := unix.Pwrite(fd, []byte("x"), 0); return err }()},
		{"pread", func() error { _, err := unix.Pread(fd, make([]byte, 1), 0); return err }()},
		{"ftruncate", unix.Ftruncate(fd, 0)},
		{"fsync", unix.Fsync(fd)},
		{"flock", unix.Flock(fd, unix.LOCK_EX|unix.LOCK_NB)},
		{"fchmod", unix.Fchmod(fd, 0o640)},
		{"fchownat", unix.Fchownat(fd, "", -1, -1, unix.AT_EMPTY_PATH)},
		{"fstatfs", unix.Fstatfs(dfd, &unix.Statfs_t{})},
		{"dup", func() error { d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0); unix.Close(d); return err }()},
		{"getfl", func() error { _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); return err }()},
		{"linkat", unix.Linkat(dfd, "new", dfd, "linked", 0)},
		{"renameat", unix.Renameat(dfd, "linked", dfd, "renamed")},
		{"mkdirat", unix.Mkdirat(dfd, "sub", 0o700)},
		{"symlinkat", unix.Symlinkat("/", dfd, "sym")},
		{"readlinkat", func() error { _, err := unix.Readlinkat(dfd, "sym", make([]byte, 64)); return err }()},
		{"utimensat", unix.UtimesNanoAt(dfd, "sym", []unix.Timespec{{Nsec: unix.UTIME_NOW}, {Nsec: unix.UTIME_OMIT}}, unix.AT_SYMLINK_NOFOLLOW)},
		{"newfstatat", unix.Fstatat(dfd, "sub", &unix.Stat_t{}, unix.AT_SYMLINK_NOFOLLOW)},
		{"unlinkat", unix.Unlinkat(dfd, "sub", unix.AT_REMOVEDIR)},
		{"lseek", func() error { _, err := unix.Seek(fd, 0, 0); return err }()},
		{"getdents64", func() error {
			d, err := unix.Openat2(dfd, ".", &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH})
			if err != nil {
				return err
			}
			defer unix.Close(d)
			_, err = unix.Getdents(d, make([]byte, 4096))
			return err
		}()},
		{"geteuid/getppid", func() error { _, _ = unix.Geteuid(), unix.Getppid(); return nil }()},
		{"close", unix.Close(fd)},
	}
	for _, s := range steps {
		if s.err != nil {
			return fmt.Errorf("%s: %w", s.what, s.err)
		}
	}
	return nil
}

func init() {
	for _, c := range fsCases {
		childCases["fs-"+c.name] = func() error {
			dir := filepath.Dir(os.Getenv(argFileEnv))
			if err := InstallFileServer(Kill); err != nil {
				return err
			}
			return c.run(dir)
		}
	}
}

// TestFileServerRules: the file server's filter (package ninep's child)
// lets its own calls through and kills on each call it has no business
// making, the argument-checked ones included.
func TestFileServerRules(t *testing.T) {
	requireSupported(t)
	other, err := os.StartProcess("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = other.Kill(); _, _ = other.Wait() })
	for _, c := range fsCases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.WriteFile(filepath.Join(dir, "file"), []byte("host"), 0o600))
			out, st := runChildEnv(t, "fs-"+c.name, argFileEnv+"="+filepath.Join(dir, "marker"), argPIDEnv+"="+strconv.Itoa(other.Pid))
			ws, ok := st.Sys().(syscall.WaitStatus)
			require.True(t, ok)
			if !c.forbidden {
				require.True(t, ws.Exited(), "child was killed (%v):\n%s", st, out)
				require.Equal(t, 0, ws.ExitStatus(), "child:\n%s", out)
				assert.FileExists(t, filepath.Join(dir, "renamed"))
				return
			}
			require.True(t, ws.Signaled(), "child was not killed (%v):\n%s", st, out)
			require.Equal(t, syscall.SIGSYS, ws.Signal(), "child's signal:\n%s", out)
			assert.NoFileExists(t, filepath.Join(dir, "l"))
			assert.NoFileExists(t, filepath.Join(dir, "fifo"))
			assert.NoError(t, other.Signal(syscall.Signal(0)), "the other process was killed")
			vs, err := waitViolations(st.Pid())
			if err != nil || len(vs) == 0 {
				t.Logf("no audit line read (%v): the syscall's name is not checked", err)
				return
			}
			assert.Equal(t, c.syscall, vs[0].Name, "syscall named by the audit line %v", vs[0])
		})
	}
}

// TestFileServerProgram: the list assembles, and the process list's
// file-changing calls (what the VMM must never get) stay off it.
func TestFileServerProgram(t *testing.T) {
	_, err := Program(FileServer, Kill)
	require.NoError(t, err)
	for _, n := range []string{"renameat", "mkdirat", "linkat", "symlinkat", "openat2"} {
		assert.NotContains(t, Allowed(Process), n, "the VMM's process list must not get %s", n)
	}
	for _, n := range []string{"openat", "open", "mknodat", "ioctl", "execve", "socket", "ptrace"} {
		assert.NotContains(t, Allowed(FileServer), n)
	}
	assert.Len(t, FileServerRules(), len(fileServerArgRules(1)))
}
