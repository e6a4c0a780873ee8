package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hpcvmm/hpcvmm/agent"
	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/binds"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/pmi"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// jobFlags are the flags of `hpcvmm run ... -- COMMAND` (docs/jobs.md).
type jobFlags struct {
	rootfs   string
	env      []string
	envFiles []string
	workdir  string
	user     string
	quiet    bool
	hostname string
	// initrdCache is the hidden --initramfs-cache: the initramfs cache
	// directory ("" the user's own, cachedir.Default), for tests.
	initrdCache string
	// modules are --module's names, normalized (kmodules.Normalize).
	modules []string
	// modaliases are the passed-through devices' (deviceModaliases),
	// read once the host checks passed.
	modaliases []string
	// gpuLibs is --gpu-libs (on, off), driver the host driver's user
	// space opened for the job (jobDriver; nil: none).
	gpuLibs string
	driver  *driverFiles
	bindFlags
}

// agentPath is where a job's initramfs holds hpcvmm as its agent.
const agentPath = initramfs.AgentPath

// addJobFlags defines the Job group of `hpcvmm run`.
func addJobFlags(c *command, rf *runFlags) {
	f := &rf.job
	g := c.group("Job")
	g.StringVar(&f.rootfs, "rootfs", "", "`IMAGE`: the job's files: a SquashFS, EROFS or Apptainer/Singularity SIF file (mapped read-only into the guest as persistent memory, never copied), or a directory, a tar archive (plain, gzip, zstd), an OCI image layout or a docker/podman save archive (hpcvmm builds and caches the initramfs of its tree); the initramfs holds hpcvmm's agent and the guest's modules. Not with --initrd")
	g.StringArrayVar(&f.env, "env", nil, "`KEY=VALUE`: COMMAND's environment (repeatable; KEY alone takes hpcvmm's value). PATH defaults to "+agent.DefaultPath)
	g.StringArrayVar(&f.envFiles, "env-file", nil, "`FILE`: KEY=VALUE lines for COMMAND's environment (# comments and blank lines skipped), before --env (repeatable)")
	g.StringVar(&f.workdir, "workdir", "", "`DIR`: COMMAND's working directory in the guest (default: the host's working directory when it is bound, else /)")
	g.StringVar(&f.user, "user", "", "`UID[:GID]`: run COMMAND as this numeric user and group (GID defaults to UID; default: hpcvmm's own user and groups, or the job's user when root runs hpcvmm for a Slurm job; root when root runs it for itself)")
	g.BoolVar(&f.quiet, "quiet", false, "print nothing of hpcvmm's own (no log, no guest console) on stderr: COMMAND's stderr and a one-line failure reason only")
	g.Func("dns", "`ADDRESS`: a name server for the job's /etc/resolv.conf in the guest (repeatable; default: with ip=dhcp the DHCP server's, else the host's /etc/resolv.conf name servers that are not loopback addresses)", func(s string) error {
		if net.ParseIP(s) == nil {
			return fmt.Errorf("%q: want an IP address", s)
		}
		rf.dns = append(rf.dns, s)
		return nil
	})
	g.StringVar(&f.hostname, "hostname", "", "`NAME`: the guest's hostname (default the host's, as for a job run directly)")
	g.Func("module", "`NAME`: a kernel module of the guest kernel's module tree (IMAGE's /lib/modules/RELEASE, else the host's) loaded with its dependencies before COMMAND: a file system client, rdma_rxe, ... (repeatable)", func(s string) error {
		if err := kmodules.ValidateName(s); err != nil {
			return err
		}
		if n := kmodules.Normalize(s); !slices.Contains(f.modules, n) {
			f.modules = append(f.modules, n)
		}
		return nil
	})
	g.Func("gpu-libs", "`on|off`: with an NVIDIA GPU passed through, the host driver's libraries and programs (of the loaded kernel module's version, as Apptainer's --nv gives them) read-only in the guest at "+jobproto.DriverLibDir+" and "+jobproto.DriverBinDir+", appended to COMMAND's LD_LIBRARY_PATH and PATH (default on; with --initrd only when on is given)", func(s string) error {
		if !slices.Contains(gpuLibsModes, s) {
			return fmt.Errorf("%q: give on or off", s)
		}
		f.gpuLibs = s
		return nil
	})
	addBindFlags(g, &f.bindFlags)
}

// jobCommand is COMMAND: the arguments after "--", nil when there are none
// (arguments before "--" are the caller's error to report).
func jobCommand(fs *pflag.FlagSet) []string {
	if fs.NArg() == 0 || fs.ArgsLenAtDash() != 0 {
		return nil
	}
	return fs.Args()
}

// jobEnv builds COMMAND's environment from --env-file and --env, in order.
// Each --env-file is opened with the rights of the user hpcvmm acts for
// (as; nil for itself).
func jobEnv(f *jobFlags, lookup func(string) (string, bool), as *asuser.User) ([]string, error) {
	var env []string
	add := func(kv, where string) error {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" || strings.ContainsAny(k, " \t\x00") || strings.Contains(v, "\x00") {
			return fmt.Errorf("%s %q: want KEY=VALUE with a KEY of no spaces", where, kv)
		}
		if !ok {
			hv, set := lookup(k)
			if !set {
				return nil // as docker does: KEY alone, unset on the host, is left out
			}
			v = hv
		}
		env = append(env, k+"="+v)
		return nil
	}
	for _, file := range f.envFiles {
		fh, err := asuser.Open(as, file)
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", file, errors.Unwrap(err))
		}
		s := bufio.NewScanner(fh)
		for n := 1; s.Scan(); n++ {
			line := strings.TrimSpace(s.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(line, fmt.Sprintf("--env-file %s line %d:", file, n)); err != nil {
				fh.Close()
				return nil, err
			}
		}
		err = s.Err()
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", file, err)
		}
	}
	for _, kv := range f.env {
		if err := add(kv, "--env"); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// parseUser parses --user UID[:GID].
func parseUser(s string) (uid, gid uint32, err error) {
	u, g, hasG := strings.Cut(s, ":")
	parse := func(v string) (uint32, error) {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("--user %s: %q is not a numeric id (names are not looked up: give UID[:GID] numbers)", s, v)
		}
		return uint32(n), nil
	}
	if uid, err = parse(u); err != nil {
		return 0, 0, err
	}
	gid = uid
	if hasG {
		if gid, err = parse(g); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

// hostKernel is the default kernel of a job: the host's own, so the guest
// runs the host's drivers (an HPC node's GPU and InfiniBand modules).
func hostKernel() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return "/boot/vmlinuz-" + unix.ByteSliceToString(u.Release[:]), nil
}

// jobCmdline is the kernel command line of a job: the serial console only
// (the kernel's messages go to hpcvmm's stderr), quiet (each console byte
// is an exit), the agent as init, and the guest's end ending the VM.
func jobCmdline(user string) string {
	if user == "" {
		return "console=ttyS0 quiet reboot=k panic=-1 rdinit=" + agentPath
	}
	if !strings.Contains(user, "rdinit=") {
		user += " rdinit=" + agentPath
	}
	return user
}

// runJob is `hpcvmm run ... -- COMMAND`: the VM runs COMMAND under the
// agent and hpcvmm exits with COMMAND's status.
func runJob(c *command, f *runFlags, jf *jobFlags, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(stderr, "hpcvmm run: "+format+"\n", args...)
		return code
	}
	if code := checkJobFiles(c, f, jf, stderr); code >= 0 {
		return code
	}
	spec, step, err := jobSpec(f, jf, argv)
	if err != nil {
		return fail(2, "%v", err)
	}

	logOut, consoleOut := jobStderr(stderr, jf.quiet)
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: f.logLevel}))

	acting := f.cfg.ActingFor
	opened, err := jobUserAndBinds(jf, &spec, acting, log)
	if err != nil {
		return fail(2, "%v", err)
	}
	defer binds.Close(opened)

	// What needs nothing but the host, before IMAGE is read: a host that
	// cannot run the VM (no usable KVM, too few hugepages) refuses in
	// milliseconds, with nothing read of IMAGE and nothing cached.
	if err := vmm.CheckHost(jobConfig(f.cfg)); err != nil {
		return fail(exitCode(err, jobproto.CodeAgentFailed), "%s", describeError(err))
	}

	if err := jobDevices(c, f, &spec, len(opened), log); err != nil {
		return fail(exitCode(err, 2), "%v", err)
	}
	defer jf.driver.Close()
	if jf.rootfs != "" {
		code := prepareImage(jf.rootfs, f, &spec, checkBindsInImage(opened), log, stderr)
		defer closePMEMFile(f.cfg.PMEM.File) // vmm.New takes its own descriptor
		if code >= 0 {
			return code
		}
	}

	in, isTerm := stdin.(*os.File)
	isTerm = isTerm && term.IsTerminal(int(in.Fd()))
	if isTerm {
		spec.TTY = true
		spec.Rows, spec.Cols = terminalSize(stdout)
	}
	spec.Mounts = append(binds.Mounts(opened, jf.mountMSize, jf.mountCache), jf.driver.mounts(len(opened), jf.mountMSize, jf.mountCache)...)
	j, err := job.New(spec, job.Streams{Stdin: stdin, Stdout: stdout, Stderr: stderr},
		job.Options{ShutdownTimeout: f.shutdownTimeout, Log: log})
	if err != nil {
		return fail(2, "%v", err)
	}

	cfg, watch := jobVMConfig(f.cfg, j, consoleOut, logOut, log)
	if step != nil {
		defer step.Conn.Close()
		cfg.ConsolePorts = append(cfg.ConsolePorts, pmiPorts(step, log)...)
	}

	server, err := serveJobBinds(opened, jf.driver.sets(), jf.mountMSize, acting, f.cfg.Seccomp, logOut, log)
	if err != nil {
		return fail(jobproto.CodeAgentFailed, "%v", err)
	}
	defer server.Close()
	cfg.ConsolePorts = append(cfg.ConsolePorts, server.Ports...)

	vm, err := vmm.New(cfg)
	if err != nil {
		return fail(exitCode(err, jobproto.CodeAgentFailed), "%s", describeError(err))
	}
	defer vm.Close()

	defer relayJobSignals(j, stdout, isTerm, log)()
	if isTerm {
		// Raw mode: keys (Ctrl-C included) go to the guest's pty, whose
		// line discipline interprets them as a local terminal would.
		if saved, err := term.MakeRaw(int(in.Fd())); err == nil {
			defer func() { _ = term.Restore(int(in.Fd()), saved) }()
		}
	}
	st := j.Run(context.Background(), vm)
	if err := vm.Close(); err != nil {
		log.Warn("releasing the VM", "err", err)
	}
	if st.Failure == jobproto.FailAgent && st.Reason == job.ReasonNoStatus && watch.Last() != "" {
		st.Reason = "the guest ended without the command's status: " + watch.Last()
	}
	if st.Failure != 0 {
		printJobReason(stderr, st.Reason)
	} else {
		log.Debug("job: ended", "status", st.String())
	}
	return st.ExitCode()
}

// jobDevices reads the passed-through devices' modaliases (for the
// initramfs's modules) and counts the NVIDIA GPUs among them, whose device
// nodes the agent makes (a guest without the driver fails the job with the
// reason), and opens the host driver's user space for them (jobDriver;
// the 9P client is then in the initramfs).
func jobDevices(c *command, f *runFlags, spec *job.Spec, nbinds int, log *slog.Logger) error {
	var err error
	if f.job.modaliases, err = deviceModaliases(f); err != nil {
		return err
	}
	spec.GPUs = uint32(gpudriver.GPUs(f.job.modaliases))
	if f.job.driver, err = jobDriver(&f.job, c.fs.Changed("gpu-libs"), spec, nbinds, log); err != nil {
		return err
	}
	f.job.withBinds = f.job.withBinds || f.job.driver != nil
	return nil
}

// jobVMConfig is the job's VM: jobConfig's, its output and log, the
// job's ports; watch sees the kernel's console.
func jobVMConfig(base vmm.Config, j *job.Job, consoleOut, logOut io.Writer, log *slog.Logger) (cfg vmm.Config, watch *consoleWatch) {
	cfg = jobConfig(base)
	cfg.Stdin = nil
	watch = &consoleWatch{w: consoleOut}
	cfg.Stdout = watch // the kernel's console, never COMMAND's stdout
	cfg.Progress = logOut
	cfg.Logger = log
	cfg.StartTime = processStart
	cfg.ConsolePorts = j.Ports()
	return cfg, watch
}

// jobConfig is a job's VM: the flags' with the job's command line and
// its streams on virtio-console ports.
func jobConfig(cfg vmm.Config) vmm.Config {
	cfg.Cmdline = jobCmdline(cfg.Cmdline)
	cfg.Console = vmm.ConsoleVirtio // the ports are virtio-console ports
	return cfg
}

// checkJobFiles refuses a job without its files (or with two sources of
// them) or with a --console it cannot have, and settles the kernel; a code
// >= 0 is the exit status.
func checkJobFiles(c *command, f *runFlags, jf *jobFlags, stderr io.Writer) int {
	if jf.rootfs != "" && f.cfg.Initrd != "" {
		return c.usageError(stderr, "--rootfs and --initrd: give one (--rootfs IMAGE builds the initramfs; --initrd FILE must hold hpcvmm at %s)", agentPath)
	}
	if jf.rootfs == "" && f.cfg.Initrd == "" {
		return c.usageError(stderr, "COMMAND needs its files: give --rootfs IMAGE")
	}
	if c.fs.Changed("console") && f.cfg.Console != vmm.ConsoleVirtio {
		// A job's streams are its own ports; the kernel's console goes
		// to stderr. Said rather than ignored (issue 35).
		return c.usageError(stderr, "--console %s: a job's stdin, stdout and stderr are COMMAND's (virtio-console ports) and the kernel's console goes to stderr (--quiet drops it): leave --console out", f.cfg.Console)
	}
	if jf.rootfs == "" && len(jf.modules) > 0 {
		return c.usageError(stderr, "--module %s needs --rootfs IMAGE: hpcvmm puts the modules into the initramfs it builds (an --initrd of one's own lists its modules in %s)", jf.modules[0], initramfs.ModulesList)
	}
	if err := defaultJobKernel(&f.cfg); err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
		return 2
	}
	return -1
}

// defaultJobKernel sets cfg.Kernel, when --kernel was not given, to the
// running kernel's image in /boot: a job boots the host's kernel unless
// told otherwise.
func defaultJobKernel(cfg *vmm.Config) error {
	if cfg.Kernel != "" {
		return nil
	}
	k, err := hostKernel()
	if err != nil {
		return fmt.Errorf("--kernel: none given and the running kernel's release is unknown (%v): pass --kernel", err)
	}
	if _, err := os.Stat(k); err != nil {
		return fmt.Errorf("--kernel: none given and the host's kernel %s is not readable (%v): pass --kernel", k, errors.Unwrap(err))
	}
	cfg.Kernel = k
	return nil
}

// jobSpec is the job.Spec of `hpcvmm run ... -- COMMAND` from the flags
// and the environment, and srun's PMI step when there is one; an error
// names the flag or variable at fault.
func jobSpec(f *runFlags, jf *jobFlags, argv []string) (job.Spec, *pmi.Step, error) {
	env, err := jobEnv(jf, os.LookupEnv, f.cfg.ActingFor)
	if err != nil {
		return job.Spec{}, nil, err
	}
	// Under srun, COMMAND learns its place in the job as a native task
	// does: every SLURM_* and PMI_* variable first, so --env-file and
	// --env override them; with srun --mpi=pmi2, PMI_FD's socket is
	// relayed into the guest (package pmi).
	step, err := pmi.FromEnv(os.Environ())
	if err != nil {
		return job.Spec{}, nil, err
	}
	env = append(pmi.JobEnv(os.Environ()), env...)
	if jf.workdir != "" && !path.IsAbs(jf.workdir) {
		return job.Spec{}, nil, fmt.Errorf("--workdir %q: not an absolute path in the guest: give one such as /work", jf.workdir)
	}
	spec := job.Spec{Argv: argv, Env: env, Workdir: jf.workdir, Hostname: jf.hostname, PMI: step != nil}
	if jf.user != "" {
		if spec.UID, spec.GID, err = parseUser(jf.user); err != nil {
			return job.Spec{}, nil, err
		}
		spec.SetUser = true
	}
	if spec.Hostname == "" {
		spec.Hostname, _ = os.Hostname()
	}
	for _, g := range f.guestNets {
		spec.Interfaces = append(spec.Interfaces, jobproto.Interface{MAC: g.MAC, Address: g.Address, Gateway: g.Gateway, DHCP: g.DHCP})
	}
	if len(f.cfg.Nets) > 0 {
		for _, s := range f.jobDNS() {
			ip := net.ParseIP(s)
			if ip4 := ip.To4(); ip4 != nil {
				ip = ip4
			}
			spec.DNS = append(spec.DNS, ip)
		}
	}
	return spec, step, nil
}

// pmiPorts are the two ports that relay srun's PMI socket into the guest.
func pmiPorts(step *pmi.Step, log *slog.Logger) []console.Port {
	log.Info("PMI: relaying srun's PMI socket into the guest", "pmi_fd", os.Getenv(pmi.FDVar), "ports", pmi.PortIn+","+pmi.PortOut)
	return []console.Port{
		{Name: pmi.PortIn, FromHost: step.Conn},
		{Name: pmi.PortOut, ToHost: pmi.SocketWriter{File: step.Conn}},
	}
}

// relayJobSignals passes the signals a job's COMMAND gets on to it
// (forwardJobSignals) until the returned func is called.
func relayJobSignals(j *job.Job, stdout io.Writer, isTerm bool, log *slog.Logger) (stop func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCONT, syscall.SIGWINCH)
	stopSignals := make(chan struct{})
	go forwardJobSignals(sigs, stopSignals, j, stdout, isTerm, log)
	return func() { signal.Stop(sigs); close(stopSignals) }
}

// forwardJobSignals passes the signals hpcvmm receives to the job's
// command until stop is closed; SIGWINCH becomes a resize of the command's
// terminal when it has one.
func forwardJobSignals(sigs <-chan os.Signal, stop <-chan struct{}, j *job.Job, stdout io.Writer, isTerm bool, log *slog.Logger) {
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				if r, c := terminalSize(stdout); r != 0 && isTerm {
					j.Resize(r, c)
				}
				continue
			}
			log.Debug("job: passing a signal to the command", "signal", s.String())
			j.Signal(s.(syscall.Signal))
		case <-stop:
			return
		}
	}
}

// prepareRootfs checks IMAGE and COMMAND before boot and returns the job's
// initramfs; a code >= 0 is the exit status to end with (its reason
// printed). A cached initramfs is looked up first: on a hit the checks read
// nothing of an archive or container IMAGE, and nothing is built.
func prepareRootfs(image string, f *runFlags, spec *job.Spec, check func(*rootfs.Image) error, log *slog.Logger, stderr io.Writer) (string, int) {
	im, err := rootfs.OpenAs(image, func(p string) (*os.File, error) {
		return asuser.OpenFile(f.cfg.ActingFor, p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	})
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: --rootfs %s: %s\n", image, imageError(image, err))
		return "", 2
	}
	defer im.Close()
	if err := check(im); err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
		return "", 2
	}
	t0 := time.Now()
	cfg, cfgErr := jobInitrdConfig(im, f)
	var hit *initramfs.Result
	if cfgErr == nil {
		if hit, err = initramfs.Lookup(cfg); err != nil {
			log.Debug("job: initramfs cache lookup", "err", err)
		}
	}
	path := agent.DefaultPath
	for _, kv := range agent.Env((*jobproto.Start)(spec)) {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	if _, err := im.LookPath(spec.Argv[0], path); err != nil && !f.job.driver.provides(spec.Argv[0]) {
		code := jobproto.CodeNotFound
		if errors.Is(err, rootfs.ErrNotExecutable) {
			code = jobproto.CodeNotExecutable
		} else if !errors.Is(err, rootfs.ErrNotFound) {
			code = 2
		}
		fmt.Fprintf(stderr, "hpcvmm run: --rootfs %s: %s\n", image, imageError(image, err))
		return "", code
	}
	if hit == nil {
		u, err := im.Usage()
		if err != nil {
			fmt.Fprintf(stderr, "hpcvmm run: --rootfs %s: %s\n", image, imageError(image, err))
			return "", 2
		}
		// Checked before the build, from IMAGE's index (the archive's
		// estimate counts names and synthesized parents too) and what the
		// build adds (the agent, the modules), so this minimum is the one
		// the build accepts.
		if cfgErr == nil {
			var a, m int64
			var err error
			cfg, err = adaptModules(cfg, f.job.modules, log, func(c initramfs.Config) (err error) {
				a, m, err = initramfs.Extra(c)
				return err
			})
			if err == nil {
				u.Archive, u.Memory = u.Archive+a, u.Memory+m
			} else {
				log.Debug("job: the initramfs's modules", "err", err) // the build says it again
			}
		}
		if err := initramfs.Fits(u.Archive, u.Memory, int64(f.cfg.Memory)); err != nil {
			fmt.Fprintf(stderr, "hpcvmm run: --rootfs %s: --memory: %v\n", image, err)
			return "", 2
		}
	}
	if cfgErr != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", cfgErr)
		return "", 2
	}
	res := hit
	if res == nil {
		if res, err = buildJobInitrd(cfg, f.job.modules, log); err != nil {
			var me *moduleError
			if errors.As(err, &me) {
				fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
				return "", 2
			}
			var de *deviceModuleError
			if errors.As(err, &de) {
				fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
				return "", de.exitCode()
			}
			fmt.Fprintf(stderr, "hpcvmm run: --rootfs %s: %s\n", image, imageError(image, err))
			return "", 125
		}
	}
	if err := checkModuleSource(res, f.job.modules, cfg.Release); err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
		return "", 2
	}
	if err := checkDeviceModuleSource(res, cfg); err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
		return "", exitCode(err, 2)
	}
	logInitrd(log, im, res, time.Since(t0))
	return res.Path, -1
}

// imageError is err about IMAGE without the package and IMAGE it names
// itself ("rootfs: image IMAGE: ", "initramfs: image IMAGE "): the line
// names --rootfs IMAGE once (issue 35: "--rootfs: rootfs: image").
func imageError(image string, err error) string {
	msg := err.Error()
	for _, p := range []string{"IMAGE " + image + ": ", "rootfs: image " + image + ": ", "rootfs: image " + image + " ", "initramfs: image " + image + ": ", "initramfs: image " + image + " "} {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			return rest
		}
	}
	return msg
}
