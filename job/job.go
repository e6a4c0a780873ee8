// Package job is the host half of `hpcvmm run --rootfs IMAGE -- COMMAND`
// (docs/jobs.md): a command, its streams as io.Reader/io.Writer, and its
// exit status from Run.
//
// A Job gives the VM four named virtio-console ports (Ports, for
// vmm.Config.ConsolePorts): the control port, on which it sends the guest
// agent (package agent) the Spec once the agent says Ready, then Signal and
// Resize messages, and hears Started, Exited or Failed and Log lines
// (package jobproto); and the stdin, stdout and stderr ports, which are the
// caller's streams themselves: the console device reads Streams.Stdin for
// the guest and writes the guest's bytes straight to Streams.Stdout and
// Streams.Stderr, so a slow writer holds the guest's output (back-pressure)
// and nothing is buffered here or copied per chunk. Run also ends the job:
// after Exited or Failed it waits until the guest has closed its output
// ports (all of COMMAND's output written), then closes the control port,
// which the agent takes as its cue to power off.
//
// The VM is seen only through Machine (run it, press its power button), so
// the package is tested with pipes and a fake guest; *vmm.VM is a Machine.
package job

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/virtio/console"
)

// Spec is what runs in the guest: jobproto.Start's fields (argv, env,
// working directory, user, pty and window size, hostname, network,
// hugepages).
type Spec jobproto.Start

// Streams are COMMAND's standard streams on the host. Stdin nil is an
// empty input (COMMAND reads end of file); Stdout or Stderr nil discard.
type Streams struct {
	Stdin          io.Reader
	Stdout, Stderr io.Writer
}

// Machine is the VM as a job needs it.
type Machine interface {
	// Run runs the guest until it powers off (nil), fails, or ctx is
	// done (a hard stop).
	Run(ctx context.Context) error
	// PressPowerButton raises the guest's ACPI power button.
	PressPowerButton() error
}

// Options tune a job.
type Options struct {
	// ShutdownTimeout is how long COMMAND has to exit after the first
	// SIGTERM before the power button is pressed, and the guest then to
	// power off before it is stopped hard. 0 means DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Log receives the agent's Log lines and the job's progress; nil
	// discards them.
	Log *slog.Logger
}

// DefaultShutdownTimeout is Options.ShutdownTimeout's default.
const DefaultShutdownTimeout = 30 * time.Second

// drainIdle is how long Run waits, after COMMAND's status, for output
// that does not move before it gives up on the output ports.
const drainIdle = 10 * time.Second

// Job is one command in one VM.
type Job struct {
	spec    Spec
	opts    Options
	log     *slog.Logger
	ctlIn   *io.PipeReader // FromHost of the control port
	ctlInW  *io.PipeWriter
	ctlOut  *io.PipeReader // ToHost of the control port, read here
	ctlOutW *io.PipeWriter
	stdin   io.Reader
	stdout  *sink
	stderr  *sink
	events  chan event
	ran     atomic.Bool
}

// event is a request from Signal or Resize, served by Run's loop (so a
// signal sent before the agent is ready follows the Start message).
type event struct {
	sig        syscall.Signal
	rows, cols uint16
}

// New validates spec and prepares the job's ports.
func New(spec Spec, streams Streams, opts Options) (*Job, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("job: Spec.Argv: no command; give the command and its arguments")
	}
	if spec.GPUs > jobproto.MaxGPUs {
		return nil, fmt.Errorf("job: Spec.GPUs: %d NVIDIA GPUs, at most %d", spec.GPUs, jobproto.MaxGPUs)
	}
	if _, err := jobproto.AppendFrame(nil, (*jobproto.Start)(&spec)); err != nil {
		return nil, fmt.Errorf("job: Spec: %w: shorten the arguments or the environment", err)
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	if spec.StopGrace == 0 {
		// After the power button the host waits ShutdownTimeout for the
		// guest to go down: the agent's SIGKILL comes well before.
		spec.StopGrace = min(opts.ShutdownTimeout/2, jobproto.MaxStopGrace).Truncate(time.Millisecond)
	}
	j := &Job{spec: spec, opts: opts, log: opts.Log, events: make(chan event, 64)}
	if j.log == nil {
		j.log = slog.New(slog.DiscardHandler)
	}
	j.ctlIn, j.ctlInW = io.Pipe()
	j.ctlOut, j.ctlOutW = io.Pipe()
	j.stdin = streams.Stdin
	if j.stdin == nil {
		j.stdin = eof{}
	}
	j.stdout = newSink(streams.Stdout)
	j.stderr = newSink(streams.Stderr)
	return j, nil
}

// Ports are the job's virtio-console ports, for vmm.Config.ConsolePorts.
func (j *Job) Ports() []console.Port {
	return []console.Port{
		{Name: jobproto.PortControl, FromHost: j.ctlIn, ToHost: j.ctlOutW},
		{Name: jobproto.PortStdin, FromHost: j.stdin},
		{Name: jobproto.PortStdout, ToHost: j.stdout},
		{Name: jobproto.PortStderr, ToHost: j.stderr},
	}
}

// Signal delivers sig to COMMAND's process group in the guest. The first
// SIGTERM also starts the shutdown timeout (Options.ShutdownTimeout).
// Signals beyond what the queue holds while the guest does not read them
// are dropped.
func (j *Job) Signal(sig syscall.Signal) {
	select {
	case j.events <- event{sig: sig}:
	default:
	}
}

// Resize tells a pty job the terminal's new size.
func (j *Job) Resize(rows, cols uint16) {
	select {
	case j.events <- event{rows: rows, cols: cols}:
	default:
	}
}

// Run runs m, the VM given Ports, until the job ends, and returns how it
// ended. ctx done stops the VM hard (125 unless a status came first).
// Run may be called once.
//
// Run is over 100 lines because it is one event loop: the job's state
// (status, Start sent, events pending until Ready, the shutdown stage, the
// output drain, the VM's end) is read and written by every case of one
// select, so its steps read in order here rather than spread over a state
// struct and its methods.
func (j *Job) Run(ctx context.Context, m Machine) jobproto.Status {
	if j.ran.Swap(true) {
		return failed("job: Run called twice")
	}
	defer j.ctlOut.CloseWithError(errors.New("job: ended"))

	vmCtx, hardStop := context.WithCancelCause(context.Background())
	defer hardStop(nil)
	vmDone := make(chan error, 1)
	go func() { vmDone <- m.Run(vmCtx) }()

	// The control port, both ways: a writer goroutine so a guest that
	// does not read never blocks this loop, a reader goroutine for the
	// guest's frames.
	out := make(chan jobproto.Message, 64)
	go func() {
		for m := range out {
			if err := jobproto.Write(j.ctlInW, m); err != nil {
				break
			}
		}
		j.ctlInW.Close() // end of stream: the agent powers off
	}()
	outOpen := true
	closeControl := func() {
		if outOpen {
			close(out)
			outOpen = false
		}
	}
	defer closeControl()
	send := func(m jobproto.Message) {
		if !outOpen {
			return
		}
		select {
		case out <- m:
		default:
			j.log.Warn("job: control port full, message dropped", "type", m.Type())
		}
	}
	in := make(chan jobproto.Message)
	inErr := make(chan error, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		r := jobproto.NewReader(j.ctlOut, jobproto.MaxGuestFrame)
		for {
			m, err := r.Read()
			if err != nil {
				inErr <- err
				return
			}
			select {
			case in <- m:
			case <-stop:
				return
			}
		}
	}()

	var (
		status     *jobproto.Status
		started    bool // Start sent
		pending    []event
		sigterm    bool
		shutdown   <-chan time.Time // shutdown timeout running
		stage      int              // 0: signal sent, 1: power button pressed
		drainTick  *time.Ticker
		drainC     <-chan time.Time
		lastOut    uint64
		outputDone = allClosed(j.stdout, j.stderr)
		vmEnded    = false
		vmErr      error
		vmStopped  <-chan time.Time // bound on the power-off after the status
		done       = ctx.Done()
	)
	finish := func(s jobproto.Status) {
		if status == nil {
			status = &s
			drainTick = time.NewTicker(drainIdle)
			drainC = drainTick.C
		}
	}
	defer func() {
		if drainTick != nil {
			drainTick.Stop()
		}
	}()
	deliver := func(e event) {
		switch {
		case e.sig != 0:
			send(&jobproto.Signal{Signo: uint8(e.sig)})
		case e.rows != 0:
			send(&jobproto.Resize{Rows: e.rows, Cols: e.cols})
		}
	}
	for {
		if status != nil && outputDone == nil && outOpen {
			closeControl()
			vmStopped = time.After(j.opts.ShutdownTimeout)
		}
		if vmEnded {
			break
		}
		select {
		case m := <-in:
			switch m := m.(type) {
			case *jobproto.Ready:
				if !started {
					started = true
					send((*jobproto.Start)(&j.spec))
					for _, e := range pending {
						deliver(e)
					}
					pending = nil
				}
			case *jobproto.Started:
				// The bench times "launch → command started" from this line.
				j.log.Debug("job: command started in the guest", "pid", m.PID)
			case *jobproto.Exited:
				// Logged as it arrives: the bench times "command exited →
				// hpcvmm exited" from this line (tests/bench/jobs.go).
				j.log.Debug("job: command exited in the guest", "status", jobproto.StatusOf(m).String())
				finish(jobproto.StatusOf(m))
			case *jobproto.Failed:
				finish(jobproto.Status{Failure: m.Kind, Reason: m.Reason})
			case *jobproto.Log:
				j.log.Info("guest agent: " + m.Text)
			default:
				finish(failed(fmt.Sprintf("the guest agent sent %T, a host-to-guest message", m)))
				hardStop(errors.New("protocol error"))
			}
		case err := <-inErr:
			inErr = nil
			if status == nil && !errors.Is(err, io.EOF) {
				finish(failed("the guest agent's control stream: " + err.Error()))
				hardStop(err)
			}
		case e := <-j.events:
			if e.sig == syscall.SIGTERM && !sigterm {
				sigterm = true
				shutdown = time.After(j.opts.ShutdownTimeout)
			}
			if !started {
				pending = append(pending, e)
				continue
			}
			deliver(e)
		case <-shutdown:
			if status != nil {
				shutdown = nil
				continue
			}
			if stage == 0 {
				j.log.Info("job: the command did not exit within --shutdown-timeout after SIGTERM: pressing the power button", "timeout", j.opts.ShutdownTimeout)
				if err := m.PressPowerButton(); err != nil {
					j.log.Warn("job: no power button", "err", err)
				}
				stage = 1
				shutdown = time.After(j.opts.ShutdownTimeout)
				continue
			}
			finish(failed(fmt.Sprintf("the command did not exit within --shutdown-timeout %v after SIGTERM and the power button: stopped the VM", j.opts.ShutdownTimeout)))
			hardStop(errors.New("shutdown timeout"))
			shutdown = nil
		case <-outputDone:
			outputDone = nil
		case <-drainC:
			n := j.stdout.n.Load() + j.stderr.n.Load()
			if n == lastOut {
				j.log.Warn("job: the guest's output ports did not close after the command ended; ending the job", "idle", drainIdle)
				outputDone = nil
				drainTick.Stop()
				drainC = nil
			}
			lastOut = n
		case <-vmStopped:
			j.log.Warn("job: the guest did not power off after the job ended: stopped it")
			hardStop(errors.New("the guest did not power off"))
			vmStopped = nil
		case vmErr = <-vmDone:
			vmEnded = true
		case <-done:
			done = nil
			finish(failed("stopped: " + context.Cause(ctx).Error()))
			hardStop(context.Cause(ctx))
		}
	}
	switch {
	case status != nil:
		return *status
	case vmErr != nil:
		return failed("the VM failed: " + vmErr.Error())
	}
	return failed(ReasonNoStatus)
}

// ReasonNoStatus is the reason of a job whose guest ended without a status
// (the agent failed early or the kernel panicked: the console says which).
const ReasonNoStatus = "the guest powered off without reporting the command's status (the agent's reason, or a kernel panic, is on the guest console)"

func failed(reason string) jobproto.Status {
	return jobproto.Status{Failure: jobproto.FailAgent, Reason: reason}
}

// sink is an output port's ToHost: the caller's writer, a count of bytes
// (drain progress) and the guest's end of stream. Write adds nothing per
// chunk: no copy, no allocation.
type sink struct {
	w      io.Writer
	n      atomic.Uint64
	closed chan struct{}
	once   sync.Once
}

func newSink(w io.Writer) *sink {
	if w == nil {
		w = io.Discard
	}
	return &sink{w: w, closed: make(chan struct{})}
}

// Write implements io.Writer; it blocks as long as the caller's writer
// does, which holds the guest's writes (back-pressure).
func (s *sink) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	s.n.Add(uint64(n))
	return n, err
}

// Close is the guest's end of stream.
func (s *sink) Close() error {
	s.once.Do(func() { close(s.closed) })
	return nil
}

// allClosed is closed once every sink is.
func allClosed(sinks ...*sink) <-chan struct{} {
	c := make(chan struct{})
	go func() {
		for _, s := range sinks {
			<-s.closed
		}
		close(c)
	}()
	return c
}

// eof is an input that ends at once.
type eof struct{}

func (eof) Read([]byte) (int, error) { return 0, io.EOF }
