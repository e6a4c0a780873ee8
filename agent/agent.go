// Package agent is hpcvmm's guest agent: PID 1 of a job's VM (docs/jobs.md).
// hpcvmm's own static binary runs it when started as hpcvmm-agent (the
// initramfs holds it at /.hpcvmm/hpcvmm-agent, the kernel starts it with
// rdinit=), so there is no second program to install or keep in step; so
// does any static program whose main calls jobrun.Dispatch first.
//
// Main, as PID 1, mounts /proc, /sys, /dev (devtmpfs), /dev/pts, /dev/shm
// and /tmp, loads the modules /.hpcvmm/modules lists, switches root to
// IMAGE when the kernel command line names it as persistent memory
// (hpcvmm.pmem=squashfs|erofs: /dev/pmem0 read-only under a tmpfs overlay,
// pmemroot.go), finds the job's
// virtio-console ports by name, and hands them to Agent.Serve, which speaks
// jobproto with the host: Ready, then the host's Start; it sets the
// hostname, mounts hugetlbfs, configures the network, creates the device
// nodes of the job's NVIDIA GPUs (GPUNodes), and runs COMMAND with
// the spec's environment, directory and user, its stdin/stdout/stderr on
// the ports (or a pty on them), in its own process group, to which the
// host's Signal messages go. It reaps every orphan (Reap), reports COMMAND's
// end (Exited) or why it could not run (Failed), kills what COMMAND left
// behind, closes the output ports (end of stream for the host) and waits
// for the host to close the control port, which the host does once it has
// all of COMMAND's output; then it syncs and powers the guest off. If the
// host cannot be reached, the reason goes to /dev/console (the serial
// console, which hpcvmm prints on its stderr) and the guest powers off. The
// ACPI power button (a KEY_POWER press on an input device) sends COMMAND
// SIGTERM, then SIGKILL after StopGrace.
//
// Everything but Main runs unprivileged too: the unit tests run Serve on
// the host over pipes, with real commands.
package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/pmi"
)

// StopGrace is how long COMMAND has between SIGTERM and SIGKILL after the
// power button was pressed, unless the spec says (Start.StopGrace: the host
// gives half its own wait after pressing the button).
const StopGrace = 5 * time.Second

// drainTimeout bounds the wait for a pty's last output after COMMAND ended.
const drainTimeout = 5 * time.Second

// Agent runs one job over its ports.
type Agent struct {
	// Root is the guest's root directory ("/"; a directory in tests).
	Root string
	// Control is the control port.
	Control io.ReadWriter
	// Stdin, Stdout, Stderr are the stream ports. Serve closes Stdout and
	// Stderr once COMMAND and what it left behind are gone.
	Stdin, Stdout, Stderr *os.File
	// Waiter reaps children (SysWaiter).
	Waiter Waiter
	// PID1 kills every process left when COMMAND ends (kill(-1)): as PID
	// 1 the agent is the guest's last process. Off in tests.
	PID1 bool
	// PowerButton delivers power-button presses; nil for none.
	PowerButton <-chan struct{}
	// Prepare applies the spec's system settings (hostname, hugetlbfs,
	// network) before COMMAND starts; an error fails the job (125).
	Prepare func(*jobproto.Start) error
	// OpenPMI opens the two PMI ports (pmi.PortIn, pmi.PortOut) for a
	// spec with PMI; nil when the agent has none (a spec asking for PMI
	// then fails, 125).
	OpenPMI func() (in io.Reader, out io.WriteCloser, err error)
	// OpenPort opens a named port for reading and writing (a bind's 9P
	// connection); nil when the agent has none (a spec with Mounts then
	// fails, 125).
	OpenPort func(name string) (*os.File, error)
	// Mount and Unmount mount and unmount a file system (unix.Mount and
	// unix.Unmount as PID 1, creating the target first); nil: no binds.
	Mount   func(source, target, fstype string, flags uintptr, data string) error
	Unmount func(target string) error
	// MakeGPUNodes creates the device nodes of a spec's NVIDIA GPUs
	// (GPUNodes.Make); nil: a spec with GPUs fails (125).
	MakeGPUNodes func(gpus int) error

	wmu       sync.Mutex
	stopGrace time.Duration // the spec's, 0 for StopGrace
	mounted   []string      // the binds' targets, in mount order
}

// send writes one message to the control port; writes come from several
// goroutines, and a frame must go out whole.
func (a *Agent) send(m jobproto.Message) error {
	a.wmu.Lock()
	defer a.wmu.Unlock()
	return jobproto.Write(a.Control, m)
}

// Logf sends a line for hpcvmm's log (best effort).
func (a *Agent) Logf(format string, args ...any) {
	_ = a.send(&jobproto.Log{Text: fmt.Sprintf(format, args...)})
}

// Serve runs the job: Ready, Start, COMMAND, Exited or Failed, and returns
// once the host has closed the control port (or the port failed). A nil
// error means the host got the status.
func (a *Agent) Serve() error {
	if err := a.send(&jobproto.Ready{}); err != nil {
		return fmt.Errorf("sending Ready: %w", err)
	}
	r := jobproto.NewReader(a.Control, jobproto.MaxFrame)
	m, err := r.Read()
	if err != nil {
		return fmt.Errorf("reading Start: %w", err)
	}
	start, ok := m.(*jobproto.Start)
	if !ok {
		return fmt.Errorf("first message %T, want Start", m)
	}
	// The rest of the control stream: Signal and Resize, then end of
	// stream when the host is done.
	msgs := make(chan jobproto.Message, 16)
	hostDone := make(chan struct{})
	go func() {
		defer close(hostDone)
		for {
			m, err := r.Read()
			if err != nil {
				return
			}
			msgs <- m
		}
	}()
	if f := a.run(start, msgs, hostDone); f != nil {
		a.closeOutputs()
		if err := a.send(f); err != nil {
			return fmt.Errorf("sending Failed (%s): %w", f.Reason, err)
		}
	}
	<-hostDone
	return nil
}

func (a *Agent) closeOutputs() {
	a.Stdout.Close()
	a.Stderr.Close()
}

// run starts COMMAND and serves it until it ends; a non-nil result is the
// failure to report instead of Exited.
func (a *Agent) run(s *jobproto.Start, msgs <-chan jobproto.Message, hostDone <-chan struct{}) *jobproto.Failed {
	if len(s.Argv) == 0 {
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: "Start without a command"}
	}
	if f := a.setUp(s); f != nil {
		return f
	}
	if f := a.mountBinds(s); f != nil {
		return f
	}
	env := Env(s)
	if f := CheckWorkdir(a.Root, s.Workdir); f != nil {
		return f
	}
	path, f := LookPath(a.Root, s.Argv[0], env)
	if f != nil {
		return f
	}
	cmd := Command(s, path, env)
	var relay *pmi.Guest
	if s.PMI {
		g, f := a.attachPMI(cmd)
		if f != nil {
			return f
		}
		relay = g
		defer g.Child.Close()
	}

	var master *os.File
	if s.TTY {
		m, tty, err := pty.Open()
		if err != nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: "opening a pty: " + err.Error()}
		}
		defer tty.Close()
		master = m
		if s.Rows != 0 && s.Cols != 0 {
			_ = pty.Setsize(master, &pty.Winsize{Rows: s.Rows, Cols: s.Cols})
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	} else {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = a.Stdin, a.Stdout, a.Stderr
	}

	chld := make(chan os.Signal, 1)
	signal.Notify(chld, unix.SIGCHLD)
	defer signal.Stop(chld)
	if err := cmd.Start(); err != nil {
		if master != nil {
			master.Close()
		}
		return StartFailure(a.Root, path, err)
	}
	pid := cmd.Process.Pid
	if relay != nil {
		a.startPMI(relay)
	}
	var drained chan struct{}
	if master != nil {
		cmd.Stdin.(*os.File).Close() // the child has the pty now
		drained = a.relayPTY(master)
	}
	if err := a.send(&jobproto.Started{PID: uint32(pid)}); err != nil {
		_ = unix.Kill(-pid, unix.SIGKILL)
	}

	ws := a.wait(pid, master, chld, msgs, hostDone)

	// What COMMAND left behind goes with it, as when a container's main
	// process ends; as PID 1 everything else, otherwise its group.
	if a.PID1 {
		_ = unix.Kill(-1, unix.SIGKILL)
	} else {
		_ = unix.Kill(-pid, unix.SIGKILL)
	}
	a.reapRest(pid)
	a.unmountBinds()
	if drained != nil {
		select {
		case <-drained:
		case <-time.After(drainTimeout):
		}
		master.Close()
	}
	a.closeOutputs()
	ex := jobproto.ExitedFrom(syscall.WaitStatus(ws))
	if err := a.send(&ex); err != nil {
		return nil // the host is gone: nothing to report to
	}
	return nil
}

// setUp applies the spec's system settings (Prepare), creates its GPUs'
// device nodes and COMMAND's user, before anything of COMMAND's runs.
func (a *Agent) setUp(s *jobproto.Start) *jobproto.Failed {
	if a.Prepare != nil {
		if err := a.Prepare(s); err != nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: err.Error()}
		}
	}
	if s.GPUs > 0 {
		// The modules were loaded before Serve; COMMAND (nvidia-smi,
		// a CUDA program) opens the nodes first thing.
		if a.MakeGPUNodes == nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: "the job has NVIDIA GPUs but this agent cannot create their device nodes"}
		}
		if err := a.MakeGPUNodes(int(s.GPUs)); err != nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: err.Error()}
		}
	}
	a.stopGrace = s.StopGrace
	if err := ensureUser(a.Root, s); err != nil {
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: err.Error()}
	}
	return nil
}

// wait serves COMMAND until it ends and returns its wait status.
func (a *Agent) wait(pid int, master *os.File, chld <-chan os.Signal, msgs <-chan jobproto.Message, hostDone <-chan struct{}) unix.WaitStatus {
	var kill <-chan time.Time
	// A child may have ended before the first SIGCHLD could be caught;
	// the ticker also covers a coalesced signal.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		if ws, found, _ := Reap(a.Waiter, pid); found {
			return ws
		}
		select {
		case <-chld:
		case <-tick.C:
		case m := <-msgs:
			switch m := m.(type) {
			case *jobproto.Signal:
				_ = unix.Kill(-pid, unix.Signal(m.Signo))
			case *jobproto.Resize:
				if master != nil && m.Rows != 0 && m.Cols != 0 {
					_ = pty.Setsize(master, &pty.Winsize{Rows: m.Rows, Cols: m.Cols})
				}
			}
		case <-a.PowerButton:
			_ = unix.Kill(-pid, unix.SIGTERM)
			grace := StopGrace
			if a.stopGrace > 0 {
				grace = a.stopGrace
			}
			kill = time.After(grace)
		case <-kill:
			_ = unix.Kill(-pid, unix.SIGKILL)
		case <-hostDone:
			// The host closed the control port before COMMAND ended:
			// it gave up on the job.
			_ = unix.Kill(-pid, unix.SIGKILL)
			hostDone = nil
		}
	}
}

// reapRest reaps the children still there after the kill, for a bounded
// time (a process in uninterruptible sleep can outlive SIGKILL for a while).
func (a *Agent) reapRest(pid int) {
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if _, _, none := Reap(a.Waiter, pid); none {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// relayPTY copies the stdin port into the pty master and the master's
// output to the stdout port; the returned channel closes when the output
// ends (every slave closed: EIO).
func (a *Agent) relayPTY(master *os.File) chan struct{} {
	go func() {
		_, err := io.Copy(master, a.Stdin)
		if err == nil { // end of stdin: the terminal's end-of-file key
			_, _ = master.Write([]byte{4})
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(a.Stdout, master)
	}()
	return done
}

// ErrNotPID1 is Main's error when the process is not PID 1.
var ErrNotPID1 = errors.New("hpcvmm-agent runs only as the guest's init (PID 1, rdinit=/.hpcvmm/hpcvmm-agent)")
