package hosttest

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// InOwnNetns runs f on a locked OS thread in a fresh network namespace, so
// the TAPs the code under test creates are invisible to the host and die
// with the thread even if that code leaked them. It returns unshare's error
// (root is needed) without running f.
func InOwnNetns(f func()) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread leaves the namespace by exiting
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		f()
		errc <- nil
	}()
	return <-errc
}
