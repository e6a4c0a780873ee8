package agent

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// fakeHost is the host's end of a job's ports, over pipes: the test plays
// hpcvmm against a real Agent running real commands.
type fakeHost struct {
	t       *testing.T
	ctlW    *io.PipeWriter // host -> agent
	ctlR    *jobproto.Reader
	stdinW  *os.File
	stdout  chan []byte
	stderr  chan []byte
	served  chan error
	started bool
}

func startAgent(t *testing.T, start *jobproto.Start, power <-chan struct{}) *fakeHost {
	t.Helper()
	return startAgentWith(t, start, power, nil)
}

// startAgentWith is startAgent with setup applied to the Agent before it
// serves (nil: none).
func startAgentWith(t *testing.T, start *jobproto.Start, power <-chan struct{}, setup func(*Agent)) *fakeHost {
	t.Helper()
	h2aR, h2aW := io.Pipe()
	a2hR, a2hW := io.Pipe()
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	errR, errW, err := os.Pipe()
	require.NoError(t, err)
	h := &fakeHost{t: t, ctlW: h2aW, ctlR: jobproto.NewReader(a2hR, jobproto.MaxGuestFrame), stdinW: inW,
		stdout: make(chan []byte, 1), stderr: make(chan []byte, 1), served: make(chan error, 1)}
	collect := func(r *os.File, ch chan []byte) {
		b, _ := io.ReadAll(r)
		r.Close()
		ch <- b
	}
	go collect(outR, h.stdout)
	go collect(errR, h.stderr)
	a := &Agent{Root: "/", Control: struct {
		io.Reader
		io.Writer
	}{h2aR, a2hW}, Stdin: inR, Stdout: outW, Stderr: errW, Waiter: SysWaiter{}, PowerButton: power}
	if setup != nil {
		setup(a)
	}
	go func() { h.served <- a.Serve(); a2hW.Close() }()
	t.Cleanup(func() { h.ctlW.Close(); inW.Close() })
	require.IsType(t, &jobproto.Ready{}, h.read())
	require.NoError(t, jobproto.Write(h.ctlW, start))
	return h
}

func (h *fakeHost) read() jobproto.Message {
	h.t.Helper()
	m, err := h.ctlR.Read()
	require.NoError(h.t, err)
	return m
}

// finish reads up to the status, checks the outputs ended, closes the
// control port and checks Serve returned.
func (h *fakeHost) finish() (jobproto.Message, string, string) {
	h.t.Helper()
	var m jobproto.Message
	for {
		m = h.read()
		if _, ok := m.(*jobproto.Log); ok {
			continue
		}
		if _, ok := m.(*jobproto.Started); ok {
			h.started = true
			continue
		}
		break
	}
	out, errOut := <-h.stdout, <-h.stderr
	h.ctlW.Close()
	select {
	case err := <-h.served:
		require.NoError(h.t, err)
	case <-time.After(10 * time.Second):
		h.t.Fatal("Serve did not return after the control port closed")
	}
	return m, string(out), string(errOut)
}

func sh(script string) *jobproto.Start {
	return &jobproto.Start{Argv: []string{"sh", "-c", script}, Env: []string{"PATH=/usr/bin:/bin"}}
}

func TestServeStreamsAndStatus(t *testing.T) {
	h := startAgent(t, sh("echo out; echo err >&2; exit 7"), nil)
	h.stdinW.Close()
	m, out, errOut := h.finish()
	require.True(t, h.started)
	require.Equal(t, &jobproto.Exited{Code: 7}, m)
	require.Equal(t, "out\n", out)
	require.Equal(t, "err\n", errOut)
}

func TestServeStdinEOF(t *testing.T) {
	h := startAgent(t, &jobproto.Start{Argv: []string{"cat"}}, nil)
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	go func() { _, _ = h.stdinW.Write(data); h.stdinW.Close() }()
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	require.True(t, bytes.Equal(data, []byte(out)), "cat gave %d bytes of %d", len(out), len(data))
}

func TestServeSignals(t *testing.T) {
	// The signal goes to the process group: the shell's trap runs (and
	// its sleep dies with it).
	h := startAgent(t, sh(`trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done`), nil)
	require.IsType(t, &jobproto.Started{}, h.read())
	h.started = true
	time.Sleep(200 * time.Millisecond) // the trap is set once "ready" is written; the pipe is read at the end
	require.NoError(t, jobproto.Write(h.ctlW, &jobproto.Signal{Signo: uint8(syscall.SIGTERM)}))
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	require.Equal(t, "ready\ngot TERM\n", out)

	h = startAgent(t, sh("kill -TERM $$"), nil)
	m, _, _ = h.finish()
	require.Equal(t, &jobproto.Exited{Signal: 15}, m)
	require.Equal(t, 143, jobproto.StatusOf(m.(*jobproto.Exited)).ExitCode())
}

func TestServePowerButton(t *testing.T) {
	press := make(chan struct{}, 1)
	h := startAgent(t, sh(`trap 'echo bye; exit 3' TERM; while :; do sleep 0.05; done`), press)
	require.IsType(t, &jobproto.Started{}, h.read())
	h.started = true
	time.Sleep(100 * time.Millisecond)
	press <- struct{}{}
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{Code: 3}, m)
	require.Equal(t, "bye\n", out)
}

func TestServeFailures(t *testing.T) {
	dir := t.TempDir()
	// A dynamic ELF whose interpreter is absent: execve gives ENOENT for
	// a file that exists.
	elfPath := filepath.Join(dir, "dyn")
	require.NoError(t, os.WriteFile(elfPath, elfWithInterp("/nonexistent/ld-linux-x86-64.so.2"), 0o755))
	script := filepath.Join(dir, "script")
	require.NoError(t, os.WriteFile(script, []byte("#!/nonexistent/sh\necho hi\n"), 0o755))
	noexec := filepath.Join(dir, "noexec")
	require.NoError(t, os.WriteFile(noexec, []byte("echo hi\n"), 0o644))
	garbage := filepath.Join(dir, "garbage")
	require.NoError(t, os.WriteFile(garbage, []byte{0x7f, 'E', 'L', 'F', 0}, 0o755))

	for _, c := range []struct {
		argv    []string
		workdir string
		kind    jobproto.FailKind
		reason  string
	}{
		{[]string{"no-such-command"}, "", jobproto.FailNotFound, "no-such-command: command not found in PATH"},
		{[]string{filepath.Join(dir, "absent")}, "", jobproto.FailNotFound, "no such file"},
		{[]string{elfPath}, "", jobproto.FailAgent, "ELF interpreter /nonexistent/ld-linux-x86-64.so.2 is missing"},
		{[]string{script}, "", jobproto.FailNotExecutable, "bad interpreter /nonexistent/sh"},
		{[]string{noexec}, "", jobproto.FailNotExecutable, "no execute bit"},
		{[]string{garbage}, "", jobproto.FailNotExecutable, "exec format error"},
		{[]string{dir}, "", jobproto.FailNotExecutable, "is a directory"},
		{[]string{"true"}, filepath.Join(dir, "nodir"), jobproto.FailAgent, "--workdir"},
	} {
		h := startAgent(t, &jobproto.Start{Argv: c.argv, Workdir: c.workdir}, nil)
		h.stdinW.Close()
		m, _, _ := h.finish()
		f, ok := m.(*jobproto.Failed)
		require.True(t, ok, "%v: got %#v", c.argv, m)
		require.Equal(t, c.kind, f.Kind, "%v: %s", c.argv, f.Reason)
		require.Contains(t, f.Reason, c.reason)
		require.False(t, h.started)
	}
}

func TestServeTTY(t *testing.T) {
	s := sh("test -t 0 && test -t 1 && test -t 2 && stty size; echo err >&2")
	s.TTY, s.Rows, s.Cols = true, 33, 77
	h := startAgent(t, s, nil)
	m, out, errOut := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	// Both streams on the terminal, with its line discipline (CRLF).
	require.Equal(t, "33 77\r\nerr\r\n", out)
	require.Empty(t, errOut)
}

func TestEnvDefaults(t *testing.T) {
	env := Env(&jobproto.Start{Env: []string{"A=1"}})
	require.Equal(t, []string{"A=1", "PATH=" + DefaultPath, "HOME=/root"}, env)
	env = Env(&jobproto.Start{Env: []string{"PATH=/x", "HOME=/h"}, TTY: true})
	require.Equal(t, []string{"PATH=/x", "HOME=/h", "TERM=xterm"}, env)
	require.Equal(t, "2", getenv([]string{"K=1", "K=2"}, "K"))
}

func TestCommand(t *testing.T) {
	cmd := Command(&jobproto.Start{Argv: []string{"ls", "-l"}, SetUser: true, UID: 1000, GID: 100}, "/bin/ls", []string{"A=1"})
	require.Equal(t, "/bin/ls", cmd.Path)
	require.Equal(t, []string{"ls", "-l"}, cmd.Args)
	require.Equal(t, "/", cmd.Dir)
	require.True(t, cmd.SysProcAttr.Setpgid)
	require.Equal(t, &syscall.Credential{Uid: 1000, Gid: 100, Groups: []uint32{}}, cmd.SysProcAttr.Credential)
	cmd = Command(&jobproto.Start{Argv: []string{"sh"}, TTY: true, Workdir: "/w"}, "/bin/sh", nil)
	require.True(t, cmd.SysProcAttr.Setsid && cmd.SysProcAttr.Setctty)
	require.False(t, cmd.SysProcAttr.Setpgid)
	require.Nil(t, cmd.SysProcAttr.Credential)
	require.Equal(t, "/w", cmd.Dir)
}

func TestLookPath(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{"a", "b", "c/tool"} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, d), 0o755))
	}
	require.NoError(t, os.WriteFile(filepath.Join(root, "a/tool"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "b/tool"), nil, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "a/only"), nil, 0o644))
	env := []string{"PATH=/c:/a:/b"}
	p, f := LookPath(root, "tool", env)
	require.Nil(t, f)
	require.Equal(t, "/b/tool", p)
	_, f = LookPath(root, "only", env)
	require.Equal(t, jobproto.FailNotExecutable, f.Kind)
	_, f = LookPath(root, "none", env)
	require.Equal(t, jobproto.FailNotFound, f.Kind)
	p, f = LookPath(root, "/b/tool", env)
	require.Nil(t, f)
	require.Equal(t, "/b/tool", p)
}

// fakeWaiter replays wait4 results.
type fakeWaiter struct {
	results []struct {
		pid int
		ws  unix.WaitStatus
		err error
	}
}

func (f *fakeWaiter) Wait4(pid int, ws *unix.WaitStatus, options int) (int, error) {
	if pid != -1 || options&unix.WNOHANG == 0 {
		panic("Reap must wait for any child without blocking")
	}
	if len(f.results) == 0 {
		return 0, nil
	}
	r := f.results[0]
	f.results = f.results[1:]
	*ws = r.ws
	return r.pid, r.err
}

func TestReap(t *testing.T) {
	type res = struct {
		pid int
		ws  unix.WaitStatus
		err error
	}
	// Orphans before and after COMMAND are reaped in one call; COMMAND's
	// status is the one returned, whatever order they come in.
	w := &fakeWaiter{results: []res{{7, 0, nil}, {0, 0, unix.EINTR}, {42, unix.WaitStatus(3 << 8), nil}, {9, 9, nil}, {0, 0, nil}}}
	ws, found, none := Reap(w, 42)
	require.True(t, found)
	require.False(t, none)
	require.Equal(t, 3, ws.ExitStatus())
	require.Empty(t, w.results)

	w = &fakeWaiter{results: []res{{8, 0, nil}, {0, 0, unix.ECHILD}}}
	_, found, none = Reap(w, 42)
	require.False(t, found)
	require.True(t, none)

	// A stopped COMMAND (WUNTRACED is not asked for, but a status that is
	// neither exit nor signal) is not its end.
	w = &fakeWaiter{results: []res{{42, unix.WaitStatus(0x137f), nil}}}
	_, found, _ = Reap(w, 42)
	require.False(t, found)
}

func TestFindPorts(t *testing.T) {
	sys, dev := t.TempDir(), t.TempDir()
	add := func(port, name string) {
		require.NoError(t, os.MkdirAll(filepath.Join(sys, "class/virtio-ports", port), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(sys, "class/virtio-ports", port, "name"), []byte(name+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dev, port), nil, 0o600))
	}
	add("vport1p1", jobproto.PortControl)
	add("vport1p2", jobproto.PortStdin)
	go func() { time.Sleep(50 * time.Millisecond); add("vport1p3", jobproto.PortStdout) }()
	ports, err := FindPorts(sys, dev, []string{jobproto.PortControl, jobproto.PortStdin, jobproto.PortStdout}, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dev, "vport1p3"), ports[jobproto.PortStdout])
	_, err = FindPorts(sys, dev, []string{jobproto.PortStderr}, 30*time.Millisecond)
	require.ErrorContains(t, err, jobproto.PortStderr)
}

func TestPowerPress(t *testing.T) {
	ev := func(typ, code uint16, value int32) []byte {
		b := make([]byte, inputEventSize)
		binary.LittleEndian.PutUint16(b[16:], typ)
		binary.LittleEndian.PutUint16(b[18:], code)
		binary.LittleEndian.PutUint32(b[20:], uint32(value))
		return b
	}
	require.True(t, isPowerPress(ev(evKey, keyPower, 1)))
	require.False(t, isPowerPress(ev(evKey, keyPower, 0))) // release
	require.False(t, isPowerPress(ev(evKey, 30, 1)))
	require.False(t, isPowerPress(ev(0, keyPower, 1)))
	require.False(t, isPowerPress(ev(evKey, keyPower, 1)[:20]))
}

func TestHugeMounts(t *testing.T) {
	ms := hugeMounts([]uint64{2 << 20, 1 << 30})
	var got []string
	for _, m := range ms {
		got = append(got, m.target+" "+m.data)
	}
	require.Equal(t, "/dev/hugepages pagesize=2097152,/dev/hugepages-2048kB pagesize=2097152,/dev/hugepages-1048576kB pagesize=1073741824", strings.Join(got, ","))
}

func TestReadModules(t *testing.T) {
	p := filepath.Join(t.TempDir(), "modules")
	require.NoError(t, os.WriteFile(p, []byte("/lib/modules/v/a.ko\n\n# comment\n/lib/modules/v/b.ko\n"), 0o644))
	mods, err := readModules(p)
	require.NoError(t, err)
	require.Equal(t, []string{"/lib/modules/v/a.ko", "/lib/modules/v/b.ko"}, mods)
	mods, err = readModules(p + ".absent")
	require.NoError(t, err)
	require.Empty(t, mods)
}

// elfWithInterp is a minimal x86-64 executable ELF whose only program
// header is PT_INTERP naming interp: execve looks the interpreter up first.
func elfWithInterp(interp string) []byte {
	const ehsize, phsize = 64, 56
	b := make([]byte, ehsize+phsize)
	copy(b, "\x7fELF\x02\x01\x01")
	le := binary.LittleEndian
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], 0x400000) // entry
	le.PutUint64(b[32:], ehsize)   // phoff
	le.PutUint16(b[52:], ehsize)
	le.PutUint16(b[54:], phsize)
	le.PutUint16(b[56:], 1)
	ph := b[ehsize:]
	le.PutUint32(ph[0:], 3) // PT_INTERP
	le.PutUint32(ph[4:], 4)
	le.PutUint64(ph[8:], uint64(len(b)))
	le.PutUint64(ph[16:], 0x400000+uint64(len(b)))
	le.PutUint64(ph[24:], 0x400000+uint64(len(b)))
	le.PutUint64(ph[32:], uint64(len(interp)+1))
	le.PutUint64(ph[40:], uint64(len(interp)+1))
	le.PutUint64(ph[48:], 1)
	return append(b, append([]byte(interp), 0)...)
}

func TestServeTTYResize(t *testing.T) {
	s := sh("stty size; read x; stty size")
	s.TTY, s.Rows, s.Cols = true, 33, 77
	h := startAgent(t, s, nil)
	require.IsType(t, &jobproto.Started{}, h.read())
	h.started = true
	time.Sleep(300 * time.Millisecond) // the first stty has run; read waits
	require.NoError(t, jobproto.Write(h.ctlW, &jobproto.Resize{Rows: 40, Cols: 100}))
	time.Sleep(200 * time.Millisecond)
	_, err := h.stdinW.Write([]byte("go\n"))
	require.NoError(t, err)
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	require.Equal(t, "33 77\r\ngo\r\n40 100\r\n", out)
}

func TestServePowerButtonGrace(t *testing.T) {
	press := make(chan struct{}, 1)
	s := sh(`trap '' TERM; while :; do sleep 0.05; done`)
	s.StopGrace = 200 * time.Millisecond
	h := startAgent(t, s, press)
	require.IsType(t, &jobproto.Started{}, h.read())
	h.started = true
	time.Sleep(100 * time.Millisecond)
	t0 := time.Now()
	press <- struct{}{}
	m, _, _ := h.finish()
	require.Equal(t, &jobproto.Exited{Signal: uint8(syscall.SIGKILL)}, m, "SIGTERM ignored, SIGKILL after the spec's grace")
	require.Less(t, time.Since(t0), 3*time.Second)
}

// TestServePMI: a spec with PMI gives COMMAND a socket in PMI_FD whose
// bytes reach the PMI ports both ways, each end of file passed on, with the
// host's PMI_* variables in its environment.
func TestServePMI(t *testing.T) {
	inR, inW, err := os.Pipe() // pmi.PortIn: host to guest
	require.NoError(t, err)
	outR, outW, err := os.Pipe() // pmi.PortOut: guest to host
	require.NoError(t, err)
	s := sh(`read line <&"$PMI_FD"; echo "got $line fd=$PMI_FD" >&"$PMI_FD"; cat <&"$PMI_FD"; echo "rank $PMI_RANK"`)
	s.PMI = true
	s.Env = append(s.Env, "PMI_RANK=1")
	h := startAgentWith(t, s, nil, func(a *Agent) {
		a.OpenPMI = func() (io.Reader, io.WriteCloser, error) { return inR, outW, nil }
	})
	_, err = inW.Write([]byte("cmd=init\ncmd=barrier_out\n"))
	require.NoError(t, err)
	require.NoError(t, inW.Close())    // srun's end of stream: COMMAND's cat ends
	fromGuest, err := io.ReadAll(outR) // end of file once COMMAND's socket is gone
	require.NoError(t, err)
	h.stdinW.Close()
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	require.Equal(t, "got cmd=init fd=3\n", string(fromGuest))
	require.Equal(t, "cmd=barrier_out\nrank 1\n", out)
}

// TestServePMIWithoutPorts: an agent without PMI ports refuses a spec that
// asks for PMI (125), instead of running COMMAND without its PMI_FD.
func TestServePMIWithoutPorts(t *testing.T) {
	s := sh("true")
	s.PMI = true
	h := startAgent(t, s, nil)
	h.stdinW.Close()
	m, _, _ := h.finish()
	f, ok := m.(*jobproto.Failed)
	require.True(t, ok, "%#v", m)
	require.Equal(t, jobproto.FailAgent, f.Kind)
	require.Contains(t, f.Reason, "PMI")
}
