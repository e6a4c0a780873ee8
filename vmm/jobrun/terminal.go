package jobrun

import (
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"

	"github.com/hpcvmm/hpcvmm/job"
)

// terminal is a job's Stdin when it is a terminal: COMMAND then gets a
// pty (job.Spec.TTY) and the terminal is in raw mode while the job runs.
type terminal struct{ fd int }

// openTerminal is stdin's terminal, or nil when stdin is none (a pipe, a
// file, a reader that is not an *os.File).
func openTerminal(stdin io.Reader) *terminal {
	f, ok := stdin.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return nil
	}
	return &terminal{fd: int(f.Fd())}
}

// makeRaw puts the terminal in raw mode and returns what restores it
// (nothing to restore when it cannot be switched: keys stay
// line-buffered).
func (t *terminal) makeRaw() (restore func()) {
	saved, err := term.MakeRaw(t.fd)
	if err != nil {
		return func() {}
	}
	return func() { _ = term.Restore(t.fd, saved) }
}

// TerminalSize returns the rows and columns of out when it is a terminal,
// else zeros (unknown): the size a job's pty starts with and follows on
// SIGWINCH, and hpcvmm's console's.
func TerminalSize(out io.Writer) (rows, cols uint16) {
	f, ok := out.(*os.File)
	if !ok {
		return 0, 0
	}
	w, h, err := term.GetSize(int(f.Fd()))
	if err != nil || w <= 0 || h <= 0 || w > 0xffff || h > 0xffff {
		return 0, 0
	}
	return uint16(h), uint16(w)
}

// relayJobSignals passes the signals a job's COMMAND gets on to it
// (forwardJobSignals) until the returned func is called.
func relayJobSignals(j *job.Job, stdout io.Writer, isTerm bool, log *slog.Logger) (stop func()) {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
		syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGCONT, syscall.SIGWINCH)
	stopSignals := make(chan struct{})
	go forwardJobSignals(sigs, stopSignals, j, stdout, isTerm, log)
	return func() { signal.Stop(sigs); close(stopSignals) }
}

// forwardJobSignals passes the signals the process receives to the job's
// command until stop is closed; SIGWINCH becomes a resize of the command's
// terminal when it has one.
func forwardJobSignals(sigs <-chan os.Signal, stop <-chan struct{}, j *job.Job, stdout io.Writer, isTerm bool, log *slog.Logger) {
	for {
		select {
		case s := <-sigs:
			if s == syscall.SIGWINCH {
				if r, c := TerminalSize(stdout); r != 0 && isTerm {
					j.Resize(r, c)
				}
				continue
			}
			log.Debug("job: passing a signal to the command", "signal", s.String())
			j.Signal(s.(syscall.Signal))
		case <-stop:
			return
		}
	}
}
