package seccomp

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	libseccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// Kind is a kind of hpcvmm thread, with its own allow-list.
type Kind string

// The thread kinds. Go runs goroutines on whichever OS thread is free, so
// only a thread locked with runtime.LockOSThread for the rest of its life
// can carry a list of its own; every other thread, the Go runtime's
// included, runs under Process (see the package documentation).
const (
	// Process is the list every thread of the process runs under: the Go
	// runtime (GC workers, sysmon, the template thread, new Ms), the main
	// goroutine (waiting for the VM, signals, teardown), the device
	// goroutines (virtqueue workers, the console reader, the transport's
	// doorbell poller) and, stacked under VCPU, the vCPU threads.
	Process Kind = "process"
	// VCPU is the stricter list stacked on each vCPU thread: KVM_RUN and
	// the device emulation an exit runs on that thread.
	VCPU Kind = "vcpu"
)

// Mode is what a syscall outside the list does.
type Mode int

// The modes.
const (
	// Kill kills the whole process with SIGSYS (SECCOMP_RET_KILL_PROCESS)
	// before the syscall runs; the kernel logs it ("audit: type=1326 ...
	// syscall=N", in dmesg), and Name turns N into a name.
	Kill Mode = iota
	// Log lets the syscall run and has the kernel log it the same way
	// (SECCOMP_RET_LOG): how a new workload's missing syscalls are found
	// without killing it.
	Log
)

// lists are the allow-lists, most frequent first: the kernel runs the
// filter as a linear chain of comparisons when its per-syscall cache cannot
// decide (kernels before 5.11), so the hot syscalls (KVM_RUN's ioctl, the
// runtime's futex) come first. How each entry was found: the package
// documentation.
var lists = map[Kind][]string{
	Process: {
		// The VMM's own work: KVM, VFIO, vhost and TAP ioctls, eventfds,
		// virtqueue data to and from TAPs, VFIO config space, the
		// transport's doorbell poll, the console and log.
		// ioctl: only the requests in ioctlRequests (argRules).
		"ioctl", "futex", "read", "write", "readv", "writev", "pread64", "pwrite64",
		"poll", "ppoll", "epoll_pwait", "epoll_wait", "epoll_ctl", "epoll_create1", "eventfd2",
		// The Go runtime: scheduler and timers, memory, signals
		// (preemption is SIGURG by tgkill), new Ms (clone), exits.
		// mmap and mprotect without PROT_EXEC, kill and tgkill of this
		// process only (argRules).
		"nanosleep", "sched_yield", "clock_gettime", "gettimeofday", "getrandom",
		"mmap", "munmap", "madvise",
		"rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack",
		"getpid", "gettid", "tgkill", "kill",
		"clone", "exit", "exit_group",
		// A sleep (nanosleep, a timed futex or poll) that a signal
		// interrupted without running a handler on that thread resumes
		// through restart_syscall, which only continues the interrupted
		// call: without it a signal to hpcvmm at the wrong moment (srun's
		// SIGTERM to a job step) killed it with SIGSYS.
		"restart_syscall",
		// Naming a vCPU thread (PR_SET_NAME only, argRules).
		"prctl",
		"sched_getaffinity", "sched_setaffinity",
		// New Ms in a cgo-linked binary (the default `go build`: package
		// net links runtime/cgo) are made by glibc's pthread_create: its
		// stack and guard page, clone3, rseq and robust-list registration,
		// and malloc for the start arguments.
		"clone3", "mprotect", "rseq", "set_robust_list", "brk",
		// Files after setup: /proc and /sys reads (vhost worker placement,
		// the journal of rebound devices, /dev/vhost-net at DRIVER_OK),
		// the journal's removal at teardown, terminal state. openat only
		// without write, create, truncate or append flags (argRules):
		// what the run writes is opened before the filter (the sysfs
		// attributes the journal's restore writes: vmm's hostWriter).
		// No renameat or mkdirat: a rename would let a thread move a
		// file another user wrote over one root trusts.
		"openat", "close", "fstat", "newfstatat", "lseek", "getdents64", "fcntl",
		"readlinkat", "unlinkat", "fsync",
		// Requests on the sockets opened before the filter, and on no
		// other descriptor (argRules; left out of the filter when
		// InstallProcess names none): the rtnetlink socket through which
		// teardown restores the GUIDs and link state of InfiniBand VFs
		// (ibvf.Conn). A request on an open netlink socket is a sendto,
		// a recvfrom for each answer, and a getsockname for the port ID
		// the answers are matched against. socket, bind and connect stay
		// off the list: no thread can open a socket after setup.
		"sendto", "recvfrom", "getsockname",
		// Installing the stricter vCPU filters after this one: a filter
		// can only narrow what is allowed, so allowing seccomp(2) gives
		// nothing away.
		"seccomp",
		// A job's PMI relay (package pmi) passes the guest's end of
		// stream on to srun's socket: shutdown, SHUT_WR only (argRules).
		"shutdown",
	},
	VCPU: {
		// KVM_RUN and the exits' device work: ioctls (KVM, VFIO config
		// and interrupts, vhost setup at DRIVER_OK), eventfd signals,
		// the UART's output and the log, VFIO config space.
		"ioctl", "futex", "write", "read", "pread64", "pwrite64", "eventfd2", "close",
		// The Go runtime on a locked thread: sleeping while the goroutine
		// waits, heap growth in an allocating exit, signals (preemption,
		// the kick that stops a vCPU), the thread's exit when the
		// goroutine ends, a crash.
		"nanosleep", "sched_yield", "clock_gettime", "gettimeofday",
		"mmap", "munmap", "madvise",
		"rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack",
		"getpid", "gettid", "tgkill", "exit", "exit_group",
		// The resumption of a sleep a signal interrupted (see Process).
		"restart_syscall",
		// A GC started by an allocation on this thread restarts the world
		// from it, and that polls the network poller without waiting
		// (found by the unit test's runtime.GC on a locked thread).
		"epoll_pwait",
		// Placing the vhost-net worker when the guest's DRIVER_OK write
		// (on this thread) starts it: /proc reads, sched_setaffinity.
		"openat", "fstat", "newfstatat", "getdents64", "epoll_ctl", "fcntl", "sched_setaffinity",
	},
}

// ioctlRequests are the ioctl requests the process filter allows: those
// hpcvmm makes once setup is done, by their C names (package uapi has the
// numbers), KVM_RUN first because the filter's comparisons run in order on
// every ioctl. Found by reading the code that runs after Run installs the
// filter: the exit loop and its devices (interrupt lines and routes,
// irqfds and ioeventfds as the guest programs MSI-X and enables queues,
// memslots as it moves BARs, VFIO interrupts, DMA maps and resets),
// virtio-net's DRIVER_OK (vhost-net set-up, TAP queues and offloads), the
// state logged when a vCPU fails and the stats read at the end, teardown
// (VFIO group and KVM-VFIO device release) and the console terminal's
// state (raw mode's restore, the window size). Left out are the requests
// only setup makes (creating VMs, vCPUs, devices, the IRQ chip; CPUID,
// capabilities, TAP creation, VFIO container and group set-up) and every
// request hpcvmm never makes: TIOCSTI (typing into the console's
// terminal), TIOCSETD, FS_IOC_SETFLAGS, block and network device requests.
var ioctlRequests = []string{
	"KVM_RUN", "KVM_IRQ_LINE", "KVM_SIGNAL_MSI", "KVM_IRQFD", "KVM_SET_GSI_ROUTING", "KVM_IOEVENTFD",
	"KVM_SET_USER_MEMORY_REGION", "KVM_NMI", "KVM_CHECK_EXTENSION",
	"KVM_GET_REGS", "KVM_GET_SREGS", "KVM_GET_MSRS", "KVM_GET_FPU", "KVM_GET_LAPIC", "KVM_GET_MP_STATE",
	"KVM_GET_XCRS", "KVM_GET_STATS_FD", "KVM_SET_DEVICE_ATTR", "KVM_GET_DEVICE_ATTR", "KVM_HAS_DEVICE_ATTR",
	"VFIO_DEVICE_SET_IRQS", "VFIO_DEVICE_GET_REGION_INFO", "VFIO_DEVICE_RESET",
	"VFIO_IOMMU_MAP_DMA", "VFIO_IOMMU_UNMAP_DMA", "VFIO_GROUP_UNSET_CONTAINER", "VFIO_CHECK_EXTENSION",
	"VHOST_GET_FEATURES", "VHOST_SET_FEATURES", "VHOST_SET_OWNER", "VHOST_SET_MEM_TABLE",
	"VHOST_SET_VRING_NUM", "VHOST_SET_VRING_ADDR", "VHOST_SET_VRING_BASE", "VHOST_SET_VRING_KICK",
	"VHOST_SET_VRING_CALL", "VHOST_NET_SET_BACKEND",
	"TUNSETQUEUE", "TUNSETOFFLOAD", "TUNSETVNETHDRSZ", "TUNGETIFF",
	"TCGETS", "TCSETS", "TCSETSW", "TCSETSF", "TIOCGWINSZ",
}

// openWriteFlags are the openat flags that open a file for changing it:
// write access (O_TMPFILE needs it too), creation, truncation (Linux
// truncates even a read-only open with O_TRUNC), appending.
const openWriteFlags = unix.O_WRONLY | unix.O_RDWR | unix.O_CREAT | unix.O_TRUNC | unix.O_APPEND

// Rule is one argument condition of the process filter: syscall Name is
// allowed only when Allows says so.
type Rule struct {
	Name   string
	Allows string // the condition, in words
}

// Rules lists the process filter's argument conditions, for documentation
// and for the message that names a logged or killing syscall.
func Rules() []Rule {
	return []Rule{
		{"openat", "without O_WRONLY, O_RDWR, O_CREAT, O_TRUNC or O_APPEND: files written after setup are opened before the filter"},
		{"mmap", "without PROT_EXEC"},
		{"mprotect", "without PROT_EXEC"},
		{"kill", "only of this process (pid == getpid())"},
		{"tgkill", "only of this process's threads (tgid == getpid())"},
		{"prctl", "only PR_SET_NAME"},
		{"shutdown", "only SHUT_WR: a job's PMI relay passes the guest's end of stream on to srun's socket"},
		{"ioctl", "only with the requests " + strings.Join(ioctlRequests, ", ")},
		{"sendto", socketRule},
		{"recvfrom", socketRule},
		{"getsockname", socketRule},
	}
}

// socketRule is the condition of the socket syscalls, in words.
const socketRule = "only on the sockets opened before the filter and named to InstallProcess (the rtnetlink socket that restores InfiniBand VF identities at teardown); not at all when there are none"

// socketCalls are the syscalls allowed only on the sockets InstallProcess
// names (socketRule).
var socketCalls = []string{"sendto", "recvfrom", "getsockname"}

// argRule is one argument condition: syscall name is allowed only when its
// argument arg, as the kernel reads it (the low 32 bits: every argument
// checked here is an int, an unsigned int or, for mmap's and mprotect's
// prot, a word whose PROT_EXEC bit is in the low half), equals one of
// values (equal; the high half must be 0 as well), or has none of
// values[0]'s bits set (!equal).
type argRule struct {
	name   string
	arg    int
	equal  bool
	values []uint64
}

// argRules are the process filter's argument conditions for process pid
// whose already-open sockets are sockets.
func argRules(pid int, sockets []int) ([]argRule, error) {
	reqs := make([]uint64, 0, len(ioctlRequests))
	for _, n := range ioctlRequests {
		req, ok := uapi.IoctlRequest(n)
		if !ok {
			return nil, fmt.Errorf("seccomp: ioctl request %s unknown to package uapi", n)
		}
		reqs = append(reqs, uint64(req))
	}
	rules := []argRule{
		{name: "ioctl", arg: 1, equal: true, values: reqs},
		{name: "openat", arg: 2, values: []uint64{openWriteFlags}},
		{name: "mmap", arg: 2, values: []uint64{unix.PROT_EXEC}},
		{name: "mprotect", arg: 2, values: []uint64{unix.PROT_EXEC}},
		{name: "kill", arg: 0, equal: true, values: []uint64{uint64(pid)}},
		{name: "tgkill", arg: 0, equal: true, values: []uint64{uint64(pid)}},
		{name: "prctl", arg: 0, equal: true, values: []uint64{unix.PR_SET_NAME}},
		{name: "shutdown", arg: 1, equal: true, values: []uint64{unix.SHUT_WR}},
	}
	if len(sockets) > 0 {
		fds := make([]uint64, 0, len(sockets))
		for _, fd := range sockets {
			if fd < 0 || fd > 1<<31-1 {
				return nil, fmt.Errorf("seccomp: socket descriptor %d out of range", fd)
			}
			fds = append(fds, uint64(fd))
		}
		for _, name := range socketCalls {
			rules = append(rules, argRule{name: name, arg: 0, equal: true, values: fds})
		}
	}
	return rules, nil
}

// Allowed returns the allow-list of kind k (a copy), or nil for an unknown
// kind. For Process, the syscalls of Rules are allowed only with the
// arguments they name.
func Allowed(k Kind) []string { return slices.Clone(lists[k]) }

// Program assembles kind k's filter in mode m for this process into BPF:
// the syscall numbers of this architecture, the argument conditions of
// Rules (Process only), other architectures' (and x32's) calls refused, the
// default action from m. No socket is named: the socket syscalls are
// refused.
func Program(k Kind, m Mode) ([]bpf.RawInstruction, error) {
	return program(k, m, os.Getpid(), nil)
}

// program is kind k's filter in mode m for process pid. The argument
// conditions are on the process filter only: it runs on every thread, the
// vCPU threads included, so the stacked vCPU filter would add nothing by
// checking them again, and without conditions the kernel's action cache
// answers its allowed syscalls without running it.
//
// The BPF is laid out here rather than by go-seccomp-bpf's Policy: its
// argument conditions (v1.6.0) leave the argument in the accumulator when
// a condition fails and go on comparing it with the next syscalls'
// numbers, so mmap with PROT_READ|PROT_WRITE|PROT_EXEC (7) matched poll's
// number and was allowed (TestArgumentRules caught it). Here a syscall with
// conditions ends its own block with an allow or the default action, and
// nothing after a failed condition compares numbers.
//
// sockets are the process's already-open sockets on which the process
// filter allows socketCalls; with none, they are left out of the list.
func program(k Kind, m Mode, pid int, sockets []int) ([]bpf.RawInstruction, error) {
	names, ok := lists[k]
	if !ok {
		return nil, fmt.Errorf("seccomp: unknown thread kind %q", k)
	}
	var rules []argRule
	switch k {
	case Process:
		var err error
		if rules, err = argRules(pid, sockets); err != nil {
			return nil, err
		}
		if len(sockets) == 0 {
			names = slices.DeleteFunc(slices.Clone(names), func(n string) bool { return slices.Contains(socketCalls, n) })
		}
	case FileServer:
		rules = fileServerArgRules(pid)
	}
	def := uint32(libseccomp.ActionKillProcess)
	if m == Log {
		def = uint32(libseccomp.ActionLog)
	}
	insts, err := assembleFilter(names, rules, def)
	if err != nil {
		return nil, err
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	return raw, nil
}

// Offsets in struct seccomp_data.
const (
	dataNR   = 0
	dataArch = 4
	dataArgs = 16
)

// assembleFilter lays out the filter: the architecture check, x32 calls
// refused with ENOSYS, one block per syscall with argument conditions
// (ioctl first: KVM_RUN is the hottest call that runs the program; the
// kernel's action cache answers the unconditional ones without it), the
// unconditional syscalls, then the default action def.
func assembleFilter(names []string, rules []argRule, def uint32) ([]bpf.Instruction, error) {
	a, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	nr := func(name string) (uint32, error) {
		n, ok := a.SyscallNames[name]
		if !ok {
			return 0, fmt.Errorf("seccomp: unknown syscall %q on %s", name, a.Name)
		}
		return uint32(n) | uint32(a.SeccompMask), nil
	}
	allow := bpf.RetConstant{Val: uint32(libseccomp.ActionAllow)}
	deny := bpf.RetConstant{Val: def}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: dataArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(a.ID), SkipTrue: 1},
		deny,
		bpf.LoadAbsolute{Off: dataNR, Size: 4},
	}
	if a.ID == arch.X86_64.ID {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpLessThan, Val: uint32(arch.X32.SeccompMask), SkipTrue: 1},
			bpf.RetConstant{Val: uint32(libseccomp.ActionErrno) | uint32(unix.ENOSYS)},
		)
	}
	conditional := map[string]bool{}
	for _, r := range rules {
		if !slices.Contains(names, r.name) {
			return nil, fmt.Errorf("seccomp: argument rule for %s, which is not in the list", r.name)
		}
		if conditional[r.name] {
			return nil, fmt.Errorf("seccomp: two argument rules for %s", r.name)
		}
		conditional[r.name] = true
		n, err := nr(r.name)
		if err != nil {
			return nil, err
		}
		if len(r.values) == 0 || len(r.values) > 200 || r.arg < 0 || r.arg > 5 || (!r.equal && len(r.values) != 1) {
			return nil, fmt.Errorf("seccomp: argument rule for %s out of range", r.name)
		}
		for _, v := range r.values {
			if v>>32 != 0 {
				return nil, fmt.Errorf("seccomp: argument rule for %s: value %#x beyond 32 bits", r.name, v)
			}
		}
		lo := bpf.LoadAbsolute{Off: uint32(dataArgs + 8*r.arg), Size: 4}
		var block []bpf.Instruction
		if r.equal {
			// The whole argument must equal a value: its high half 0.
			k := len(r.values)
			block = append(block,
				bpf.LoadAbsolute{Off: uint32(dataArgs + 8*r.arg + 4), Size: 4},
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipFalse: uint8(k + 1)},
				lo)
			for i, v := range r.values {
				block = append(block, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(v), SkipTrue: uint8(k - i)})
			}
		} else {
			block = append(block, lo, bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: uint32(r.values[0]), SkipFalse: 1})
		}
		block = append(block, deny, allow)
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipFalse: uint8(len(block))})
		prog = append(prog, block...)
	}
	var plain []uint32
	for _, name := range names {
		if conditional[name] {
			continue
		}
		n, err := nr(name)
		if err != nil {
			return nil, err
		}
		plain = append(plain, n)
	}
	if len(plain) > 250 {
		return nil, fmt.Errorf("seccomp: %d unconditional syscalls: more than one jump reaches", len(plain))
	}
	for i, n := range plain {
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipTrue: uint8(len(plain) - i)})
	}
	return append(prog, deny, allow), nil
}

// InstallProcess puts the Process filter on every thread of the process,
// the Go runtime's included, with SECCOMP_FILTER_FLAG_TSYNC; threads created
// later inherit it from their creator. It sets no_new_privs (on every thread,
// through TSYNC), which an unprivileged filter needs and which keeps a
// later execve from gaining privileges the filter was meant to bound.
// Call it once, before any thread has a filter of its own (TSYNC fails
// when a thread's filters are not an ancestor of the caller's).
//
// sockets are descriptors of sockets opened before (hpcvmm's: the
// rtnetlink socket of ibvf.Conn), on which sendto, recvfrom and
// getsockname stay allowed; on any other descriptor, and with none
// named, those syscalls take the default action like any syscall outside
// the list.
func InstallProcess(m Mode, sockets ...int) error { return install(Process, m, true, sockets) }

// InstallThread stacks kind k's filter on the calling OS thread only. The
// caller must have called runtime.LockOSThread and must never unlock: a
// filtered thread returned to the scheduler would run other goroutines
// under k's list. The Go runtime never clones a thread from a locked one
// (it asks its template thread to), so the stricter list does not spread
// to new threads either; see the package documentation.
func InstallThread(k Kind, m Mode) error { return install(k, m, false, nil) }

// tsyncFlags makes the kernel report a thread it could not synchronise as
// ESRCH: without TSYNC_ESRCH it returns that thread's id as a positive
// result, which the library (checking errno only) would take for success.
const tsyncFlags = unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH

func install(k Kind, m Mode, allThreads bool, sockets []int) error {
	raw, err := program(k, m, os.Getpid(), sockets)
	if err != nil {
		return err
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	var flags uint
	if allThreads {
		// no_new_privs is per thread: on this one now, on the others by
		// TSYNC, which requires it (or CAP_SYS_ADMIN) on the caller.
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return fmt.Errorf("seccomp: set no_new_privs: %w", err)
		}
		flags = tsyncFlags
	}
	if err := uapi.SeccompSetFilter(prog, flags); err != nil {
		if allThreads && errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("seccomp: process filter: a thread already has a filter of its own (TSYNC): %w", err)
		}
		return fmt.Errorf("seccomp: load the %s filter: %w", k, err)
	}
	return nil
}

// Name returns the name of syscall number nr on this architecture (as in
// the kernel's audit line "syscall=N"), or "syscall N" when unknown.
func Name(nr int) string {
	if a, err := arch.GetInfo(""); err == nil {
		if n, ok := a.SyscallNumbers[nr]; ok {
			return n
		}
	}
	return "syscall " + strconv.Itoa(nr)
}

// ThreadMode is one thread's seccomp state from /proc/PID/task/TID/status.
type ThreadMode struct {
	TID     int
	Comm    string // the thread's name ("vcpu0" for vCPU threads)
	Mode    int    // the Seccomp: line: 0 none, 1 strict, 2 filter
	Filters int    // the Seccomp_filters: line: how many filters are stacked
}

// Threads reads the seccomp state of every thread of process pid from
// procRoot (normally /proc): what an operator or a test checks to see that
// every thread is filtered and vCPU threads carry one filter more.
func Threads(procRoot string, pid int) ([]ThreadMode, error) {
	dir := filepath.Join(procRoot, strconv.Itoa(pid), "task")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []ThreadMode
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		tm, err := readStatus(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread exited meanwhile
			}
			return nil, err
		}
		tm.TID = tid
		out = append(out, tm)
	}
	return out, nil
}

func readStatus(path string) (ThreadMode, error) {
	var tm ThreadMode
	f, err := os.Open(path)
	if err != nil {
		return tm, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch k {
		case "Name":
			tm.Comm = v
		case "Seccomp":
			tm.Mode, _ = strconv.Atoi(v)
		case "Seccomp_filters":
			tm.Filters, _ = strconv.Atoi(v)
		}
	}
	return tm, s.Err()
}
