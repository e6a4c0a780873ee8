package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"
)

// tarEnt is one entry of a test archive.
type tarEnt struct {
	name, body, link string
	typ              byte
	mode             int64
}

func file(name, body string) tarEnt {
	return tarEnt{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func exe(name, body string) tarEnt {
	return tarEnt{name: name, body: body, typ: tar.TypeReg, mode: 0o755}
}
func dir(name string) tarEnt { return tarEnt{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) tarEnt {
	return tarEnt{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}

func tarBytes(t testing.TB, ents ...tarEnt) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)), Format: tar.FormatPAX}
		require.NoError(t, tw.WriteHeader(hdr))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

// collect walks im and returns "name kind [link|content]" lines in walk
// order.
func collect(t testing.TB, im *Image) []string {
	t.Helper()
	var out []string
	require.NoError(t, im.Walk(func(e *Entry, r io.Reader) error {
		s := e.Name + " "
		switch {
		case e.IsDir():
			s += "dir"
		case e.Mode&fs.ModeSymlink != 0:
			s += "link " + e.Link
		case e.Hardlink:
			s += "hardlink " + e.Link
		default:
			b, err := io.ReadAll(r)
			require.NoError(t, err)
			require.Len(t, b, int(e.Size))
			s += "file " + string(b)
		}
		out = append(out, s)
		return nil
	}))
	return out
}

var basicTree = []tarEnt{dir("bin"), exe("bin/sh", "#!sh"), symlink("bin/ash", "sh"), file("etc/hostname", "h"), symlink("etc/pw", "/etc/passwd")}

var basicWant = []string{"bin dir", "bin/sh file #!sh", "bin/ash link sh", "etc dir", "etc/hostname file h", "etc/pw link /etc/passwd"}

func writeFile(t testing.TB, b []byte) string {
	p := filepath.Join(t.TempDir(), "image")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func TestOpenTarFormats(t *testing.T) {
	raw := tarBytes(t, basicTree...)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	var zs bytes.Buffer
	zsw, _ := zstd.NewWriter(&zs)
	zsw.Write(raw)
	zsw.Close()
	for name, b := range map[string][]byte{"plain": raw, "gzip": gz.Bytes(), "zstd": zs.Bytes()} {
		t.Run(name, func(t *testing.T) {
			im, err := Open(writeFile(t, b))
			require.NoError(t, err)
			require.Equal(t, FormatTar, im.Format())
			require.Equal(t, basicWant, collect(t, im))
			k1, err := im.Key()
			require.NoError(t, err)
			im2, _ := Open(writeFile(t, append(b[:len(b):len(b)], 0)))
			k2, err := im2.Key()
			require.NoError(t, err)
			require.NotEqual(t, k1, k2, "a different file has a different key")
		})
	}
}

func TestOpenDirectory(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "bin/sh"), []byte("#!sh"), 0o755))
	require.NoError(t, os.Symlink("sh", filepath.Join(root, "bin/ash")))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("h"), 0o644))
	// A symlink to the host's /etc/passwd stays a link: never followed.
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(root, "etc/pw")))
	im, err := Open(root)
	require.NoError(t, err)
	require.Equal(t, FormatDir, im.Format())
	require.Equal(t, []string{"bin dir", "bin/ash link sh", "bin/sh file #!sh", "etc dir", "etc/hostname file h", "etc/pw link /etc/passwd"}, collect(t, im))

	k1, err := im.Key()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("x"), 0o644))
	im2, _ := Open(root)
	k2, _ := im2.Key()
	require.NotEqual(t, k1, k2, "changed content, changed key")

	u, err := im.Usage()
	require.NoError(t, err)
	require.Equal(t, int64(6), u.Entries)
	require.Equal(t, int64(5), u.Bytes)
	require.Equal(t, int64(6*EntryOverhead+2*PageSize), u.Memory)
}

// layer builds an image layer from tar entries.
func layer(t testing.TB, ents ...tarEnt) v1.Layer {
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	require.NoError(t, err)
	return l
}

// whiteoutImage: the second layer deletes a file of the first (whiteout),
// empties a directory (opaque whiteout) and adds a file.
func whiteoutImage(t testing.TB) v1.Image {
	l1 := layer(t, dir("bin"), exe("bin/sh", "#!sh"), dir("data"), file("data/secret", "s"), file("data/keep", "k"),
		dir("opq"), file("opq/old", "o"))
	l2 := layer(t, file("data/.wh.secret", ""), dir("opq"), file("opq/.wh..wh..opq", ""), file("opq/new", "n"), file("etc/added", "a"))
	img, err := mutate.AppendLayers(empty.Image, l1, l2)
	require.NoError(t, err)
	return img
}

func names(lines []string) []string {
	var out []string
	for _, l := range lines {
		out = append(out, strings.SplitN(l, " ", 2)[0])
	}
	sort.Strings(out)
	return out
}

func TestOCILayoutWhiteouts(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, p.AppendImage(whiteoutImage(t)))
	im, err := Open(dir)
	require.NoError(t, err)
	require.Equal(t, FormatOCILayout, im.Format())
	got := collect(t, im)
	require.Equal(t, []string{"bin", "bin/sh", "data", "data/keep", "etc", "etc/added", "opq", "opq/new"}, names(got))
	requireParentsFirst(t, got)
	k, err := im.Key()
	require.NoError(t, err)
	require.NotEqual(t, Key{}, k)
	_, err = im.LookPath("sh", "/usr/bin:/bin")
	require.NoError(t, err)
	_, err = im.LookPath("secret", "/data")
	require.ErrorIs(t, err, ErrNotFound)
}

func TestDockerArchive(t *testing.T) {
	p := filepath.Join(t.TempDir(), "saved.tar")
	ref, err := name.ParseReference("example.com/job:1")
	require.NoError(t, err)
	require.NoError(t, tarball.WriteToFile(p, ref, whiteoutImage(t)))
	im, err := Open(p)
	require.NoError(t, err)
	require.Equal(t, FormatDockerArchive, im.Format())
	require.Equal(t, []string{"bin", "bin/sh", "data", "data/keep", "etc", "etc/added", "opq", "opq/new"}, names(collect(t, im)))
}

func requireParentsFirst(t testing.TB, lines []string) {
	seen := map[string]bool{"": true}
	for _, l := range lines {
		n := strings.SplitN(l, " ", 2)[0]
		dir := filepath.Dir(n)
		if dir == "." {
			dir = ""
		}
		require.True(t, seen[dir], "%s before its parent", n)
		seen[n] = true
	}
}

func TestBadInput(t *testing.T) {
	_, err := Open("/nonexistent/image")
	require.ErrorContains(t, err, "/nonexistent/image does not exist")
	p := writeFile(t, []byte("just some text, not an archive at all"))
	_, err = Open(p)
	require.ErrorContains(t, err, "is not a known format")
	require.ErrorContains(t, err, p)

	// A gzip stream that does not hold a tar.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("not a tar"))
	zw.Close()
	_, err = Open(writeFile(t, gz.Bytes()))
	require.ErrorContains(t, err, "does not hold a tar archive")

	// A truncated archive: opened, but the walk says it is corrupt.
	raw := tarBytes(t, file("a", strings.Repeat("x", 4096)), file("b", "y"))
	p = writeFile(t, raw[:1500])
	_, err = Open(p)
	require.ErrorContains(t, err, "corrupt or truncated")
	require.ErrorContains(t, err, p)
	// Compressed, the truncation shows only when the walk reaches it.
	var tgz bytes.Buffer
	zw = gzip.NewWriter(&tgz)
	zw.Write(raw[:1500])
	zw.Close()
	p = writeFile(t, tgz.Bytes())
	im, err := Open(p)
	require.NoError(t, err)
	err = im.Walk(func(*Entry, io.Reader) error { return nil })
	require.ErrorContains(t, err, "corrupt or truncated")
	require.ErrorContains(t, err, p)
}

func TestPathEscapesRefused(t *testing.T) {
	for _, n := range []string{"../x", "a/../../x", "/abs", "/etc/passwd"} {
		p := writeFile(t, tarBytes(t, file("ok", "1"), file(n, "evil")))
		im, err := Open(p)
		require.NoError(t, err)
		err = im.Walk(func(*Entry, io.Reader) error { return nil })
		require.Error(t, err, n)
		require.ErrorContains(t, err, p)
		require.ErrorContains(t, err, n)
	}
	// Inside names that merely look odd are cleaned, not refused.
	im, err := Open(writeFile(t, tarBytes(t, file("./a/../b", "1"), dir("c/"))))
	require.NoError(t, err)
	require.Equal(t, []string{"b file 1", "c dir"}, collect(t, im))

	// A layer entry escaping the root fails the container image too.
	l := layer(t, file("../escape", "x"))
	img, err := mutate.AppendLayers(empty.Image, l)
	require.NoError(t, err)
	dir := t.TempDir()
	lp, _ := layout.Write(dir, empty.Index)
	require.NoError(t, lp.AppendImage(img))
	oim, err := Open(dir)
	require.NoError(t, err)
	err = oim.Walk(func(*Entry, io.Reader) error { return nil })
	require.ErrorContains(t, err, "../escape")
	require.ErrorContains(t, err, dir)

	// Below a symlink: refused (the guest's unpacking would follow it).
	im, err = Open(writeFile(t, tarBytes(t, symlink("etc", "/host-etc"), file("etc/passwd", "x"))))
	require.NoError(t, err)
	require.ErrorContains(t, im.Walk(func(*Entry, io.Reader) error { return nil }), "not a directory")
}

func TestParentsSynthesized(t *testing.T) {
	im, err := Open(writeFile(t, tarBytes(t, file("a/b/c", "1"), tarEnt{name: "a", typ: tar.TypeDir, mode: 0o700})))
	require.NoError(t, err)
	var got []string
	require.NoError(t, im.Walk(func(e *Entry, _ io.Reader) error {
		got = append(got, e.Name+" "+e.Mode.String()+" "+map[bool]string{true: "synthetic", false: "real"}[e.Synthetic])
		return nil
	}))
	require.Equal(t, []string{"a drwxr-xr-x synthetic", "a/b drwxr-xr-x synthetic", "a/b/c -rw-r--r-- real", "a drwx------ real"}, got)
}

func TestLookPath(t *testing.T) {
	p := writeFile(t, tarBytes(t,
		dir("usr"), dir("usr/bin"), exe("usr/bin/python3.11", "elf"), symlink("usr/bin/python3", "python3.11"),
		symlink("bin", "usr/bin"), file("usr/bin/notexec", "x"), dir("usr/bin/adir"),
		symlink("usr/bin/abs", "/usr/bin/python3"), symlink("usr/bin/loop", "loop"), symlink("usr/bin/dangling", "/nowhere"),
		symlink("usr/bin/out", "../../../../usr/bin/python3.11")))
	im, err := Open(p)
	require.NoError(t, err)
	for cmd, want := range map[string]string{"python3": "/bin/python3", "abs": "/bin/abs", "/usr/bin/python3": "/usr/bin/python3", "out": "/bin/out"} {
		got, err := im.LookPath(cmd, "/sbin:/bin:/usr/bin")
		require.NoError(t, err, cmd)
		require.Equal(t, want, got)
	}
	for cmd, want := range map[string]error{"notexec": ErrNotExecutable, "adir": ErrNotExecutable, "nope": ErrNotFound, "dangling": ErrNotFound, "/bin/nope": ErrNotFound} {
		_, err := im.LookPath(cmd, "/bin")
		require.ErrorIs(t, err, want, cmd)
		require.ErrorContains(t, err, p)
	}
	_, err = im.LookPath("loop", "/bin")
	require.ErrorContains(t, err, "symbolic links")

	files, err := im.ReadFiles([]string{"/bin/python3", "/nope", "usr/bin/adir"}, 100)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"/bin/python3": []byte("elf")}, files)
}

func TestSymlinkNotFollowedOnHost(t *testing.T) {
	// A directory image whose bin is a symlink to the host's /usr/bin:
	// lookups resolve it inside the image (where there is no usr/bin), not
	// on the host.
	root := t.TempDir()
	require.NoError(t, os.Symlink("/usr/bin", filepath.Join(root, "bin")))
	im, err := Open(root)
	require.NoError(t, err)
	_, err = im.LookPath("env", "/bin")
	require.ErrorIs(t, err, ErrNotFound)
	files, err := im.ReadFiles([]string{"/bin/env"}, 1<<30)
	require.NoError(t, err)
	require.Empty(t, files)
	require.Equal(t, []string{"bin link /usr/bin"}, collect(t, im))
}

func TestFormatErrorsAreOneLine(t *testing.T) {
	_, err := Open(t.TempDir() + "/missing")
	require.False(t, strings.Contains(err.Error(), "\n"))
	require.False(t, errors.Is(err, ErrNotFound))
}

func TestCorruptLayer(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	img := whiteoutImage(t)
	require.NoError(t, p.AppendImage(img))
	layers, err := img.Layers()
	require.NoError(t, err)
	d, err := layers[0].Digest()
	require.NoError(t, err)
	blob := filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	require.NoError(t, err)
	// A layer blob whose bytes no longer match its digest (the gzip stream
	// kept valid: the tar inside differs).
	raw := tarBytes(t, file("bin/sh", "tampered"))
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(raw)
	zw.Close()
	require.NotEqual(t, b, gz.Bytes())
	require.NoError(t, os.WriteFile(blob, gz.Bytes(), 0o644))
	im, err := Open(dir)
	require.NoError(t, err)
	err = im.Walk(func(*Entry, io.Reader) error { return nil })
	require.ErrorContains(t, err, "a layer is corrupt")
	require.ErrorContains(t, err, dir)

	// A missing blob.
	require.NoError(t, os.Remove(blob))
	im, err = Open(dir)
	require.NoError(t, err)
	err = im.Walk(func(*Entry, io.Reader) error { return nil })
	require.ErrorContains(t, err, "a layer is corrupt or unreadable")
}

func TestUsageOfArchive(t *testing.T) {
	im, err := Open(writeFile(t, tarBytes(t, file("a", "12345"), tarEnt{name: "b", link: "a", typ: tar.TypeLink, mode: 0o644}, symlink("c", "a"))))
	require.NoError(t, err)
	u, err := im.Usage()
	require.NoError(t, err)
	// newc: a 110-byte header and "a\x00" padded to 112, then the content
	// padded to 8 (a and its copy b) or the link target to 4 (c).
	require.Equal(t, Usage{Entries: 3, Bytes: 10, Memory: 3*EntryOverhead + 2*PageSize, Archive: 120 + 120 + 116}, u, "a hard link counts as a copy")
	got, err := im.LookPath("b", "/")
	require.ErrorIs(t, err, ErrNotExecutable, got)
}

func TestCorruptConfigRefusedAtOpen(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	img := whiteoutImage(t)
	require.NoError(t, p.AppendImage(img))
	cn, err := img.ConfigName()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "blobs", cn.Algorithm, cn.Hex), []byte(`{"rootfs":{"type":"layers","diff_ids":[]}}`), 0o644))
	_, err = Open(dir)
	require.ErrorContains(t, err, "does not hash to its name")
	require.ErrorContains(t, err, dir)
}

func TestIndexRoundTrip(t *testing.T) {
	p := writeFile(t, tarBytes(t, dir("usr"), dir("usr/bin"), exe("usr/bin/python3.11", "elf"), symlink("usr/bin/py", "python3.11"),
		symlink("bin", "usr/bin"), tarEnt{name: "usr/bin/hl", link: "usr/bin/python3.11", typ: tar.TypeLink, mode: 0o755},
		file("odd \"name\" with spaces", "x"), symlink("l", "a \" b")))
	im, err := Open(p)
	require.NoError(t, err)
	// A full walk keeps the index: no second read for lookups.
	collect(t, im)
	var buf bytes.Buffer
	require.NoError(t, im.SaveIndex(&buf))
	want, err := im.Usage()
	require.NoError(t, err)

	im2, err := Open(p)
	require.NoError(t, err)
	require.NoError(t, os.Remove(p)) // nothing is read from here on
	require.NoError(t, im2.LoadIndex(bytes.NewReader(buf.Bytes())))
	got, err := im2.LookPath("hl", "/bin")
	require.NoError(t, err)
	require.Equal(t, "/bin/hl", got)
	_, e, err := im2.Stat("/l")
	require.ErrorIs(t, err, fs.ErrNotExist, "dangling link")
	require.Nil(t, e)
	u, err := im2.Usage()
	require.NoError(t, err)
	require.Equal(t, want, u)
	require.Equal(t, int64(8), u.Entries)

	require.Error(t, im2.LoadIndex(strings.NewReader("garbage")))
	require.ErrorContains(t, im2.LoadIndex(strings.NewReader(indexMagic+"\n\"../x\" 0 0 0 0 0 0 0 \"\"\nusage 1 0 0\n")), "not clean")
	require.ErrorContains(t, im2.LoadIndex(strings.NewReader(indexMagic+"\n")), "truncated")
}

func TestFileSwappedForSymlinkMidWalk(t *testing.T) {
	root := t.TempDir()
	p := filepath.Join(root, "f")
	require.NoError(t, os.WriteFile(p, []byte("data"), 0o644))
	im, err := Open(root)
	require.NoError(t, err)
	err = im.Walk(func(e *Entry, r io.Reader) error {
		// Between the walk's Lstat and the read, f becomes a link to a
		// host file: the read must fail, not follow it.
		require.NoError(t, os.Remove(p))
		require.NoError(t, os.Symlink("/etc/passwd", p))
		b, err := io.ReadAll(r)
		require.Empty(t, b)
		return err
	})
	require.Error(t, err)
	require.ErrorContains(t, err, root)
}

// A tree that changes between Key and the walk that fills a cache entry
// must not be yielded as the keyed tree: that would store one tree's
// content under another's key (the kernel cache's poisoning, issue 23).
func TestWalkAfterKeyRefusesAChangedImage(t *testing.T) {
	t.Run("tar", func(t *testing.T) {
		p := writeFile(t, tarBytes(t, exe("bin/sh", "genuine")))
		im, err := Open(p)
		require.NoError(t, err)
		_, err = im.Key()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(p, tarBytes(t, exe("bin/sh", "evil!!!")), 0o644))
		err = im.Walk(func(*Entry, io.Reader) error { return nil })
		require.ErrorContains(t, err, "changed while hpcvmm read it")
	})
	t.Run("directory", func(t *testing.T) {
		root := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(root, "sh"), []byte("genuine"), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "skipped"), []byte("genuine"), 0o644))
		im, err := Open(root)
		require.NoError(t, err)
		_, err = im.Key()
		require.NoError(t, err)
		// Unchanged: the keyed walk passes, even where fn reads nothing.
		require.NoError(t, im.WalkKeyed(func(e *Entry, r io.Reader) error { return nil }))
		// Same size, other bytes, in a file the consumer does not read.
		require.NoError(t, os.WriteFile(filepath.Join(root, "skipped"), []byte("evil!!!"), 0o644))
		err = im.WalkKeyed(func(e *Entry, r io.Reader) error {
			if e.Name == "sh" {
				_, err := io.Copy(io.Discard, r)
				return err
			}
			return nil
		})
		require.ErrorContains(t, err, "changed while hpcvmm read it")
	})
	t.Run("OCI config", func(t *testing.T) {
		dir := t.TempDir()
		p, err := layout.Write(dir, empty.Index)
		require.NoError(t, err)
		img := whiteoutImage(t)
		require.NoError(t, p.AppendImage(img))
		im, err := Open(dir)
		require.NoError(t, err)
		_, err = im.Key()
		require.NoError(t, err)
		cn, err := img.ConfigName()
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "blobs", cn.Algorithm, cn.Hex), []byte(`{"rootfs":{"type":"layers","diff_ids":[]}}`), 0o644))
		err = im.Walk(func(*Entry, io.Reader) error { return nil })
		require.ErrorContains(t, err, "changed since the image was opened")
	})
}

func TestContainerKeyIsTheConfigDigest(t *testing.T) {
	img := whiteoutImage(t)
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, lp.AppendImage(img))
	p := filepath.Join(t.TempDir(), "saved.tar")
	ref, _ := name.ParseReference("example.com/job:1")
	require.NoError(t, tarball.WriteToFile(p, ref, img))
	oci, err := Open(dir)
	require.NoError(t, err)
	docker, err := Open(p)
	require.NoError(t, err)
	require.Equal(t, oci.cfgDigest, docker.cfgDigest, "the same image saved two ways has one config")
	cn, _ := img.ConfigName()
	require.Equal(t, cn, oci.cfgDigest)
}

// lstatBeneath never follows a symlink on the way: a directory of IMAGE
// that is (or was swapped for) a link out of IMAGE is not a directory.
func TestLstatBeneathFollowsNoLink(t *testing.T) {
	root, outside := t.TempDir(), t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "f"), []byte("secret"), 0o600))
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "link")))
	require.NoError(t, os.Mkdir(filepath.Join(root, "d"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "d", "f"), []byte("public"), 0o644))
	_, _, err := lstatBeneath(root, "link/f")
	require.ErrorIs(t, err, syscall.ENOTDIR)
	dir, fi, err := lstatBeneath(root, "d/f")
	require.NoError(t, err)
	defer dir.Close()
	require.Equal(t, int64(6), fi.Size())
	dir2, fi, err := lstatBeneath(root, "link")
	require.NoError(t, err)
	defer dir2.Close()
	require.Equal(t, fs.ModeSymlink, fi.Mode().Type())

	im, err := Open(root)
	require.NoError(t, err)
	got, err := im.ReadFiles([]string{"/d/f", "/link/f"}, 100)
	require.NoError(t, err)
	require.Equal(t, map[string][]byte{"/d/f": []byte("public")}, got,
		"/link's absolute target is resolved inside the image (where it does not exist), never on the host")
}

// Issue 30 item 4: names past PATH_MAX or MaxDepth components are refused
// by every format: a tar entry, a symlink target, a directory IMAGE.
func TestNameLimits(t *testing.T) {
	deep := strings.Repeat("d/", MaxDepth) + "f"
	for name, tb := range map[string][]byte{
		"long name":   tarBytes(t, file(strings.Repeat("x", MaxName+1), "")),
		"deep name":   tarBytes(t, file(deep, "")),
		"long target": tarBytes(t, symlink("l", strings.Repeat("x", MaxName+1))),
	} {
		t.Run(name, func(t *testing.T) {
			im, err := Open(writeFile(t, tb))
			require.NoError(t, err)
			err = im.Walk(func(*Entry, io.Reader) error { return nil })
			require.Error(t, err)
			require.Regexp(t, "PATH_MAX|more than hpcvmm's limit of 256", err.Error())
		})
	}
	// MaxDepth components are fine.
	im, err := Open(writeFile(t, tarBytes(t, file(strings.Repeat("d/", MaxDepth-1)+"f", "x"))))
	require.NoError(t, err)
	require.NoError(t, im.Walk(func(*Entry, io.Reader) error { return nil }))

	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, strings.Repeat("d/", MaxDepth+1)), 0o755))
	im, err = Open(root)
	require.NoError(t, err)
	err = im.Walk(func(*Entry, io.Reader) error { return nil })
	require.ErrorContains(t, err, "257 directories deep, more than hpcvmm's limit of 256")
	require.ErrorContains(t, err, root)
}
