package vmlinux

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/trustfs"
)

// Hashing a kernel costs time at every launch (a 60 MiB vmlinux and its
// 8 MiB bzImage took 2.4 s of SHA-256 in the nested test bed, most of the
// time before the guest's clock started). So the cache remembers, in small
// record files beside its entries, the identity of each file it has hashed
// — device, inode, size, modification and status-change times — and a
// later launch that finds the same identity trusts the earlier hash instead
// of hashing again. Changing a file's bytes updates its status-change time,
// which only root can set back (by setting the clock), and root chooses the
// kernel anyway; a file replaced by rename has a new inode. As git does
// with its index, an identity is recorded only once the file has been left
// alone for RecordAfter: the kernel's file timestamps advance in clock ticks,
// so a change made within the tick of the hash would keep the identity.
// Records live in the cache directory, whose ownership OpenCache checks, so
// nobody else can forge one. A bzImage's record is trusted only for a file
// that no one but root and hpcvmm's user can write (KeyFor): for another
// writer's file the identity proves nothing.

// RecordAfter is how long a file must have gone unchanged before the cache
// records its identity (see above): a launch within RecordAfter of the
// cache entry's or the bzImage's last change hashes it again.
const RecordAfter = 2 * time.Second

// racyWindow is RecordAfter, a variable for tests.
var racyWindow = RecordAfter

// Record file names: "<entry>.ok" for an entry whose content hash was
// checked, "bzimage-<hash of the identity>.key" for a bzImage whose key
// was computed.
const (
	verifiedSuffix = ".ok"
	keyPrefix      = "bzimage-"
	keySuffix      = ".key"
	recordMagic    = "hpcvmm-identity v1\n"
)

// identity is what a file is recognised by between hashes.
type identity struct {
	dev, ino         uint64
	size             int64
	mtimeNs, ctimeNs int64
}

// identityOf returns fi's identity, and false when fi has no stat data or
// changed too recently to be recorded (within racyWindow of now).
func identityOf(fi fs.FileInfo) (identity, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return identity{}, false
	}
	id := identity{
		dev: uint64(st.Dev), ino: st.Ino, size: st.Size,
		mtimeNs: st.Mtim.Nano(), ctimeNs: st.Ctim.Nano(),
	}
	newest := time.Unix(0, max(id.mtimeNs, id.ctimeNs))
	return id, time.Since(newest) >= racyWindow
}

func (id identity) String() string {
	return fmt.Sprintf("dev %d ino %d size %d mtime %d ctime %d", id.dev, id.ino, id.size, id.mtimeNs, id.ctimeNs)
}

// readRecord returns the lines of a record file after its magic line, or
// nil when the file is missing, is not a record, or could have been
// written by someone other than root or hpcvmm's user (checkInfo).
func readRecord(path string) []string {
	fi, err := os.Lstat(path)
	if err != nil || checkInfo(path, fi, false) != nil || fi.Size() > maxHeaderBytes {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(b, []byte(recordMagic)) {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b[len(recordMagic):]), "\n"), "\n")
}

// writeRecord writes a record file atomically (temporary file, rename),
// read-only. Failures are ignored: a cache hpcvmm cannot write still
// serves, at the price of hashing at every launch.
func (c *Cache) writeRecord(path string, lines ...string) {
	_ = trustfs.WriteFile(path, tempPrefix+"record-", trustfs.PrivateFile, false, []byte(recordMagic+strings.Join(lines, "\n")+"\n"))
}

// verifiedPath is the record of entry path's last content hash.
func verifiedPath(entry string) string { return entry + verifiedSuffix }

// trusted reports whether entry path, with file info fi, is the file whose
// content hash was checked before (its record holds fi's identity).
func trusted(path string, fi fs.FileInfo) bool {
	id, settled := identityOf(fi)
	if !settled {
		return false
	}
	lines := readRecord(verifiedPath(path))
	return len(lines) == 1 && lines[0] == id.String()
}

// rememberVerified records that entry path, with file info fi, matched its
// content hash. A file changed too recently gets a record that matches no
// identity: the record's time still tells eviction the entry was used.
func (c *Cache) rememberVerified(path string, fi fs.FileInfo) {
	line := "unsettled"
	if id, settled := identityOf(fi); settled {
		line = id.String()
	}
	c.writeRecord(verifiedPath(path), line)
}

// keyRecordPath is where the key of the bzImage with identity id is kept.
func (c *Cache) keyRecordPath(id identity) string {
	h := sha256.Sum256([]byte(id.String()))
	return filepath.Join(c.dir, keyPrefix+hex.EncodeToString(h[:16])+keySuffix)
}

// KeyFor returns the cache key of bzImage, the contents of the file
// described by fi (stat'ed from the descriptor the bytes were read or
// mapped through). When the cache has recorded the key of a file with the
// same identity it is returned without hashing (hashed false); otherwise
// the bytes are hashed and, once the file has settled, the key recorded.
//
// Only a bzImage that no one but root and hpcvmm's user can write has its
// identity trusted (onlyWeWrite): another writer can change the bytes
// without changing the identity (a write through a shared writable mapping
// to a page already dirty does not update the times; a FUSE file system's
// owner reports whatever identity it likes), and the key would then name
// bytes this launch never hashed.
func (c *Cache) KeyFor(bzImage []byte, fi fs.FileInfo) (key Key, hashed bool) {
	id, settled := identityOf(fi)
	settled = settled && trustfs.OnlyWeWrite(fi)
	if settled && id.size == int64(len(bzImage)) {
		if lines := readRecord(c.keyRecordPath(id)); len(lines) == 2 && lines[0] == id.String() {
			if b, err := hex.DecodeString(lines[1]); err == nil && len(b) == len(key) {
				copy(key[:], b)
				return key, false
			}
		}
	}
	key = KeyOf(bzImage)
	if settled && id.size == int64(len(bzImage)) {
		c.writeRecord(c.keyRecordPath(id), id.String(), key.String())
	}
	return key, true
}
