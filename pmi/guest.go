package pmi

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// Guest is the agent's half of the relay: a connected socket pair whose one
// end COMMAND inherits as its PMI_FD and whose other end the agent relays to
// the two ports. A socket, not a pipe pair, because PMI clients expect one
// descriptor they both read and write (and some call recv/send on it).
type Guest struct {
	// Child is COMMAND's end; pass it in exec.Cmd.ExtraFiles and name its
	// descriptor number in PMI_FD. Close it in the agent once COMMAND runs.
	Child *os.File
	local *os.File
}

// NewGuest makes the socket pair.
func NewGuest() (*Guest, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pmi: socketpair: %w", err)
	}
	return &Guest{Child: os.NewFile(uintptr(fds[0]), "pmi-child"), local: os.NewFile(uintptr(fds[1]), "pmi-agent")}, nil
}

// Relay copies the host's bytes (from PortIn) to COMMAND's socket and
// COMMAND's bytes to the host (to PortOut) until both directions have ended,
// each end of file passed on on its own: the host's end of stream shuts the
// socket's sending side down; COMMAND closing its socket (or exiting) closes
// out, which the host sees as the port's end of stream. It closes the
// agent's end of the socket and out before returning.
func (g *Guest) Relay(in io.Reader, out io.WriteCloser) error {
	done := make(chan error, 1)
	go func() {
		_, err := Splice(SocketWriter{File: g.local}, in, nil)
		done <- err
	}()
	_, errOut := Splice(closeWriter{out}, g.local, nil)
	errIn := <-done
	return errors.Join(errIn, errOut, g.local.Close())
}

// closeWriter ends a one-way stream (a port's file) by closing it.
type closeWriter struct{ io.WriteCloser }

func (c closeWriter) CloseWrite() error { return c.Close() }
