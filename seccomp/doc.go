// Package seccomp holds hpcvmm's syscall allow-lists, one per thread kind,
// and installs them as seccomp-BPF filters once setup is done and before
// the first KVM_RUN (issue 16). A syscall outside the list kills the whole
// process with SIGSYS (SECCOMP_RET_KILL_PROCESS) before it runs. The dead
// process can log nothing, so the name comes from the kernel: it logs an
// audit line, "audit: type=1326 ... pid=P comm="vcpu0" ... sig=31 ...
// syscall=N" (dmesg; comm is the thread, so "vcpu0" means the vCPU list),
// which KernelViolations reads back and Name turns into "unlinkat". In Log
// mode (hpcvmm --seccomp=log) the same lists let such a syscall run and
// only log it (SECCOMP_RET_LOG).
//
// # Library
//
// The syscall tables come from github.com/elastic/go-seccomp-bpf: pure Go
// (no cgo, no libseccomp: the harness builds hpcvmm with CGO_ENABLED=0),
// maintained (Elastic's Beats and Auditbeat load their filters with it),
// small (it needs golang.org/x/net/bpf and x/sys only), its tables
// generated from the kernel's per architecture. The others:
// github.com/seccomp/libseccomp-golang needs cgo and libseccomp; gVisor's
// pkg/seccomp is good but pulls in a large part of gVisor.
//
// The BPF program itself is laid out here with golang.org/x/net/bpf
// (assembleFilter), and loaded by package uapi (SeccompSetFilter): the
// library's argument conditions (v1.6.0, the latest) leave the argument in
// the accumulator when a condition fails and go on comparing it with the
// following syscalls' numbers, so an mmap with PROT_READ|PROT_WRITE|
// PROT_EXEC (7) matched poll's number and was allowed. The layout is
// small: the architecture check, x32 refused with ENOSYS, one block per
// syscall with argument conditions that ends in its own allow or default
// action, the unconditional syscalls, the default action.
// TestProgramMatchesRules runs both programs in x/net/bpf's interpreter on
// 200,000 calls drawn at the edges and compares every answer with the
// rules evaluated in Go. The process filter is loaded with
// SECCOMP_FILTER_FLAG_TSYNC and SECCOMP_FILTER_FLAG_TSYNC_ESRCH (Linux
// 5.7), so a thread that could not be synchronised is ESRCH, not a
// positive return taken for success.
//
// # Thread kinds, and why Go makes it two filters
//
// hpcvmm's threads are vCPU threads, device and vhost workers, the main
// thread, the Go runtime's own (sysmon, GC workers, the template thread,
// Ms started on demand) and, during setup only, the prefault workers. In
// Go a "kind of thread" only exists for a thread locked to one goroutine:
// every other goroutine (main, the virtio transport's doorbell poller, the
// virtio-net workers, the console reader) runs on whichever M is free and
// moves between them, and GC work runs on any of them. So:
//
//   - Process: one filter on every thread, installed by vmm.(*VM).Run with
//     SECCOMP_FILTER_FLAG_TSYNC after setup (the runtime's threads exist by
//     then; TSYNC reaches them all, and every thread created later inherits
//     it from its creator). Its list is the union of what the Go runtime,
//     the main goroutine (signals, terminal, teardown: closing devices,
//     giving back rebound devices through the journal) and the device
//     goroutines need. no_new_privs comes with it, set on every thread by
//     TSYNC.
//   - VCPU: a stricter filter stacked on each vCPU thread by the thread
//     itself, after it is pinned and named and before KVM_RUN. The kernel
//     runs every filter of a thread and the strictest answer wins, so a
//     vCPU thread gets the intersection. It has no clone, socket, file
//     creation or removal, seccomp or memfd.
//   - Device and vhost workers: device goroutines are not locked, so they
//     run under Process. Kernel vhost-net workers never return to user
//     space; from Linux 6.4 they are threads of hpcvmm created by
//     VHOST_SET_OWNER on the vCPU thread that wrote DRIVER_OK, so they
//     inherit (and show) its filters; before 6.4 they are kernel threads
//     outside the process.
//   - Prefault workers have exited when Run starts.
//
// A stricter filter on a thread that later ran other goroutines, or that
// passed it on to threads it creates, would kill hpcvmm for syscalls that
// thread kind never makes. Neither happens:
//
//   - a vCPU goroutine calls runtime.LockOSThread and never unlocks, so its
//     thread runs nothing else, and it exits when the goroutine ends;
//   - clone(2) copies the creating thread's filters, and the Go runtime may
//     need a new M while a locked goroutine runs (it starts goroutines at
//     DRIVER_OK, GC restarts the world from it, wakep runs on it). But
//     runtime.newm (runtime/proc.go, Go 1.26) checks gp.m.lockedExt != 0 on
//     the calling thread and then does not clone: it queues the request for
//     the template thread, which LockOSThread started from an unlocked
//     thread before the first lock ("We don't want to clone that into
//     another thread"). TestNewThreadsFromALockedThreadGetOnlyTheProcessFilter
//     relies on it: a locked thread whose filter forbids clone starts
//     goroutines blocked in syscalls until the runtime has made new Ms, and
//     every new thread has exactly one filter.
//
// Filters stack in order: TSYNC refuses when a thread already has a filter
// the caller lacks, so Run installs the process filter before it starts
// any vCPU goroutine.
//
// # How the lists were found
//
// From the code paths that run after setup and from measurement:
//
//   - Unit tests here run the Go runtime's kinds of work (goroutines
//     blocked in syscalls, timers, GC, allocation, /proc reads, eventfds,
//     poll) under each filter in a child process, which found that a GC on
//     a locked thread polls the network poller (epoll_pwait) and that a
//     cgo-linked binary (the default `go build`: package net links
//     runtime/cgo) makes new Ms with glibc's pthread_create (clone3,
//     mprotect, rseq, set_robust_list, brk).
//   - The scenarios of the nested test bed (boot with 1 and 4 vCPUs,
//     console round trip, net with and without vhost-net, pinned vCPUs on
//     1 GiB pages, SIGTERM shutdown) ran with the filters on (the default):
//     a missing syscall kills hpcvmm and fails the scenario, and
//     TestGuestRAMOnHugepagesAndPinnedVCPUs checks Seccomp: 2 on every
//     thread while the guest runs. strace is not in the L1 image; the
//     kernel's own log sees every thread instead: a run with --seccomp=log
//     logs each syscall outside the lists (L1's /init lowers the console
//     log level to 3, so read L1's dmesg, not its console log). On a host
//     with hardware KVM, `strace -f -c hpcvmm run ...` gives the union.
//   - To find what a new setup needs: run it with --seccomp=log and read
//     dmesg | grep type=1326; Name (or ausyscall) names the numbers.
//
// What is not covered by measurement (error paths, passthrough with a
// guest that reprograms MSI-X at run time) is covered by reading the code:
// those paths make ioctl, pread64/pwrite64, eventfd2 and close, all listed.
//
// # Argument rules (issue 23)
//
// A syscall number alone does not contain a compromised thread: openat
// with O_WRONLY|O_CREAT writes /etc/ld.so.preload or
// /proc/sys/kernel/core_pattern as root (code execution outside every
// filter), mmap or mprotect with PROT_EXEC runs injected code, kill and
// tgkill reach any process, ioctl reaches any driver (TIOCSTI types into
// the terminal hpcvmm was started from). The process filter therefore
// checks arguments (Rules):
//
//   - openat only without O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND:
//     what the run writes is opened before the filter (the sysfs
//     attributes the journal's restore writes, in vmm), or needs no write
//     access (/dev/vhost-net, opened at DRIVER_OK, is opened read-only);
//     vCPU threads name themselves with prctl, not by writing
//     /proc/self/task/TID/comm. renameat and mkdirat are not on the list:
//     a rename would move a file another user wrote over one root trusts.
//   - mmap and mprotect without PROT_EXEC (the Go runtime maps no
//     executable memory after start, nor does glibc's pthread_create).
//   - kill and tgkill only with this process's pid: the runtime's
//     preemption and crash signals, a vCPU's kick.
//   - prctl only PR_SET_NAME.
//   - ioctl only the requests of ioctlRequests, named as in the C headers
//     (package uapi has the numbers and checks them against the headers).
//   - sendto, recvfrom and getsockname only on the sockets InstallProcess
//     is given, opened before the filter: the rtnetlink socket through
//     which the VM restores its InfiniBand VFs' GUIDs and link state at
//     teardown (ibvf.Conn; a request on an open netlink socket needs no
//     more). With none given they are not in the filter at all; socket,
//     bind and connect never are, so no thread can open a socket after
//     setup.
//
// What remains: unlinkat (the journal's removal at teardown) can remove a
// file, though not create or change one; read-only opens and reads of
// whatever root can read; the vCPU filter's list is a subset of the
// process list and carries no conditions of its own (both filters run on
// a vCPU thread, so the process filter's conditions hold there too).
// A call refused by a rule takes the filter's default action like a
// syscall outside the list: SIGSYS in Kill mode, run and logged in Log
// mode, so --seccomp=log finds what a new setup needs either way (the
// audit line names the syscall; Violation.String adds the rule).
//
// The argument checks cost: an ioctl (KVM_RUN's included) runs the process
// program (the kernel's action cache answers only calls whose answer does
// not depend on arguments); ioctl's block comes first, KVM_RUN its first
// request, so KVM_RUN is allowed after 10 BPF instructions.
package seccomp
