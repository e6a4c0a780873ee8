// Package seccomp holds hpcvmm's syscall allow-lists, one per thread kind,
// and installs them as seccomp-BPF filters once setup is done and before
// the first KVM_RUN (issue 16). A syscall outside the list kills the whole
// process with SIGSYS (SECCOMP_RET_KILL_PROCESS) before it runs; the kernel
// logs an audit line, "audit: type=1326 ... pid=P comm="vcpu0" ... sig=31
// ... syscall=N" (dmesg), and KernelViolations and Name read it back. In
// Log mode the same lists only log (SECCOMP_RET_LOG). Documentation in
// full: this file; the lists with a comment per group: seccomp.go.
package seccomp
