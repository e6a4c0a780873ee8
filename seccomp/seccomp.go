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
		"ioctl", "futex", "read", "write", "readv", "writev", "pread64", "pwrite64",
		"poll", "ppoll", "epoll_pwait", "epoll_wait", "epoll_ctl", "epoll_create1", "eventfd2",
		// The Go runtime: scheduler and timers, memory, signals
		// (preemption is SIGURG by tgkill), new Ms (clone), exits.
		"nanosleep", "sched_yield", "clock_gettime", "gettimeofday", "getrandom",
		"mmap", "munmap", "madvise",
		"rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack",
		"getpid", "gettid", "tgkill", "kill",
		"clone", "exit", "exit_group",
		"sched_getaffinity", "sched_setaffinity",
		// New Ms in a cgo-linked binary (the default `go build`: package
		// net links runtime/cgo) are made by glibc's pthread_create: its
		// stack and guard page, clone3, rseq and robust-list registration,
		// and malloc for the start arguments.
		"clone3", "mprotect", "rseq", "set_robust_list", "brk",
		// Files after setup: /proc and /sys reads (vhost worker placement,
		// the journal of rebound devices), the journal's updates and
		// removal at teardown, terminal state.
		"openat", "close", "fstat", "newfstatat", "lseek", "getdents64", "fcntl",
		"readlinkat", "unlinkat", "renameat", "mkdirat", "fsync",
		// Installing the stricter vCPU filters after this one: a filter
		// can only narrow what is allowed, so allowing seccomp(2) gives
		// nothing away.
		"seccomp",
		// A job's PMI relay (package pmi) passes the guest's end of
		// stream on to srun's socket: shutdown(SHUT_WR).
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
		// A GC started by an allocation on this thread restarts the world
		// from it, and that polls the network poller without waiting
		// (found by the unit test's runtime.GC on a locked thread).
		"epoll_pwait",
		// Placing the vhost-net worker when the guest's DRIVER_OK write
		// (on this thread) starts it: /proc reads, sched_setaffinity.
		"openat", "fstat", "newfstatat", "getdents64", "epoll_ctl", "fcntl", "sched_setaffinity",
	},
}

// Allowed returns the allow-list of kind k (a copy), or nil for an unknown
// kind.
func Allowed(k Kind) []string { return slices.Clone(lists[k]) }

// Program assembles kind k's filter in mode m into BPF: the syscall
// numbers of this architecture, other architectures' (and x32's) calls
// refused, the default action from m.
func Program(k Kind, m Mode) ([]bpf.RawInstruction, error) {
	names, ok := lists[k]
	if !ok {
		return nil, fmt.Errorf("seccomp: unknown thread kind %q", k)
	}
	return assemble(policy(names, m))
}

func policy(names []string, m Mode) libseccomp.Policy {
	def := libseccomp.ActionKillProcess
	if m == Log {
		def = libseccomp.ActionLog
	}
	return libseccomp.Policy{
		DefaultAction: def,
		Syscalls:      []libseccomp.SyscallGroup{{Action: libseccomp.ActionAllow, Names: names}},
	}
}

func assemble(p libseccomp.Policy) ([]bpf.RawInstruction, error) {
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("seccomp: %w", err)
	}
	return raw, nil
}

// InstallProcess puts the Process filter on every thread of the process,
// the Go runtime's included, with SECCOMP_FILTER_FLAG_TSYNC; threads created
// later inherit it from their creator. It sets no_new_privs (on every thread,
// through TSYNC), which an unprivileged filter needs and which keeps a
// later execve from gaining privileges the filter was meant to bound.
// Call it once, before any thread has a filter of its own (TSYNC fails
// when a thread's filters are not an ancestor of the caller's).
func InstallProcess(m Mode) error { return install(lists[Process], m, true) }

// InstallThread stacks kind k's filter on the calling OS thread only. The
// caller must have called runtime.LockOSThread and must never unlock: a
// filtered thread returned to the scheduler would run other goroutines
// under k's list. The Go runtime never clones a thread from a locked one
// (it asks its template thread to), so the stricter list does not spread
// to new threads either; see the package documentation.
func InstallThread(k Kind, m Mode) error {
	names, ok := lists[k]
	if !ok {
		return fmt.Errorf("seccomp: unknown thread kind %q", k)
	}
	return install(names, m, false)
}

// tsyncFlags makes the kernel report a thread it could not synchronise as
// ESRCH: without TSYNC_ESRCH it returns that thread's id as a positive
// result, which the library (checking errno only) would take for success.
const tsyncFlags = unix.SECCOMP_FILTER_FLAG_TSYNC | unix.SECCOMP_FILTER_FLAG_TSYNC_ESRCH

func install(names []string, m Mode, allThreads bool) error {
	f := libseccomp.Filter{NoNewPrivs: allThreads, Policy: policy(names, m)}
	if allThreads {
		f.Flag = tsyncFlags
	}
	if err := libseccomp.LoadFilter(f); err != nil {
		if allThreads && errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("seccomp: process filter: a thread already has a filter of its own (TSYNC): %w", err)
		}
		return fmt.Errorf("seccomp: %w", err)
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
