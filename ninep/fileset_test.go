package ninep

import (
	"bytes"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
)

// setFixture is a driver-like file set over the fixture's tree: two
// libraries in one host directory, a program in another, beside files of
// those directories that are not in the set (export/file, export/sub/inner
// and everything under outside/), and the soname links.
type setFixture struct {
	*fixture
	lib, libOther, bin string
	set                *FileSet
}

func newSetFixture(t testing.TB) *setFixture {
	fx := newFixture(t)
	sf := &setFixture{fixture: fx,
		lib:      filepath.Join(fx.export, "libcuda.so.580.159.04"),
		libOther: filepath.Join(fx.export, "libnvidia-ml.so.580.159.04"),
		bin:      filepath.Join(fx.export, "sub", "nvidia-smi")}
	require.NoError(t, os.WriteFile(sf.lib, []byte("cuda 580"), 0o644))
	require.NoError(t, os.WriteFile(sf.libOther, []byte("nvml 580"), 0o644))
	require.NoError(t, os.WriteFile(sf.bin, []byte("#!/bin/sh\n"), 0o755))
	set, err := OpenFileSet([]string{sf.lib, sf.libOther, sf.bin}, []SetLink{
		{Name: "libcuda.so.1", Target: "libcuda.so.580.159.04"},
		{Name: "libcuda.so", Target: "libcuda.so.1"},
		{Name: "libnvidia-ml.so.1", Target: "libnvidia-ml.so.580.159.04"},
	})
	require.NoError(t, err)
	t.Cleanup(func() { set.Close() })
	sf.set = set
	return sf
}

func (sf *setFixture) serve(t testing.TB) p9.File {
	t.Helper()
	srv, cli := socketPair(t)
	done := make(chan error, 1)
	go func() { done <- Serve(Export{Files: sf.set}, srv, srv, sf.options(Options{MaxFids: 64})) }()
	c, err := p9.NewClient(cli, p9.WithMessageSize(64<<10))
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
		sf.noPanics(t)
	})
	return root
}

// TestFileSetNames: the directory lists exactly the set, files with their
// host attributes, links as links with their text; files read as on the
// host; the names of the set only are found.
func TestFileSetNames(t *testing.T) {
	sf := newSetFixture(t)
	want := []string{"libcuda.so", "libcuda.so.1", "libcuda.so.580.159.04", "libnvidia-ml.so.1", "libnvidia-ml.so.580.159.04", "nvidia-smi"}
	require.Equal(t, want, sf.set.Names())
	root := sf.serve(t)

	_, dir, err := root.Walk(nil)
	require.NoError(t, err)
	_, _, err = dir.Open(p9.ReadOnly)
	require.NoError(t, err)
	var names []string
	for off := uint64(0); ; {
		ents, err := dir.Readdir(off, 60) // two entries a call at most
		require.NoError(t, err)
		if len(ents) == 0 {
			break
		}
		for _, e := range ents {
			names = append(names, e.Name)
			off = e.Offset
			assert.Equal(t, map[bool]p9.QIDType{true: p9.TypeSymlink, false: p9.TypeRegular}[e.Name == "libcuda.so" || e.Name == "libcuda.so.1" || e.Name == "libnvidia-ml.so.1"], e.Type, e.Name)
		}
	}
	dir.Close()
	require.Equal(t, want, names)

	_, _, attr, err := root.GetAttr(p9.AttrMaskAll)
	require.NoError(t, err)
	assert.Equal(t, p9.ModeDirectory|0o555, attr.Mode)

	for name, text := range map[string]string{"libcuda.so.580.159.04": "cuda 580", "libnvidia-ml.so.580.159.04": "nvml 580", "nvidia-smi": "#!/bin/sh\n"} {
		f, err := walk(root, name)
		require.NoError(t, err, name)
		got, err := readAll(f)
		require.NoError(t, err, name)
		assert.Equal(t, text, got, name)
		_, _, attr, err := f.GetAttr(p9.AttrMaskAll)
		require.NoError(t, err)
		st, err := os.Stat(map[string]string{"libcuda.so.580.159.04": sf.lib, "libnvidia-ml.so.580.159.04": sf.libOther, "nvidia-smi": sf.bin}[name])
		require.NoError(t, err)
		assert.Equal(t, uint64(st.Size()), attr.Size, name)
		assert.Equal(t, uint32(st.Mode().Perm()), uint32(attr.Mode.Permissions()), name)
		f.Close()
	}
	for name, target := range map[string]string{"libcuda.so.1": "libcuda.so.580.159.04", "libcuda.so": "libcuda.so.1"} {
		l, err := walk(root, name)
		require.NoError(t, err)
		got, err := l.Readlink()
		require.NoError(t, err)
		assert.Equal(t, target, got)
		_, _, attr, err := l.GetAttr(p9.AttrMaskAll)
		require.NoError(t, err)
		assert.True(t, attr.Mode.IsSymlink())
		_, _, err = l.Open(p9.ReadOnly)
		assert.Error(t, err, "a link is never opened (the library refuses it first, EINVAL; the server would say EACCES)")
		l.Close()
	}
	sf.checkOutside(t)
}

// TestFileSetNoEscape: the set's directories' other files, the fixture's
// links out and the outside tree are not reachable; nothing walks below a
// file or a link; ".." and paths are refused; a file replaced on the host
// is not served (ESTALE), nor a link swapped in for it.
func TestFileSetNoEscape(t *testing.T) {
	sf := newSetFixture(t)
	root := sf.serve(t)
	for _, name := range []string{"file", "sub", "inner", "abs", "rel", "updir", "secret", "export"} {
		_, err := walk(root, name)
		assert.ErrorIs(t, err, linux.ENOENT, name)
	}
	for _, path := range []string{"..", ".", "nvidia-smi/..", "libcuda.so.1/x", "nvidia-smi/x", "sub/inner"} {
		_, err := walk(root, path)
		assert.Error(t, err, path)
	}
	_, _, err := root.Walk([]string{"a/b"})
	assert.Error(t, err)

	f, err := walk(root, "libcuda.so.580.159.04")
	require.NoError(t, err)
	require.NoError(t, os.Rename(sf.lib, sf.lib+".old"))
	require.NoError(t, os.Symlink(filepath.Join(sf.outside, "secret"), sf.lib))
	_, _, err = f.Open(p9.ReadOnly)
	assert.Error(t, err, "a link swapped in is not followed")
	require.NoError(t, os.Remove(sf.lib))
	require.NoError(t, os.WriteFile(sf.lib, []byte("another driver"), 0o644))
	_, f2, err := f.Walk(nil)
	require.NoError(t, err)
	_, _, err = f2.Open(p9.ReadOnly)
	assert.ErrorIs(t, err, linux.ESTALE, "the file hpcvmm opened is gone: not another served in its place")
	f.Close()
	f2.Close()
	sf.checkOutside(t)
}

// TestFileSetReadOnly: every change, at the root, on a file and on a
// link, is EROFS and changes nothing on the host.
func TestFileSetReadOnly(t *testing.T) {
	sf := newSetFixture(t)
	before := snapshot(t, sf.export)
	root := sf.serve(t)
	file, err := walk(root, "nvidia-smi")
	require.NoError(t, err)
	link, err := walk(root, "libcuda.so.1")
	require.NoError(t, err)
	ops := map[string]func() error{
		"create":  func() error { _, _, _, err := root.Create("new", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID); return err },
		"mkdir":   func() error { _, err := root.Mkdir("d", 0o755, p9.NoUID, p9.NoGID); return err },
		"symlink": func() error { _, err := root.Symlink("x", "s", p9.NoUID, p9.NoGID); return err },
		"link":    func() error { return root.Link(file, "l") },
		"rename":  func() error { return root.RenameAt("nvidia-smi", root, "f") },
		"unlink":  func() error { return root.UnlinkAt("nvidia-smi", 0) },
		"mknod":   func() error { _, err := root.Mknod("n", p9.ModeNamedPipe|0o644, 0, 0, p9.NoUID, p9.NoGID); return err },
		"chmod":   func() error { return file.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777}) },
		"chmod-root": func() error {
			return root.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777})
		},
		"utimes-link": func() error { return link.SetAttr(p9.SetAttrMask{MTime: true}, p9.SetAttr{}) },
		"truncate":    func() error { return file.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}) },
		"open-write": func() error {
			_, f, _ := file.Walk(nil)
			defer f.Close()
			_, _, err := f.Open(p9.WriteOnly)
			return err
		},
		"open-root-trunc": func() error {
			_, f, _ := root.Walk(nil)
			defer f.Close()
			_, _, err := f.Open(p9.ReadOnly | dotlTrunc)
			return err
		},
	}
	for name, op := range ops {
		assert.ErrorIs(t, op(), linux.EROFS, name)
	}
	assert.Equal(t, before, snapshot(t, sf.export), "the set's host directory changed")
	got, err := readAll(file)
	require.NoError(t, err, "reading stays allowed")
	assert.Equal(t, "#!/bin/sh\n", got)
}

// TestOpenFileSetRefuses: relative paths, a symbolic link (the driver's
// files are given resolved), a directory, two files of one name, a link
// that shadows a name or points outside the set; nothing stays open.
func TestOpenFileSetRefuses(t *testing.T) {
	sf := newSetFixture(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	n := fds()
	for name, c := range map[string]struct {
		paths []string
		links []SetLink
		want  string
	}{
		"relative":    {[]string{"export/file"}, nil, "not an absolute, clean path"},
		"unclean":     {[]string{sf.export + "/sub/../file"}, nil, "not an absolute, clean path"},
		"symlink":     {[]string{filepath.Join(sf.export, "abs")}, nil, "not a regular file"},
		"directory":   {[]string{filepath.Join(sf.export, "sub")}, nil, "not a regular file"},
		"missing":     {[]string{filepath.Join(sf.export, "nosuch")}, nil, "no such file"},
		"same name":   {[]string{sf.lib, filepath.Join(sf.outside, "dir", "libcuda.so.580.159.04")}, nil, "two files named"},
		"shadow":      {[]string{sf.lib}, []SetLink{{Name: "libcuda.so.580.159.04", Target: "libcuda.so.580.159.04"}}, "a name the set already has"},
		"out":         {[]string{sf.lib}, []SetLink{{Name: "x", Target: "../outside/secret"}}, "the target must be another name of the set"},
		"self":        {[]string{sf.lib}, []SetLink{{Name: "x", Target: "x"}}, "the target must be another name of the set"},
		"slash name":  {[]string{sf.lib}, []SetLink{{Name: "a/b", Target: "libcuda.so.580.159.04"}}, "not one path component"},
		"dotdot link": {[]string{sf.lib}, []SetLink{{Name: "..", Target: "libcuda.so.580.159.04"}}, "not one path component"},
	} {
		if name == "same name" {
			require.NoError(t, os.WriteFile(c.paths[1], []byte("x"), 0o644))
		}
		_, err := OpenFileSet(c.paths, c.links)
		require.ErrorContains(t, err, c.want, name)
		if name == "same name" {
			require.NoError(t, os.Remove(c.paths[1]))
		}
	}
	assert.Equal(t, n, fds(), "no descriptor left open")
	_, err := Spawn("/nonexistent", []Export{{Files: sf.set, Root: sf.root}}, SpawnOptions{})
	assert.Error(t, err, "a root and a set in one export")
}

// TestSpawnServesAFileSet: the child process serves a file set beside a
// directory export (descriptors and names passed as Spawn lays them out),
// under its seccomp filter: the set's files read, its links read back,
// a change refused and logged.
func TestSpawnServesAFileSet(t *testing.T) {
	sf := newSetFixture(t)
	self, err := os.Executable()
	require.NoError(t, err)
	var log testenv.LockedBuffer
	p, err := Spawn(self, []Export{{Root: sf.root, ReadOnly: true}, {Files: sf.set}}, SpawnOptions{MaxMessageSize: 64 << 10, Seccomp: true, Log: &log})
	require.NoError(t, err)
	c := p.Conns[1]
	cl, err := p9.NewClient(connRW{Reader: c.Replies, WriteCloser: c.Requests, r: c.Replies}, p9.WithMessageSize(64<<10))
	require.NoError(t, err)
	root, err := cl.Attach("")
	require.NoError(t, err)
	f, err := walk(root, "libnvidia-ml.so.580.159.04")
	require.NoError(t, err)
	got, err := readAll(f)
	require.NoError(t, err)
	assert.Equal(t, "nvml 580", got)
	l, err := walk(root, "libcuda.so.1")
	require.NoError(t, err)
	target, err := l.Readlink()
	require.NoError(t, err)
	assert.Equal(t, "libcuda.so.580.159.04", target)
	_, err = walk(root, "file")
	assert.ErrorIs(t, err, linux.ENOENT, "the directory's other files are not in the set")
	assert.ErrorIs(t, root.UnlinkAt("nvidia-smi", 0), linux.EROFS)
	f.Close()
	l.Close()
	root.Close()
	cl.Close()
	require.NoError(t, p.Close(), "log: %s", log.String())
	assert.Contains(t, log.String(), "hpcvmm-9p: refused: export 1: unlink on a read-only bind")
	sf.checkOutside(t)
}

// The child refuses file-set arguments that do not describe a set.
func TestChildRefusesBadSetArgs(t *testing.T) {
	for _, set := range [][]string{
		{"set:1:1:0"},               // too few names
		{"set:2:1:0", "0/a"},        // more directories than files
		{"set:1:1:0", "1/a"},        // directory index out of range
		{"set:1:1:0", "0/.."},       // not a name
		{"set:1:2:0", "0/b", "0/a"}, // not sorted
		{"set:1:2:0", "0/a", "0/a"}, // twice
		{"set:1:1:1", "0/a", "l/x"}, // link to nothing
		{"set:1:1:1", "0/a", "a/a"}, // link shadowing a file
		{"set:1:1:1", "0/a", "l/l"}, // link to itself
		{"set:x:1:0", "0/a"},        // not numbers
		{"set:1:1:0:9", "0/a"},      // trailing junk is not a count
		{"set:1:600:0"},             // over MaxSetEntries
	} {
		_, err := parseChildArgs(append([]string{"-msize", "0", "-seccomp", "off"}, set...))
		assert.Error(t, err, "%q", set)
	}
	c, err := parseChildArgs([]string{"-msize", "0", "-seccomp", "off", "rw", "set:1:2:1", "0/a", "0/b", "l/a", "ro"})
	require.NoError(t, err)
	require.Len(t, c.exports, 3)
	assert.Equal(t, &childSet{dirs: 1, names: []string{"a", "b"}, dirOf: []int{0, 0}, links: []SetLink{{Name: "l", Target: "a"}}}, c.exports[1].set)
	assert.True(t, c.exports[1].readOnly)
}

// FuzzFileSet feeds raw request bytes to a FileSet export's Serve.
// Property: the server ends when the input does, never panics, reads or
// changes nothing outside the set (inotify on the outside tree and on a
// FIFO beside the set's files, the snapshots of the outside tree and of
// the set's own host directory, which it never changes either).
func FuzzFileSet(f *testing.F) {
	var sessions []func(root p9.File)
	for _, name := range slices.Sorted(maps.Keys(seedSessions)) {
		sessions = append(sessions, seedSessions[name])
	}
	sessions = append(sessions, func(root p9.File) {
		if l, err := walk(root, "libcuda.so.1"); err == nil {
			_, _ = l.Readlink()
			l.Close()
		}
		if file, err := walk(root, "libcuda.so.580.159.04"); err == nil {
			_, _ = readAll(file)
			_ = file.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{})
			file.Close()
		}
		_, _ = root.Readdir(0, 100)
	})
	for _, session := range sessions {
		sf := newSetFixture(f)
		srv, cli := socketPair(f)
		rec := &recorder{ReadWriteCloser: cli}
		done := make(chan error, 1)
		go func() { done <- Serve(Export{Files: sf.set}, srv, srv, Options{}) }()
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
		sf := newSetFixture(t)
		// A FIFO beside the set's files, which the watch sees opened.
		require.NoError(t, unix.Mkfifo(filepath.Join(sf.export, "fifo"), 0o666))
		before := snapshot(t, sf.export)
		w := newWatch(t, sf.fixture)
		reqR, reqW, err := os.Pipe()
		require.NoError(t, err)
		repR, repW, err := os.Pipe()
		require.NoError(t, err)
		defer repR.Close()
		done := make(chan error, 1)
		go func() {
			done <- Serve(Export{Files: sf.set}, reqR, repW, sf.options(Options{MaxMessageSize: 64 << 10}))
		}()
		go func() { _, _ = io.Copy(io.Discard, repR) }()
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
		sf.noPanics(t)
		require.Zero(t, w.events(), "a request opened, read or changed a node outside the set")
		sf.checkOutside(t)
		require.Equal(t, withoutSetAtimes(before), withoutSetAtimes(snapshot(t, sf.export)), "the set's host directory changed")
	})
}

// withoutSetAtimes is a snapshot of the set's host directory less the
// access times of the set's own files, which reading them may change.
func withoutSetAtimes(snap map[string]string) map[string]string {
	out := maps.Clone(snap)
	for _, k := range []string{"libcuda.so.580.159.04", "libnvidia-ml.so.580.159.04", "sub/nvidia-smi"} {
		f := strings.Fields(out[k])
		if i := slices.Index(f, "atime"); i >= 0 && i+1 < len(f) {
			out[k] = strings.Join(slices.Delete(f, i, i+2), " ")
		}
	}
	return out
}
