package ninep

import (
	"bytes"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// watchEvents are the inotify events that show a node was opened, read or
// changed. An O_PATH open raises none (the kernel skips fsnotify for it),
// so walking to a node is not counted; opening it for I/O is.
const watchEvents = unix.IN_OPEN | unix.IN_ACCESS | unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE |
	unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// watch is an inotify instance on the outside tree and the export's FIFO.
type watch struct{ fd int }

func newWatch(t testing.TB, fx *fixture) *watch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	for _, p := range []string{fx.outside, filepath.Join(fx.outside, "dir"), filepath.Join(fx.outside, "secret"),
		filepath.Join(fx.outside, "dir", "secret2"), filepath.Join(fx.export, "fifo")} {
		_, err := unix.InotifyAddWatch(fd, p, watchEvents)
		require.NoError(t, err, p)
	}
	return &watch{fd: fd}
}

// events returns the number of events seen since the last call.
func (w *watch) events() int {
	buf := make([]byte, 4096)
	total := 0
	for {
		n, err := unix.Read(w.fd, buf)
		if n <= 0 || err != nil {
			return total
		}
		for b := buf[:n]; len(b) >= unix.SizeofInotifyEvent; {
			total++
			l := binary.NativeEndian.Uint32(b[12:])
			b = b[unix.SizeofInotifyEvent+int(l):]
		}
	}
}

// recorder keeps what a client writes: a session's requests as bytes.
type recorder struct {
	io.ReadWriteCloser
	mu  sync.Mutex
	buf bytes.Buffer
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.buf.Write(p)
	r.mu.Unlock()
	return r.ReadWriteCloser.Write(p)
}

// seedSessions are client sessions whose requests seed FuzzServer: the
// escape attempts and the ordinary operations, so that mutations start
// from valid messages with valid fids.
var seedSessions = map[string]func(root p9.File){
	"links-out": func(root p9.File) {
		for _, n := range []string{"abs", "rel", "updir", "fifo"} {
			if f, err := walk(root, n); err == nil {
				_, _ = f.Readlink()
				_, _ = readAll(f)
				f.Close()
			}
		}
		_, _ = walk(root, "updir/secret")
	},
	"guest-link": func(root p9.File) {
		_, _ = root.Symlink("/", "escape", p9.NoUID, p9.NoGID)
		_, _ = walk(root, "escape/etc/shadow")
		_, _ = root.Mknod("node", p9.ModeCharacterDevice|0o666, 1, 3, p9.NoUID, p9.NoGID)
	},
	"write-rename-link": func(root p9.File) {
		_, f, _ := root.Walk(nil)
		if _, _, _, err := f.Create("new", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID); err == nil {
			_, _ = f.WriteAt([]byte("data"), 0)
		}
		f.Close()
		sub, _ := walk(root, "sub")
		_ = root.RenameAt("new", sub, "moved")
		if file, err := walk(root, "file"); err == nil {
			_ = root.Link(file, "file2")
			_ = file.SetAttr(p9.SetAttrMask{Permissions: true, Size: true}, p9.SetAttr{Permissions: 0o600, Size: 1})
		}
		_ = root.UnlinkAt("file2", 0)
	},
	"readdir": func(root p9.File) {
		_, d, _ := root.Walk(nil)
		if _, _, err := d.Open(p9.ReadOnly); err == nil {
			_, _ = d.Readdir(0, 512)
		}
		_, _ = root.StatFS()
	},
}

// fuzzFixture is a fixture with a FIFO in the export, the node kind whose
// opening the property checks.
func fuzzFixture(t testing.TB) *fixture {
	fx := newFixture(t)
	require.NoError(t, unix.Mkfifo(filepath.Join(fx.export, "fifo"), 0o666))
	return fx
}

// FuzzServer feeds raw request bytes to Serve. Property: the server ends
// when the input does, never panics, and no request opens, reads or
// changes anything outside the export (inotify on the outside tree, and
// the snapshot of its contents, link counts and times) or opens the FIFO
// in the export.
func FuzzServer(f *testing.F) {
	for _, session := range seedSessions {
		fx := fuzzFixture(f)
		srv, cli := socketPair(f)
		rec := &recorder{ReadWriteCloser: cli}
		done := make(chan error, 1)
		go func() { done <- Serve(Export{Root: fx.root}, srv, srv, Options{}) }()
		c, err := p9.NewClient(rec, p9.WithMessageSize(8192))
		require.NoError(f, err)
		root, err := c.Attach("")
		require.NoError(f, err)
		session(root)
		c.Close()
		<-done
		rec.mu.Lock()
		f.Add(bytes.Clone(rec.buf.Bytes()))
		rec.mu.Unlock()
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		fx := fuzzFixture(t)
		w := newWatch(t, fx)
		reqR, reqW, err := os.Pipe()
		require.NoError(t, err)
		repR, repW, err := os.Pipe()
		require.NoError(t, err)
		defer repR.Close()
		done := make(chan error, 1)
		go func() {
			done <- Serve(Export{Root: fx.root}, reqR, repW, fx.options(Options{MaxMessageSize: 64 << 10}))
		}()
		go func() { _, _ = io.Copy(io.Discard, repR) }()
		// Written from a goroutine: a server that stops reading must
		// fail the property below, not block the fuzzer.
		go func() {
			_, _ = reqW.Write(in)
			reqW.Close()
		}()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not end with its input")
		}
		fx.noPanics(t)
		require.Zero(t, w.events(), "a request opened, read or changed a node outside the export, or the FIFO")
		fx.checkOutside(t)
	})
}

// The watch sees what the property is about: opening the FIFO and reading
// an outside file are events.
func TestWatchSeesOpens(t *testing.T) {
	fx := fuzzFixture(t)
	w := newWatch(t, fx)
	fd, err := unix.Open(filepath.Join(fx.export, "fifo"), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	unix.Close(fd)
	require.Positive(t, w.events(), "opening the FIFO")
	_, err = os.ReadFile(filepath.Join(fx.outside, "secret"))
	require.NoError(t, err)
	require.Positive(t, w.events(), "reading outside")
	fd, err = unix.Open(filepath.Join(fx.export, "fifo"), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	unix.Close(fd)
	require.Zero(t, w.events(), "an O_PATH open (a walk) is no event")
}
