package imagepack

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// fuzzTar turns fuzz bytes into a tar archive: every 4 bytes one entry
// with a name from a tiny alphabet (so names repeat, nest and collide),
// a type (file, directory, symlink, hard link, FIFO), a mode and content.
func fuzzTar(t testing.TB, data []byte) []byte {
	names := []string{"a", "b", "a/b", "a/c", "b/a", "a/b/c", "c", "b/b"}
	ents := []ent{file("z", "always", 0o644)} // never an empty archive, which is no IMAGE
	for i := 0; i+4 <= len(data) && len(ents) < 64; i += 4 {
		name := names[int(data[i])%len(names)]
		mode := int64(data[i+2]) | 0o400 // owner-readable: 0o400 to 0o777
		switch data[i+1] % 6 {
		case 0, 1:
			ents = append(ents, ent{name: name, typ: tar.TypeReg, mode: mode, body: strings.Repeat(string(rune('A'+data[i+3]%26)), int(data[i+3]))})
		case 2:
			ents = append(ents, ent{name: name, typ: tar.TypeDir, mode: mode | 0o700, uid: int(data[i+3])})
		case 3:
			ents = append(ents, ent{name: name, typ: tar.TypeSymlink, mode: 0o777, link: names[int(data[i+3])%len(names)]})
		case 4:
			ents = append(ents, ent{name: name, typ: tar.TypeLink, link: names[int(data[i+3])%len(names)]})
		case 5:
			ents = append(ents, ent{name: name, typ: tar.TypeFifo, mode: mode})
		}
	}
	return tarBytes(t, ents...)
}

// final is what a walk of the image leaves when the last entry of each
// name wins (the directory's last listed metadata, a synthetic parent's
// 0755 root only when never listed): what extracting the image gives.
type final struct {
	typ     byte
	mode    int64
	uid     int
	link    string
	content string
}

func finalTree(t testing.TB, im *rootfs.Image) map[string]final {
	want := map[string]final{}
	require.NoError(t, im.Walk(func(e *rootfs.Entry, r io.Reader) error {
		f := final{mode: tarMode(e.Mode), uid: e.UID}
		switch {
		case e.IsDir():
			if _, ok := want[e.Name]; ok && e.Synthetic {
				return nil
			}
			f.typ = tar.TypeDir
		case e.Hardlink:
			f.typ, f.content = tar.TypeReg, want[e.Link].content
		case e.Mode.IsRegular():
			b, err := io.ReadAll(r)
			require.NoError(t, err)
			f.typ, f.content = tar.TypeReg, string(b)
		case e.Mode&fs.ModeSymlink != 0:
			f.typ, f.link = tar.TypeSymlink, e.Link
		default:
			f.typ = tar.TypeFifo
		}
		want[e.Name] = f
		return nil
	}))
	return want
}

// packAll is convert's two passes into a buffer instead of mksquashfs.
func packAll(im *rootfs.Image) ([]byte, error) {
	once := func(skip map[string]int) ([]byte, error) {
		var buf bytes.Buffer
		pk := newPacker(&sink{w: &buf, limit: 1 << 30}, im.Path(), true, skip)
		if err := im.WalkKeyed(pk.entry); err != nil {
			return nil, err
		}
		err := pk.close()
		return buf.Bytes(), err
	}
	out, err := once(nil)
	if !errors.Is(err, errDuplicate) {
		return out, err
	}
	skip, err := countDuplicates(im)
	if err != nil {
		return nil, err
	}
	return once(skip)
}

// FuzzPack holds the tar stream mksquashfs reads to what it needs to
// build the image that extracting IMAGE gives: every name once (it keeps
// the first of a name), a hard link only to a name it has already read
// (4.5.1 crashes otherwise), and each name's type, mode, owner, link and
// content those of the name's last entry in IMAGE.
func FuzzPack(f *testing.F) {
	f.Add([]byte{0, 0, 0o244, 3, 0, 1, 0o200, 5, 1, 4, 0, 0})                 // a twice, b → a
	f.Add([]byte{2, 2, 0o355, 0, 2, 0, 0o244, 1, 0, 2, 0o300, 9})             // a/b before a's entry, a again
	f.Add([]byte{0, 0, 0o244, 3, 1, 4, 0, 0, 0, 0, 0o200, 5})                 // b → a, then a replaced
	f.Add([]byte{6, 3, 0, 1, 6, 0, 0o244, 2, 7, 5, 0o200, 0, 6, 4, 0, 7})     // symlink replaced, FIFO, links
	f.Add([]byte{0, 2, 0o355, 0, 0, 0, 0o244, 1, 2, 0, 0o244, 1, 0, 2, 0, 0}) // file under a dir, dir again
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		p := filepath.Join(dir, "image.tar")
		require.NoError(t, os.WriteFile(p, fuzzTar(t, data), 0o644))
		im, err := rootfs.Open(p)
		require.NoError(t, err)
		out, err := packAll(im)
		if err != nil {
			// rootfs refuses an inconsistent archive, the packer a hard
			// link it cannot honour: both one-line errors naming IMAGE.
			require.Contains(t, err.Error(), p)
			require.NotContains(t, err.Error(), "\n")
			return
		}
		im2, err := rootfs.Open(p)
		require.NoError(t, err)
		want := finalTree(t, im2)
		tr := tar.NewReader(bytes.NewReader(out))
		got := map[string]final{}
		for {
			hdr, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
			name := strings.TrimSuffix(hdr.Name, "/")
			_, dup := got[name]
			require.False(t, dup, "%s written twice", name)
			g := final{typ: hdr.Typeflag, mode: hdr.Mode, uid: hdr.Uid, link: hdr.Linkname}
			switch hdr.Typeflag {
			case tar.TypeLink:
				target, ok := got[hdr.Linkname]
				require.True(t, ok && target.typ == tar.TypeReg, "hard link %s to %s, not a file written before it", name, hdr.Linkname)
				g.typ, g.link, g.content = tar.TypeReg, "", target.content
			case tar.TypeReg:
				b, err := io.ReadAll(tr)
				require.NoError(t, err)
				g.content = string(b)
			}
			got[name] = g
		}
		if len(want) == 0 && len(got) == 0 {
			return
		}
		require.Equal(t, want, got)
	})
}
