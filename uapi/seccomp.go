package uapi

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// SeccompSetFilter loads a classic-BPF seccomp program on the calling
// thread (seccomp(SECCOMP_SET_MODE_FILTER, flags, prog)); with
// SECCOMP_FILTER_FLAG_TSYNC in flags, on every thread of the process. A
// positive return (TSYNC without TSYNC_ESRCH: the thread that could not be
// synchronised) is reported as ESRCH. no_new_privs must be set already
// unless the caller has CAP_SYS_ADMIN.
func SeccompSetFilter(prog []unix.SockFilter, flags uint) error {
	if len(prog) == 0 {
		return unix.EINVAL
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, uintptr(flags), uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return e
	}
	if r != 0 {
		return unix.ESRCH
	}
	return nil
}
