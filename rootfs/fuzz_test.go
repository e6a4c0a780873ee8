package rootfs

import (
	"bytes"
	"io"
	"path"
	"strings"
	"testing"
)

// FuzzWalkTar feeds arbitrary bytes to the tar → entries path. Property:
// it never panics, and every entry it yields has a clean, relative name
// inside the root whose parent directory was yielded before it; a regular
// file's content is exactly Size bytes.
func FuzzWalkTar(f *testing.F) {
	f.Add(tarBytes(f, basicTree...))
	f.Add(tarBytes(f, file("../x", "1")))
	f.Add(tarBytes(f, file("/abs", "1"), symlink("a", "/etc/passwd"), file("a/b", "")))
	f.Add(tarBytes(f, file("a/b/c", "xyz"), dir("a"), tarEnt{name: "h", link: "a/b/c", typ: '1'}))
	f.Fuzz(func(t *testing.T, data []byte) {
		dirs := map[string]bool{"": true}
		_ = walkTar(bytes.NewReader(data), "fuzz", func(e *Entry, r io.Reader) error {
			n := e.Name
			if n == "" || n == "." || strings.HasPrefix(n, "/") || n == ".." || strings.HasPrefix(n, "../") || path.Clean(n) != n || strings.IndexByte(n, 0) >= 0 {
				t.Fatalf("entry name %q escapes or is not clean", n)
			}
			parent := path.Dir(n)
			if parent == "." {
				parent = ""
			}
			if !dirs[parent] {
				t.Fatalf("entry %q before its parent", n)
			}
			if e.IsDir() {
				dirs[n] = true
			}
			if e.Hardlink && (e.Link == "" || strings.HasPrefix(e.Link, "/") || path.Clean(e.Link) != e.Link || strings.HasPrefix(e.Link, "../")) {
				t.Fatalf("hard link %q → %q escapes", n, e.Link)
			}
			if r != nil {
				got, err := io.Copy(io.Discard, r)
				if err == nil && got != e.Size {
					t.Fatalf("entry %q: %d bytes of content, Size %d", n, got, e.Size)
				}
			}
			return nil
		})
	})
}
