package agent

import (
	"errors"

	"golang.org/x/sys/unix"
)

// Waiter is wait4(2), behind an interface so the reaping logic is tested
// without being PID 1.
type Waiter interface {
	Wait4(pid int, ws *unix.WaitStatus, options int) (int, error)
}

// SysWaiter is the real wait4.
type SysWaiter struct{}

// Wait4 implements Waiter.
func (SysWaiter) Wait4(pid int, ws *unix.WaitStatus, options int) (int, error) {
	return unix.Wait4(pid, ws, options, nil)
}

// Reap collects every child that has ended without blocking (PID 1 inherits
// every orphan, and an unreaped one stays a zombie), and returns the wait
// status of pid when it is among them. The agent never calls exec.Cmd.Wait:
// a wait4(-1) here could take COMMAND's status first, so COMMAND's status
// comes from this loop alone.
func Reap(w Waiter, pid int) (ws unix.WaitStatus, found bool, none bool) {
	for {
		var s unix.WaitStatus
		got, err := w.Wait4(-1, &s, unix.WNOHANG)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil { // ECHILD: no children left
			return ws, found, true
		}
		if got == 0 {
			return ws, found, false
		}
		if got == pid && (s.Exited() || s.Signaled()) {
			ws, found = s, true
		}
	}
}
