package ninep

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ChildName is argv[0] under which hpcvmm's binary is the file server
// (cmd/hpcvmm dispatches to ChildMain on it).
const ChildName = "hpcvmm-9p"

// closeWait is how long Close waits for the child to end after closing
// its connections.
const closeWait = 5 * time.Second

// SpawnOptions configure the file server's child process.
type SpawnOptions struct {
	// Log receives the child's stderr: the refusals, one line each,
	// already rate-limited by the child. nil discards them.
	Log io.Writer
	// MaxMessageSize is each connection's bound (Options.MaxMessageSize;
	// 0 is DefaultMessageSize).
	MaxMessageSize uint32
	// Credential, when set, is what the child runs as (the job's user
	// under Slurm); nil keeps hpcvmm's.
	Credential *syscall.Credential
	// Seccomp puts the FileServer filter (package seccomp) on the child
	// before it reads a request.
	Seccomp bool
}

// Conn is one export's connection to the child: the two ends the console
// port's relays use.
type Conn struct {
	// Requests is written with what the guest sends (the port's ToHost).
	Requests io.WriteCloser
	// Replies is read for what goes to the guest (the port's FromHost).
	Replies io.ReadCloser
}

// Process is a running file server child, one Conn per export in the
// order given to Spawn.
type Process struct {
	Conns []Conn

	cmd  *exec.Cmd
	done chan struct{}
	once sync.Once
	err  error
}

// Spawn starts hpcvmm's binary self as the file server (argv[0]
// ChildName) for exports, each given as descriptors from 3 on, in order:
// a directory export's root and two pipes, a file set's two pipes, its
// directories and its files; with the read-only flags, the sets' names
// and the bounds as arguments that the child checks. The child is killed if
// hpcvmm ends (Pdeathsig, from a thread kept for the child's lifetime).
// Nothing is started when an export or option is unusable.
func Spawn(self string, exports []Export, o SpawnOptions) (*Process, error) {
	if len(exports) == 0 {
		return nil, errors.New("ninep: no export to serve")
	}
	if _, err := (Options{MaxMessageSize: o.MaxMessageSize}).messageSize(); err != nil {
		return nil, err
	}
	args, err := childArgs(exports, o)
	if err != nil {
		return nil, err
	}
	p := &Process{done: make(chan struct{})}
	child, pipes, err := p.childFiles(exports)
	if err != nil {
		return nil, err
	}
	closeAll := func() {
		for _, f := range pipes {
			f.Close()
		}
	}
	log := o.Log
	if log == nil {
		log = io.Discard
	}
	// The child's stderr is a pipe of our own: its end of file says the
	// child has ended. hpcvmm never waits for the child (waitid, wait4):
	// the VMM's seccomp list has neither, and a wait interrupted by a
	// signal (srun's SIGTERM) is restarted under that list and kills
	// hpcvmm with SIGSYS. The child stays a zombie until hpcvmm exits.
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll()
		p.closeConns()
		return nil, fmt.Errorf("ninep: pipe: %w", err)
	}
	p.cmd = &exec.Cmd{
		Path:       self,
		Args:       args,
		Env:        []string{},
		ExtraFiles: child,
		Stderr:     errW,
		SysProcAttr: &syscall.SysProcAttr{
			Pdeathsig:  syscall.SIGKILL,
			Credential: o.Credential,
		},
	}
	// Pdeathsig fires when the thread that forked the child ends, not the
	// process: the Go runtime ends a thread whose goroutine exits locked
	// to it (vCPU threads, prefault workers), and any thread may be the
	// one that forks. So the child is started from a goroutine that keeps
	// its thread locked until the child has ended: that thread ends only
	// with hpcvmm (or after the child).
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := p.cmd.Start()
		started <- err
		if err != nil {
			return
		}
		<-p.done
	}()
	err = <-started
	errW.Close()
	// The child has its own copies now; the roots and sets stay the
	// caller's.
	closeAll()
	if err != nil {
		errR.Close()
		p.closeConns()
		return nil, fmt.Errorf("ninep: start the file server %s: %w", self, err)
	}
	go func() {
		_, _ = io.Copy(log, errR)
		errR.Close()
		close(p.done)
	}()
	return p, nil
}

// childFiles makes each export's two pipes (p.Conns gets the ends of
// ours) and returns the child's descriptors in Spawn's order and those of
// them made here (the pipes' other ends), to close once the child runs.
func (p *Process) childFiles(exports []Export) (child, pipes []*os.File, err error) {
	for _, e := range exports {
		reqR, reqW, err := os.Pipe()
		if err == nil {
			var repR, repW *os.File
			if repR, repW, err = os.Pipe(); err == nil {
				pipes = append(pipes, reqR, repW)
				if e.Files == nil {
					child = append(child, e.Root, reqR, repW)
				} else {
					child = append(append(child, reqR, repW), e.Files.dirs...)
					for _, f := range e.Files.files {
						child = append(child, f.f)
					}
				}
				p.Conns = append(p.Conns, Conn{Requests: reqW, Replies: repR})
				continue
			}
			reqR.Close()
			reqW.Close()
		}
		for _, f := range pipes {
			f.Close()
		}
		p.closeConns()
		return nil, nil, fmt.Errorf("ninep: pipe: %w", err)
	}
	return child, pipes, nil
}

// childArgs are the child's arguments for exports: its message bound, its
// seccomp mode and each export's access, after each root is checked to be
// a directory.
func childArgs(exports []Export, o SpawnOptions) ([]string, error) {
	args := []string{ChildName, "-msize", strconv.FormatUint(uint64(o.MaxMessageSize), 10), "-seccomp", "off"}
	if o.Seccomp {
		args[4] = "kill"
	}
	for i, e := range exports {
		if e.Files != nil {
			if e.Root != nil {
				return nil, fmt.Errorf("ninep: export %d has a root directory and a file set: give one", i)
			}
			args = append(args, setArgs(e.Files)...)
			continue
		}
		if e.Root == nil {
			return nil, fmt.Errorf("ninep: export %d has no root descriptor", i)
		}
		if st, err := statFD(int(e.Root.Fd())); err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return nil, fmt.Errorf("ninep: export %d (%s) is not a directory: give a directory to bind", i, e.Root.Name())
		}
		args = append(args, map[bool]string{true: "ro", false: "rw"}[e.ReadOnly])
	}
	return args, nil
}

// setArgs are a file set's arguments: "set:DIRS:FILES:LINKS", then
// "DIR/NAME" for each file (DIR its directory's index) and "NAME/TARGET"
// for each link. Names never hold '/' (OpenFileSet), so the first one
// splits them.
func setArgs(s *FileSet) []string {
	args := []string{fmt.Sprintf("set:%d:%d:%d", len(s.dirs), len(s.files), len(s.links))}
	for _, f := range s.files {
		args = append(args, strconv.Itoa(f.dir)+"/"+f.name)
	}
	for _, l := range s.links {
		args = append(args, l.Name+"/"+l.Target)
	}
	return args
}

func (p *Process) closeConns() {
	for _, c := range p.Conns {
		c.Requests.Close()
		c.Replies.Close()
	}
}

// Done is closed when the child has ended (its stderr reached end of
// file).
func (p *Process) Done() <-chan struct{} { return p.done }

// Close ends the file server: its connections are closed, so the child
// serves what it has and exits. A child still running after a few seconds
// is left to Pdeathsig (it ends with hpcvmm: killing it from here would
// need a syscall the VMM's seccomp list does not have) and reported. It
// returns the same on every call.
func (p *Process) Close() error {
	p.once.Do(func() {
		p.closeConns()
		select {
		case <-p.done:
		case <-time.After(closeWait):
			p.err = fmt.Errorf("ninep: the file server (pid %d) did not end within %v of its connections closing; it ends with hpcvmm", p.cmd.Process.Pid, closeWait)
		}
	})
	return p.err
}
