package filecache

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

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

// fileRecordPath is the record of the hash of the file at abs with
// identity id; treeRecordPath the record of a directory IMAGE's files.
func (c *Cache) fileRecordPath(abs, id string) string {
	rh := sha256.Sum256([]byte(abs + "\n" + id))
	return filepath.Join(c.dir, hashPrefix+hex.EncodeToString(rh[:16])+hashExt)
}

func (c *Cache) treeRecordPath(abs string) string {
	rh := sha256.Sum256([]byte(abs))
	return filepath.Join(c.dir, treePrefix+hex.EncodeToString(rh[:16])+treeExt)
}

// Forget removes the hash records of the file or directory at path: after
// a walk found IMAGE other than its key said, the next launch hashes it
// again instead of failing the same way.
func (c *Cache) Forget(path string) {
	abs, _ := filepath.Abs(path)
	_ = os.Remove(c.treeRecordPath(abs))
	if fi, err := os.Stat(abs); err == nil {
		id, _ := c.identityOf(fi)
		_ = os.Remove(c.fileRecordPath(abs, id))
	}
}

// Remember records that the file at path, as it is now, has SHA-256 sum,
// for a caller that hashed it some other way (nothing is recorded while
// the file is unsettled). The record is believed by FileSHA256 until the
// file's identity changes; see the package doc for why a wrong one does
// no harm beyond a failed launch.
func (c *Cache) Remember(path string, sum [sha256.Size]byte) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(path)
	if id, settled := c.identityOf(fi); settled {
		c.WriteRecord(c.fileRecordPath(abs, id), abs, id, hex.EncodeToString(sum[:]))
	}
	return nil
}

// FileSHA256 returns the SHA-256 of the file at path: from the record of
// an earlier hash of the same, unchanged file when there is one (hashed
// false), else by reading it (and recording it once the file has
// settled). It implements rootfs.HashMemo.
func (c *Cache) FileSHA256(path string) (sum [sha256.Size]byte, hashed bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return sum, false, err
	}
	defer f.Close()
	return c.OpenSHA256(f, path)
}

// OpenSHA256 is FileSHA256 of the open file f, recorded under the name
// path: for a file the caller opened itself (beneath a directory root, as
// initramfs opens the firmware files).
func (c *Cache) OpenSHA256(f *os.File, path string) (sum [sha256.Size]byte, hashed bool, err error) {
	fi, err := f.Stat()
	if err != nil {
		return sum, false, err
	}
	abs, _ := filepath.Abs(path)
	id, settled := c.identityOf(fi)
	rec := c.fileRecordPath(abs, id)
	if settled {
		if lines := c.ReadRecord(rec); len(lines) == 3 && lines[0] == abs && lines[1] == id {
			if b, err := hex.DecodeString(lines[2]); err == nil && len(b) == len(sum) {
				copy(sum[:], b)
				now := time.Now()
				_ = os.Chtimes(rec, now, now)
				return sum, false, nil
			}
		}
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, true, err
	}
	h.Sum(sum[:0])
	if settled {
		c.WriteRecord(rec, abs, id, hex.EncodeToString(sum[:]))
	}
	return sum, true, nil
}

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
	b, err := c.ReadOwned(t.rec, maxTreeBytes)
	if err != nil || !strings.HasPrefix(string(b), identityMagic) {
		return t
	}
	lines := strings.Split(string(b[len(identityMagic):]), "\n")
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
	id, settled := t.c.identityOf(fi)
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
		_ = t.c.WriteFile(t.rec, []byte(identityMagic+t.root+"\n"+t.next.String()))
	}
}
