package jobproto

import (
	"fmt"
	"syscall"
)

// Exit statuses of `hpcvmm run -- COMMAND` when COMMAND never ran or the VM
// failed, as `docker run` uses them (and the shell, for 126 and 127).
const (
	// CodeAgentFailed: the VM or the agent failed (kernel panic, triple
	// fault, an agent error, a guest that powered off without a status).
	CodeAgentFailed = 125
	// CodeNotExecutable: COMMAND exists but cannot be executed.
	CodeNotExecutable = 126
	// CodeNotFound: COMMAND is not in IMAGE (or its PATH).
	CodeNotFound = 127
	// signalBase + N is the status of a COMMAND killed by signal N.
	signalBase = 128
)

// FailKind is why COMMAND did not run.
type FailKind uint8

// Failure kinds, each with its exit status.
const (
	// FailAgent: the agent (or the VM) failed; 125.
	FailAgent FailKind = 1
	// FailNotFound: COMMAND was not found; 127.
	FailNotFound FailKind = 2
	// FailNotExecutable: COMMAND was found but could not be executed; 126.
	FailNotExecutable FailKind = 3
)

// String names the kind as docs/jobs.md does.
func (k FailKind) String() string {
	switch k {
	case FailAgent:
		return "agent"
	case FailNotFound:
		return "not-found"
	case FailNotExecutable:
		return "not-executable"
	}
	return fmt.Sprintf("FailKind(%d)", uint8(k))
}

// Code is the exit status of a failure of kind k.
func (k FailKind) Code() int {
	switch k {
	case FailNotFound:
		return CodeNotFound
	case FailNotExecutable:
		return CodeNotExecutable
	}
	return CodeAgentFailed
}

// Status is how a job ended: COMMAND's exit code, the signal that killed
// it, or the failure that kept it from running (or ended the VM).
type Status struct {
	// Code is COMMAND's exit code (0-255) when it exited.
	Code int
	// Signal is the signal that killed COMMAND, or 0.
	Signal syscall.Signal
	// Failure is non-zero when COMMAND did not run or the VM failed;
	// Reason then says why in one line.
	Failure FailKind
	Reason  string
}

// ExitCode is hpcvmm's exit status for s: the failure's code, 128+N for
// signal N, else COMMAND's exit code.
func (s Status) ExitCode() int {
	switch {
	case s.Failure != 0:
		return s.Failure.Code()
	case s.Signal != 0:
		return signalBase + int(s.Signal)
	}
	return s.Code & 0xff
}

// String describes s for a log line.
func (s Status) String() string {
	switch {
	case s.Failure != 0:
		return fmt.Sprintf("%s failure (exit status %d): %s", s.Failure, s.ExitCode(), s.Reason)
	case s.Signal != 0:
		return fmt.Sprintf("killed by signal %d (%v), exit status %d", int(s.Signal), s.Signal, s.ExitCode())
	}
	return fmt.Sprintf("exit status %d", s.Code)
}

// StatusOf converts an Exited message to a Status.
func StatusOf(m *Exited) Status {
	if m.Signal != 0 {
		return Status{Signal: syscall.Signal(m.Signal)}
	}
	return Status{Code: int(m.Code)}
}

// ExitedFrom is the Exited message for a process's wait status.
func ExitedFrom(ws syscall.WaitStatus) Exited {
	if ws.Signaled() {
		return Exited{Signal: uint8(ws.Signal())}
	}
	return Exited{Code: uint8(ws.ExitStatus())}
}
