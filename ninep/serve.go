package ninep

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/hugelgupf/p9/p9"
)

// Message sizes (package documentation: how the default was measured).
const (
	// DefaultMessageSize is the msize the server offers at most when
	// Options.MaxMessageSize is 0: 1 MiB, the most Linux's trans=fd
	// takes (MAX_SOCK_BUF) and the fastest measured (package doc).
	DefaultMessageSize uint32 = 1 << 20
	// MaxMessageSizeLimit is the largest MaxMessageSize: the p9
	// library's own bound on a message.
	MaxMessageSizeLimit uint32 = 4 << 20
	// MinMessageSize is the smallest MaxMessageSize: the smallest msize that carries a useful read
	// (the p9 client asks for 4 KiB at least).
	MinMessageSize uint32 = 4 << 10
)

// Export is one bound directory: SRC's root descriptor and whether the
// guest may change it; or a FileSet, a flat read-only directory of host
// files (Root nil).
type Export struct {
	// Root is a descriptor of SRC (O_PATH|O_DIRECTORY|O_CLOEXEC is
	// enough), opened by the caller, which keeps and closes it.
	Root *os.File
	// ReadOnly refuses every changing request with EROFS.
	ReadOnly bool
	// Files, instead of Root, serves a fixed set of host files as one
	// flat directory, always read-only; the caller keeps and closes it.
	Files *FileSet
}

// attacher returns e's attacher.
func (e Export) attacher(o Options) (*attacher, error) {
	if e.Files == nil {
		return newAttacher(e.Root, e.ReadOnly, o)
	}
	if e.Root != nil {
		return nil, fmt.Errorf("ninep: an export has a root directory or a file set, not both")
	}
	s := e.Files
	var files []*os.File
	var names []string
	var dirOf []int
	for _, f := range s.files {
		files, names, dirOf = append(files, f.f), append(names, f.name), append(dirOf, f.dir)
	}
	fs, err := newSetFS(s.dirs, files, names, dirOf, s.links)
	if err != nil {
		return nil, err
	}
	return newSetAttacher(fs, o), nil
}

// messageSize is o's bound on a message, checked.
func (o Options) messageSize() (uint32, error) {
	switch m := o.MaxMessageSize; {
	case m == 0:
		return DefaultMessageSize, nil
	case m < MinMessageSize || m > MaxMessageSizeLimit:
		return 0, fmt.Errorf("ninep: message size %d out of range: give %d to %d bytes", m, MinMessageSize, MaxMessageSizeLimit)
	default:
		return m, nil
	}
}

// Serve serves export e on one connection: 9P2000.L requests read from
// requests, replies written to replies, until requests ends or fails
// (both are closed then). A request the server refuses gets an error
// reply; a message larger than the bound ends the connection. It returns
// an error only for an unusable export or options.
func Serve(e Export, requests io.ReadCloser, replies io.WriteCloser, o Options) error {
	msize, err := o.messageSize()
	if err != nil {
		requests.Close()
		replies.Close()
		return err
	}
	a, err := e.attacher(o)
	if err != nil {
		requests.Close()
		replies.Close()
		return err
	}
	defer a.close()
	var opts []p9.ServerOpt
	if o.Logf != nil {
		opts = append(opts, p9.WithServerLogger(logger(o.Logf)))
	}
	srv := p9.NewServer(a, opts...)
	lim := &limitReader{r: requests, max: msize, refused: a.refuse}
	return handleRecovering(srv.Handle, lim, replies, o.Logf)
}

// handleRecovering runs the p9 library's Handle, and survives the one
// panic its connection shutdown can raise. p9 v0.3.0 starts a further
// receive goroutine whenever a message arrives and none is idle; that
// goroutine's first act is pendingWg.Add(1) (server.go:508). When the
// connection ends, Handle's goroutine waits on the same WaitGroup
// (connState.stop, server.go:592); if a goroutine started just before the
// end runs its Add after an in-flight handler's Done woke that Wait but
// before Wait looked again, Wait panics "sync: WaitGroup is reused before
// previous Wait has returned" — in this goroutine, killing the file server
// (the test bed's fuzzing saw it once in a few hundred sessions: a worker
// exiting with status 2). The late goroutine itself only finds the
// connection shut down and returns, so nothing is lost but stop's own
// cleanup, done here: both ends closed (the attacher, with every open
// file's descriptor, is closed by Serve). Any other panic is re-raised.
func handleRecovering(handle func(io.ReadCloser, io.WriteCloser) error, requests io.ReadCloser, replies io.WriteCloser, logf func(string, ...any)) (err error) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if msg, ok := r.(string); !ok || !strings.HasPrefix(msg, "sync: WaitGroup is reused") {
			panic(r)
		}
		requests.Close()
		replies.Close()
		if logf != nil {
			logf("ninep: p9's connection shutdown raced a late receive goroutine (%s); both ends closed", r)
		}
		err = nil
	}()
	return handle(requests, replies)
}

// logger adapts Options.Logf to the p9 library's logger.
type logger func(format string, args ...any)

func (l logger) Printf(format string, args ...any) { l(format, args...) }

// Message layout: size[4] type[1] tag[2], and Tversion's msize[4] next.
const (
	headerLen   = 7
	tversion    = 100
	tversionLen = headerLen + 4
	tflush      = 108
	tflushLen   = headerLen + 2
	noTag       = 0xffff
)

// errTooLarge ends a connection whose guest sent a message over the bound.
var errTooLarge = errors.New("ninep: message larger than the negotiated bound")

// limitReader sits between the transport and the p9 library: it checks
// the size of every message before the library reads it (so a guest
// cannot make the server allocate more than max for one), and lowers the
// msize a Tversion proposes to max, which the library then agrees to, and
// keeps a Tflush from waiting on itself or on another flush. It
// passes the bytes through otherwise, reading the header and Tversion's
// msize into a small buffer and nothing more: no allocation per message.
type limitReader struct {
	r       io.ReadCloser
	max     uint32
	refused func(string, error) error

	hdr     [tversionLen]byte
	flushes [1 << 16]bool // tags whose latest request is a Tflush
	pending []byte        // header bytes read but not yet passed on
	rest    uint32        // bytes of the current message still to pass through
	err     error
}

// Read implements io.Reader.
func (l *limitReader) Read(p []byte) (int, error) {
	if len(l.pending) == 0 && l.rest == 0 {
		if l.err != nil {
			return 0, l.err
		}
		if err := l.nextHeader(); err != nil {
			l.err = err
			return 0, err
		}
	}
	if len(l.pending) > 0 {
		n := copy(p, l.pending)
		l.pending = l.pending[n:]
		return n, nil
	}
	if uint32(len(p)) > l.rest {
		p = p[:l.rest]
	}
	n, err := l.r.Read(p)
	l.rest -= uint32(n)
	if err == io.EOF && l.rest > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// nextHeader reads and checks the next message's header.
func (l *limitReader) nextHeader() error {
	if _, err := io.ReadFull(l.r, l.hdr[:headerLen]); err != nil {
		if err == io.ErrUnexpectedEOF {
			return err
		}
		return err // io.EOF between messages: the guest closed
	}
	size := binary.LittleEndian.Uint32(l.hdr[:])
	if size < headerLen {
		return l.refused("malformed message", fmt.Errorf("ninep: message size %d below the header's", size))
	}
	if size > l.max {
		l.refused("message over the size bound", errTooLarge)
		return fmt.Errorf("%w: %d > %d", errTooLarge, size, l.max)
	}
	n := headerLen
	tag := binary.LittleEndian.Uint16(l.hdr[5:])
	l.flushes[tag] = l.hdr[4] == tflush
	if l.hdr[4] == tflush && size >= tflushLen {
		if _, err := io.ReadFull(l.r, l.hdr[headerLen:tflushLen]); err != nil {
			return io.ErrUnexpectedEOF
		}
		// The p9 library's Tflush waits for the old tag to finish: a
		// flush of itself, or of a flush that may be waiting in turn,
		// would wait for ever and hold the connection open. Linux never
		// flushes a flush; such a flush is pointed at no tag, which the
		// library answers at once.
		if old := binary.LittleEndian.Uint16(l.hdr[headerLen:]); old == tag || l.flushes[old] {
			binary.LittleEndian.PutUint16(l.hdr[headerLen:], noTag)
		}
		n = tflushLen
	}
	if l.hdr[4] == tversion && size >= tversionLen {
		if _, err := io.ReadFull(l.r, l.hdr[headerLen:tversionLen]); err != nil {
			return io.ErrUnexpectedEOF
		}
		if binary.LittleEndian.Uint32(l.hdr[headerLen:]) > l.max {
			binary.LittleEndian.PutUint32(l.hdr[headerLen:], l.max)
		}
		n = tversionLen
	}
	l.pending = l.hdr[:n]
	l.rest = size - uint32(n)
	return nil
}

// Close implements io.Closer.
func (l *limitReader) Close() error { return l.r.Close() }
