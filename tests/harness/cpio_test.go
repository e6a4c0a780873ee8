package harness

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// newcMagic starts every newc header.
const newcMagic = "070701"

// newcEntry is one decoded archive member.
type newcEntry struct {
	name string
	mode uint32
	data string
}

// readNewc decodes a newc archive independently of the writer, checking
// magic and 4-byte alignment as the kernel does.
func readNewc(t *testing.T, b []byte) []newcEntry {
	t.Helper()
	var out []newcEntry
	off := 0
	align := func() { off = (off + 3) &^ 3 }
	for {
		require.LessOrEqual(t, off+110, len(b), "truncated header at %d", off)
		h := string(b[off : off+110])
		require.Equal(t, newcMagic, h[:6], "magic at %d", off)
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			require.NoError(t, err)
			return uint32(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		off += 110
		name := string(b[off : off+int(namesize)-1])
		require.Equal(t, byte(0), b[off+int(namesize)-1], "name NUL")
		off += int(namesize)
		align()
		data := string(b[off : off+int(size)])
		off += int(size)
		align()
		if name == "TRAILER!!!" {
			require.Equal(t, len(b), off, "bytes after the trailer")
			return out
		}
		out = append(out, newcEntry{name, mode, data})
	}
}

func TestImageWritesNewcWithParentsFirst(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "busybox")
	require.NoError(t, os.WriteFile(src, []byte("ELF..."), 0o644))

	im := NewImage()
	im.AddFile("/bin/busybox", src, 0o755)
	im.AddBytes("/etc/hpcvmm-modules", []byte("a.ko\n"), 0o644)
	im.AddSymlink("/bin/sh", "busybox")
	im.AddBytes("/init", []byte("#!/bin/sh\n"), 0o755) // odd lengths exercise padding

	var buf bytes.Buffer
	require.NoError(t, im.WriteCPIO(&buf))
	ents := readNewc(t, buf.Bytes())

	var names []string
	byName := map[string]newcEntry{}
	for _, e := range ents {
		names = append(names, e.name)
		byName[e.name] = e
	}
	assert.Equal(t, []string{"bin", "bin/busybox", "bin/sh", "etc", "etc/hpcvmm-modules", "init"}, names)
	assert.Equal(t, uint32(0o040755), byName["bin"].mode)
	assert.Equal(t, uint32(0o100755), byName["bin/busybox"].mode)
	assert.Equal(t, "ELF...", byName["bin/busybox"].data)
	assert.Equal(t, uint32(0o120777), byName["bin/sh"].mode)
	assert.Equal(t, "busybox", byName["bin/sh"].data)
	assert.Equal(t, "#!/bin/sh\n", byName["init"].data)
}

// TestImageReadableByCPIO cross-checks the archive with GNU cpio when it is
// installed (tests/testbed-packages.sh installs it).
func TestImageReadableByCPIO(t *testing.T) {
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio(1) not installed; the in-test decoder covers the format")
	}
	im := NewImage()
	im.AddBytes("/a/b/c.txt", []byte("hello"), 0o600)
	im.AddSymlink("/a/link", "b/c.txt")
	var buf bytes.Buffer
	require.NoError(t, im.WriteCPIO(&buf))
	cmd := exec.Command(cpio, "-it", "--quiet")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	require.NoError(t, err)
	got := strings.Fields(string(out))
	sort.Strings(got)
	assert.Equal(t, []string{"a", "a/b", "a/b/c.txt", "a/link"}, got)

	// Unpacking gives back the content, permissions and link target.
	dir := t.TempDir()
	require.NoError(t, im.WriteCPIO(&buf))
	cmd = exec.Command(cpio, "-id", "--quiet", "--no-absolute-filenames")
	cmd.Dir, cmd.Stdin = dir, &buf
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	data, err := os.ReadFile(filepath.Join(dir, "a/b/c.txt"))
	require.NoError(t, err)
	assert.Equal(t, "hello", string(data))
	st, err := os.Lstat(filepath.Join(dir, "a/b/c.txt"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	target, err := os.Readlink(filepath.Join(dir, "a/link"))
	require.NoError(t, err)
	assert.Equal(t, "b/c.txt", target)
}

func TestImageBuildReusesUnchangedArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(src, []byte("one"), 0o644))
	out := filepath.Join(dir, "out", "img.cpio")

	im := NewImage()
	im.AddFile("/f", src, 0o644)
	rebuilt, err := im.Build(out, false)
	require.NoError(t, err)
	assert.True(t, rebuilt, "first build")
	rebuilt, err = im.Build(out, false)
	require.NoError(t, err)
	assert.False(t, rebuilt, "unchanged inputs must reuse the archive")

	require.NoError(t, os.WriteFile(src, []byte("two!"), 0o644)) // size changes
	rebuilt, err = im.Build(out, false)
	require.NoError(t, err)
	assert.True(t, rebuilt, "changed input must rebuild")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, "two!", readNewc(t, b)[0].data)

	rebuilt, err = im.Build(out, true)
	require.NoError(t, err)
	assert.True(t, rebuilt, "switching to gzip must rebuild")
	b, err = os.ReadFile(out)
	require.NoError(t, err)
	assert.Equal(t, []byte{0x1f, 0x8b}, b[:2], "gzip magic")
}

func TestImageBuildNamesMissingSource(t *testing.T) {
	im := NewImage()
	im.AddFile("/x", "/nonexistent/hpcvmm-source", 0o644)
	_, err := im.Build(filepath.Join(t.TempDir(), "x.cpio"), false)
	require.ErrorContains(t, err, "/nonexistent/hpcvmm-source")
}

func TestCPIOWriterRejectsShortData(t *testing.T) {
	w := NewCPIOWriter(io.Discard)
	err := w.File("f", 0o644, 10, strings.NewReader("short"))
	require.ErrorContains(t, err, "wrote 5 bytes of file instead of 10")
}

// TestCPIOWriterInodesDistinct checks the metadata policy the harness adds on
// top of u-root's writer: distinct inode numbers, one link per file, so the
// kernel's hard-link detection never merges two entries.
func TestCPIOWriterInodesDistinct(t *testing.T) {
	var buf bytes.Buffer
	w := NewCPIOWriter(&buf)
	require.NoError(t, w.Dir("d", 0o755))
	require.NoError(t, w.File("d/a", 0o644, 1, strings.NewReader("a")))
	require.NoError(t, w.File("d/b", 0o644, 1, strings.NewReader("b")))
	require.NoError(t, w.Close())
	b := buf.Bytes()
	seen := map[string]bool{}
	for off := 0; off+110 <= len(b); {
		h := string(b[off : off+110])
		require.Equal(t, newcMagic, h[:6])
		ino, nlink := strings.ToLower(h[6:14]), h[38:46]
		size, _ := strconv.ParseUint(h[54:62], 16, 32)
		namesize, _ := strconv.ParseUint(h[94:102], 16, 32)
		name := string(b[off+110 : off+110+int(namesize)-1])
		if name == "TRAILER!!!" {
			break
		}
		assert.False(t, seen[ino], "inode %s reused by %s", ino, name)
		seen[ino] = true
		if name != "d" {
			assert.Equal(t, "00000001", nlink, "nlink of %s", name)
		}
		off = (off + 110 + int(namesize) + 3) &^ 3
		off = (off + int(size) + 3) &^ 3
	}
	assert.Len(t, seen, 3)
}
