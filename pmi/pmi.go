// Package pmi carries a Slurm job step's process-management interface (PMI)
// into a VM, so that an unchanged MPI program started by
// `srun --mpi=pmi2 hpcvmm run … -- ./app` finds its peers as it would on the
// node.
//
// srun gives each task a connected socket in PMI_FD and its place in the job
// in PMI_RANK, PMI_SIZE, PMI_JOBID (and PMI_SPAWNED). The ranks speak PMI-1
// (MPICH's default) or PMI-2 (MVAPICH, Intel MPI) over that socket: put,
// fence, get, finalize. hpcvmm does not interpret either protocol: it relays
// the byte stream, in order and unchanged, between the socket srun gave it and
// a socket the guest agent gives COMMAND in its own PMI_FD. Relaying bytes
// instead of speaking PMI keeps every client version and both protocol
// generations working, and leaves Slurm's PMI server as the only
// implementation.
//
// The stream crosses the VM boundary on two named virtio-console ports, one
// per direction (PortIn, PortOut), because a virtio-console port has a single
// open/closed state per side: when the host side of a port closes, the guest
// can no longer write to it. Two one-way ports let either direction end on
// its own (a half-close), as it does on the socket.
package pmi

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Port names of the two one-way streams. The guest finds them by name under
// /sys/class/virtio-ports.
const (
	// PortIn carries srun's bytes to the guest's PMI client.
	PortIn = "org.hpcvmm.pmi.in"
	// PortOut carries the guest's PMI client's bytes to srun.
	PortOut = "org.hpcvmm.pmi.out"
)

// FDVar is the variable that names the PMI socket, on the host as in the
// guest.
const FDVar = "PMI_FD"

// Step is the PMI endpoint srun handed this process.
type Step struct {
	// Conn is the connected socket PMI_FD names.
	Conn *os.File
	// Env holds the PMI and Slurm variables COMMAND gets in the guest, as
	// KEY=VALUE, sorted: every PMI_* but PMI_FD (the agent sets its own) and
	// every SLURM_* variable.
	Env []string
}

// FromEnv returns the PMI endpoint in environ (os.Environ's form), or nil
// when PMI_FD is not set (hpcvmm was not started by srun --mpi=pmi2 or
// pmi). A PMI_FD that does not name an open socket is an error naming the
// variable.
func FromEnv(environ []string) (*Step, error) {
	val, ok := lookup(environ, FDVar)
	if !ok {
		return nil, nil
	}
	fd, err := strconv.Atoi(val)
	if err != nil || fd < 0 {
		return nil, fmt.Errorf("%s=%q: not a file descriptor number; it is set by srun --mpi=pmi2, unset it otherwise", FDVar, val)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%s=%d: %v; it must name the socket srun --mpi=pmi2 opened for this task, unset it otherwise", FDVar, fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s=%d: not a socket; it must name the socket srun --mpi=pmi2 opened for this task, unset it otherwise", FDVar, fd)
	}
	// Keep the descriptor out of any program hpcvmm starts.
	unix.CloseOnExec(fd)
	return &Step{Conn: os.NewFile(uintptr(fd), "pmi"), Env: JobEnv(environ)}, nil
}

// JobEnv picks, from environ, the variables a rank reads to learn its place
// in the job: every SLURM_* and every PMI_* variable except PMI_FD. They
// reach COMMAND by default, as they reach a native task; --env overrides.
func JobEnv(environ []string) []string {
	var out []string
	for _, kv := range environ {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == FDVar {
			continue
		}
		if strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "PMI_") {
			out = append(out, kv)
		}
	}
	sort.Strings(out)
	return out
}

func lookup(environ []string, key string) (string, bool) {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v, true
		}
	}
	return "", false
}

// HalfCloser is a stream whose sending direction can end on its own: a
// socket's shutdown(SHUT_WR), a pipe's or a one-way port's Close.
type HalfCloser interface {
	io.Writer
	// CloseWrite ends the stream in the writing direction; the peer reads
	// end of file after everything written before.
	CloseWrite() error
}

// SocketWriter is the sending half of a connected socket: Write sends,
// Close ends the sending direction with shutdown(SHUT_WR) and leaves the
// receiving one open. It is what the host's PortOut writes into: the guest
// client closing its socket becomes srun's end of file.
type SocketWriter struct{ File *os.File }

// Write implements io.Writer.
func (w SocketWriter) Write(p []byte) (int, error) { return w.File.Write(p) }

// CloseWrite implements HalfCloser.
func (w SocketWriter) CloseWrite() error {
	raw, err := w.File.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.Shutdown(int(fd), unix.SHUT_WR) }); err != nil {
		return err
	}
	if serr != nil && !errors.Is(serr, unix.ENOTCONN) {
		return fmt.Errorf("pmi: shutdown(SHUT_WR): %w", serr)
	}
	return nil
}

// Close implements io.Closer as CloseWrite, so a SocketWriter can stand where
// an io.WriteCloser ends a one-way stream.
func (w SocketWriter) Close() error { return w.CloseWrite() }

// ChunkSize is the relay's buffer: PMI messages are short lines (a
// business card is under 1 KiB), so one chunk carries a whole message.
const ChunkSize = 64 << 10

// Splice copies src to dst until src ends, then ends dst's sending direction,
// so the peer sees end of file exactly where the source did. buf is the one
// buffer it uses (nil: it makes one of ChunkSize), so a relay allocates
// nothing per chunk. It returns the first error other than src's end.
//
// Writes go straight through: nothing is held back or merged, so a PMI
// client waiting for the reply to a line it sent gets it as soon as the peer
// wrote it.
func Splice(dst HalfCloser, src io.Reader, buf []byte) (int64, error) {
	if buf == nil {
		buf = make([]byte, ChunkSize)
	}
	var n int64
	for {
		r, rerr := src.Read(buf)
		if r > 0 {
			w, werr := dst.Write(buf[:r])
			n += int64(w)
			if werr == nil && w != r {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return n, fmt.Errorf("pmi: relay write: %w", werr)
			}
		}
		if rerr == io.EOF {
			if err := dst.CloseWrite(); err != nil {
				return n, fmt.Errorf("pmi: relay end of stream: %w", err)
			}
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("pmi: relay read: %w", rerr)
		}
	}
}
