package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// portTimeout bounds the wait for the job's ports to appear.
const portTimeout = 20 * time.Second

// Main is the agent as the guest's PID 1. It never returns: it powers the
// guest off (falling back to a reboot, which hpcvmm's reboot=k command
// line also turns into the end of the VM).
func Main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "hpcvmm-agent:", ErrNotPID1)
		os.Exit(125)
	}
	if err := pid1(); err != nil {
		fmt.Fprintln(os.Stderr, "hpcvmm-agent:", err)
	}
	unix.Sync()
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	select {}
}

// pid1 sets the guest up and serves the job; its error is for the console.
func pid1() error {
	warn, err := doMounts(baseMounts)
	if err != nil {
		return err
	}
	useConsole()
	var warnings []string
	if warn != nil {
		warnings = append(warnings, warn.Error())
	}
	if err := loadModules(ModulesList); err != nil {
		warnings = append(warnings, err.Error())
	}
	// IMAGE as persistent memory (hpcvmm.pmem= on the command line):
	// after the modules (nd_e820, nd_pmem, squashfs or erofs, overlay),
	// before the ports, so the job runs in IMAGE's tree.
	if err := pmemRootFromCmdline(sysRootSwitch(), "/proc/cmdline"); err != nil {
		for _, w := range warnings {
			fmt.Fprintln(os.Stderr, "hpcvmm-agent:", w)
		}
		return fmt.Errorf("cannot switch to IMAGE: %w", err)
	}
	names := []string{jobproto.PortControl, jobproto.PortStdin, jobproto.PortStdout, jobproto.PortStderr}
	ports, err := FindPorts("/sys", "/dev", names, portTimeout)
	if err != nil {
		for _, w := range warnings {
			fmt.Fprintln(os.Stderr, "hpcvmm-agent:", w)
		}
		return fmt.Errorf("cannot reach hpcvmm: %w", err)
	}
	control, err := os.OpenFile(ports[jobproto.PortControl], os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cannot reach hpcvmm: opening the control port: %w", err)
	}
	stdin, err1 := os.OpenFile(ports[jobproto.PortStdin], os.O_RDONLY, 0)
	stdout, err2 := os.OpenFile(ports[jobproto.PortStdout], os.O_WRONLY, 0)
	stderr, err3 := os.OpenFile(ports[jobproto.PortStderr], os.O_WRONLY, 0)
	for _, e := range []error{err1, err2, err3} {
		if e != nil {
			return fmt.Errorf("cannot reach hpcvmm: opening a stream port: %w", e)
		}
	}
	press := make(chan struct{}, 1)
	watchPowerButton("/dev", press)
	a := &Agent{
		Root: "/", Control: control, Stdin: stdin, Stdout: stdout, Stderr: stderr,
		Waiter: SysWaiter{}, PID1: true, PowerButton: press, Prepare: prepare,
		OpenPMI: openPMIPorts, OpenPort: openPort, Mount: mountAt, Unmount: unmountAt,
		MakeGPUNodes: GPUNodes{Root: "/", Mknod: unix.Mknod}.Make,
	}
	for _, w := range warnings {
		a.Logf("%s", w)
	}
	return a.Serve()
}

// openPort opens a named port for reading and writing (as PID 1).
func openPort(name string) (*os.File, error) {
	ports, err := FindPorts("/sys", "/dev", []string{name}, portTimeout)
	if err != nil {
		return nil, err
	}
	return os.OpenFile(ports[name], os.O_RDWR, 0)
}

// mountAt mounts a file system, creating its target in the guest's tree.
func mountAt(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	return unix.Mount(source, target, fstype, flags, data)
}

func unmountAt(target string) error { return unix.Unmount(target, 0) }

// useConsole points the agent's own stdin/stdout/stderr at /dev/console
// (the serial console), whatever the kernel gave init: its messages are
// what a user sees when the host cannot be reached.
func useConsole() {
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	for _, to := range []int{0, 1, 2} {
		if fd != to {
			_ = unix.Dup3(fd, to, 0)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// prepare applies the spec's system settings as PID 1.
func prepare(s *jobproto.Start) error {
	if s.Hostname != "" {
		if err := unix.Sethostname([]byte(s.Hostname)); err != nil {
			return fmt.Errorf("setting the hostname %q: %w", s.Hostname, err)
		}
		// Programs (MPI launchers among them) resolve their own name.
		_ = appendLine("/etc/hosts", "127.0.1.1\t"+s.Hostname)
	}
	if warn, err := doMounts(hugeMounts(hugePageSizes(s.HugePageSizes))); err != nil || warn != nil {
		return fmt.Errorf("hugetlbfs: %w", firstErr(err, warn))
	}
	// Always, also without interfaces: it brings lo up, which anything
	// that talks to localhost needs (an Open MPI singleton finds no
	// network interface without it).
	if err := configureNetwork(s); err != nil {
		return err
	}
	return nil
}

func firstErr(errs ...error) error {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

func appendLine(path, line string) error {
	if err := os.MkdirAll("/etc", 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = io.WriteString(f, line+"\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// hugePageSizes are the spec's page sizes and those the guest kernel has
// pages of (/sys/kernel/mm/hugepages/hugepages-SIZEkB/nr_hugepages > 0,
// from hugepages= on its command line), each once.
func hugePageSizes(spec []uint64) []uint64 {
	sizes := append([]uint64(nil), spec...)
	dirs, _ := filepath.Glob("/sys/kernel/mm/hugepages/hugepages-*kB")
	for _, d := range dirs {
		var kb uint64
		if _, err := fmt.Sscanf(filepath.Base(d), "hugepages-%dkB", &kb); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, "nr_hugepages"))
		if err != nil || strings.TrimSpace(string(b)) == "0" || slices.Contains(sizes, kb<<10) {
			continue
		}
		sizes = append(sizes, kb<<10)
	}
	return sizes
}
