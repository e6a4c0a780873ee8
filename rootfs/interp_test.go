package rootfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostInterp is /bin/true's interpreter as debug/elf reads it (the whole
// file): the reference elfInterp must agree with.
func hostInterp(t testing.TB) ([]byte, string) {
	b, err := os.ReadFile("/bin/true")
	require.NoError(t, err)
	f, err := elf.NewFile(bytes.NewReader(b))
	require.NoError(t, err)
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			s, err := io.ReadAll(p.Open())
			require.NoError(t, err)
			return b, strings.TrimRight(string(s), "\x00")
		}
	}
	t.Fatal("/bin/true is static here: the tests need a dynamic program")
	return nil, ""
}

// elfWith is a minimal ELF executable of class and byte order whose one
// program header is a PT_INTERP naming interp ("" : a PT_LOAD, static).
func elfWith(t testing.TB, class elf.Class, bo binary.ByteOrder, interp string) []byte {
	var b bytes.Buffer
	data := elf.ELFDATA2LSB
	if bo == binary.BigEndian {
		data = elf.ELFDATA2MSB
	}
	ident := [elf.EI_NIDENT]byte{0x7f, 'E', 'L', 'F', byte(class), byte(data), byte(elf.EV_CURRENT)}
	typ := elf.PT_LOAD
	if interp != "" {
		typ = elf.PT_INTERP
	}
	name := interp + "\x00"
	if class == elf.ELFCLASS64 {
		off := uint64(64 + 56)
		require.NoError(t, binary.Write(&b, bo, elf.Header64{Ident: ident, Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: 1, Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1}))
		require.NoError(t, binary.Write(&b, bo, elf.Prog64{Type: uint32(typ), Off: off, Filesz: uint64(len(name)), Memsz: uint64(len(name))}))
	} else {
		off := uint32(52 + 32)
		require.NoError(t, binary.Write(&b, bo, elf.Header32{Ident: ident, Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_386), Version: 1, Phoff: 52, Ehsize: 52, Phentsize: 32, Phnum: 1}))
		require.NoError(t, binary.Write(&b, bo, elf.Prog32{Type: uint32(typ), Off: off, Filesz: uint32(len(name)), Memsz: uint32(len(name))}))
	}
	b.WriteString(name)
	return b.Bytes()
}

func TestElfInterp(t *testing.T) {
	bin, want := hostInterp(t)
	assert.Equal(t, want, elfInterp(bytes.NewReader(bin)), "/bin/true")
	for _, c := range []struct {
		class elf.Class
		bo    binary.ByteOrder
	}{{elf.ELFCLASS64, binary.LittleEndian}, {elf.ELFCLASS32, binary.LittleEndian}, {elf.ELFCLASS64, binary.BigEndian}} {
		assert.Equal(t, "/lib/ld.so.1", elfInterp(bytes.NewReader(elfWith(t, c.class, c.bo, "/lib/ld.so.1"))), "%v %v", c.class, c.bo)
		assert.Empty(t, elfInterp(bytes.NewReader(elfWith(t, c.class, c.bo, ""))), "static")
	}
	for name, data := range map[string][]byte{
		"a script":  []byte("#!/bin/sh\necho hi\n"),
		"empty":     nil,
		"truncated": bin[:0x318+5], // the name cut
	} {
		assert.Empty(t, elfInterp(bytes.NewReader(data)), name)
	}
	// A name without its NUL, or with one inside, is one the kernel
	// refuses (ENOEXEC): not a name to look up.
	bad := elfWith(t, elf.ELFCLASS64, binary.LittleEndian, "/lib/ld.so")
	bad[len(bad)-1] = 'x'
	assert.Empty(t, elfInterp(bytes.NewReader(bad)))
	bad = elfWith(t, elf.ELFCLASS64, binary.LittleEndian, "/lib\x00/ld.so")
	assert.Empty(t, elfInterp(bytes.NewReader(bad)))
}

// countingReaderAt counts the bytes read through it.
type countingReaderAt struct {
	r io.ReaderAt
	n int
}

func (c *countingReaderAt) ReadAt(p []byte, off int64) (int, error) {
	n, err := c.r.ReadAt(p, off)
	c.n += n
	return n, err
}

// TestElfInterpReadsTheHeadersOnly: the interpreter of a program is read
// from its headers, never the whole file; an archive entry's stream is
// read only as far as that.
func TestElfInterpReadsTheHeadersOnly(t *testing.T) {
	bin, want := hostInterp(t)
	c := &countingReaderAt{r: bytes.NewReader(bin)}
	require.Equal(t, want, elfInterp(c))
	assert.Less(t, c.n, 4096, "of %d bytes", len(bin))
	r := bytes.NewReader(bin)
	var sp streamPrefix
	sp.reset(r)
	require.Equal(t, want, elfInterp(&sp))
	assert.Less(t, len(bin)-r.Len(), 4096, "read of the stream")
}

// TestInterp: an image's executable names its interpreter, followed
// through symlinks and hard links inside the image: a directory IMAGE's
// file read beneath it, a tar's from its index, also once the index is
// saved and loaded again (a warm launch reads nothing of the tar).
func TestInterp(t *testing.T) {
	bin, want := hostInterp(t)
	static := elfWith(t, elf.ELFCLASS64, binary.LittleEndian, "")
	dirImg := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(dirImg, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dirImg, "bin/true"), bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dirImg, "bin/static"), static, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dirImg, "bin/script"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.Symlink("/bin/true", filepath.Join(dirImg, "bin/yes")))
	tarImg := writeFile(t, tarBytes(t, dir("bin"), exe("bin/true", string(bin)), exe("bin/static", string(static)),
		exe("bin/script", "#!/bin/sh\n"), symlink("bin/yes", "/bin/true"),
		tarEnt{name: "bin/hl", link: "bin/true", typ: '1', mode: 0o755}))

	check := func(im *Image, names ...string) {
		t.Helper()
		for _, n := range names {
			got, err := im.Interp(n)
			require.NoError(t, err, n)
			assert.Equal(t, want, got, "%s in %s", n, im.Path())
		}
		for _, n := range []string{"/bin/static", "/bin/script", "/bin"} {
			got, err := im.Interp(n)
			require.NoError(t, err, n)
			assert.Empty(t, got, n)
		}
		_, err := im.Interp("/bin/nosuch")
		assert.ErrorIs(t, err, os.ErrNotExist)
	}
	d, err := Open(dirImg)
	require.NoError(t, err)
	check(d, "/bin/true", "bin/yes")

	tr, err := Open(tarImg)
	require.NoError(t, err)
	check(tr, "/bin/true", "/bin/yes", "/bin/hl")
	var idx bytes.Buffer
	require.NoError(t, tr.SaveIndex(&idx))
	assert.Contains(t, idx.String(), `interp "bin/true" "`+want+`"`)
	warm, err := Open(tarImg)
	require.NoError(t, err)
	require.NoError(t, warm.LoadIndex(bytes.NewReader(idx.Bytes())))
	require.NoError(t, os.Truncate(tarImg, 0), "a warm launch reads nothing of the tar")
	check(warm, "/bin/true", "/bin/yes", "/bin/hl")
}

// TestInterpFromAWalk: a walk that reads the content itself (the
// initramfs's build) records the interpreters too, and its caller gets
// every byte.
func TestInterpFromAWalk(t *testing.T) {
	bin, want := hostInterp(t)
	im, err := Open(writeFile(t, tarBytes(t, exe("bin/true", string(bin)))))
	require.NoError(t, err)
	var got []byte
	require.NoError(t, im.Walk(func(e *Entry, r io.Reader) error {
		if r != nil {
			got, err = io.ReadAll(r)
		}
		return err
	}))
	assert.Equal(t, bin, got)
	s, err := im.Interp("/bin/true")
	require.NoError(t, err)
	assert.Equal(t, want, s)
}

// TestLoadIndexV2: an older hpcvmm's index (no interpreters) still loads:
// the interpreters are unknown.
func TestLoadIndexV2(t *testing.T) {
	bin, _ := hostInterp(t)
	p := writeFile(t, tarBytes(t, exe("bin/true", string(bin))))
	im, err := Open(p)
	require.NoError(t, err)
	var idx bytes.Buffer
	require.NoError(t, im.SaveIndex(&idx))
	var v2 []string
	for _, l := range strings.Split(strings.TrimSuffix(idx.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, "interp ") {
			v2 = append(v2, l)
		}
	}
	v2[0] = indexMagicV2
	old, err := Open(p)
	require.NoError(t, err)
	require.NoError(t, old.LoadIndex(strings.NewReader(strings.Join(v2, "\n")+"\n")))
	s, err := old.Interp("/bin/true")
	require.NoError(t, err)
	assert.Empty(t, s)
	for _, bad := range []string{`interp "../x" "/lib/ld.so"`, `interp "x" ""`, `interp "x"`, `interp "x" "/a\x00b"`} {
		_, _, err := parseInterpLine(strings.TrimPrefix(bad, "interp "))
		assert.Error(t, err, bad)
	}
}

// FuzzElfInterp: elfInterp never panics and never names more than the
// file holds. Properties: a name is NUL-free, shorter than PATH_MAX and
// stands in the file followed by its NUL; and where debug/elf parses the
// same bytes and its first PT_INTERP lies within the prefix elfInterp
// reads, both read the same name (none where debug/elf finds none).
func FuzzElfInterp(f *testing.F) {
	bin, _ := hostInterp(f)
	f.Add(bin[:4096])
	f.Add(elfWith(f, elf.ELFCLASS64, binary.LittleEndian, "/lib64/ld-linux-x86-64.so.2"))
	f.Add(elfWith(f, elf.ELFCLASS32, binary.BigEndian, "/lib/ld.so.1"))
	f.Add(elfWith(f, elf.ELFCLASS64, binary.LittleEndian, ""))
	f.Fuzz(func(t *testing.T, data []byte) {
		got := elfInterp(bytes.NewReader(data))
		if got != "" {
			if strings.IndexByte(got, 0) >= 0 || len(got) >= pathMax || !bytes.Contains(data, append([]byte(got), 0)) {
				t.Fatalf("interpreter %q is not a name the file holds", got)
			}
		}
		ef, err := elf.NewFile(bytes.NewReader(data))
		if err != nil {
			return
		}
		want := ""
		for _, p := range ef.Progs {
			if p.Type != elf.PT_INTERP {
				continue
			}
			if p.Filesz < 2 || p.Filesz > pathMax || p.Off > interpPrefixMax || p.Filesz > interpPrefixMax-p.Off || p.Off+p.Filesz > uint64(len(data)) {
				break
			}
			b := data[p.Off : p.Off+p.Filesz]
			if b[len(b)-1] == 0 && bytes.IndexByte(b[:len(b)-1], 0) < 0 {
				want = string(b[:len(b)-1])
			}
			break
		}
		if got != want && progsInPrefix(data) {
			t.Fatalf("elfInterp %q, debug/elf %q", got, want)
		}
	})
}

// progsInPrefix says whether data's program headers lie within the
// prefix elfInterp reads (debug/elf reads them wherever they are).
func progsInPrefix(data []byte) bool {
	if len(data) < elf.EI_NIDENT {
		return false
	}
	var bo binary.ByteOrder = binary.LittleEndian
	if elf.Data(data[elf.EI_DATA]) == elf.ELFDATA2MSB {
		bo = binary.BigEndian
	}
	r := bytes.NewReader(data)
	switch elf.Class(data[elf.EI_CLASS]) {
	case elf.ELFCLASS64:
		var h elf.Header64
		if binary.Read(r, bo, &h) != nil {
			return false
		}
		return h.Phentsize == 56 && h.Phoff < interpPrefixMax && uint64(h.Phnum)*56 <= interpPrefixMax-h.Phoff
	case elf.ELFCLASS32:
		var h elf.Header32
		if binary.Read(r, bo, &h) != nil {
			return false
		}
		return h.Phentsize == 32 && uint64(h.Phoff) < interpPrefixMax && uint64(h.Phnum)*32 <= interpPrefixMax-uint64(h.Phoff)
	}
	return false
}
