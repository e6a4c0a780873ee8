// Package filecache is the directory a content cache keeps its entries in,
// and the rules every such cache of hpcvmm follows: the initramfs archives
// of package initramfs and the file system images of package imagepack
// share it (the kernel cache of package vmlinux keeps its own copy, as its
// entries embed their header).
//
//   - The directory is owned by root or hpcvmm's user, writable by no one
//     else (whoever writes there chooses every job's files), 0700, and
//     every file in it 0400 (an entry holds every file of a user's image,
//     its index and the hash records name them: issue 30 item 2); one per
//     user by default (package cachedir).
//   - An entry is "<key><data extension>", its data, and side files
//     ("<key>.meta", its record, and whatever else its cache keeps), all
//     written to a temporary file and renamed into place, the record last,
//     so a reader that finds the record finds the whole entry (Put).
//   - Verified on read (Verify): owner, mode and size every time, the
//     content's SHA-256 on the first read and whenever the file's identity
//     (device, inode, size, modification and status-change times) differs
//     from the one recorded at the last check ("<key>.ok"): a truncated,
//     corrupt or replaced entry is refused, never used.
//   - Least recently used entries evicted beyond a size bound, never one
//     used within Options.Grace (a launch between building an entry and
//     mapping it); an entry never grows past EntryBound (the size bound,
//     or the file system's free space less a margin).
//   - File hashes (a tar IMAGE, a directory IMAGE's files, the agent
//     binary) remembered by identity ("file-<hash of path and
//     identity>.hash", "tree-<hash of the directory>.sums"), so a warm
//     launch hashes nothing it hashed before (FileSHA256, TreeMemo: the
//     cache is a rootfs.HashMemo). Changing a file's bytes updates its
//     status-change time, which only root can set back (by setting the
//     clock); a file replaced by rename has a new inode. That is not proof
//     against the file's writer (a write through a shared mapping to a page
//     already dirty updates no time stamp; a FUSE file system's owner
//     reports whatever identity it likes), and the records are trusted for
//     files any user owns all the same, because a record only ever chooses
//     the key: the caches fill an entry only from a walk that checked
//     everything it read against that key (rootfs.WalkKeyed), so a stale
//     or lied-about identity can make a launch fail ("changed while hpcvmm
//     read it", and the caller then Forgets the records) or serve the tree
//     the key names, never store one tree under another's key.
package filecache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/evict"
	"github.com/hpcvmm/hpcvmm/trustfs"
)

// The cache's own file names.
const (
	// MetaExt is the extension of an entry's record, which its cache
	// writes last (Put's last File).
	MetaExt    = ".meta"
	okExt      = ".ok"
	hashPrefix = "file-"
	hashExt    = ".hash"
	tempPrefix = ".tmp-"
	// staleTemp is how old a temporary file or an orphaned side file must
	// be before eviction removes it (a build still writing it is younger).
	staleTemp = time.Hour
	// freeMargin is the free space an entry leaves on the cache's file
	// system.
	freeMargin = 256 << 20
)

// identityMagic starts every identity record.
const identityMagic = "hpcvmm-identity v1\n"

// RecordAfter is how long a file must have gone unchanged before the cache
// records its identity: file timestamps advance in clock ticks, so a change
// within the tick of a hash could keep the identity (as git's index).
const RecordAfter = 2 * time.Second

// ErrMiss is Verify's error when the entry has no data file.
var ErrMiss = errors.New("not in the cache")

// Options describe one cache.
type Options struct {
	// Name names the cache's owner in errors ("initramfs": "initramfs:
	// cache file ...").
	Name string
	// Kind is the cachedir kind of the default directory (Open's dir "").
	Kind string
	// DataExt is the extension of an entry's data file (".cpio").
	DataExt string
	// SideExts are the extensions of an entry's other files, removed with
	// it (MetaExt and any others); the identity record ".ok" is the
	// cache's own.
	SideExts []string
	// Setting is how the caller names another directory in an error's
	// advice ("Config.CacheDir").
	Setting string
	// Max bounds the data files' total size in bytes.
	Max int64
	// Settle is how long a file must be unchanged before its identity is
	// recorded: RecordAfter (tests pass 0).
	Settle time.Duration
	// Grace is how recently used an entry must be to be safe from
	// eviction: a launch between building it and mapping it.
	Grace time.Duration
	// Records are the caller's own long-lived records, each a file name
	// prefix and extension ({"fw-", ".refs"}): like the hash records, not
	// tied to one entry, removed once unused for a month.
	Records []Record
}

// Record names a kind of record by its file name's prefix and extension.
type Record struct{ Prefix, Ext string }

// Cache is an open cache directory.
type Cache struct {
	dir string
	o   Options
}

// Open returns the cache in dir ("": the user's own, cachedir.Default of
// o.Kind), created 0700 with its missing parents, refusing a directory
// that is a symlink, not owned by root or the caller, or writable by group
// or others, and making one of the caller's that others may read 0700 (an
// older hpcvmm made it 0755).
func Open(dir string, o Options) (*Cache, error) {
	if dir == "" {
		var err error
		if dir, err = cachedir.Default(o.Kind); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Name, err)
		}
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("%s: cache %q is not an absolute path: pass an absolute %s", o.Name, dir, o.Setting)
	}
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, trustfs.PrivateDir); err != nil {
			return nil, fmt.Errorf("%s: create cache: %w: pass %s with a directory you own", o.Name, err, o.Setting)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: cache: %w", o.Name, err)
	}
	c := &Cache{dir: dir, o: o}
	if err := c.checkInfo(dir, fi, true); err != nil {
		return nil, err
	}
	if err := trustfs.MakePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("%s: cache: %w", o.Name, err)
	}
	return c, nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.dir }

// Max is the cache's size bound in bytes.
func (c *Cache) Max() int64 { return c.o.Max }

// Path is the file of key's entry with extension ext (the data file:
// Options.DataExt).
func (c *Cache) Path(key, ext string) string { return filepath.Join(c.dir, key+ext) }

func (c *Cache) checkInfo(path string, fi fs.FileInfo, dir bool) error {
	bad := trustfs.Check(path, fi, dir)
	if bad == nil {
		return nil
	}
	what, fix := "file", "remove it"
	if dir {
		what, fix = "directory", "chown root "+path+"; chmod go-w "+path+", or pass another cache directory"
	}
	return bad.Explain(trustfs.Wording{
		Subject:  c.o.Name + ": cache " + what + " " + path,
		Kind:     what,
		Fix:      fix,
		ModeRisk: ", who could choose every job's files",
	})
}

// checkPrivate is checkInfo for an open cache file, which it then makes
// readable by its owner alone (trustfs.Private: an older hpcvmm wrote
// entries 0444).
func (c *Cache) checkPrivate(p string, f *os.File, fi fs.FileInfo) error {
	if err := c.checkInfo(p, fi, false); err != nil {
		return err
	}
	if _, err := trustfs.Private(f, fi); err != nil {
		return fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	return nil
}

// EntryBound is the most bytes one entry's data may take, and what sets
// it: the cache's size bound, or the free space of the cache's file system
// (as an unprivileged user sees it) less 256 MiB, whichever is smaller. A
// build checks every write against it (issue 30 item 4: an 8 KiB image
// became a 256 MiB entry, and the bound applied only after it was
// written).
func (c *Cache) EntryBound() (int64, string) {
	bound, why := c.o.Max, fmt.Sprintf("the size bound of the cache %s (%d MiB)", c.dir, mib(c.o.Max))
	var st unix.Statfs_t
	if err := unix.Statfs(c.dir, &st); err == nil {
		if free := int64(st.Bavail)*st.Bsize - freeMargin; free < bound {
			bound = max(free, 0)
			why = fmt.Sprintf("the free space of the file system of the cache %s, less %d MiB", c.dir, mib(freeMargin))
		}
	}
	return bound, why
}

func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// CreateTemp creates a temporary file for key's data in the cache
// directory (0600; Put renames it into place, eviction removes one left
// over an hour).
func (c *Cache) CreateTemp(key string) (*os.File, error) {
	f, err := os.CreateTemp(c.dir, tempPrefix+key[:min(len(key), 16)]+"-*")
	if err != nil {
		return nil, fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	return f, nil
}

// IsTemp reports whether name (a file name in the cache directory) is a
// temporary file.
func IsTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

// Verify checks key's data file against its record's size and SHA-256
// (hex): owner, mode and size every time, the content when the file's
// identity is not the one recorded at the last check (hashed then says
// so). ErrMiss when there is no data file; any other error means the entry
// is unusable (the message says why). A check that hashed records the
// identity; one that did not marks the entry used (for eviction).
func (c *Cache) Verify(key string, size int64, sum string) (hashed bool, err error) {
	p := c.Path(key, c.o.DataExt)
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, ErrMiss
	}
	if err != nil {
		return false, fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	if err := c.checkPrivate(p, f, fi); err != nil {
		return false, err
	}
	if fi.Size() != size {
		return false, fmt.Errorf("%s: cache file %s holds %d bytes, its record says %d: truncated or replaced", c.o.Name, p, fi.Size(), size)
	}
	id, settled := c.identityOf(fi)
	ok := c.Path(key, okExt)
	if settled && c.readRecordLine(ok) == id {
		now := time.Now()
		_ = os.Chtimes(ok, now, now) // LRU order; a read-only cache still serves
		return false, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return true, fmt.Errorf("%s: cache file %s: %w", c.o.Name, p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != sum {
		return true, fmt.Errorf("%s: cache file %s has SHA-256 %s, its record says %s: corrupt or replaced", c.o.Name, p, got, sum)
	}
	if !settled {
		id = "unsettled" // matches no identity; its time still orders eviction
	}
	c.WriteRecord(ok, id)
	return true, nil
}

// ReadOwned reads a cache file no larger than limit after checking its
// owner and mode.
func (c *Cache) ReadOwned(p string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := c.checkPrivate(p, f, fi); err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%s: cache file %s is larger than %d bytes: remove it", c.o.Name, p, limit)
	}
	return io.ReadAll(f)
}

// File is a side file of an entry: its extension and content.
type File struct {
	Ext     string
	Content []byte
}

// Put moves tmp (a file from CreateTemp, closed, whose content the caller
// hashed as it was written) into place as key's data, writes files in
// order (the record last), records the data file's identity as checked,
// then evicts.
func (c *Cache) Put(key, tmp string, files ...File) error {
	if err := os.Chmod(tmp, trustfs.PrivateFile); err != nil {
		return fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	_ = os.Remove(c.Path(key, okExt))
	data := c.Path(key, c.o.DataExt)
	if err := os.Rename(tmp, data); err != nil {
		return fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	for _, f := range files {
		if err := c.WriteFile(c.Path(key, f.Ext), f.Content); err != nil {
			return err
		}
	}
	// The content was hashed as it was written: record this file's
	// identity, so the next launch need not hash it again (once settled).
	if fi, err := os.Lstat(data); err == nil {
		id, settled := c.identityOf(fi)
		if !settled {
			id = "unsettled"
		}
		c.WriteRecord(c.Path(key, okExt), id)
	}
	return c.Evict(key)
}

// WriteFile writes content to path (in the cache directory) by temporary
// file and rename, 0400, synced.
func (c *Cache) WriteFile(path string, content []byte) error {
	if err := trustfs.WriteFile(path, tempPrefix+"rec-", trustfs.PrivateFile, true, content); err != nil {
		return fmt.Errorf("%s: cache: write %s: %w", c.o.Name, path, err)
	}
	return nil
}

// WriteRecord writes a record of lines at path (0400, by temporary file
// and rename), marked as the cache's own; failures are ignored (a cache
// hpcvmm cannot write still serves, doing the work again at every launch).
func (c *Cache) WriteRecord(path string, lines ...string) {
	_ = c.WriteFile(path, []byte(identityMagic+strings.Join(lines, "\n")+"\n"))
}

// readRecordLine returns the first line of an identity record, "" when
// there is none or it could have been written by someone else.
func (c *Cache) readRecordLine(path string) string {
	lines := c.ReadRecord(path)
	if len(lines) == 0 {
		return ""
	}
	return lines[0]
}

// ReadRecord returns the lines of the record at path (WriteRecord's), nil
// when there is none, it is not the caller's own or it is not a record.
func (c *Cache) ReadRecord(path string) []string {
	b, err := c.ReadOwned(path, 4096)
	if err != nil || !strings.HasPrefix(string(b), identityMagic) {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b[len(identityMagic):]), "\n"), "\n")
}

// identityOf returns fi's identity, and false when it changed too recently
// to be recorded (within Options.Settle).
func (c *Cache) identityOf(fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	newest := time.Unix(0, max(st.Mtim.Nano(), st.Ctim.Nano()))
	return fmt.Sprintf("dev %d ino %d size %d mtime %d ctime %d", st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()),
		time.Since(newest) >= c.o.Settle
}

// Evict removes least recently used entries until the data files fit the
// bound, never keep nor an entry used within Options.Grace; and leftovers:
// temporary files over an hour old, side files whose entry is gone, file
// hash records unused for a month.
func (c *Cache) Evict(keep string) error {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("%s: cache: %w", c.o.Name, err)
	}
	var entries []evict.Entry
	var total int64
	for _, de := range des {
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if key, ok := strings.CutSuffix(de.Name(), c.o.DataExt); ok && !IsTemp(de.Name()) {
			used := fi.ModTime()
			if ok, err := os.Stat(c.Path(key, okExt)); err == nil && ok.ModTime().After(used) {
				used = ok.ModTime()
			}
			entries = append(entries, evict.Entry{Name: key, Size: fi.Size(), Used: used})
			total += fi.Size()
			continue
		}
		c.removeLeftover(de.Name(), fi)
	}
	inUse := func(e evict.Entry) bool { return e.Name == keep || time.Since(e.Used) < c.o.Grace }
	err = evict.Oldest(entries, total, c.o.Max, inUse, func(e evict.Entry) error {
		if err := os.Remove(c.Path(e.Name, c.o.DataExt)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		for _, ext := range append([]string{okExt}, c.o.SideExts...) {
			_ = os.Remove(c.Path(e.Name, ext))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: cache: evict: %w", c.o.Name, err)
	}
	return nil
}

// removeLeftover removes the file name of the cache directory when it is
// a stale temporary file, a side file whose entry is gone or a hash
// record unused for a month.
func (c *Cache) removeLeftover(name string, fi fs.FileInfo) {
	p := filepath.Join(c.dir, name)
	age := time.Since(fi.ModTime())
	if IsTemp(name) {
		if age > staleTemp {
			_ = os.Remove(p)
		}
		return
	}
	record := (strings.HasPrefix(name, hashPrefix) && strings.HasSuffix(name, hashExt)) ||
		(strings.HasPrefix(name, treePrefix) && strings.HasSuffix(name, treeExt))
	for _, r := range c.o.Records {
		record = record || strings.HasPrefix(name, r.Prefix) && strings.HasSuffix(name, r.Ext)
	}
	if record {
		if age > 30*24*time.Hour {
			_ = os.Remove(p)
		}
		return
	}
	for _, ext := range append([]string{okExt}, c.o.SideExts...) {
		if key, ok := strings.CutSuffix(name, ext); ok {
			if _, err := os.Lstat(c.Path(key, c.o.DataExt)); errors.Is(err, fs.ErrNotExist) && age > staleTemp {
				_ = os.Remove(p)
			}
			return
		}
	}
}
