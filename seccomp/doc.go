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
// The BPF is built by github.com/elastic/go-seccomp-bpf: pure Go (no cgo, no
// libseccomp: the harness builds hpcvmm with CGO_ENABLED=0), maintained (Elastic's Beats and Auditbeat
// load their filters with it), small (it needs golang.org/x/net/bpf and
// x/sys only), with syscall tables generated from the kernel's per
// architecture, the architecture check and x32 refusal every filter needs,
// and SECCOMP_FILTER_FLAG_TSYNC. It also makes the seccomp(2) call itself
// (its unsafe stays in the dependency, like x/sys/unix's; nothing here needs
// package uapi). The others: github.com/seccomp/libseccomp-golang needs cgo
// and libseccomp; gVisor's pkg/seccomp is good but pulls in a large part of
// gVisor; golang.org/x/net/bpf alone is an assembler, leaving the jump
// arithmetic, architecture check and syscall tables to hand-written code.
// One gap is covered here: with TSYNC the kernel reports a thread it could
// not synchronise as a positive return value, which the library (checking
// errno only) would take for success, so InstallProcess adds
// SECCOMP_FILTER_FLAG_TSYNC_ESRCH (Linux 5.7) to get ESRCH instead.
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
// The lists filter syscall numbers, not arguments. Argument checks (which
// ioctl requests a vCPU thread may make) would make the kernel run the BPF
// program on every KVM_RUN; without them the kernel's per-filter action
// cache (Linux 5.11) answers an allowed syscall without running it.
package seccomp
