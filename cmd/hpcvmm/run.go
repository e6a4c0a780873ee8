package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/binds"
	"github.com/hpcvmm/hpcvmm/guestnet"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/vmlinux"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// runFlags are what `hpcvmm run`'s flags set: the vmm.Config (most flags
// write straight into it) and the CLI's own settings.
type runFlags struct {
	cfg             vmm.Config
	job             jobFlags
	logLevel        slog.Level
	shutdownTimeout time.Duration
	consoleRaw      bool
	// guestNets is the guest's half of each --net (in cfg.Nets' order)
	// and dns the --dns servers, for a job's spec (netflag.go).
	guestNets []guestnet.Interface
	dns       []string
}

// newRunCommand defines the flags of `hpcvmm run`, grouped as a user scans
// them: what the guest is, where it runs, what it gets, how to talk to it.
func newRunCommand() (*command, *runFlags) {
	f := &runFlags{cfg: vmm.DefaultConfig(), logLevel: slog.LevelInfo, shutdownTimeout: 30 * time.Second}
	c := newCommand("hpcvmm run",
		"Boot a Linux guest directly (no firmware): vCPUs pinned to the host CPUs of one NUMA node, "+
			"guest RAM on hugepages of that node, prefaulted before the guest starts, devices passed through VFIO.",
		"hpcvmm run [--kernel FILE] [--initrd FILE] [--cmdline TEXT] [--cpus N]",
		"[--kernel-decompress host|guest] [--kernel-cache DIR] [--kernel-cache-size SIZE]",
		"[--memory SIZE] [--hugepages 1G|2M|none]",
		"[--numa-node N|auto] [--cpu-list LIST] [--allow-cross-numa] [--prefault-workers N]",
		"[--cpu-mode dedicated|shared]",
		"[--gpu BDF[,clique=N]|slurm]... [--vf BDF|slurm[,IB-OPTIONS]]...",
		"[--bind-devices] [--p2p=false]",
		"[--net tap=NAME[,mac=MAC][,queues=N][,vhost=on|off][,bridge=BRIDGE]",
		"      [,ip=ADDRESS/PREFIX[+rank|+node]|dhcp][,gw=GATEWAY]]... [--nccl-topo FILE]",
		"[--console virtio|serial|none] [--log-level debug|info|warn|error]",
		"[--acpi on|off] [--topology host|flat] [--shutdown-timeout DURATION]",
		"[--seccomp on|off|log]",
		"[--rootfs IMAGE] [--env KEY=VALUE]... [--env-file FILE]... [--workdir DIR]",
		"[--user UID[:GID]] [--quiet] [--dns ADDRESS]... [--hostname NAME]",
		"[-B|--bind SRC[:DST[:ro|rw]]]... [--no-home] [--no-cwd] [--contain]",
		"[-- COMMAND [ARG...]]")
	c.footer = runFooter + "\n\n" + exitHelp("run")
	// The command runs one VM and exits, so the filters are on by default
	// (the library's zero value is off: see vmm.SeccompOff).
	f.cfg.Seccomp = vmm.SeccompOn

	g := c.group("Guest")
	g.StringVar(&f.cfg.Kernel, "kernel", "", "`FILE`: the bzImage to boot (required without a job's COMMAND; a job boots the running kernel, /boot/vmlinuz-$(uname -r), by default): any distribution kernel, /boot/vmlinuz-*; boot protocol 2.06 or later; or an uncompressed x86-64 vmlinux ELF, entered at its ELF entry point")
	g.Var(decompressValue{&f.cfg.KernelDecompress}, "kernel-decompress", "where a bzImage's kernel is unpacked: host (once per bzImage, kept in --kernel-cache, entered at its 64-bit entry: the guest skips its decompressor, so in-guest KASLR is off and the kernel runs at its link addresses) or guest (the bzImage's own decompressor at every launch, with KASLR)")
	g.StringVar(&f.cfg.KernelCache, "kernel-cache", "", "`DIR`: where --kernel-decompress host keeps decompressed kernels, one file per bzImage SHA-256 with the content's SHA-256 checked on first use and whenever the file changed since (by inode, size and times); refused when writable by group or others (default "+vmlinux.DefaultCacheDir+" as root, else the user's own $XDG_CACHE_HOME/hpcvmm/kernels or ~/.cache/hpcvmm/kernels, 0700)")
	g.Var(int64SizeValue{&f.cfg.KernelCacheMax}, "kernel-cache-size", "bound of --kernel-cache, with a K, M or G suffix; the least recently used kernels are removed beyond it (default 1G)")
	g.StringVar(&f.cfg.Initrd, "initrd", "", "`FILE`: the initramfs to load")
	g.StringVar(&f.cfg.Cmdline, "cmdline", "", "`TEXT`: the kernel command line (default \""+defaultCmdline(vmm.ConsoleVirtio)+"\"; without console=hvc0 unless --console virtio); reboot=k makes a guest reboot end the VM")
	g.IntVar(&f.cfg.CPUs, "cpus", f.cfg.CPUs, "`N`: vCPUs, each a host thread pinned to one host CPU")
	g.Var(sizeValue{&f.cfg.Memory}, "memory", "guest RAM, with a K, M, G or T suffix; a multiple of the page size")
	g.Var(pageSizeValue{&f.cfg.HugePages}, "hugepages", "page size backing guest RAM: 1G, 2M, or none (4 KiB pages, development only)")
	g.Var(onOffValue{p: &f.cfg.NoACPI, invert: true}, "acpi", "on: ACPI tables (MADT, MCFG for the full 4 KiB config space, SRAT/SLIT, power button); off: an MP table only, for kernels without ACPI (at most 254 vCPUs, flat topology)")

	g = c.group("Placement")
	g.Var(nodeValue{&f.cfg.NUMANode}, "numa-node", "host NUMA node for guest RAM and vCPUs; auto: the first passthrough device's node, else the node with the most free hugepages")
	g.Var(cpuListValue{&f.cfg.CPUList}, "cpu-list", "exact host CPUs for the vCPUs, e.g. 4-7 or 4,6,8; vCPU i runs on the i-th (default: the node's CPUs)")
	g.BoolVar(&f.cfg.AllowCrossNUMA, "allow-cross-numa", false, "accept a --cpu-list that spans NUMA nodes")
	g.Var(cpuModeValue{&f.cfg.CPUMode}, "cpu-mode", "dedicated: each vCPU owns its host CPU, idle vCPUs keep it (HLT and PAUSE stay in the guest, KVM_HINTS_REALTIME, no halt polling), refused without a free host CPU per vCPU; shared: idle vCPUs exit to the host; auto (default): dedicated when every vCPU has a host CPU of its own. Without --cpu-list each VM claims the node CPUs it pins (/run/hpcvmm/cpus) and the next VM takes the free ones")
	g.IntVar(&f.cfg.PrefaultWorkers, "prefault-workers", 0, "`N`: threads that fault guest RAM in before the guest starts, each pinned to a CPU of the guest's node (default 0: all of the node's CPUs this process may use, since no vCPU runs yet); the kernel's clearing of the pages is the work, so fewer workers only make start-up slower")
	g.Var(topologyValue{&f.cfg.Topology}, "topology", "host: vCPUs on SMT siblings are threads of one guest core, vCPUs on cores sharing an L3 share one in the guest, passthrough devices that share a PCIe switch on the host sit behind one emulated switch, the others behind their own root ports; flat: single-thread cores in one package, devices on bus 0")

	g = c.group("Devices")
	addPassthroughFlags(g, &f.cfg.Passthrough)
	g.Func("net", "`tap=NAME[,KEY=VALUE]...`: virtio-net on a host TAP, created if absent and removed afterwards; kernel vhost-net when available; keys: mac=MAC, queues=N, vhost=on|off, bridge=BRIDGE (attach the TAP hpcvmm creates to this existing bridge), ip=ADDRESS/PREFIX|dhcp and gw=GATEWAY (a job's interface in the guest; ADDRESS/PREFIX+rank adds SLURM_PROCID, +node SLURM_NODEID) (repeatable)", func(s string) error {
		n, g, err := parseNet(s, os.Getenv)
		if err != nil {
			return err
		}
		f.cfg.Nets = append(f.cfg.Nets, n)
		f.guestNets = append(f.guestNets, g)
		return nil
	})

	g.StringVar(&f.cfg.NCCLTopoFile, "nccl-topo", "", "`FILE`: write the guest's PCI tree of the passthrough devices as an NCCL topology file (NCCL_TOPO_FILE), with the guest's bus IDs")

	g = c.group("Console and logging")
	g.Var(consoleValue{&f.cfg.Console}, "console", "where stdin/stdout go: virtio (guest /dev/hvc0), serial (the 16550 UART, guest ttyS0) or none; the UART always prints early boot messages")
	g.Var(levelValue{&f.logLevel}, "log-level", "`LEVEL`: debug, info, warn or error (debug adds the start-up timeline: each setup step's start and duration)")
	g.Var(seccompValue{&f.cfg.Seccomp}, "seccomp", "on: every thread under a syscall allow-list from before the first KVM_RUN, a syscall outside it kills hpcvmm with SIGSYS (dmesg names it); log: let it run and log it; off: no filter, for debugging")
	g.DurationVar(&f.shutdownTimeout, "shutdown-timeout", f.shutdownTimeout, "`DURATION`: after SIGTERM/SIGINT, how long the guest has to power off after the ACPI power button before it is stopped hard")

	addJobFlags(c, f)

	c.hidden(func(fs *pflag.FlagSet) {
		fs.StringVar(&f.cfg.SysfsRoot, "sysfs", "", "sysfs root (tests)")
		fs.StringVar(&f.cfg.ProcfsRoot, "procfs", "", "procfs root (tests)")
		// Hidden only until docs/running.md's flag table (TestREADMEMatchesRunFlags)
		// lists it: then it belongs in "Console and logging".
		fs.BoolVar(&f.consoleRaw, "console-raw", false, "pass the guest's console output to a terminal unfiltered; by default terminal control sequences that could harm the terminal (title and clipboard sets, status reports, mode switches) are dropped (docs/hardening.md)")
		fs.StringVar(&f.cfg.RunDir, "run-dir", "", "run directory of the CPU claims (tests; default /run/hpcvmm)")
		fs.Var(apicIDsValue{&f.cfg.APICIDs}, "apic-ids", "APIC ID of each vCPU, e.g. 0,256 (tests of x2APIC-only IDs)")
		addBindTuningFlags(fs, &f.job.bindFlags)
		fs.StringVar(&f.job.initrdCache, "initramfs-cache", "", "initramfs cache directory (tests; default the user's own)")
		fs.StringVar(&f.job.imageCache, "image-cache", "", "converted-image cache directory (tests; default the user's own)")
	})
	return c.done(), f
}

// runFooter is the end of `hpcvmm run --help` before the exit statuses
// (exitTable): Slurm, the console keys, signals and jobs.
const runFooter = `Under Slurm (srun/sbatch; SLURM_JOB_ID set): --gpu slurm and --vf slurm take the
step's gpu and nic GRES (SLURM_STEP_GPUS/SLURM_JOB_GPUS indices and
SLURM_STEP_NICS/SLURM_JOB_NICS device numbers, mapped through gres.conf's
File=/dev/vfio/<group>); without --cpu-list the vCPUs go on the step's CPUs
(sched_getaffinity) on the VM's NUMA node and --cpus defaults to their number;
without --memory guest RAM is SLURM_MEM_PER_NODE (or SLURM_MEM_PER_CPU x the
job's CPUs on the node; after a bare srun, squeue --json's memory_per_node/cpu) less
5% and 256 MiB kept for hpcvmm. See docs/slurm.md.

InfiniBand VF options (IB-OPTIONS): node-guid=GUID,port-guid=GUID[,link=auto|
enable|disable], or guid=auto (GUIDs derived from the Slurm cluster, job, node
and VF); set on the PF's IPoIB netdev before the VF is reset and restored when
the VM ends (journaled; hpcvmm unbind restores them after a crash).

On a terminal, stdin is put in raw mode: Ctrl-A x stops the VM, Ctrl-A Ctrl-A
sends one Ctrl-A. The first SIGINT or SIGTERM presses the guest's ACPI power
button and waits --shutdown-timeout for it to power off (exit status 0); a
second signal, the timeout, or a guest without ACPI stops the VM hard
(exit status 1). Either way everything the VM held is released.

A job (hpcvmm run [FLAGS] --rootfs IMAGE -- COMMAND [ARG...]) runs COMMAND in
the VM under hpcvmm's agent: COMMAND's stdout is hpcvmm's stdout, its stderr
and stdin hpcvmm's; SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and
SIGCONT go to it; after the first SIGTERM it has --shutdown-timeout before the
power button, and the guest as long again before a hard stop. hpcvmm exits
with COMMAND's status (the table below). See docs/jobs.md.`

// toConfig completes the Config: the command line's default follows the
// console.
func (f *runFlags) toConfig() vmm.Config {
	cfg := f.cfg
	if cfg.Cmdline == "" {
		cfg.Cmdline = defaultCmdline(cfg.Console)
	}
	return cfg
}

// defaultCmdline is the kernel command line when --cmdline is not given:
// early messages on the UART, the interactive console where --console puts
// it, and a guest reboot (or panic) ending the VM.
func defaultCmdline(c vmm.ConsoleKind) string {
	if c == vmm.ConsoleVirtio {
		return "console=ttyS0 console=hvc0 reboot=k panic=-1"
	}
	return "console=ttyS0 reboot=k panic=-1"
}

// flagNames maps vmm.Config fields to the flags that set them, so library
// errors (a vmm.FieldError names the Config field, never a flag) read as
// CLI errors. TestFlagNamesCoverConfig keeps it complete.
var flagNames = map[string]string{
	"Kernel": "--kernel", "KernelDecompress": "--kernel-decompress", "KernelCache": "--kernel-cache",
	"KernelCacheMax": "--kernel-cache-size", "Initrd": "--initrd", "Cmdline": "--cmdline", "CPUs": "--cpus", "Memory": "--memory",
	"HugePages": "--hugepages", "NUMANode": "--numa-node", "CPUList": "--cpu-list", "AllowCrossNUMA": "--allow-cross-numa",
	"Console": "--console", "PrefaultWorkers": "--prefault-workers",
	"Passthrough": "--gpu/--vf", "Seccomp": "--seccomp", "Nets": "--net", "NoACPI": "--acpi", "Topology": "--topology",
	"NCCLTopoFile": "--nccl-topo", "APICIDs": "--apic-ids", "SysfsRoot": "--sysfs", "ProcfsRoot": "--procfs",
	"CPUMode": "--cpu-mode", "RunDir": "--run-dir", "PMEM": "--rootfs",
}

func describeError(err error) string {
	var msgs []string
	var joined interface{ Unwrap() []error }
	errsList := []error{err}
	if errors.As(err, &joined) {
		errsList = joined.Unwrap()
	}
	for _, e := range errsList {
		var fe *vmm.FieldError
		if errors.As(e, &fe) {
			name := flagNames[fe.Field]
			if name == "" {
				name = fe.Field
			}
			msgs = append(msgs, name+": "+fe.Err.Error())
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return strings.Join(msgs, "\nhpcvmm run: ")
}

// setActingFor sets cfg.ActingFor: under Slurm as root (or setuid), every
// file the user named is opened with that user's rights (issue 30).
func setActingFor(cfg *vmm.Config, log *slog.Logger) error {
	acting, err := asuser.Acting(os.Getenv)
	if err != nil {
		return err
	}
	if cfg.ActingFor = acting; acting != nil {
		log.Debug("opening the files named on the command line as the job's user", "user", acting.String())
	}
	return nil
}

// runRun implements `hpcvmm run`: one VM from the flags (or a job's
// COMMAND after --, see runJob), run until the guest powers off, it fails or a
// signal stops it.
func runRun(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	c, f := newRunCommand()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return rc
	}
	argv := jobCommand(c.fs)
	if argv == nil {
		if rc := c.noArgs(stderr, "the kernel is given with --kernel; a job's COMMAND goes after --"); rc >= 0 {
			return rc
		}
	}
	logOut := stderr
	if f.job.quiet {
		logOut = io.Discard
	}
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: f.logLevel}))
	disableTHP(log)
	sysRoot := f.cfg.SysfsRoot
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	procRoot := f.cfg.ProcfsRoot
	if procRoot == "" {
		procRoot = "/proc"
	}
	env := &slurm.Env{Host: host.New(sysRoot, procRoot)}
	if err := applySlurm(&f.cfg, c.fs, env, slurm.AllowedCPUs, log); err != nil {
		fmt.Fprintln(stderr, "hpcvmm run:", err)
		return exitCode(err, exitInput) // 3 for a node whose gres.conf does not match it
	}
	if err := setActingFor(&f.cfg, log); err != nil {
		fmt.Fprintln(stderr, "hpcvmm run:", err)
		return exitInput
	}
	if argv != nil {
		return runJob(c, f, &f.job, argv, stdin, stdout, stderr)
	}
	if rc := refuseJobFlagsWithoutJob(c, &f.job, stderr); rc >= 0 {
		return rc
	}
	cfg := f.toConfig()
	cfg.Logger = log
	cfg.Stdout = consoleOutput(stdout, f.consoleRaw)
	cfg.Progress = stderr
	cfg.StartTime = processStart

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	built := make(chan powerButton, 1)
	go handleStopSignals(ctx, sigs, built, f.shutdownTimeout, cancel, log)

	termFD := -1
	if cfg.Console == vmm.ConsoleSerial || cfg.Console == vmm.ConsoleVirtio {
		in, fd := consoleInput(stdin, func() { cancel(errors.New("console escape Ctrl-A x")) })
		termFD = fd
		cfg.Stdin = in
		cfg.ConsoleRows, cfg.ConsoleCols = terminalSize(stdout)
	}

	vm, err := vmm.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm run:", describeError(err))
		return exitCode(err, exitFailed)
	}
	built <- vm
	if termFD >= 0 {
		restore := makeRaw(termFD, log)
		defer restore()
	}
	if cfg.Console == vmm.ConsoleVirtio {
		stopResize := forwardResizes(stdout, vm)
		defer stopResize()
	}
	// Once the VM is built the VMM allocates almost nothing (exits and
	// virtqueues allocate nothing), so a low GC target costs no CPU and
	// keeps what little it allocates (log lines, console bursts) from
	// growing the heap to the runtime's 4 MiB minimum before the first
	// collection: that would be resident memory beside every guest. GOGC
	// in the environment still wins.
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(runGCPercent)
	}
	runErr := vm.Run(ctx)
	closeErr := vm.Close()
	if runErr != nil {
		fmt.Fprintln(stderr, "hpcvmm run:", runErr)
		return exitFailed
	}
	if closeErr != nil {
		fmt.Fprintln(stderr, "hpcvmm run: releasing the VM:", closeErr)
		return exitFailed
	}
	return exitOK
}

// refuseJobFlagsWithoutJob refuses the Job group's flags that mean
// nothing without a COMMAND (-B, --module, --rootfs); a code >= 0 is the
// exit status.
func refuseJobFlagsWithoutJob(c *command, jf *jobFlags, stderr io.Writer) int {
	switch {
	case len(jf.binds) > 0:
		return refuseBindWithoutJob(c, jf.binds[0], stderr)
	case len(jf.modules) > 0:
		return c.usageError(stderr, "--module without a COMMAND: a job's initramfs (--rootfs IMAGE -- COMMAND) loads it")
	case jf.rootfs != "":
		return c.usageError(stderr, "--rootfs without a COMMAND: give it after --, e.g. hpcvmm run --rootfs %s -- /bin/sh", jf.rootfs)
	}
	return -1
}

// refuseBindWithoutJob is the error for --bind on a VM without a job's
// COMMAND. The old boolean spelling of --bind-devices lands here too
// (`--bind=true`, or `--bind --gpu ...`): the parser's error names the new
// flag.
func refuseBindWithoutJob(c *command, bind string, stderr io.Writer) int {
	if _, err := binds.Parse(bind, "/"); err != nil {
		return c.usageError(stderr, "%v", err)
	}
	return c.usageError(stderr, "--bind binds a host directory for a job's COMMAND: give it after --, e.g. hpcvmm run --rootfs IMAGE --bind %s -- /bin/sh", bind)
}

// disableTHP turns transparent hugepages off for the VMM's own memory.
// Where THP is "always" (Debian's kernels) every 2 MiB of the Go heap the
// VMM touches becomes a whole resident huge page: measured in the test
// bed, 3-5 MiB resident in the heap's mapping while the runtime's live
// heap was under 1 MiB. Guest RAM is hugetlb (or a shared memfd) and not
// affected. The flag holds for the process's later faults, so setting it
// before the VM is built is early enough.
func disableTHP(log *slog.Logger) {
	if err := unix.Prctl(unix.PR_SET_THP_DISABLE, 1, 0, 0, 0); err != nil {
		log.Debug("transparent hugepages stay on for the VMM's own memory", "err", err)
	}
}

// runGCPercent is the GC target while the VM runs: the heap may grow 25%
// over what is live between collections (the runtime's minimum heap goal
// scales with it, from 4 MiB at 100 to 1 MiB).
const runGCPercent = 25

// consoleInput returns what the guest console reads and, when stdin is a
// terminal, its descriptor (else -1) for makeRaw. On a terminal the bytes go
// through the Ctrl-A escape reader; anything else (a pipe, a file) passes
// unchanged, so scripted input may contain any byte.
func consoleInput(stdin io.Reader, escape func()) (in io.Reader, termFD int) {
	file, ok := stdin.(*os.File)
	if !ok || !term.IsTerminal(int(file.Fd())) {
		return stdin, -1
	}
	return &escapeReader{r: stdin, escape: escape}, int(file.Fd())
}

// makeRaw puts the terminal in raw mode, so every key (Ctrl-C included)
// reaches the guest unchanged, and returns the func that restores it. It is
// called only once the VM is built, so input rejected by vmm.New leaves the
// terminal as it was.
func makeRaw(fd int, log *slog.Logger) (restore func()) {
	saved, err := term.MakeRaw(fd)
	if err != nil {
		log.Warn("console: cannot switch the terminal to raw mode; keys are line-buffered and Ctrl-C stops hpcvmm", "err", err)
		return func() {}
	}
	log.Info("console: terminal in raw mode; Ctrl-A x stops the VM, Ctrl-A Ctrl-A sends Ctrl-A")
	return func() { _ = term.Restore(fd, saved) }
}

// ctrlA is the console escape key (as in QEMU and screen): Ctrl-A x stops
// the VM, Ctrl-A Ctrl-A sends one Ctrl-A, Ctrl-A before anything else is
// passed on with that byte.
const ctrlA = 0x01

// escapeReader passes terminal input through, watching for Ctrl-A x. A key
// arrives as one read of one or more bytes (an arrow key is three), and a
// Ctrl-A is held back until the next byte decides what it is, so one Read
// can have one byte more to give than it was handed: decoded bytes are
// therefore produced from input kept in its own buffer, never in place in
// the caller's, and only as many as fit.
type escapeReader struct {
	r       io.Reader
	escape  func()
	buf     []byte // read from r; in is its unconsumed part
	in      []byte
	err     error // r's error (or io.EOF after Ctrl-A x), returned once in is drained
	pending bool  // the last byte consumed was a Ctrl-A not yet passed on
}

func (e *escapeReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		w := 0
		for w < len(p) && len(e.in) > 0 {
			b := e.in[0]
			if !e.pending {
				e.in = e.in[1:]
				if b == ctrlA {
					e.pending = true
				} else {
					p[w] = b
					w++
				}
				continue
			}
			e.pending = false
			switch b {
			case 'x':
				e.in, e.err = nil, io.EOF
				e.escape()
			case ctrlA:
				e.in = e.in[1:]
				p[w] = ctrlA
				w++
			default:
				// The held Ctrl-A goes on; b is looked at again, as an
				// ordinary byte, in the next iteration.
				p[w] = ctrlA
				w++
			}
		}
		if w > 0 {
			return w, nil
		}
		if e.err != nil {
			if e.pending {
				// Input ended after a Ctrl-A: nothing can follow it.
				e.pending = false
				p[0] = ctrlA
				return 1, nil
			}
			return 0, e.err
		}
		if e.buf == nil {
			e.buf = make([]byte, max(len(p), 64))
		}
		n, err := e.r.Read(e.buf)
		e.in, e.err = e.buf[:n], err
		if n == 0 && err == nil {
			return 0, nil // let the caller decide whether to read again
		}
	}
}

// terminalSize returns the rows and columns of out when it is a terminal,
// else zeros (unknown): jobrun's, which a job's pty follows too.
var terminalSize = jobrun.TerminalSize

// forwardResizes passes terminal size changes (SIGWINCH) to the guest's
// virtio console until the returned func is called.
func forwardResizes(out io.Writer, vm *vmm.VM) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGWINCH)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				if r, c := terminalSize(out); r != 0 {
					vm.SetConsoleSize(r, c)
				}
			case <-done:
				return
			}
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// powerButton is the part of *vmm.VM a stop signal uses.
type powerButton interface {
	PressPowerButton() error
	Shutdown(ctx context.Context) error
}

// handleStopSignals turns SIGINT/SIGTERM into a clean shutdown: the first
// presses the guest's ACPI power button (once the VM is built) and gives the
// guest timeout to power off, logging as it counts down; a second signal or
// the timeout stops the VM hard through cancel, whose cause Run returns. A
// signal before the VM exists, or a guest without ACPI, stops it at once.
func handleStopSignals(ctx context.Context, sigs <-chan os.Signal, built <-chan powerButton, timeout time.Duration,
	cancel context.CancelCauseFunc, log *slog.Logger) {
	var first os.Signal
	select {
	case first = <-sigs:
	case <-ctx.Done():
		return
	}
	var vm powerButton
	select {
	case vm = <-built:
	default:
	}
	if vm == nil || timeout <= 0 {
		cancel(fmt.Errorf("received %v", first))
		return
	}
	log.Info("asking the guest to shut down (ACPI power button); a second signal stops it now",
		"signal", first.String(), "timeout", timeout)
	sctx, stop := context.WithTimeout(ctx, timeout)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- vm.Shutdown(sctx) }() // presses the button, then waits
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	deadline := time.Now().Add(timeout)
	for {
		select {
		case err := <-done:
			switch {
			case err == nil || ctx.Err() != nil:
			case sctx.Err() != nil:
				cancel(fmt.Errorf("the guest did not shut down within --shutdown-timeout %v after %v: stopped it", timeout, first))
			default: // no power button (--acpi=off)
				cancel(fmt.Errorf("received %v (%v)", first, err))
			}
			return
		case s := <-sigs:
			cancel(fmt.Errorf("received %v again while the guest was shutting down: stopped it", s))
			return
		case <-tick.C:
			log.Info("waiting for the guest to power off", "left", time.Until(deadline).Round(time.Second))
		}
	}
}
