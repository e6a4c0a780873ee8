package seccomp

import (
	"golang.org/x/sys/unix"
)

// FileServer is the list of hpcvmm's 9P file server (package ninep), a
// child process of its own ("hpcvmm-9p") so that the VMM's Process list
// never gets file-changing syscalls. It is one filter on every thread of
// that process (InstallFileServer), not stacked on another.
const FileServer Kind = "fileserver"

// fileServerList is what the file server needs after its setup (its
// descriptors checked, its rate-limited log set up), found by running it
// under Log mode over ninep's tests and benchmarks and reading the
// kernel's audit lines (package documentation), and by reading ninep's
// syscalls: each host call of ninep is one of the file calls here.
var fileServerList = []string{
	// The 9P connections: pipe reads and writes, the log on stderr.
	"read", "write", "readv", "writev", "futex",
	// The Go runtime, as in the process list: scheduler, timers,
	// memory (no PROT_EXEC: rules), signals (kill and tgkill of this
	// process only: rules), new Ms, exits; glibc's pthread_create in a
	// cgo-linked binary.
	"nanosleep", "sched_yield", "clock_gettime", "gettimeofday", "getrandom",
	"mmap", "munmap", "madvise", "mprotect",
	"rt_sigreturn", "rt_sigprocmask", "rt_sigaction", "sigaltstack",
	"getpid", "gettid", "tgkill", "kill", "getppid", "geteuid",
	"clone", "clone3", "rseq", "set_robust_list", "brk", "exit", "exit_group",
	"sched_getaffinity", "epoll_pwait", "epoll_ctl", "epoll_create1", "eventfd2",
	// The file server's own calls, each on a descriptor of an export:
	// openat2 is its only way to open (openat and open are not on the
	// list); linkat never with AT_SYMLINK_FOLLOW or AT_EMPTY_PATH, fcntl
	// only to read flags and duplicate (rules). No mknodat, ioctl,
	// execve, socket or ptrace.
	"openat2", "close", "newfstatat", "fstat", "fstatfs", "readlinkat", "getdents64", "lseek",
	"pread64", "pwrite64", "ftruncate", "fsync", "flock", "fcntl",
	"mkdirat", "symlinkat", "linkat", "renameat", "unlinkat", "fchmod", "fchownat", "utimensat",
}

// fileServerArgRules are the file server filter's argument conditions for
// process pid.
func fileServerArgRules(pid int) []argRule {
	return []argRule{
		{name: "mmap", arg: 2, values: []uint64{unix.PROT_EXEC}},
		{name: "mprotect", arg: 2, values: []uint64{unix.PROT_EXEC}},
		{name: "kill", arg: 0, equal: true, values: []uint64{uint64(pid)}},
		{name: "tgkill", arg: 0, equal: true, values: []uint64{uint64(pid)}},
		{name: "linkat", arg: 4, values: []uint64{unix.AT_SYMLINK_FOLLOW | unix.AT_EMPTY_PATH}},
		{name: "fcntl", arg: 1, equal: true, values: []uint64{unix.F_GETFL, unix.F_GETFD, unix.F_SETFD, unix.F_DUPFD_CLOEXEC}},
	}
}

// FileServerRules lists the file server filter's argument conditions, in
// words.
func FileServerRules() []Rule {
	return []Rule{
		{"mmap", "without PROT_EXEC"},
		{"mprotect", "without PROT_EXEC"},
		{"kill", "only of this process (pid == getpid())"},
		{"tgkill", "only of this process's threads (tgid == getpid())"},
		{"linkat", "without AT_SYMLINK_FOLLOW or AT_EMPTY_PATH: a link is made by parent and name, never through a link or a bare descriptor"},
		{"fcntl", "only F_GETFL, F_GETFD, F_SETFD, F_DUPFD_CLOEXEC"},
	}
}

func init() { lists[FileServer] = fileServerList }

// InstallFileServer puts the FileServer filter on every thread of the
// calling process (TSYNC, with no_new_privs), for the 9P server's child
// process once it has checked its descriptors.
func InstallFileServer(m Mode) error { return install(FileServer, m, true, nil) }
