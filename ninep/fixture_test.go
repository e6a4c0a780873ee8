package ninep

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// secretText is the content of every file outside the export: a reply
// that carries it is an escape.
const secretText = "TOPSECRET-outside-the-bind"

// fixture is an export with a sibling "outside" tree the server must never
// read or change, and links from the export pointing out of it.
type fixture struct {
	dir, export, outside string
	root                 *os.File
	before               map[string]string

	mu      sync.Mutex
	refused []string
	logs    []string
}

// newFixture lays out:
//
//	outside/secret, outside/dir/secret2       (secretText; atime before mtime)
//	export/file ("inside"), export/sub/inner  ("inner")
//	export/abs -> DIR/outside/secret          (absolute link out)
//	export/rel -> ../outside/secret           (relative link out)
//	export/updir -> ../outside                (directory link out)
func newFixture(t testing.TB) *fixture {
	t.Helper()
	dir := t.TempDir()
	fx := &fixture{dir: dir, export: filepath.Join(dir, "export"), outside: filepath.Join(dir, "outside")}
	for _, d := range []string{fx.export, filepath.Join(fx.export, "sub"), fx.outside, filepath.Join(fx.outside, "dir")} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for name, text := range map[string]string{
		"outside/secret": secretText, "outside/dir/secret2": secretText,
		"export/file": "inside", "export/sub/inner": "inner",
	} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	require.NoError(t, os.Symlink(filepath.Join(fx.outside, "secret"), filepath.Join(fx.export, "abs")))
	require.NoError(t, os.Symlink("../outside/secret", filepath.Join(fx.export, "rel")))
	require.NoError(t, os.Symlink("../outside", filepath.Join(fx.export, "updir")))
	// relatime updates atime on a read when it is not after mtime: an
	// atime an hour before mtime makes any read of an outside file show.
	for _, f := range []string{"secret", "dir/secret2"} {
		p := filepath.Join(fx.outside, f)
		st, err := os.Stat(p)
		require.NoError(t, err)
		require.NoError(t, os.Chtimes(p, st.ModTime().Add(-time.Hour), st.ModTime()))
	}
	root, err := os.OpenFile(fx.export, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { root.Close() })
	fx.root = root
	fx.before = snapshot(t, fx.outside)
	return fx
}

// snapshot describes every entry under dir: type, mode, size, link count,
// modification time, a file's access time and content hash (read with O_NOATIME, so
// taking it changes nothing).
func snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("%o %d %d %d.%d", st.Mode, st.Size, st.Nlink, st.Mtim.Sec, st.Mtim.Nsec)
		if st.Mode&unix.S_IFMT == unix.S_IFREG {
			// A directory's atime is left out: this walk reads it.
			desc += fmt.Sprintf(" atime %d.%d", st.Atim.Sec, st.Atim.Nsec)
			fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOATIME|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			f := os.NewFile(uintptr(fd), p)
			h := sha256.New()
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
			desc += " " + hex.EncodeToString(h.Sum(nil))
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = desc
		return nil
	})
	require.NoError(t, err)
	return out
}

// checkOutside fails t if anything outside the export was read or
// changed since the fixture was made.
func (fx *fixture) checkOutside(t testing.TB) {
	t.Helper()
	require.Equal(t, fx.before, snapshot(t, fx.outside), "the tree outside the export was read or changed")
}

// options are Options that record refusals and the library's log.
func (fx *fixture) options(o Options) Options {
	o.Refused = func(what string) {
		fx.mu.Lock()
		fx.refused = append(fx.refused, what)
		fx.mu.Unlock()
	}
	o.Logf = func(format string, args ...any) {
		fx.mu.Lock()
		fx.logs = append(fx.logs, fmt.Sprintf(format, args...))
		fx.mu.Unlock()
	}
	return o
}

// refusals returns the refusals recorded so far.
func (fx *fixture) refusals() []string {
	fx.mu.Lock()
	defer fx.mu.Unlock()
	return slices.Clone(fx.refused)
}

// noPanics fails t if the p9 library recovered a panic of a handler.
func (fx *fixture) noPanics(t testing.TB) {
	t.Helper()
	fx.mu.Lock()
	defer fx.mu.Unlock()
	for _, l := range fx.logs {
		require.NotContains(t, l, "panic", "a handler panicked")
	}
}

// serve starts Serve on one end of a socket pair and returns a client
// attached to the export's root; both end with the test.
func (fx *fixture) serve(t testing.TB, ro bool, o Options, msize uint32) (*p9.Client, p9.File) {
	t.Helper()
	srv, cli := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- Serve(Export{Root: fx.root, ReadOnly: ro}, srv, srv, fx.options(o)) }()
	c, err := p9.NewClient(cli, p9.WithMessageSize(msize))
	require.NoError(t, err)
	root, err := c.Attach("")
	require.NoError(t, err)
	t.Cleanup(func() {
		root.Close()
		c.Close()
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after the client closed")
		}
		fx.noPanics(t)
	})
	return c, root
}

// socketPair is a connected stream socket pair as two files.
func socketPair(t testing.TB) (a, b *os.File) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	require.NoError(t, err)
	return os.NewFile(uintptr(fds[0]), "server"), os.NewFile(uintptr(fds[1]), "client")
}

// readAll opens f read-only (a walked clone) and reads it whole.
func readAll(f p9.File) (string, error) {
	_, nf, err := f.Walk(nil)
	if err != nil {
		return "", err
	}
	defer nf.Close()
	if _, _, err := nf.Open(p9.ReadOnly); err != nil {
		return "", err
	}
	var sb strings.Builder
	buf := make([]byte, 4096)
	for off := int64(0); ; {
		n, err := nf.ReadAt(buf, off)
		sb.Write(buf[:n])
		off += int64(n)
		if err == io.EOF || n == 0 {
			return sb.String(), nil
		}
		if err != nil {
			return sb.String(), err
		}
	}
}

// walk walks root along the slash-separated path.
func walk(root p9.File, path string) (p9.File, error) {
	_, f, err := root.Walk(strings.Split(path, "/"))
	return f, err
}
