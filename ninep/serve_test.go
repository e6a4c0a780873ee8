package ninep

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The server does what a mount needs: create, write, read back, list,
// stat, chmod, truncate, rename, unlink, mkdir, statfs, lock.
func TestFileOperations(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	// The client's Create turns the directory fid into the new file.
	_, f, err := root.Walk(nil)
	require.NoError(t, err)
	_, _, _, err = f.Create("new", p9.ReadWrite, 0o4755, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	payload := bytes.Repeat([]byte("0123456789"), 20000)
	for off := 0; off < len(payload); {
		n, err := f.WriteAt(payload[off:min(off+32<<10, len(payload))], int64(off))
		require.NoError(t, err)
		off += n
	}
	st, err := os.Stat(filepath.Join(fx.export, "new"))
	require.NoError(t, err)
	assert.Equal(t, int64(len(payload)), st.Size())
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())
	assert.Zero(t, st.Mode()&os.ModeSetuid, "set-user-ID from the guest")
	require.NoError(t, f.Close())

	nf, err := walk(root, "new")
	require.NoError(t, err)
	got, err := readAll(nf)
	require.NoError(t, err)
	assert.Equal(t, string(payload), got)
	require.NoError(t, nf.SetAttr(p9.SetAttrMask{Permissions: true, Size: true}, p9.SetAttr{Permissions: 0o600, Size: 10}))
	_, _, attr, err := nf.GetAttr(p9.AttrMaskAll)
	require.NoError(t, err)
	assert.Equal(t, uint64(10), attr.Size)
	assert.Equal(t, p9.FileMode(0o600), attr.Mode.Permissions())
	require.NoError(t, nf.SetAttr(p9.SetAttrMask{MTime: true, MTimeNotSystemTime: true}, p9.SetAttr{MTimeSeconds: 1000}))
	st, err = os.Stat(filepath.Join(fx.export, "new"))
	require.NoError(t, err)
	assert.Equal(t, int64(1000), st.ModTime().Unix())

	_, err = root.Mkdir("dir", 0o755, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	dir, err := walk(root, "dir")
	require.NoError(t, err)
	require.NoError(t, root.RenameAt("new", dir, "renamed"))
	got, err = readAll(nf)
	require.NoError(t, err, "a file follows its rename")
	assert.Equal(t, "0123456789", got)

	for i := range 300 {
		_, err := dir.Mkdir("d"+strings.Repeat("x", i%40)+string(rune('a'+i%26))+string(rune('a'+i/26)), 0o755, p9.NoUID, p9.NoGID)
		require.NoError(t, err)
	}
	_, ld, err := dir.Walk(nil)
	require.NoError(t, err)
	_, _, err = ld.Open(p9.ReadOnly)
	require.NoError(t, err)
	names := map[string]bool{}
	for off := uint64(0); ; {
		ents, err := ld.Readdir(off, 2048)
		require.NoError(t, err)
		if len(ents) == 0 {
			break
		}
		for _, e := range ents {
			assert.False(t, names[e.Name], "entry %s twice", e.Name)
			names[e.Name] = true
			off = e.Offset
		}
	}
	assert.Len(t, names, 301, "every entry once, across many Readdir calls")

	require.NoError(t, dir.UnlinkAt("renamed", 0))
	assert.NoFileExists(t, filepath.Join(fx.export, "dir", "renamed"))
	fs, err := root.StatFS()
	require.NoError(t, err)
	assert.NotZero(t, fs.BlockSize)
	fx.checkOutside(t)
}

// rawServe starts Serve over pipes for raw bytes and returns the request
// writer, the reply reader and Serve's result.
func rawServe(t testing.TB, fx *fixture, o Options) (io.WriteCloser, io.ReadCloser, chan error) {
	t.Helper()
	reqR, reqW, err := os.Pipe()
	require.NoError(t, err)
	repR, repW, err := os.Pipe()
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- Serve(Export{Root: fx.root}, reqR, repW, fx.options(o)) }()
	t.Cleanup(func() { reqW.Close(); repR.Close() })
	return reqW, repR, done
}

// tversionMsg is a Tversion asking for msize.
func tversionMsg(msize uint32) []byte {
	v := "9P2000.L"
	b := binary.LittleEndian.AppendUint32(nil, uint32(7+4+2+len(v)))
	b = append(b, tversion, 0xff, 0xff)
	b = binary.LittleEndian.AppendUint32(b, msize)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(v)))
	return append(b, v...)
}

// The msize a guest proposes is lowered to the bound, and a message over
// it ends the connection before the server reads it.
func TestMessageSizeBound(t *testing.T) {
	fx := newFixture(t)
	w, r, done := rawServe(t, fx, Options{MaxMessageSize: 64 << 10})
	_, err := w.Write(tversionMsg(4 << 20))
	require.NoError(t, err)
	var hdr [11]byte
	_, err = io.ReadFull(r, hdr[:])
	require.NoError(t, err)
	assert.Equal(t, byte(101), hdr[4], "Rversion")
	assert.Equal(t, uint32(64<<10), binary.LittleEndian.Uint32(hdr[7:]), "negotiated msize")
	rest := make([]byte, binary.LittleEndian.Uint32(hdr[:])-11)
	_, err = io.ReadFull(r, rest)
	require.NoError(t, err)

	big := binary.LittleEndian.AppendUint32(nil, 64<<10+1)
	big = append(big, 118, 1, 0) // Twrite
	_, err = w.Write(big)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the server still reads after an oversized message")
	}
	_, err = io.ReadAll(r)
	require.NoError(t, err)
	assert.Contains(t, fx.refusals(), "message over the size bound")
	fx.noPanics(t)
	assert.Error(t, Serve(Export{Root: fx.root}, nopRW{}, nopRW{}, Options{MaxMessageSize: 100}), "a bound below 4 KiB")
}

type nopRW struct{}

func (nopRW) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopRW) Write(p []byte) (int, error) { return len(p), nil }
func (nopRW) Close() error                { return nil }

// Garbage, cut messages and random bytes after a valid Tversion: the
// server answers with errors or ends the connection, never panics, and
// nothing outside the export changes.
func TestGarbageRequests(t *testing.T) {
	fx := newFixture(t)
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := [][]byte{
		{}, {1, 2, 3}, {0, 0, 0, 0, 0, 0, 0}, {7, 0, 0, 0, 200, 1, 0},
		append(tversionMsg(8192), 0xff, 0xff, 0xff, 0xff),
		append(tversionMsg(8192), 20, 0, 0, 0, 110, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0), // Twalk cut short
	}
	for range 50 {
		b := tversionMsg(8192)
		junk := make([]byte, rng.IntN(2000))
		for i := range junk {
			junk[i] = byte(rng.Uint32())
		}
		inputs = append(inputs, append(b, junk...))
	}
	for _, in := range inputs {
		w, r, done := rawServe(t, fx, Options{})
		go func() { _, _ = io.Copy(io.Discard, r) }()
		_, _ = w.Write(in)
		w.Close()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("Serve did not end for input %x", in)
		}
	}
	fx.noPanics(t)
	fx.checkOutside(t)
}

// The rate limiter writes the first line of a kind at once and counts the
// rest until the interval has passed.
func TestRateLimiter(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	r := NewRateLimiter(&buf, 10*time.Second)
	r.now = func() time.Time { return now }
	for range 5 {
		r.Report("mknod")
	}
	r.Report("open of a FIFO")
	assert.Equal(t, "hpcvmm-9p: refused: mknod\nhpcvmm-9p: refused: open of a FIFO\n", buf.String())
	now = now.Add(11 * time.Second)
	r.Report("mknod")
	assert.Contains(t, buf.String(), "refused: mknod (and 4 more since the last line)")
	r.Report("mknod")
	buf.Reset()
	r.Flush()
	assert.Equal(t, "hpcvmm-9p: refused: mknod 1 more times\n", buf.String())
}

// Lock is flock on the open file, never blocking the server. (Tested on
// the attacher: the p9 v0.3.0 client's Lock sends no fid.)
func TestLock(t *testing.T) {
	fx := newFixture(t)
	a, err := newAttacher(fx.root, false, Options{})
	require.NoError(t, err)
	defer a.close()
	root, err := a.Attach()
	require.NoError(t, err)
	defer root.Close()
	f, _, _, err := root.Create("locked", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
	require.NoError(t, err)
	defer f.Close()
	status, err := f.Lock(1, p9.WriteLock, 0, 0, 0, "")
	require.NoError(t, err)
	assert.Equal(t, p9.LockStatusOK, status)
	other, err := os.Open(filepath.Join(fx.export, "locked"))
	require.NoError(t, err)
	defer other.Close()
	assert.ErrorIs(t, unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB), unix.EWOULDBLOCK, "the host sees the guest's lock")
	require.NoError(t, unix.Flock(int(other.Fd()), unix.LOCK_UN))
	status, err = f.Lock(1, p9.Unlock, 0, 0, 0, "")
	require.NoError(t, err)
	assert.Equal(t, p9.LockStatusOK, status)
	require.NoError(t, unix.Flock(int(other.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	_, f2, err := root.Walk([]string{"locked"})
	require.NoError(t, err)
	defer f2.Close()
	_, _, err = f2.Open(p9.ReadOnly)
	require.NoError(t, err)
	status, err = f2.Lock(1, p9.ReadLock, 0, 0, 0, "")
	require.NoError(t, err)
	assert.Equal(t, p9.LockStatusBlocked, status, "a lock held elsewhere")
}

// Errors the guest sees are errnos.
func TestErrno(t *testing.T) {
	assert.Equal(t, linux.ENOENT, errno(unix.ENOENT))
	assert.Equal(t, linux.EIO, errno(io.ErrUnexpectedEOF))
	assert.NoError(t, errno(nil))
}

// tflushMsg is a Tflush with tag tag for oldtag old.
func tflushMsg(tag, old uint16) []byte {
	b := binary.LittleEndian.AppendUint32(nil, 9)
	b = append(b, tflush)
	b = binary.LittleEndian.AppendUint16(b, tag)
	return binary.LittleEndian.AppendUint16(b, old)
}

// A flush of itself, or two flushes of each other, would leave the p9
// library waiting for ever (found by FuzzServer): the connection must
// still end when the guest closes it.
func TestFlushCyclesEnd(t *testing.T) {
	fx := newFixture(t)
	for name, in := range map[string][]byte{
		"self":  tflushMsg(5, 5),
		"cycle": append(tflushMsg(5, 6), tflushMsg(6, 5)...),
	} {
		w, r, done := rawServe(t, fx, Options{})
		go func() { _, _ = io.Copy(io.Discard, r) }()
		_, err := w.Write(append(tversionMsg(8192), in...))
		require.NoError(t, err)
		w.Close()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the connection hangs", name)
		}
	}
}

// closeRecorder records whether Close was called.
type closeRecorder struct {
	io.Reader
	io.Writer
	closed bool
}

func (c *closeRecorder) Close() error { c.closed = true; return nil }

// TestHandleRecoveringShutdownRace: the p9 library's shutdown race (its
// WaitGroup's Wait panicking "reused before previous Wait has returned"
// when a late receive goroutine adds itself) ends the connection, both
// ends closed and the race logged, instead of killing the file server;
// any other panic still propagates.
func TestHandleRecoveringShutdownRace(t *testing.T) {
	req, rep := &closeRecorder{}, &closeRecorder{}
	var logged []string
	logf := func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) }
	err := handleRecovering(func(io.ReadCloser, io.WriteCloser) error {
		panic("sync: WaitGroup is reused before previous Wait has returned")
	}, req, rep, logf)
	require.NoError(t, err)
	assert.True(t, req.closed, "the request end is closed")
	assert.True(t, rep.closed, "the reply end is closed")
	require.Len(t, logged, 1)
	assert.Contains(t, logged[0], "late receive goroutine")

	assert.PanicsWithValue(t, "unused tag cleared", func() {
		_ = handleRecovering(func(io.ReadCloser, io.WriteCloser) error { panic("unused tag cleared") }, req, rep, logf)
	}, "another panic of the library is not swallowed")
	wantErr := errors.New("x")
	assert.Equal(t, wantErr, handleRecovering(func(io.ReadCloser, io.WriteCloser) error { return wantErr }, req, rep, nil))
}
