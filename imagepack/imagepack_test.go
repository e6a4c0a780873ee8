package imagepack

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// twoLayers: the second layer deletes a file of the first (whiteout),
// empties a directory (opaque whiteout) and adds a file; the first holds
// every kind of entry a layer may.
func twoLayers() [][]ent {
	dev := ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3}
	blk := ent{name: "dev/vda", typ: tar.TypeBlock, mode: 0o660, gid: 6, major: 254, minor: 0}
	fifo := ent{name: "run/fifo", typ: tar.TypeFifo, mode: 0o600}
	suid := file("bin/su", "#!su", 0o4755)
	owned := file("home/u/notes", "mine", 0o600)
	owned.uid, owned.gid = 1000, 1000
	hard := ent{name: "bin/sh-hard", typ: tar.TypeLink, link: "bin/sh"}
	return [][]ent{
		{dir("bin", 0o755), file("bin/sh", "#!sh", 0o755), symlink("bin/ash", "sh"), hard, suid, dir("data", 0o750),
			file("data/secret", "s", 0o644), file("data/keep", "k", 0o644), dir("opq", 0o755), file("opq/old", "o", 0o644),
			dir("dev", 0o755), dev, blk, dir("run", 0o755), fifo, dir("home/u", 0o700), owned, symlink("etc/pw", "/etc/passwd"),
			dir("tmp", 0o1777)},
		{file("data/.wh.secret", "", 0o644), dir("opq", 0o755), file("opq/.wh..wh..opq", "", 0o644), file("opq/new", "n", 0o644),
			file("etc/added", "a", 0o644)},
	}
}

func TestConvertOCILayoutWithWhiteouts(t *testing.T) {
	dir := ociLayout(t, twoLayers()...)
	c := openCache(t)
	var logBuf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logBuf, nil))
	res, err := Convert(context.Background(), openImage(t, dir), c, log)
	require.NoError(t, err)
	require.False(t, res.Hit)
	require.Equal(t, imagefile.SquashFS, res.Image.FSType)
	require.Contains(t, logBuf.String(), "imagepack: converted")

	ls := listing(t, res.Path)
	require.NotContains(t, ls, "/data/secret", "the whited-out file")
	require.NotContains(t, ls, "/opq/old", "the file under the opaque directory")
	require.NotContains(t, ls, "/data/.wh.secret")
	want := map[string]string{
		"":              "drwxr-xr-x 0/0",
		"/bin":          "drwxr-xr-x 0/0",
		"/bin/sh":       "-rwxr-xr-x 0/0",
		"/bin/sh-hard":  "-rwxr-xr-x 0/0",
		"/bin/ash":      "lrwxrwxrwx 0/0 -> sh",
		"/bin/su":       "-rwsr-xr-x 0/0",
		"/data":         "drwxr-x--- 0/0",
		"/data/keep":    "-rw-r--r-- 0/0",
		"/opq/new":      "-rw-r--r-- 0/0",
		"/etc":          "drwxr-xr-x 0/0", // never listed: made by rootfs as 0755 root's
		"/etc/added":    "-rw-r--r-- 0/0",
		"/etc/pw":       "lrwxrwxrwx 0/0 -> /etc/passwd",
		"/dev/null":     "crw-rw-rw- 0/0 1,3",
		"/dev/vda":      "brw-rw---- 0/6 254,0",
		"/run/fifo":     "prw------- 0/0",
		"/home/u":       "drwx------ 0/0",
		"/home/u/notes": "-rw------- 1000/1000",
		"/tmp":          "drwxrwxrwt 0/0",
	}
	for name, w := range want {
		require.Equal(t, w, ls[name], name)
	}
	require.Equal(t, "#!sh", cat(t, res.Path, "bin/sh"))
	require.Equal(t, "#!sh", cat(t, res.Path, "bin/sh-hard"))
	require.Equal(t, "mine", cat(t, res.Path, "home/u/notes"))
	require.Equal(t, "n", cat(t, res.Path, "opq/new"))
	fi, err := os.Stat(res.Path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o400), fi.Mode().Perm())

	// The second launch is a hit that reads no layer: the layers are
	// gone, and COMMAND's lookup answers from the cached index.
	blobs := layerBlobs(t, dir)
	for _, b := range blobs {
		require.NoError(t, os.Remove(b))
	}
	logBuf.Reset()
	im := openImage(t, dir)
	hit, err := Convert(context.Background(), im, c, log)
	require.NoError(t, err)
	require.True(t, hit.Hit)
	require.Equal(t, res.Path, hit.Path)
	require.Contains(t, logBuf.String(), "cache hit")
	got, err := im.LookPath("sh", rootfs.DefaultPath)
	require.NoError(t, err)
	require.Equal(t, "/bin/sh", got)
	_, err = im.LookPath("secret", "/data")
	require.ErrorIs(t, err, rootfs.ErrNotFound)

	// Without the cache, the same image cannot be converted: the hit
	// above did not read the layers.
	_, err = Convert(context.Background(), openImage(t, dir), openCache(t), nil)
	require.ErrorContains(t, err, "a layer is corrupt or unreadable")
}

// layerBlobs are the layer blobs of the layout's one image.
func layerBlobs(t testing.TB, dir string) []string {
	t.Helper()
	idx, err := layout.ImageIndexFromPath(dir)
	require.NoError(t, err)
	im, err := idx.IndexManifest()
	require.NoError(t, err)
	require.Len(t, im.Manifests, 1)
	img, err := idx.Image(im.Manifests[0].Digest)
	require.NoError(t, err)
	m, err := img.Manifest()
	require.NoError(t, err)
	var out []string
	for _, l := range m.Layers {
		p := filepath.Join(dir, "blobs", l.Digest.Algorithm, l.Digest.Hex)
		require.FileExists(t, p)
		out = append(out, p)
	}
	require.Len(t, out, 2)
	return out
}

// readBytes is what this process has read through read(2) and its kind
// (/proc/self/io's rchar).
func readBytes(t testing.TB) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/io")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "rchar: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("no rchar in /proc/self/io")
	return 0
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// A warm launch of an unchanged tar reads a few KiB (the cache's records
// and index, the SquashFS's superblock), not the tar.
func TestConvertTarWarmReadsNothingOfIt(t *testing.T) {
	big := string(randomBytes(16 << 20))
	p := writeFile(t, tarBytes(t, dir("usr/bin", 0o755), file("usr/bin/tool", "#!tool", 0o755), file("data/big", big, 0o644)))
	c := openCache(t)
	cold, err := Lookup(openImage(t, p), c)
	require.NoError(t, err)
	require.Nil(t, cold, "cold: no entry")
	first := convertPath(t, p, c)
	require.False(t, first.Hit)
	require.Equal(t, big, cat(t, first.Path, "data/big"))
	warm, err := Lookup(openImage(t, p), c)
	require.NoError(t, err)
	require.Equal(t, first.Path, warm.Path)
	require.True(t, warm.Hit)

	before := readBytes(t)
	im := openImage(t, p)
	res, err := Convert(context.Background(), im, c, nil)
	read := readBytes(t) - before
	require.NoError(t, err)
	require.True(t, res.Hit)
	require.Less(t, read, int64(1<<20), "a warm launch read %d bytes; the tar has 16 MiB", read)

	// COMMAND's lookup needs nothing of the tar either.
	require.NoError(t, os.Remove(p))
	got, err := im.LookPath("tool", rootfs.DefaultPath)
	require.NoError(t, err)
	require.Equal(t, "/usr/bin/tool", got)
}

func TestCorruptEntryDetectedAndRebuilt(t *testing.T) {
	p := writeFile(t, tarBytes(t, file("etc/hostname", "node\n", 0o644), file("data", string(randomBytes(256<<10)), 0o644)))
	c := openCache(t)
	res := convertPath(t, p, c)
	for name, tamper := range map[string]func(){
		"flipped byte": func() {
			b, err := os.ReadFile(res.Path)
			require.NoError(t, err)
			b[len(b)/2] ^= 1
			require.NoError(t, os.WriteFile(res.Path, b, 0o400))
		},
		"truncated": func() { require.NoError(t, os.Truncate(res.Path, res.Size/2)) },
		"zeroed":    func() { require.NoError(t, os.WriteFile(res.Path, make([]byte, res.Size), 0o400)) },
		"record":    func() { require.NoError(t, os.WriteFile(c.Path(res.Key, metaExt), []byte("garbage"), 0o400)) },
		"index": func() {
			require.NoError(t, os.WriteFile(c.Path(res.Key, indexExt), []byte("hpcvmm-rootfs-index v2\n"), 0o400))
		},
		"group-open": func() { require.NoError(t, os.Chmod(res.Path, 0o460)) },
		// A record that vouches for garbage: size and SHA-256 match, the
		// superblock check (imagefile.Detect) does not.
		"consistent garbage": func() {
			junk := randomBytes(64 << 10)
			require.NoError(t, os.WriteFile(res.Path, junk, 0o400))
			sum := sha256.Sum256(junk)
			mb, err := os.ReadFile(c.Path(res.Key, metaExt))
			require.NoError(t, err)
			m, err := decodeMeta(mb)
			require.NoError(t, err)
			m.sum, m.size = hex.EncodeToString(sum[:]), int64(len(junk))
			require.NoError(t, os.WriteFile(c.Path(res.Key, metaExt), m.encode(), 0o400))
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, ext := range []string{dataExt, metaExt, indexExt} {
				require.NoError(t, os.Chmod(c.Path(res.Key, ext), 0o600))
			}
			tamper()
			again := convertPath(t, p, c)
			require.False(t, again.Hit, "a damaged entry is converted again, never used")
			require.NotEmpty(t, again.Replaced)
			require.NotContains(t, again.Replaced, "\n")
			hit := convertPath(t, p, c)
			require.True(t, hit.Hit)
			require.Equal(t, "node\n", cat(t, hit.Path, "etc/hostname"))
		})
	}
}

// A plain tar may list a name twice (tar --append): the last entry wins,
// as when the tar is extracted, though sqfstar keeps the first.
func TestTarDuplicatesLastWins(t *testing.T) {
	late := dir("a", 0o700)
	late.uid = 5
	p := writeFile(t, tarBytes(t, dir("a", 0o755), file("a/f", "one", 0o644), file("b", "file", 0o644), file("a/f", "two", 0o600),
		late, symlink("b", "t"), ent{name: "h", typ: tar.TypeLink, link: "a/f"}, file("z/late/f", "x", 0o644), dir("z", 0o711)))
	res := convertPath(t, p, openCache(t))
	ls := listing(t, res.Path)
	require.Equal(t, "drwx------ 5/0", ls["/a"])
	require.Equal(t, "-rw------- 0/0", ls["/a/f"])
	require.Equal(t, "lrwxrwxrwx 0/0 -> t", ls["/b"])
	require.Equal(t, "drwx--x--x 0/0", ls["/z"], "a directory listed after its contents")
	require.Equal(t, "drwxr-xr-x 0/0", ls["/z/late"])
	require.Equal(t, "two", cat(t, res.Path, "a/f"))
	require.Equal(t, "two", cat(t, res.Path, "h"))

	// A hard link to an entry a later one replaces has no right answer.
	p = writeFile(t, tarBytes(t, file("f", "one", 0o644), ent{name: "h", typ: tar.TypeLink, link: "f"}, file("f", "two", 0o644)))
	c := openCache(t)
	_, err := Convert(context.Background(), openImage(t, p), c, nil)
	require.ErrorContains(t, err, `hard link "h" points to "f" before a later entry of that name replaces it`)
	requireNoEntry(t, c)
}

// requireNoEntry checks that a failed conversion left nothing in the
// cache but hash records.
func requireNoEntry(t testing.TB, c *Cache) {
	t.Helper()
	for _, n := range cacheFiles(t, c) {
		require.True(t, strings.HasPrefix(n, "file-") || strings.HasPrefix(n, "tree-"), "a failed conversion left %s", n)
	}
}

func TestMissingTool(t *testing.T) {
	defer func(d []string) { toolDirs = d }(toolDirs)
	toolDirs = []string{t.TempDir()}
	p := writeFile(t, tarBytes(t, file("f", "x", 0o644)))
	c := openCache(t)
	_, err := Convert(context.Background(), openImage(t, p), c, nil)
	require.ErrorContains(t, err, "imagepack: mksquashfs not found in ")
	require.ErrorContains(t, err, "install squashfs-tools")
	require.NotContains(t, err.Error(), "\n")
	requireNoEntry(t, c)
}

// fakeTool installs a mksquashfs that runs script, for the failures the
// real one has no reliable way to show.
func fakeTool(t *testing.T, script string) string {
	t.Helper()
	d := t.TempDir()
	p := filepath.Join(d, toolName)
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755))
	old := toolDirs
	toolDirs = []string{d}
	t.Cleanup(func() { toolDirs = old })
	return p
}

func TestToolFailureNamesItsLastLine(t *testing.T) {
	fakeTool(t, "head -c 1000 >/dev/null\necho 'Reading tar' >&2\necho 'FATAL ERROR: Out of memory' >&2\nexit 1\n")
	p := writeFile(t, tarBytes(t, file("f", string(randomBytes(4<<20)), 0o644)))
	c := openCache(t)
	_, err := Convert(context.Background(), openImage(t, p), c, nil)
	require.ErrorContains(t, err, "mksquashfs failed (exit status 1): FATAL ERROR: Out of memory")
	require.ErrorContains(t, err, p)
	require.NotContains(t, err.Error(), "\n")
	requireNoEntry(t, c)
}

func TestUntrustedToolRefused(t *testing.T) {
	tool := fakeTool(t, "exit 0\n")
	require.NoError(t, os.Chmod(tool, 0o777))
	_, err := Convert(context.Background(), openImage(t, writeFile(t, tarBytes(t, file("f", "x", 0o644)))), openCache(t), nil)
	require.ErrorContains(t, err, "writable by group or others")
	require.ErrorContains(t, err, "reinstall squashfs-tools")
}

func TestToolWritingNothingRefused(t *testing.T) {
	fakeTool(t, "cat >/dev/null\nexit 0\n")
	c := openCache(t)
	_, err := Convert(context.Background(), openImage(t, writeFile(t, tarBytes(t, file("f", "x", 0o644)))), c, nil)
	require.ErrorContains(t, err, "mksquashfs wrote no valid SquashFS")
	requireNoEntry(t, c)
}

func TestConversionStoppedByContext(t *testing.T) {
	fakeTool(t, "sleep 30\n")
	c := openCache(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Convert(ctx, openImage(t, writeFile(t, tarBytes(t, file("f", string(randomBytes(8<<20)), 0o644)))), c, nil)
	require.ErrorContains(t, err, "conversion stopped")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 15*time.Second)
	requireNoEntry(t, c)
}

func TestBoundRefusesALargerImage(t *testing.T) {
	tool(t, "mksquashfs")
	c, err := OpenCache(filepath.Join(t.TempDir(), "cache"), 1<<20)
	require.NoError(t, err)
	p := writeFile(t, tarBytes(t, file("f", string(randomBytes(2<<20)), 0o644)))
	_, err = Convert(context.Background(), openImage(t, p), c, nil)
	require.ErrorContains(t, err, "is larger than 1 MiB unpacked")
	require.ErrorContains(t, err, "the size bound of the cache")
	requireNoEntry(t, c)
}

func TestWatchSizeStopsAtBound(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	require.NoError(t, err)
	defer f.Close()
	stop := make(chan struct{})
	got := make(chan int64, 1)
	go watchSize(f, 1000, time.Millisecond, stop, func(size int64) { got <- size })
	_, err = f.Write(make([]byte, 999))
	require.NoError(t, err)
	select {
	case <-got:
		t.Fatal("stopped within the bound")
	case <-time.After(50 * time.Millisecond):
	}
	_, err = f.Write(make([]byte, 2))
	require.NoError(t, err)
	select {
	case size := <-got:
		require.Equal(t, int64(1001), size)
	case <-time.After(5 * time.Second):
		t.Fatal("not stopped past the bound")
	}
	close(stop)
}

// An image changed between its key and the conversion's walk is not
// cached under the key.
func TestImageChangedAfterItsKey(t *testing.T) {
	tool(t, "mksquashfs")
	p := writeFile(t, tarBytes(t, file("f", "genuine", 0o644)))
	c := openCache(t)
	im := openImage(t, p)
	_, err := im.KeyUsing(c)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(p, tarBytes(t, file("f", "evil!!!", 0o644)), 0o644))
	_, err = Convert(context.Background(), im, c, nil)
	require.ErrorContains(t, err, "changed while hpcvmm read it")
	requireNoEntry(t, c)
	res := convertPath(t, p, c)
	require.Equal(t, "evil!!!", cat(t, res.Path, "f"))
}

func TestDirectoryImageWithSocket(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "bin/run"), []byte("#!run"), 0o750))
	require.NoError(t, os.Symlink("/etc/shadow", filepath.Join(root, "bin/shadow")))
	l, err := net.Listen("unix", filepath.Join(root, "sock"))
	require.NoError(t, err)
	defer l.Close()
	var logBuf bytes.Buffer
	res, err := Convert(context.Background(), openImage(t, root), openCache(t), slog.New(slog.NewTextHandler(&logBuf, nil)))
	require.NoError(t, err)
	ls := listing(t, res.Path)
	require.Equal(t, "-rwxr-x--- 0/0", ls["/bin/run"])
	require.Equal(t, "lrwxrwxrwx 0/0 -> /etc/shadow", ls["/bin/shadow"], "a link, never followed on the host")
	require.NotContains(t, ls, "/sock")
	require.Contains(t, logBuf.String(), "sockets left out")
	require.Equal(t, "#!run", cat(t, res.Path, "bin/run"))
}

// The same image gives the same bytes: two caches, two conversions.
func TestConversionIsReproducible(t *testing.T) {
	p := writeFile(t, tarBytes(t, dir("d", 0o755), file("d/a", strings.Repeat("text ", 50000), 0o644), file("d/b", string(randomBytes(300<<10)), 0o644)))
	one, err := os.ReadFile(convertPath(t, p, openCache(t)).Path)
	require.NoError(t, err)
	two, err := os.ReadFile(convertPath(t, p, openCache(t)).Path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(one, two))
}

func TestTailKeepsTheLastLine(t *testing.T) {
	var tl tail
	require.Equal(t, "", tl.lastLine())
	tl.Write([]byte("first\nsecond\n"))
	require.Equal(t, "second", tl.lastLine())
	long := bytes.Repeat([]byte("x"), 10000)
	tl.Write(long)
	tl.Write([]byte("\nFATAL ERROR: the end\n\n"))
	require.Equal(t, "FATAL ERROR: the end", tl.lastLine())
	line := []byte("warning: something\n")
	require.Zero(t, testing.AllocsPerRun(100, func() { tl.Write(line) }))
}

func TestOpenCacheRefusesAnOpenDirectory(t *testing.T) {
	d := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(d, 0o777))
	require.NoError(t, os.Chmod(d, 0o777))
	_, err := OpenCache(d, 0)
	require.ErrorContains(t, err, "imagepack: cache directory "+d)
	require.ErrorContains(t, err, "writable by group or others")
	_, err = OpenCache("relative", 0)
	require.ErrorContains(t, err, "not an absolute path")
	_, err = Convert(context.Background(), nil, nil, nil)
	require.Error(t, err)
	require.False(t, errors.Is(err, io.EOF))
	_ = testenv.Nobody
}
