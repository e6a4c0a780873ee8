package job

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/virtio/console"
)

// fakeVM is a Machine whose guest is a goroutine speaking jobproto on the
// job's ports, as the console device and the agent would.
type fakeVM struct {
	t       *testing.T
	ports   map[string]console.Port
	guest   func(g *fakeGuest)
	presses atomic.Int32
	pressed chan struct{}
}

func newFakeVM(t *testing.T, j *Job, guest func(g *fakeGuest)) *fakeVM {
	f := &fakeVM{t: t, ports: map[string]console.Port{}, guest: guest, pressed: make(chan struct{}, 4)}
	for _, p := range j.Ports() {
		f.ports[p.Name] = p
	}
	return f
}

func (f *fakeVM) Run(ctx context.Context) error {
	g := &fakeGuest{t: f.t, vm: f, ctl: jobproto.NewReader(f.ports[jobproto.PortControl].FromHost, jobproto.MaxFrame)}
	done := make(chan struct{})
	go func() { defer close(done); f.guest(g) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (f *fakeVM) PressPowerButton() error {
	f.presses.Add(1)
	f.pressed <- struct{}{}
	return nil
}

type fakeGuest struct {
	t   *testing.T
	vm  *fakeVM
	ctl *jobproto.Reader
}

func (g *fakeGuest) send(m jobproto.Message) {
	_ = jobproto.Write(g.vm.ports[jobproto.PortControl].ToHost, m)
}
func (g *fakeGuest) read() (jobproto.Message, error) { return g.ctl.Read() }
func (g *fakeGuest) stdin() io.Reader                { return g.vm.ports[jobproto.PortStdin].FromHost }
func (g *fakeGuest) stdout() io.WriteCloser          { return g.vm.ports[jobproto.PortStdout].ToHost }
func (g *fakeGuest) stderr() io.WriteCloser          { return g.vm.ports[jobproto.PortStderr].ToHost }

// agent plays the agent: Ready, Start, body (which returns the status
// message), outputs closed, status, then power off at the control port's
// end of stream.
func agent(body func(g *fakeGuest, s *jobproto.Start) jobproto.Message) func(g *fakeGuest) {
	return func(g *fakeGuest) {
		g.send(&jobproto.Ready{})
		m, err := g.read()
		if err != nil {
			return
		}
		res := body(g, m.(*jobproto.Start))
		g.stdout().Close()
		g.stderr().Close()
		g.send(res)
		for {
			if _, err := g.read(); err != nil {
				return // end of the control stream: power off
			}
		}
	}
}

func runJob(t *testing.T, spec Spec, streams Streams, opts Options, guest func(g *fakeGuest)) (jobproto.Status, *fakeVM, *Job) {
	t.Helper()
	j, err := New(spec, streams, opts)
	require.NoError(t, err)
	vm := newFakeVM(t, j, guest)
	done := make(chan jobproto.Status, 1)
	go func() { done <- j.Run(context.Background(), vm) }()
	select {
	case s := <-done:
		return s, vm, j
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
	}
	return jobproto.Status{}, nil, nil
}

func TestRunStreamsAndStatus(t *testing.T) {
	var out, errOut bytes.Buffer
	var got *jobproto.Start
	st, _, _ := runJob(t, Spec{Argv: []string{"sh", "-c", "x"}, Env: []string{"A=1"}}, Streams{Stdout: &out, Stderr: &errOut}, Options{},
		agent(func(g *fakeGuest, s *jobproto.Start) jobproto.Message {
			got = s
			_, _ = io.WriteString(g.stdout(), "out\n")
			_, _ = io.WriteString(g.stderr(), "err\n")
			in, _ := io.ReadAll(g.stdin()) // nil Stdin: end of file at once
			if len(in) != 0 {
				return &jobproto.Exited{Code: 1}
			}
			return &jobproto.Exited{Code: 7}
		}))
	require.Equal(t, jobproto.Status{Code: 7}, st)
	require.Equal(t, 7, st.ExitCode())
	require.Equal(t, "out\n", out.String())
	require.Equal(t, "err\n", errOut.String())
	require.Equal(t, []string{"sh", "-c", "x"}, got.Argv)
	require.Equal(t, []string{"A=1"}, got.Env)
}

// 16 MiB of random bytes through the guest's cat and back, with a writer
// that takes small pieces slowly at first: nothing lost or reordered, and
// the relay holds no buffer of its own (the guest's writes wait).
func TestRun16MiB(t *testing.T) {
	data := make([]byte, 16<<20)
	_, _ = rand.Read(data)
	h := sha256.New()
	st, _, _ := runJob(t, Spec{Argv: []string{"cat"}}, Streams{Stdin: bytes.NewReader(data), Stdout: h}, Options{},
		agent(func(g *fakeGuest, _ *jobproto.Start) jobproto.Message {
			buf := make([]byte, 32<<10)
			if _, err := io.CopyBuffer(struct{ io.Writer }{g.stdout()}, struct{ io.Reader }{g.stdin()}, buf); err != nil {
				return &jobproto.Exited{Code: 1}
			}
			return &jobproto.Exited{}
		}))
	require.Equal(t, 0, st.ExitCode(), st.String())
	want := sha256.Sum256(data)
	require.Equal(t, want[:], h.Sum(nil))
}

// The status is returned only once the guest closed its output ports: a
// status that overtakes the output does not cut it.
func TestRunWaitsForOutput(t *testing.T) {
	var out bytes.Buffer
	st, _, _ := runJob(t, Spec{Argv: []string{"x"}}, Streams{Stdout: &out}, Options{}, func(g *fakeGuest) {
		g.send(&jobproto.Ready{})
		_, _ = g.read()
		g.send(&jobproto.Exited{Code: 3})
		time.Sleep(100 * time.Millisecond)
		_, _ = io.WriteString(g.stdout(), "late\n")
		g.stdout().Close()
		g.stderr().Close()
		for {
			if _, err := g.read(); err != nil {
				return
			}
		}
	})
	require.Equal(t, 3, st.ExitCode())
	require.Equal(t, "late\n", out.String())
}

func TestRunSignals(t *testing.T) {
	// A signal sent before the agent is ready follows Start.
	j, err := New(Spec{Argv: []string{"x"}}, Streams{}, Options{})
	require.NoError(t, err)
	j.Signal(syscall.SIGUSR1)
	j.Resize(50, 132)
	var seen []jobproto.Message
	vm := newFakeVM(t, j, agent(func(g *fakeGuest, _ *jobproto.Start) jobproto.Message {
		for len(seen) < 3 {
			m, err := g.read()
			if err != nil {
				break
			}
			seen = append(seen, m)
			if s, ok := m.(*jobproto.Signal); ok && s.Signo == uint8(syscall.SIGINT) {
				return &jobproto.Exited{Signal: uint8(syscall.SIGINT)}
			}
		}
		return &jobproto.Exited{Code: 1}
	}))
	go func() { time.Sleep(50 * time.Millisecond); j.Signal(syscall.SIGINT) }()
	st := j.Run(context.Background(), vm)
	require.Equal(t, 130, st.ExitCode())
	require.Equal(t, []jobproto.Message{
		&jobproto.Signal{Signo: uint8(syscall.SIGUSR1)}, &jobproto.Resize{Rows: 50, Cols: 132}, &jobproto.Signal{Signo: uint8(syscall.SIGINT)},
	}, seen)
}

// --shutdown-timeout: a command that ignores SIGTERM gets the power
// button after the timeout; a guest that ignores that too is stopped hard
// after the timeout again, and the status says so (125).
func TestRunShutdownTimeout(t *testing.T) {
	ignoring := agent(func(g *fakeGuest, _ *jobproto.Start) jobproto.Message {
		for {
			if _, err := g.read(); err != nil {
				return &jobproto.Exited{}
			}
		}
	})
	j, err := New(Spec{Argv: []string{"x"}}, Streams{}, Options{ShutdownTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	vm := newFakeVM(t, j, ignoring)
	j.Signal(syscall.SIGTERM)
	t0 := time.Now()
	st := j.Run(context.Background(), vm)
	require.Equal(t, 125, st.ExitCode())
	require.Contains(t, st.Reason, "--shutdown-timeout")
	require.Equal(t, int32(1), vm.presses.Load())
	require.GreaterOrEqual(t, time.Since(t0), 200*time.Millisecond)

	// The power button ends the command (the agent's SIGTERM, SIGKILL).
	j, err = New(Spec{Argv: []string{"x"}}, Streams{}, Options{ShutdownTimeout: 100 * time.Millisecond})
	require.NoError(t, err)
	var vm2 *fakeVM
	vm2 = newFakeVM(t, j, agent(func(g *fakeGuest, _ *jobproto.Start) jobproto.Message {
		<-vm2.pressed
		return &jobproto.Exited{Signal: uint8(syscall.SIGKILL)}
	}))
	j.Signal(syscall.SIGTERM)
	st = j.Run(context.Background(), vm2)
	require.Equal(t, 137, st.ExitCode())
}

func TestRunFailures(t *testing.T) {
	st, _, _ := runJob(t, Spec{Argv: []string{"nosuch"}}, Streams{}, Options{}, agent(func(*fakeGuest, *jobproto.Start) jobproto.Message {
		return &jobproto.Failed{Kind: jobproto.FailNotFound, Reason: "nosuch: command not found"}
	}))
	require.Equal(t, 127, st.ExitCode())
	require.Equal(t, "nosuch: command not found", st.Reason)

	// A guest that powers off without a status.
	st, _, _ = runJob(t, Spec{Argv: []string{"x"}}, Streams{}, Options{}, func(g *fakeGuest) { g.send(&jobproto.Ready{}) })
	require.Equal(t, 125, st.ExitCode())
	require.Contains(t, st.Reason, "without reporting")

	// A guest speaking garbage is stopped: its frames are untrusted.
	st, _, _ = runJob(t, Spec{Argv: []string{"x"}}, Streams{}, Options{}, func(g *fakeGuest) {
		_, _ = g.vm.ports[jobproto.PortControl].ToHost.Write([]byte{0, 0, 0, 2, 9, 9})
		select {}
	})
	require.Equal(t, 125, st.ExitCode())
	require.Contains(t, st.Reason, "malformed")

	// An oversized frame is refused from its length.
	st, _, _ = runJob(t, Spec{Argv: []string{"x"}}, Streams{}, Options{}, func(g *fakeGuest) {
		_, _ = g.vm.ports[jobproto.PortControl].ToHost.Write([]byte{0xff, 0xff, 0xff, 0xff})
		select {}
	})
	require.Equal(t, 125, st.ExitCode())
	require.Contains(t, st.Reason, "longer than the bound")

	// A message of the wrong direction.
	st, _, _ = runJob(t, Spec{Argv: []string{"x"}}, Streams{}, Options{}, func(g *fakeGuest) {
		g.send(&jobproto.Start{Argv: []string{"x"}})
		select {}
	})
	require.Equal(t, 125, st.ExitCode())

	_, err := New(Spec{}, Streams{}, Options{})
	require.ErrorContains(t, err, "Spec.Argv")
}

// Cancelling Run's context stops the VM hard.
func TestRunCancel(t *testing.T) {
	j, err := New(Spec{Argv: []string{"x"}}, Streams{}, Options{})
	require.NoError(t, err)
	vm := newFakeVM(t, j, func(*fakeGuest) { select {} })
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(errors.New("console escape"))
	st := j.Run(ctx, vm)
	require.Equal(t, 125, st.ExitCode())
	require.Contains(t, st.Reason, "console escape")
}

// The output relay adds nothing per chunk: no allocation, no copy.
func BenchmarkStdoutChunk(b *testing.B) {
	j, err := New(Spec{Argv: []string{"x"}}, Streams{Stdout: io.Discard}, Options{})
	require.NoError(b, err)
	w := j.Ports()[2].ToHost
	chunk := []byte(strings.Repeat("x", 32<<10))
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.Write(chunk); err != nil {
			b.Fatal(err)
		}
	}
}
