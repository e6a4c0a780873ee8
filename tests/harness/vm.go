package harness

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Record keys under which a failing VMProcess sends its tails to the result
// port, so the outer side can print them apart from the test output.
const (
	keyL2ConsoleTail = "l2_console_tail"
	keyHPCVMMLogTail = "hpcvmm_log_tail"
)

func isArtifactKey(k string) bool { return k == keyL2ConsoleTail || k == keyHPCVMMLogTail }

// defaultVMTimeout bounds one hpcvmm process. An L2 boot inside L1 takes
// seconds to tens of seconds of emulated time; minutes mean a hang.
const defaultVMTimeout = 4 * time.Minute

// VMProcess is one running hpcvmm: stdout is the L2 serial console, stderr
// the hpcvmm log. Both are captured in memory and to files.
type VMProcess struct {
	t        testing.TB
	cmd      *exec.Cmd
	args     []string
	console  *capture
	log      *capture
	timeout  time.Duration
	done     chan struct{}
	exitCode int
	timedOut bool
	waitErr  error
	stdin    io.WriteCloser
}

// StartVM runs hpcvmm with args (e.g. "run", "--kernel", env.L2Kernel(t),
// ...) under a timeout (HPCVMM_VM_TIMEOUT, default 4m); inside L1 a run
// without --cpu-mode gets TestbedCPUMode (Env.VMArgs). The process is
// killed when t ends; if t failed, the L2 console and hpcvmm log tails are
// printed (and, inside L1, sent to the outer side).
func (e *Env) StartVM(t testing.TB, args ...string) *VMProcess {
	t.Helper()
	return e.startVM(t, e.VMArgs(args))
}

// StartVMDefaultCPUMode is StartVM without TestbedCPUMode: hpcvmm picks
// the CPU mode a run without --cpu-mode gets anywhere (for the scenarios
// of that choice).
func (e *Env) StartVMDefaultCPUMode(t testing.TB, args ...string) *VMProcess {
	t.Helper()
	return e.startVM(t, args)
}

func (e *Env) startVM(t testing.TB, args []string) *VMProcess {
	t.Helper()
	bin := e.HPCVMM(t)
	timeout := defaultVMTimeout
	if s := os.Getenv("HPCVMM_VM_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("HPCVMM_VM_TIMEOUT=%q: want a Go duration such as 2m", s)
		}
		timeout = d
	}
	dir := t.TempDir()
	vm := &VMProcess{t: t, args: args, timeout: timeout, done: make(chan struct{}), exitCode: -1}
	var err error
	if vm.console, err = newCapture(filepath.Join(dir, "l2-console.log")); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	if vm.log, err = newCapture(filepath.Join(dir, "hpcvmm.log")); err != nil {
		t.Fatalf("StartVM: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	vm.cmd = exec.CommandContext(ctx, bin, args...)
	vm.cmd.Stdout, vm.cmd.Stderr = vm.console, vm.log
	// hpcvmm's stdin is a pipe the scenario may write to (console input);
	// it stays open, so the console never sees EOF, until hpcvmm exits.
	if vm.stdin, err = vm.cmd.StdinPipe(); err != nil {
		cancel()
		t.Fatalf("StartVM: stdin pipe: %v", err)
	}
	// At the timeout hpcvmm gets SIGTERM first: it then stops the vCPUs
	// and logs where each one was (RIP, control registers), which is what
	// tells a hang in the guest from one in the VMM. WaitDelay later it is
	// killed, and pipes a child inherited are closed.
	vm.cmd.Cancel = func() error { return vm.cmd.Process.Signal(syscall.SIGTERM) }
	vm.cmd.WaitDelay = 5 * time.Second
	if err := vm.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("StartVM: starting %s %s: %v", bin, strings.Join(args, " "), err)
	}
	go func() {
		vm.waitErr = vm.cmd.Wait()
		vm.timedOut = ctx.Err() == context.DeadlineExceeded
		vm.exitCode = vm.cmd.ProcessState.ExitCode()
		cancel()
		vm.console.close()
		vm.log.close()
		close(vm.done)
	}()
	t.Cleanup(func() {
		select {
		case <-vm.done:
		default:
			// SIGTERM first, for the vCPU state in hpcvmm's log.
			_ = vm.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-vm.done:
			case <-time.After(5 * time.Second):
				_ = vm.cmd.Process.Kill()
				<-vm.done
			}
		}
		if !t.Failed() {
			return
		}
		con, log := vm.ConsoleTail(40), vm.LogTail(40)
		t.Logf("hpcvmm %s\n--- L2 console tail (%s) ---\n%s\n--- hpcvmm log tail (%s) ---\n%s",
			strings.Join(vm.args, " "), vm.console.path, con, vm.log.path, log)
		if e.rec != nil {
			_ = e.rec.write(Field{"test", t.Name()}, Field{"key", keyL2ConsoleTail}, Field{"value", con})
			_ = e.rec.write(Field{"test", t.Name()}, Field{"key", keyHPCVMMLogTail}, Field{"value", log})
		}
	})
	return vm
}

// Stdin is hpcvmm's standard input: what the guest's console reads.
func (vm *VMProcess) Stdin() io.Writer { return vm.stdin }

// CloseStdin closes hpcvmm's standard input: the console then sees end of
// file after whatever was written, as with `hpcvmm run < file`.
func (vm *VMProcess) CloseStdin() error { return vm.stdin.Close() }

// PID returns the hpcvmm process id.
func (vm *VMProcess) PID() int { return vm.cmd.Process.Pid }

// Wait waits for hpcvmm to exit and returns its exit code (-1 if it was
// killed by a signal). Hitting the timeout fails the test.
func (vm *VMProcess) Wait() int {
	vm.t.Helper()
	<-vm.done
	if vm.timedOut {
		vm.t.Errorf("hpcvmm %s: killed after the %v timeout (HPCVMM_VM_TIMEOUT)", strings.Join(vm.args, " "), vm.timeout)
	}
	return vm.exitCode
}

// Exited reports whether hpcvmm has exited.
func (vm *VMProcess) Exited() bool {
	select {
	case <-vm.done:
		return true
	default:
		return false
	}
}

// WaitForLine waits until a console line contains substr and returns that
// line (without line terminators). ok is false if the timeout passed or
// hpcvmm exited first.
func (vm *VMProcess) WaitForLine(substr string, timeout time.Duration) (line string, ok bool) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	for {
		line, ok, changed := vm.console.find(substr)
		if ok {
			return line, true
		}
		select {
		case <-changed:
		case <-vm.done:
			line, ok, _ := vm.console.find(substr)
			return line, ok
		case <-timer.C:
			return "", false
		}
	}
}

// Console returns everything hpcvmm wrote to stdout (the L2 console) so far.
func (vm *VMProcess) Console() string { return vm.console.String() }

// Log returns everything hpcvmm wrote to stderr (its log) so far.
func (vm *VMProcess) Log() string { return vm.log.String() }

// ConsoleTail returns the last n lines of the L2 console.
func (vm *VMProcess) ConsoleTail(n int) string { return Tail(vm.Console(), n) }

// LogTail returns the last n lines of the hpcvmm log.
func (vm *VMProcess) LogTail(n int) string { return Tail(vm.Log(), n) }

// GuestResults parses the guest /init's "hpcvmm-guest key=value" console
// lines. A malformed line fails the test.
func (vm *VMProcess) GuestResults() map[string]string {
	vm.t.Helper()
	vals, bad := ParseGuestResults(vm.Console())
	for _, l := range bad {
		vm.t.Errorf("malformed guest result line on the L2 console: %q", l)
	}
	return vals
}

// capture is an io.Writer that keeps everything written in memory and in a
// file, and wakes waiters on every write.
type capture struct {
	mu      sync.Mutex
	path    string
	buf     bytes.Buffer
	f       *os.File
	changed chan struct{}
}

func newCapture(path string) (*capture, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &capture{path: path, f: f, changed: make(chan struct{})}, nil
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if c.f != nil {
		_, _ = c.f.Write(p) // the in-memory copy is authoritative
	}
	close(c.changed)
	c.changed = make(chan struct{})
	return len(p), nil
}

func (c *capture) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.f != nil {
		_ = c.f.Close()
		c.f = nil
	}
}

func (c *capture) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// find returns the first line containing substr, or a channel closed on the
// next write.
func (c *capture) find(substr string) (string, bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range strings.Split(c.buf.String(), "\n") {
		if strings.Contains(l, substr) {
			return strings.TrimRight(l, "\r"), true, nil
		}
	}
	return "", false, c.changed
}
