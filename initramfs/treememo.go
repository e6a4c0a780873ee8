package initramfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// Tree records: "tree-<hash of the directory's path>.sums", one line per
// regular file of a directory IMAGE: its quoted name, identity and
// SHA-256.
const (
	treePrefix   = "tree-"
	treeExt      = ".sums"
	maxTreeBytes = 256 << 20
)

// treeMemo remembers a directory IMAGE's file hashes (rootfs.TreeMemo).
type treeMemo struct {
	c       *Cache
	root    string
	rec     string
	known   map[string]string // name → identity + " " + sum
	next    strings.Builder   // the record to write
	changed bool
}

// TreeMemo returns the memo of the directory IMAGE root's file hashes; it
// implements rootfs.HashMemo's TreeMemo.
func (c *Cache) TreeMemo(root string) rootfs.TreeMemo {
	abs, _ := filepath.Abs(root)
	t := &treeMemo{c: c, root: abs, rec: c.treeRecordPath(abs), known: map[string]string{}}
	b, err := readOwned(t.rec, maxTreeBytes)
	if err != nil || !bytes.HasPrefix(b, []byte(recordMagic)) {
		return t
	}
	lines := strings.Split(string(b[len(recordMagic):]), "\n")
	if len(lines) == 0 || lines[0] != abs {
		return t
	}
	for _, l := range lines[1:] {
		q, rest, ok := strings.Cut(l, "\t")
		if !ok {
			continue
		}
		if name, err := strconv.Unquote(q); err == nil {
			t.known[name] = rest
		}
	}
	return t
}

// Sum returns the file's SHA-256, from the record when the file's identity
// is the one recorded with it.
func (t *treeMemo) Sum(name string, fi fs.FileInfo, open func() (io.ReadCloser, error)) (sum [sha256.Size]byte, err error) {
	id, settled := identityOf(fi)
	if settled {
		if rest, ok := t.known[name]; ok {
			if rid, hx, ok := strings.Cut(rest, "\t"); ok && rid == id {
				if b, err := hex.DecodeString(hx); err == nil && len(b) == len(sum) {
					copy(sum[:], b)
					fmt.Fprintf(&t.next, "%s\t%s\n", strconv.Quote(name), rest)
					return sum, nil
				}
			}
		}
	}
	r, err := open()
	if err != nil {
		return sum, err
	}
	defer r.Close()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	t.changed = true
	if settled {
		fmt.Fprintf(&t.next, "%s\t%s\t%x\n", strconv.Quote(name), id, sum)
	}
	return sum, nil
}

// Close writes the record when a file was hashed (failures ignored: the
// next launch hashes again).
func (t *treeMemo) Close() {
	if t.changed {
		_ = t.c.writeFile(t.rec, recordMagic+t.root+"\n"+t.next.String())
	}
}
