package ninep

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/seccomp"
)

// TestMain makes the test binary the file server child when Spawn starts
// it under ChildName, as cmd/hpcvmm does.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == ChildName {
		os.Exit(ChildMain())
	}
	if dir := os.Getenv(underVMMFilterEnv); dir != "" {
		if err := serveUnderVMMFilter(dir); err != nil {
			fmt.Println("child error:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// underVMMFilterEnv makes the test binary serveUnderVMMFilter's child.
const underVMMFilterEnv = "NINEP_TEST_UNDER_VMM_FILTER"

// serveUnderVMMFilter is hpcvmm run's life with a file server: Spawn, then
// the VMM's process-wide seccomp list, signals (srun's SIGTERM, the job's
// forwarded ones) while the child serves, a request, Close. A syscall
// outside the list kills this process with SIGSYS.
func serveUnderVMMFilter(dir string) error {
	root, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	p, err := Spawn(self, []Export{{Root: root}}, SpawnOptions{MaxMessageSize: 64 << 10, Seccomp: true})
	if err != nil {
		return err
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGUSR1)
	if err := seccomp.InstallProcess(seccomp.Kill); err != nil {
		return err
	}
	for range 8 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
		_ = syscall.Kill(os.Getpid(), syscall.SIGUSR1)
		<-sigs
		<-sigs
		time.Sleep(20 * time.Millisecond)
	}
	cl, err := p9.NewClient(connRW{Reader: p.Conns[0].Replies, WriteCloser: p.Conns[0].Requests, r: p.Conns[0].Replies}, p9.WithMessageSize(64<<10))
	if err != nil {
		return err
	}
	rootFile, err := cl.Attach("")
	if err != nil {
		return err
	}
	f, err := walk(rootFile, "file")
	if err != nil {
		return err
	}
	if got, err := readAll(f); err != nil || got != "inside" {
		return fmt.Errorf("read %q, %v", got, err)
	}
	if err := p.Close(); err != nil {
		return err
	}
	select {
	case <-p.Done():
		return nil
	default:
		return errors.New("Close returned before the child ended")
	}
}

// The file server's parent lives under the VMM's process-wide seccomp list
// and gets signals while the child runs: nothing it does for the child
// (no wait: waitid is not on the list, and a signal restarts a wait in
// progress under it) kills it with SIGSYS.
func TestSpawnUnderTheVMMFilter(t *testing.T) {
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_GET_ACTION_AVAIL, 0, 0); e == unix.ENOSYS {
		testenv.SkipOrFail(t, "this kernel has no seccomp filter mode")
	}
	fx := newFixture(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), underVMMFilterEnv+"="+fx.export)
	out, _ := cmd.CombinedOutput()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.False(t, ws.Signaled(), "hpcvmm's stand-in was killed by %v (SIGSYS: a syscall outside the VMM's list):\n%s", ws.Signal(), out)
	require.Equal(t, 0, ws.ExitStatus(), "%s", out)
}

// connRW joins a Conn's two pipes into the client's one connection.
type connRW struct {
	io.Reader
	io.WriteCloser
	r io.Closer
}

func (c connRW) Close() error { c.WriteCloser.Close(); return c.r.Close() }

// The child under its seccomp filter serves two exports, one read-only:
// ordinary work and escape attempts over each, refusals in the log, every
// thread filtered, a clean exit when the connections close.
func TestSpawnedServerUnderSeccomp(t *testing.T) {
	fx := newFixture(t)
	ro, err := os.OpenFile(filepath.Join(fx.export, "sub"), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer ro.Close()
	self, err := os.Executable()
	require.NoError(t, err)
	var log testenv.LockedBuffer
	p, err := Spawn(self, []Export{{Root: fx.root}, {Root: ro, ReadOnly: true}}, SpawnOptions{Log: &log, Seccomp: true, MaxMessageSize: 128 << 10})
	require.NoError(t, err)
	defer p.Close()
	require.Len(t, p.Conns, 2)

	client := func(c Conn) (*p9.Client, p9.File) {
		cl, err := p9.NewClient(connRW{Reader: c.Replies, WriteCloser: c.Requests, r: c.Replies}, p9.WithMessageSize(128<<10))
		require.NoError(t, err, "log: %s", log.String())
		root, err := cl.Attach("")
		require.NoError(t, err)
		return cl, root
	}
	_, rw := client(p.Conns[0])
	_, rdonly := client(p.Conns[1])

	threads, err := seccomp.Threads("/proc", p.cmd.Process.Pid)
	require.NoError(t, err)
	for _, th := range threads {
		assert.Equal(t, 2, th.Mode, "thread %d (%s) is not filtered", th.TID, th.Comm)
	}

	_, f, err := rw.Walk(nil)
	require.NoError(t, err)
	_, _, _, err = f.Create("made", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	_, err = f.WriteAt([]byte("from the guest"), 0)
	require.NoError(t, err)
	require.NoError(t, f.FSync())
	require.NoError(t, f.Close())
	made, err := walk(rw, "made")
	require.NoError(t, err)
	got, err := readAll(made)
	require.NoError(t, err)
	assert.Equal(t, "from the guest", got)
	require.NoError(t, made.SetAttr(p9.SetAttrMask{Permissions: true, Size: true, MTime: true}, p9.SetAttr{Permissions: 0o600, Size: 4}))
	_, err = rw.Symlink("/", "escape", p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	_, err = walk(rw, "escape/etc/shadow")
	assert.Error(t, err)
	_, err = rw.Mknod("fifo", p9.ModeNamedPipe|0o600, 0, 0, p9.NoUID, p9.NoGID)
	assert.Error(t, err)
	require.NoError(t, rw.Link(made, "made2"))
	sub, err := walk(rw, "sub")
	require.NoError(t, err)
	require.NoError(t, rw.RenameAt("made2", sub, "moved"))
	_, err = rw.Mkdir("dir", 0o755, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	_, d, err := rw.Walk(nil)
	require.NoError(t, err)
	_, _, err = d.Open(p9.ReadOnly)
	require.NoError(t, err)
	ents, err := d.Readdir(0, 4096)
	require.NoError(t, err)
	assert.NotEmpty(t, ents)
	_, err = rw.StatFS()
	require.NoError(t, err)
	require.NoError(t, rw.UnlinkAt("dir", unix.AT_REMOVEDIR))

	_, err = rdonly.Mkdir("nope", 0o755, p9.NoUID, p9.NoGID)
	assert.Error(t, err)
	inner, err := walk(rdonly, "moved")
	require.NoError(t, err)
	got, err = readAll(inner)
	require.NoError(t, err)
	assert.Equal(t, "from", got)

	require.NoError(t, p.Close(), "the child's exit; log: %s", log.String())
	require.NoError(t, p.Close(), "Close is idempotent")
	out := log.String()
	assert.Contains(t, out, "hpcvmm-9p: refused: export 0: mknod")
	assert.Contains(t, out, "hpcvmm-9p: refused: export 1: mkdir on a read-only bind")
	assert.NotContains(t, out, "panic")
	fx.checkOutside(t)
}

// Spawn refuses what it cannot serve before starting anything; the child
// refuses arguments and descriptors it did not expect.
func TestSpawnAndChildRefuseBadInput(t *testing.T) {
	fx := newFixture(t)
	self, err := os.Executable()
	require.NoError(t, err)
	_, err = Spawn(self, nil, SpawnOptions{})
	assert.ErrorContains(t, err, "no export")
	f, err := os.Open(filepath.Join(fx.export, "file"))
	require.NoError(t, err)
	defer f.Close()
	_, err = Spawn(self, []Export{{Root: f}}, SpawnOptions{})
	assert.ErrorContains(t, err, "not a directory")
	_, err = Spawn(self, []Export{{Root: fx.root}}, SpawnOptions{MaxMessageSize: 10})
	assert.ErrorContains(t, err, "message size")

	for _, args := range [][]string{
		{"-msize", "0", "-seccomp", "off"},
		{"-msize", "x", "-seccomp", "off", "rw"},
		{"-msize", "0", "-seccomp", "maybe", "rw"},
		{"-msize", "0", "-seccomp", "off", "rx"},
		{"-msize", "0", "-seccomp", "off", "rw"}, // no descriptors 3-5
	} {
		_, err := parseChildArgs(args)
		if err == nil {
			_, _, _, _, err = childFiles(0, 3, nil)
			if err == nil {
				// The test binary has no descriptor 3 as a
				// directory: checked by running the child.
				continue
			}
		}
		assert.Error(t, err, "%q", args)
	}
	proc, err := os.StartProcess(self, []string{ChildName, "-msize", "0", "-seccomp", "off", "rw"}, &os.ProcAttr{Files: []*os.File{nil, os.Stdout, os.Stderr, f, f, f}})
	require.NoError(t, err)
	st, err := proc.Wait()
	require.NoError(t, err)
	assert.Equal(t, 2, st.ExitCode(), "a regular file as the export's root")
}

// The child outlives threads the runtime ends: a goroutine that exits
// locked to its thread (as vCPU threads and prefault workers do) ends that
// thread, and a Pdeathsig child forked from it would be killed with it.
func TestSpawnedServerOutlivesEndedThreads(t *testing.T) {
	fx := newFixture(t)
	self, err := os.Executable()
	require.NoError(t, err)
	p, err := Spawn(self, []Export{{Root: fx.root}}, SpawnOptions{MaxMessageSize: 128 << 10})
	require.NoError(t, err)
	defer p.Close()
	done := make(chan struct{})
	for range 64 {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			done <- struct{}{}
		}()
		<-done
	}
	time.Sleep(100 * time.Millisecond)
	select {
	case <-p.Done():
		t.Fatal("the file server ended with a thread of hpcvmm's")
	default:
	}
	cl, err := p9.NewClient(connRW{Reader: p.Conns[0].Replies, WriteCloser: p.Conns[0].Requests, r: p.Conns[0].Replies}, p9.WithMessageSize(128<<10))
	require.NoError(t, err)
	root, err := cl.Attach("")
	require.NoError(t, err)
	f, err := walk(root, "file")
	require.NoError(t, err)
	got, err := readAll(f)
	require.NoError(t, err)
	assert.Equal(t, "inside", got)
}
