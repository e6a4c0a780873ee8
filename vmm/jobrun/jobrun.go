// Package jobrun runs a job in one call: COMMAND in a VM booted for it, as
// `hpcvmm run --rootfs IMAGE -- COMMAND` runs it (Run). It is the job
// pipeline that cmd/hpcvmm and any other program share, so an embedder
// repeats none of it: the kernel (the running kernel's by default) and its
// release; the host checks that need nothing but the host, before IMAGE is
// read; COMMAND (and its ELF interpreter) looked up in IMAGE before boot;
// the guest's modules (virtio, the power button, the 9P client of the
// binds, the passed-through devices' drivers, Request.Modules); the
// initramfs of IMAGE's tree (cached), or for a SquashFS, EROFS or SIF IMAGE
// the file mapped read-only as persistent memory with an initramfs of the
// agent and modules only; the binds and the host NVIDIA driver's files,
// served over 9P by a child process; the VM, the job, its exit status.
//
// The agent (Request.Agent, default os.Executable()) is a static program
// that is hpcvmm's agent when started as hpcvmm-agent and its 9P file server
// as hpcvmm-9p: hpcvmm's own binary, or a program of one's own whose main
// calls Dispatch first thing. CheckAgent asks it (a handshake) before it is
// packed, so a program that is not one is refused with a one-line error
// instead of booting as a guest's PID 1 that never speaks to the host.
//
// A request that cannot run is an *Error before anything of the VM exists;
// its Kind says who is at fault (hpcvmm run's exit statuses 2, 3, 125, 126
// and 127), and its text names the flag of `hpcvmm run` that sets the
// Request field at fault (--rootfs for Image, --module for Modules, ...), as
// the CLI prints it. Once the VM runs, Run returns how the job ended.
package jobrun

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path"
	"time"

	"github.com/hpcvmm/hpcvmm/binds"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/pmi"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/trustfs"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// Request is one job: what `hpcvmm run`'s flags say, as fields.
type Request struct {
	// Image is the job's files (--rootfs IMAGE): a directory, a tar
	// archive (plain, gzip, zstd), an OCI image layout or a docker save
	// archive, whose initramfs is built and cached, or a SquashFS, EROFS
	// or SIF file, mapped read-only into the guest. Empty: VM.Initrd is
	// an initramfs of one's own that holds the agent at
	// initramfs.AgentPath.
	Image string
	// Argv is COMMAND and its arguments (required): Argv[0] is looked up
	// in IMAGE's PATH (Env's, else agent.DefaultPath) before boot.
	Argv []string
	// Env is COMMAND's environment, KEY=VALUE each.
	Env []string
	// Workdir is COMMAND's working directory in the guest, absolute
	// (--workdir; "": the host's working directory when a bind holds it,
	// else /).
	Workdir string
	// User runs COMMAND as these numeric ids (--user); nil: hpcvmm's own
	// user and groups, the user VM.ActingFor names, or root when root runs
	// the job for itself.
	User *User
	// Hostname is the guest's hostname (--hostname; "": the host's).
	Hostname string
	// Interfaces configure the guest's virtio-net interfaces, in VM.Nets'
	// order (--net's ip= and gw=), DNS the name servers of its
	// /etc/resolv.conf (--dns; none: IMAGE's file as it is).
	Interfaces []jobproto.Interface
	DNS        []net.IP
	// PMI is srun's PMI socket to relay into the guest (pmi.FromEnv), or
	// nil; Run closes it.
	PMI *pmi.Step

	// VM is the VM: vmm.DefaultConfig() with the caller's changes.
	// Kernel "" boots the running kernel (/boot/vmlinuz-$(uname -r));
	// Cmdline "" is the job's (the serial console, quiet, the agent as
	// init); Initrd is for a job without Image. Console, Stdin, Stdout,
	// ConsolePorts, Logger and Progress are the job's (the fields below);
	// PMEM is set from a SquashFS, EROFS or SIF Image.
	VM vmm.Config

	// Binds are host directories in the guest (-B SRC[:DST[:ro|rw]][,...],
	// Apptainer's syntax). With Image, $HOME and the working directory are
	// bound too unless NoHome, NoCwd or Contain.
	Binds                  []string
	NoHome, NoCwd, Contain bool
	// BindMSize and BindCache are the binds' 9P message size and the
	// guest 9P client's cache mode (0, "": DefaultBindMSize,
	// DefaultBindCache).
	BindMSize uint64
	BindCache string
	// Modules are kernel modules loaded, with their dependencies, before
	// COMMAND (--module; Image only).
	Modules []string
	// GPULibs says whether an NVIDIA GPU passed through brings the host
	// driver's libraries and programs (--gpu-libs), DriverRoot the host
	// root they are looked up beneath ("": /; tests: a fixture tree, as
	// hpcvmm check's preflight.Request.DriverRoot) and DriverCache the
	// loader cache's entries (nil: DriverRoot's /etc/ld.so.cache).
	GPULibs     GPULibs
	DriverRoot  string
	DriverCache []gpudriver.CacheEntry
	// Agent is the agent's binary ("": os.Executable()), which is also
	// started as the binds' file server: see CheckAgent.
	Agent string
	// InitramfsCache is the initramfs cache directory ("": the user's
	// own, cachedir.Default).
	InitramfsCache string
	// ImageMode says how a directory, tar or container IMAGE reaches the
	// guest (--rootfs-mode; the zero value is ImageAuto), ImageCache the
	// directory of its SquashFS conversions ("": the user's own,
	// cachedir.Default(cachedir.Images)).
	ImageMode  ImageMode
	ImageCache string

	// Stdin, Stdout and Stderr are COMMAND's streams (nil Stdin: none).
	// A terminal on Stdin gives COMMAND a pty of Stdout's size, in raw
	// mode while the job runs.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Console gets the guest's console: the kernel's messages and the
	// agent's before it reaches the host (nil: discarded). Never COMMAND's
	// output.
	Console io.Writer
	// Log is hpcvmm's log (nil: none) and Progress the VM's start-up
	// progress lines (vmm.Config.Progress; nil: none).
	Log      *slog.Logger
	Progress io.Writer
	// ShutdownTimeout is how long COMMAND has after the first SIGTERM
	// before the power button, and the guest as long again before a hard
	// stop (0: job.DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// RelaySignals passes the process's SIGINT, SIGTERM, SIGHUP, SIGQUIT,
	// SIGUSR1, SIGUSR2 and SIGCONT on to COMMAND while the VM runs (and
	// SIGWINCH as a resize of its pty), as hpcvmm run does. Without it
	// only ctx stops the job (at once, hard).
	RelaySignals bool
}

// User is COMMAND's numeric user and group.
type User struct{ UID, GID uint32 }

// GPULibs is Request.GPULibs: whether a job with an NVIDIA GPU gets the
// host driver's user space (--gpu-libs).
type GPULibs int

// GPULibs values.
const (
	// GPULibsDefault: on with Image, off with an initramfs of one's own
	// (which may lack the kernel's 9P client).
	GPULibsDefault GPULibs = iota
	// GPULibsOn: always.
	GPULibsOn
	// GPULibsOff: never (the image's own libraries).
	GPULibsOff
)

// Result is how a job that ran ended: COMMAND's exit code or signal
// (ExitCode, hpcvmm run's exit status), or the failure that kept COMMAND
// from running or ended the VM (Failure, Reason: one line the guest may
// have written, so filter it before a terminal).
type Result struct{ jobproto.Status }

// VMFailed reports whether the VM or the agent failed (exit status 125),
// rather than COMMAND: a kernel panic, a guest that ended without a
// status, a hard stop.
func (r Result) VMFailed() bool { return r.Failure == jobproto.FailAgent }

// Kind is who is at fault when a job cannot run.
type Kind int

// Kinds of Error, each with the exit status hpcvmm run gives it
// (cmd/hpcvmm's table).
const (
	// Input: the request can never work (2).
	Input Kind = iota + 1
	// Host: this host cannot run it (3): no usable KVM, too few free
	// hugepages, a missing device node or driver module.
	Host
	// VMFailed: the VM or hpcvmm failed while setting the job up (125).
	VMFailed
	// NotFound and NotExecutable: COMMAND (or its ELF interpreter) is not
	// in IMAGE, or is but cannot be executed (127, 126).
	NotFound
	NotExecutable
)

// Error is why a job could not run, and who is at fault: one line, or for
// a host that cannot run the VM vmm's report (each failed check with its
// fix).
type Error struct {
	Kind Kind
	// FromVMM says Err is package vmm's (vmm.CheckHost, vmm.New) about
	// Request.VM: its *vmm.FieldError name vmm.Config fields, which a
	// caller may spell as its own flags.
	FromVMM bool
	Err     error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// errorf is an *Error of kind k.
func errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Err: fmt.Errorf(format, args...)}
}

// classify is err as an *Error: its own Kind when it is one, Host when
// the node is at fault (a vmm.PreflightError, a node set up for Slurm
// otherwise than its gres.conf says, a file others could have written in
// hpcvmm's trusted state), Input for a vmm.FieldError, else fallback.
func classify(err error, fallback Kind) *Error {
	var je *Error
	var pe *vmm.PreflightError
	var te *trustfs.Error
	var fe *vmm.FieldError
	switch {
	case errors.As(err, &je):
		return je
	case errors.As(err, &pe), errors.Is(err, slurm.ErrNodeSetup), errors.As(err, &te):
		return &Error{Kind: Host, Err: err}
	case errors.As(err, &fe):
		return &Error{Kind: Input, Err: err}
	}
	return &Error{Kind: fallback, Err: err}
}

// Run runs the job req describes until it ends: a nil error and how it
// ended, or an *Error when it could not run (nothing of the VM is left
// then). ctx done stops the VM hard (Result 125 unless COMMAND's status
// came first).
func Run(ctx context.Context, req Request) (Result, error) {
	r := &runner{req: req, cfg: req.VM, log: req.Log}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if req.PMI != nil {
		r.closers = append(r.closers, func() { req.PMI.Conn.Close() })
	}
	defer r.close()
	st, err := r.run(ctx)
	if err != nil {
		return Result{}, err
	}
	return Result{st}, nil
}

// runner is one Run's state: the VM's config as it is completed, the
// command's spec, what is open for it.
type runner struct {
	req  Request
	cfg  vmm.Config
	spec job.Spec
	log  *slog.Logger
	// modaliases are the passed-through devices' (deviceModaliases), read
	// once the host checks passed; driver the host driver's user space
	// opened for the job (jobDriver; nil: none).
	modaliases []string
	driver     *driverFiles
	// opened are the binds, withBinds whether the guest needs the 9P
	// client (binds or the driver's files), mountMSize and mountCache the
	// binds' 9P settings, checked.
	opened     []binds.Opened
	withBinds  bool
	mountMSize uint32
	mountCache string
	closers    []func()
	// pmemPath is the file mapped as the guest's image when it is not
	// IMAGE itself but its conversion (prepareConverted).
	pmemPath string
}

// close releases what the run opened, last first.
func (r *runner) close() {
	for i := len(r.closers) - 1; i >= 0; i-- {
		r.closers[i]()
	}
}

// run is Run's pipeline, in the order hpcvmm run has always checked: the
// request, the kernel, the user and binds, the host, the devices, IMAGE,
// then the job, its file server and the VM.
func (r *runner) run(ctx context.Context) (jobproto.Status, error) {
	if err := r.validate(); err != nil {
		return jobproto.Status{}, err
	}
	if err := defaultJobKernel(&r.cfg); err != nil {
		return jobproto.Status{}, &Error{Kind: Input, Err: err}
	}
	if err := r.userAndBinds(); err != nil {
		return jobproto.Status{}, &Error{Kind: Input, Err: err}
	}
	// What needs nothing but the host, before IMAGE is read: a host that
	// cannot run the VM (no usable KVM, too few hugepages) refuses in
	// milliseconds, with nothing read of IMAGE and nothing cached.
	if err := vmm.CheckHost(jobConfig(r.cfg)); err != nil {
		e := classify(err, VMFailed)
		e.FromVMM = true
		return jobproto.Status{}, e
	}
	if err := r.devices(); err != nil {
		return jobproto.Status{}, classify(err, Input)
	}
	if r.req.Image != "" {
		err := r.prepareImage(ctx, checkBindsInImage(r.opened))
		r.closers = append(r.closers, func() { closePMEMFile(r.cfg.PMEM.File) }) // vmm.New takes its own descriptor
		if err != nil {
			return jobproto.Status{}, err
		}
	}
	return r.boot(ctx)
}

// validate refuses a request that can never run, before anything else.
func (r *runner) validate() error {
	req := &r.req
	switch {
	case len(req.Argv) == 0 || req.Argv[0] == "":
		return errorf(Input, "no COMMAND: give Request.Argv")
	case req.Image != "" && req.VM.Initrd != "":
		return errorf(Input, "--rootfs and --initrd: give one (--rootfs IMAGE builds the initramfs; --initrd FILE must hold hpcvmm at %s)", agentPath)
	case req.Image == "" && req.VM.Initrd == "":
		return errorf(Input, "COMMAND needs its files: give --rootfs IMAGE")
	case req.Image == "" && len(req.Modules) > 0:
		return errorf(Input, "--module %s needs --rootfs IMAGE: hpcvmm puts the modules into the initramfs it builds (an --initrd of one's own lists its modules in %s)", req.Modules[0], initramfs.ModulesList)
	case req.Workdir != "" && !path.IsAbs(req.Workdir):
		return errorf(Input, "--workdir %q: not an absolute path in the guest: give one such as /work", req.Workdir)
	}
	for _, m := range req.Modules {
		if err := kmodules.ValidateName(m); err != nil {
			return errorf(Input, "--module: %v", err)
		}
	}
	r.spec = job.Spec{Argv: req.Argv, Env: req.Env, Workdir: req.Workdir, Hostname: req.Hostname,
		PMI: req.PMI != nil, Interfaces: req.Interfaces, DNS: req.DNS}
	if req.User != nil {
		r.spec.SetUser, r.spec.UID, r.spec.GID = true, req.User.UID, req.User.GID
	}
	if r.spec.Hostname == "" {
		r.spec.Hostname, _ = os.Hostname()
	}
	return nil
}

// userAndBinds settles whom COMMAND runs as and opens the binds.
func (r *runner) userAndBinds() error {
	opened, err := jobUserAndBinds(r, r.cfg.ActingFor)
	if err != nil {
		return err
	}
	r.opened = opened
	r.closers = append(r.closers, func() { binds.Close(opened) })
	return nil
}

// boot starts the job: its ports, the binds' file server, the VM; then
// runs it to its end.
func (r *runner) boot(ctx context.Context) (jobproto.Status, error) {
	term := openTerminal(r.req.Stdin)
	if term != nil {
		r.spec.TTY = true
		r.spec.Rows, r.spec.Cols = TerminalSize(r.req.Stdout)
	}
	r.spec.Mounts = append(binds.Mounts(r.opened, r.mountMSize, r.mountCache), r.driver.mounts(len(r.opened), r.mountMSize, r.mountCache)...)
	j, err := job.New(r.spec, job.Streams{Stdin: r.req.Stdin, Stdout: r.req.Stdout, Stderr: r.req.Stderr},
		job.Options{ShutdownTimeout: r.req.ShutdownTimeout, Log: r.log})
	if err != nil {
		return jobproto.Status{}, &Error{Kind: Input, Err: err}
	}
	cfg, watch := r.vmConfig(j)
	if r.req.PMI != nil {
		cfg.ConsolePorts = append(cfg.ConsolePorts, pmiPorts(r.req.PMI, r.log)...)
	}
	server, err := serveJobBinds(r.opened, r.driver.sets(), r.mountMSize, r.req.Agent, r.cfg.ActingFor, r.cfg.Seccomp, r.req.Progress, r.log)
	if err != nil {
		return jobproto.Status{}, &Error{Kind: VMFailed, Err: err}
	}
	defer server.Close()
	cfg.ConsolePorts = append(cfg.ConsolePorts, server.Ports...)

	vm, err := vmm.New(cfg)
	if err != nil {
		e := classify(err, VMFailed)
		e.FromVMM = true
		return jobproto.Status{}, e
	}
	defer vm.Close()

	if r.req.RelaySignals {
		defer relayJobSignals(j, r.req.Stdout, term != nil, r.log)()
	}
	if term != nil {
		// Raw mode: keys (Ctrl-C included) go to the guest's pty, whose
		// line discipline interprets them as a local terminal would.
		defer term.makeRaw()()
	}
	st := j.Run(ctx, vm)
	if err := vm.Close(); err != nil {
		r.log.Warn("releasing the VM", "err", err)
	}
	if st.Failure == jobproto.FailAgent && st.Reason == job.ReasonNoStatus && watch.Last() != "" {
		st.Reason = "the guest ended without the command's status: " + watch.Last()
	}
	if st.Failure == 0 {
		r.log.Debug("job: ended", "status", st.String())
	}
	return st, nil
}

// vmConfig is the job's VM: jobConfig's, its console, progress and log,
// the job's ports; watch sees the kernel's console.
func (r *runner) vmConfig(j *job.Job) (cfg vmm.Config, watch *consoleWatch) {
	cfg = jobConfig(r.cfg)
	cfg.Stdin = nil
	out := r.req.Console
	if out == nil {
		out = io.Discard
	}
	watch = &consoleWatch{w: out}
	cfg.Stdout = watch // the kernel's console, never COMMAND's stdout
	cfg.Progress = r.req.Progress
	cfg.Logger = r.log
	if cfg.StartTime.IsZero() {
		cfg.StartTime = time.Now()
	}
	cfg.ConsolePorts = j.Ports()
	return cfg, watch
}

// devices reads the passed-through devices' modaliases (for the
// initramfs's modules) and counts the NVIDIA GPUs among them, whose device
// nodes the agent makes (a guest without the driver fails the job with the
// reason), and opens the host driver's user space for them (jobDriver;
// the 9P client is then in the initramfs).
func (r *runner) devices() error {
	var err error
	if r.modaliases, err = deviceModaliases(&r.cfg); err != nil {
		return err
	}
	r.spec.GPUs = uint32(gpudriver.GPUs(r.modaliases))
	find := gpudriver.Options{Root: r.req.DriverRoot, Cache: r.req.DriverCache}
	if r.driver, err = jobDriver(r.req.GPULibs, r.req.Image != "", find, &r.spec, len(r.opened), r.log); err != nil {
		return err
	}
	r.closers = append(r.closers, r.driver.Close)
	r.withBinds = r.withBinds || r.driver != nil
	return nil
}

// jobConfig is a job's VM: the caller's with the job's command line and
// its streams on virtio-console ports.
func jobConfig(cfg vmm.Config) vmm.Config {
	cfg.Cmdline = jobCmdline(cfg.Cmdline)
	cfg.Console = vmm.ConsoleVirtio // the ports are virtio-console ports
	return cfg
}

// pmiPorts are the two ports that relay srun's PMI socket into the guest.
func pmiPorts(step *pmi.Step, log *slog.Logger) []console.Port {
	log.Info("PMI: relaying srun's PMI socket into the guest", "pmi_fd", os.Getenv(pmi.FDVar), "ports", pmi.PortIn+","+pmi.PortOut)
	return []console.Port{
		{Name: pmi.PortIn, FromHost: step.Conn},
		{Name: pmi.PortOut, ToHost: pmi.SocketWriter{File: step.Conn}},
	}
}
