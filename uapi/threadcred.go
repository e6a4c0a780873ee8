package uapi

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ThreadGroups returns the calling thread's supplementary groups
// (getgroups(2) as a raw syscall). Lock the goroutine to its thread around
// it and ThreadSetGroups: credentials are per thread in the kernel.
func ThreadGroups() ([]uint32, error) {
	n, _, errno := unix.RawSyscall(unix.SYS_GETGROUPS, 0, 0, 0)
	if errno != 0 {
		return nil, errno
	}
	if n == 0 {
		return nil, nil
	}
	g := make([]uint32, n)
	n, _, errno = unix.RawSyscall(unix.SYS_GETGROUPS, n, uintptr(unsafe.Pointer(&g[0])), 0)
	if errno != 0 {
		return nil, errno
	}
	return g[:n], nil
}

// ThreadSetGroups sets the calling thread's supplementary groups only
// (setgroups(2) as a raw syscall; syscall.Setgroups changes every thread of
// the process since Go 1.16).
func ThreadSetGroups(g []uint32) error {
	var p uintptr
	if len(g) > 0 {
		p = uintptr(unsafe.Pointer(&g[0]))
	}
	_, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), p, 0)
	if errno != 0 {
		return errno
	}
	return nil
}
