package main

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/term"

	"github.com/hpcvmm/hpcvmm/termsafe"
)

// consoleOutput is where the guest's console output goes: through
// termsafe's filter when stdout is a terminal, so the guest cannot set the
// user's clipboard or title, make the terminal answer into hpcvmm's stdin,
// or switch its modes (issue 23); stdout itself with --console-raw, or when
// it is a file or a pipe, where the guest's bytes are data and stay raw.
func consoleOutput(stdout io.Writer, raw bool) io.Writer {
	if raw || !isTerminal(stdout) {
		return stdout
	}
	return termsafe.NewWriter(stdout)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// jobStderr returns where a job's log and the guest's console (UART and
// hvc0, which the kernel and the agent write) go on stderr: nowhere with
// --quiet; through termsafe's filter, each its own, when stderr is a
// terminal (issue 30: the guest chooses those bytes, and the agent's Log
// lines and reasons inside the log); stderr itself when it is a file or a
// pipe. COMMAND's own stdout and stderr never pass here: they reach the
// caller's streams byte for byte (job.Streams).
func jobStderr(stderr io.Writer, quiet bool) (log, console io.Writer) {
	switch {
	case quiet:
		return io.Discard, io.Discard
	case isTerminal(stderr):
		return termsafe.NewWriter(stderr), termsafe.NewWriter(stderr)
	}
	return stderr, stderr
}

// printJobReason prints the one-line reason a job failed, which the guest
// may have written (the agent's Failed.Reason, the last hpcvmm-agent:
// line of its console), through termsafe's filter when stderr is a
// terminal; also with --quiet.
func printJobReason(stderr io.Writer, reason string) {
	w := stderr
	if isTerminal(stderr) {
		w = termsafe.NewWriter(stderr)
	}
	fmt.Fprintf(w, "hpcvmm run: %s\n", reason)
}
