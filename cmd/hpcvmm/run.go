package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// runFlags are the flags of `hpcvmm run`, parsed into a vmm.Config.
type runFlags struct {
	cfg       vmm.Config
	memory    string
	hugepages string
	numaNode  string
	cpuList   string
	console   string
	logLevel  string
}

func newRunFlagSet(stderr io.Writer) (*flag.FlagSet, *runFlags) {
	f := &runFlags{cfg: vmm.DefaultConfig()}
	fs := flag.NewFlagSet("hpcvmm run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&f.cfg.Kernel, "kernel", "", "bzImage to boot (e.g. /boot/vmlinuz-...)")
	fs.StringVar(&f.cfg.Initrd, "initrd", "", "initramfs to load")
	fs.StringVar(&f.cfg.Cmdline, "cmdline", "", "kernel command line (default: "+defaultCmdline(vmm.ConsoleVirtio)+" with --console virtio, "+defaultCmdline(vmm.ConsoleSerial)+" otherwise)")
	fs.IntVar(&f.cfg.CPUs, "cpus", 1, "number of vCPUs")
	fs.StringVar(&f.memory, "memory", "1G", "guest RAM (K/M/G/T suffixes)")
	fs.StringVar(&f.hugepages, "hugepages", "1G", "page size backing guest RAM: 1G, 2M or none (4 KiB, development only)")
	fs.StringVar(&f.numaNode, "numa-node", "auto", "host NUMA node for guest RAM and vCPUs (default: node of the first passthrough device, else the node with the most free hugepages)")
	fs.StringVar(&f.cpuList, "cpu-list", "", "exact host CPUs for the vCPUs, e.g. 4-7 or 4,6,8")
	fs.BoolVar(&f.cfg.AllowCrossNUMA, "allow-cross-numa", false, "allow a --cpu-list that spans NUMA nodes")
	fs.StringVar(&f.console, "console", "virtio", "interactive console: virtio (guest hvc0), serial (guest ttyS0) or none; the UART always prints early boot messages")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	addPassthroughFlags(fs, &f.cfg.Passthrough)
	fs.Func("net", "virtio-net interface on a host TAP (repeatable): tap=NAME[,mac=MAC][,queues=N][,vhost=on|off]; a missing TAP is created and removed on exit", func(s string) error {
		n, err := parseNet(s)
		if err != nil {
			return err
		}
		f.cfg.Nets = append(f.cfg.Nets, n)
		return nil
	})
	return fs, f
}

// toConfig converts the string flags; each error names the flag.
func (f *runFlags) toConfig() (vmm.Config, error) {
	cfg := f.cfg
	var errs []error
	mem, err := guestmem.ParseSize(f.memory)
	if err != nil {
		errs = append(errs, fmt.Errorf("--memory: %w", err))
	}
	cfg.Memory = mem
	if cfg.HugePages, err = guestmem.ParsePageSize(f.hugepages); err != nil {
		errs = append(errs, fmt.Errorf("--hugepages: %w", err))
	}
	if f.numaNode == "auto" || f.numaNode == "" {
		cfg.NUMANode = vmm.NUMANodeAuto
	} else if n, err := strconv.Atoi(f.numaNode); err != nil || n < 0 {
		errs = append(errs, fmt.Errorf("--numa-node %q: want a node number or auto", f.numaNode))
	} else {
		cfg.NUMANode = n
	}
	if f.cpuList != "" {
		if cfg.CPUList, err = host.ParseCPUList(f.cpuList); err != nil {
			errs = append(errs, fmt.Errorf("--cpu-list: %w", err))
		}
	}
	cfg.Console = vmm.ConsoleKind(f.console)
	if cfg.Cmdline == "" {
		cfg.Cmdline = defaultCmdline(cfg.Console)
	}
	return cfg, errors.Join(errs...)
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
// errors read as CLI errors.
var flagNames = map[string]string{
	"Kernel": "--kernel", "Initrd": "--initrd", "CPUs": "--cpus", "Memory": "--memory",
	"HugePages": "--hugepages", "NUMANode": "--numa-node", "CPUList": "--cpu-list", "Console": "--console",
	"Passthrough": "passthrough",
	"Nets":        "--net",
}

// parseNet parses one --net value: tap=NAME[,mac=MAC][,queues=N][,vhost=on|off].
// The values themselves are checked by vmm.Config.Validate.
func parseNet(s string) (vmm.NetConfig, error) {
	var n vmm.NetConfig
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return n, fmt.Errorf("%q: want key=value pairs, e.g. tap=tap0,queues=2", kv)
		}
		if seen[k] {
			return n, fmt.Errorf("%q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "tap":
			n.TAP = v
		case "mac":
			n.MAC = v
		case "queues":
			q, err := strconv.Atoi(v)
			if err != nil || q < 1 {
				return n, fmt.Errorf("queues=%s: want a number of queue pairs, at least 1", v)
			}
			n.Queues = q
		case "vhost":
			if v != vmm.VhostOn && v != vmm.VhostOff {
				return n, fmt.Errorf("vhost=%s: want on or off", v)
			}
			n.Vhost = v
		default:
			return n, fmt.Errorf("unknown key %q: use tap, mac, queues or vhost", k)
		}
	}
	if n.TAP == "" {
		return n, fmt.Errorf("%q: no tap=NAME", s)
	}
	return n, nil
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
	return strings.Join(msgs, "\nhpcvmm: ")
}

func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	err := l.UnmarshalText([]byte(s))
	if err != nil {
		return l, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

func runRun(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs, f := newRunFlagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hpcvmm run: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	level, err := parseLevel(f.logLevel)
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm:", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	cfg, err := f.toConfig()
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm:", describeError(err))
		return 2
	}
	cfg.Logger = log
	cfg.Stdout = stdout
	cfg.Progress = stderr
	cfg.StartTime = processStart

	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	go func() {
		if s, ok := <-sigs; ok {
			cancel(fmt.Errorf("received %v", s))
		}
	}()

	if cfg.Console == vmm.ConsoleSerial || cfg.Console == vmm.ConsoleVirtio {
		in, restore := consoleInput(stdin, func() { cancel(errors.New("console escape Ctrl-A x")) }, log)
		defer restore()
		cfg.Stdin = in
		cfg.ConsoleRows, cfg.ConsoleCols = terminalSize(stdout)
	}

	vm, err := vmm.New(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm:", describeError(err))
		if errors.As(err, new(*vmm.FieldError)) || errors.As(err, new(*vmm.PreflightError)) {
			return 2
		}
		return 1
	}
	if cfg.Console == vmm.ConsoleVirtio {
		stopResize := forwardResizes(stdout, vm)
		defer stopResize()
	}
	runErr := vm.Run(ctx)
	closeErr := vm.Close()
	if runErr != nil {
		fmt.Fprintln(stderr, "hpcvmm:", runErr)
		return 1
	}
	if closeErr != nil {
		fmt.Fprintln(stderr, "hpcvmm: releasing the VM:", closeErr)
		return 1
	}
	return 0
}

// consoleInput wires stdin to the guest console. When stdin is a terminal
// it is put in raw mode (restored by the returned func) so keys reach the
// guest unchanged; Ctrl-A x then stops the VM, as in QEMU.
func consoleInput(stdin io.Reader, escape func(), log *slog.Logger) (io.Reader, func()) {
	file, ok := stdin.(*os.File)
	if !ok {
		return stdin, func() {}
	}
	fd := int(file.Fd())
	saved, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return stdin, func() {} // not a terminal: pass bytes through
	}
	raw := *saved
	raw.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	raw.Oflag &^= unix.OPOST
	raw.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	raw.Cflag &^= unix.CSIZE | unix.PARENB
	raw.Cflag |= unix.CS8
	raw.Cc[unix.VMIN], raw.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &raw); err != nil {
		log.Warn("console: cannot switch the terminal to raw mode", "err", err)
		return stdin, func() {}
	}
	log.Info("console: terminal in raw mode; Ctrl-A x stops the VM")
	restore := func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, saved) }
	return &escapeReader{r: stdin, escape: escape}, restore
}

// escapeReader passes bytes through, watching for Ctrl-A x.
type escapeReader struct {
	r       io.Reader
	escape  func()
	pending bool // the previous byte was Ctrl-A
}

func (e *escapeReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	out := p[:0]
	for _, b := range p[:n] {
		switch {
		case e.pending && b == 'x':
			e.escape()
			return len(out), io.EOF
		case e.pending && b == 0x01:
			out = append(out, 0x01) // Ctrl-A Ctrl-A sends one Ctrl-A
			e.pending = false
			continue
		case e.pending:
			out = append(out, 0x01)
			e.pending = false
		case b == 0x01:
			e.pending = true
			continue
		}
		out = append(out, b)
	}
	return len(out), err
}

// terminalSize returns the rows and columns of out when it is a terminal,
// else zeros (unknown).
func terminalSize(out io.Writer) (rows, cols uint16) {
	f, ok := out.(*os.File)
	if !ok {
		return 0, 0
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return 0, 0
	}
	return ws.Row, ws.Col
}

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
