package initramfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/evict"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/trustfs"
)

// The cache keeps built archives the way package vmlinux keeps kernels
// (the same rules; the code is separate because vmlinux's is being
// changed on its own branch, and its entries embed their header where an
// initramfs must stay a bare archive the kernel reads):
//
//   - a directory owned by root or hpcvmm's user, writable by no one else
//     (whoever writes there chooses every job's files), 0700 and every
//     file in it 0400 (an archive holds every file of a user's image, its
//     index and the hash records name them: issue 30 item 2), one per user
//     by default (cachedir);
//   - "<key>.cpio", the archive, "<key>.meta", a text record of its
//     SHA-256, size and what Build reports about it, and for an archive or
//     container IMAGE "<key>.index", the image's index (rootfs.SaveIndex:
//     lookups on a hit read nothing of IMAGE), its SHA-256 in the record;
//     all written to a temporary file and renamed into place, the record
//     last, so a reader that finds the record finds the whole entry;
//   - verified on read: owner, mode and size every time, the content's
//     SHA-256 on the first read and whenever the file's identity (device,
//     inode, size, modification and status-change times) differs from the
//     one recorded at the last check ("<key>.ok"): a truncated, corrupt or
//     replaced entry is rebuilt, never used;
//   - least recently used entries evicted beyond a size bound, never one
//     used in the last evictGrace (a launch between Build and mapping it);
//   - file hashes (the agent binary, a tar IMAGE, a directory IMAGE's
//     files) likewise remembered by identity ("file-<hash of path and
//     identity>.hash", "tree-<hash of the directory>.sums"), so a warm
//     launch hashes nothing it hashed before. Changing a file's bytes
//     updates its status-change time, which only root can set back (by
//     setting the clock); a file replaced by rename has a new inode. That
//     is not proof against the file's writer (a write through a shared
//     mapping to a page already dirty updates no time stamp; a FUSE file
//     system's owner reports whatever identity it likes), and the records
//     are trusted for files any user owns all the same, because a record
//     only ever chooses the key: an entry is filled only by a walk that
//     checked everything it read against that key (rootfs.WalkKeyed, the
//     agent hashed as copied), so a stale or lied-about identity can make
//     a launch fail ("changed while hpcvmm read it", and the records are
//     then forgotten) or serve the tree the key names, never store one tree
//     under another's key. (The kernel cache, whose fill is not checked
//     against its key that way, trusts records only for files no one but
//     root and hpcvmm's user can write.)

const (
	metaMagic    = "hpcvmm-initramfs v1\n"
	recordMagic  = "hpcvmm-identity v1\n"
	archiveExt   = ".cpio"
	metaExt      = ".meta"
	okExt        = ".ok"
	indexExt     = ".index"
	maxIndex     = 1 << 30
	hashPrefix   = "file-"
	hashExt      = ".hash"
	tempPrefix   = ".tmp-"
	maxMetaBytes = 64 << 10
	staleTemp    = time.Hour
)

// RecordAfter is how long a file must have gone unchanged before the cache
// records its identity: file timestamps advance in clock ticks, so a change
// within the tick of a hash could keep the identity (as git's index).
const RecordAfter = 2 * time.Second

// racyWindow is RecordAfter, a variable for tests.
var racyWindow = RecordAfter

// evictGrace is how recently used an entry must be to be safe from
// eviction: a launch between Build and mapping the archive. A variable for
// tests.
var evictGrace = 10 * time.Minute

// Cache is a directory of built initramfs archives.
type Cache struct {
	dir string
	max int64
}

// OpenCache returns the cache in dir ("": the user's own,
// cachedir.Default), created 0700 with its missing parents, refusing a
// directory that is a symlink, not owned by root or the caller, or
// writable by group or others, and making one of the caller's that others
// may read 0700 (an older hpcvmm made it 0755). maxBytes bounds its size
// (0: DefaultCacheMax).
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	if dir == "" {
		var err error
		if dir, err = cachedir.Default(cachedir.Initramfs); err != nil {
			return nil, fmt.Errorf("initramfs: %w", err)
		}
	}
	if maxBytes <= 0 {
		maxBytes = DefaultCacheMax
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("initramfs: cache %q is not an absolute path: pass an absolute Config.CacheDir", dir)
	}
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, trustfs.PrivateDir); err != nil {
			return nil, fmt.Errorf("initramfs: create cache: %w: pass Config.CacheDir with a directory you own", err)
		}
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("initramfs: cache: %w", err)
	}
	if err := checkInfo(dir, fi, true); err != nil {
		return nil, err
	}
	if err := trustfs.MakePrivateDir(dir); err != nil {
		return nil, fmt.Errorf("initramfs: cache: %w", err)
	}
	return &Cache{dir: dir, max: maxBytes}, nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.dir }

func checkInfo(path string, fi fs.FileInfo, dir bool) error {
	bad := trustfs.Check(path, fi, dir)
	if bad == nil {
		return nil
	}
	what, fix := "file", "remove it"
	if dir {
		what, fix = "directory", "chown root "+path+"; chmod go-w "+path+", or pass another cache directory"
	}
	return bad.Explain(trustfs.Wording{
		Subject:  "initramfs: cache " + what + " " + path,
		Kind:     what,
		Fix:      fix,
		ModeRisk: ", who could choose every job's files",
	})
}

// checkPrivate is checkInfo for an open cache file, which it then makes
// readable by its owner alone (trustfs.Private: an older hpcvmm wrote
// entries 0444).
func checkPrivate(p string, f *os.File, fi fs.FileInfo) error {
	if err := checkInfo(p, fi, false); err != nil {
		return err
	}
	if _, err := trustfs.Private(f, fi); err != nil {
		return fmt.Errorf("initramfs: cache: %w", err)
	}
	return nil
}

// meta is what a cache entry's record holds.
type meta struct {
	sum       string // SHA-256 of the archive, hex
	size      int64
	unpacked  int64
	modules   []string
	unmatched []string
	source    string
	index     string // SHA-256 of the image's index (rootfs.SaveIndex), "" when none is kept
}

func (m *meta) encode() string {
	return fmt.Sprintf("%ssha256 %s\nsize %d\nunpacked %d\nmodules %s\nunmatched %s\nsource %s\nindex %s\n", metaMagic,
		m.sum, m.size, m.unpacked, strings.Join(m.modules, ","), strings.Join(m.unmatched, ","), m.source, m.index)
}

func decodeMeta(b []byte) (*meta, error) {
	if !bytes.HasPrefix(b, []byte(metaMagic)) {
		return nil, errors.New("no hpcvmm-initramfs v1 record")
	}
	m := &meta{}
	var err error
	for _, line := range strings.Split(string(b[len(metaMagic):]), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "sha256":
			m.sum = v
		case "size":
			m.size, err = strconv.ParseInt(v, 10, 64)
		case "unpacked":
			m.unpacked, err = strconv.ParseInt(v, 10, 64)
		case "modules":
			m.modules = splitList(v)
		case "unmatched":
			m.unmatched = splitList(v)
		case "source":
			m.source = v
		case "index":
			m.index = v
		}
		if err != nil {
			return nil, fmt.Errorf("record line %q: %w", line, err)
		}
	}
	if len(m.sum) != 64 || m.size <= 0 {
		return nil, errors.New("record without a SHA-256 or size")
	}
	return m, nil
}

func splitList(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

func (c *Cache) archivePath(key string) string { return filepath.Join(c.dir, key+archiveExt) }
func (c *Cache) metaPath(key string) string    { return filepath.Join(c.dir, key+metaExt) }
func (c *Cache) okPath(key string) string      { return filepath.Join(c.dir, key+okExt) }
func (c *Cache) indexPath(key string) string   { return filepath.Join(c.dir, key+indexExt) }

// freeMargin is the free space a build leaves on the cache's file system.
const freeMargin = 256 << 20

// entryBound is the most bytes one entry's archive may take, and what sets
// it: the cache's size bound, or the free space of the cache's file system
// (as an unprivileged user sees it) less freeMargin, whichever is smaller.
// A build checks every write against it (issue 30 item 4: an 8 KiB image
// became a 256 MiB entry, and the bound applied only after it was
// written).
func (c *Cache) entryBound() (int64, string) {
	bound, why := c.max, fmt.Sprintf("the size bound of the cache %s (%d MiB)", c.dir, mib(c.max))
	var st unix.Statfs_t
	if err := unix.Statfs(c.dir, &st); err == nil {
		if free := int64(st.Bavail)*st.Bsize - freeMargin; free < bound {
			bound = max(free, 0)
			why = fmt.Sprintf("the free space of the file system of the cache %s, less %d MiB", c.dir, mib(freeMargin))
		}
	}
	return bound, why
}

// errMiss is get's error when there is no entry.
var errMiss = errors.New("initramfs: not in the cache")

// get returns the entry for key after checking it (see the top of the
// file), with its image index when it keeps one; errMiss when there is
// none, another error when it is unusable. hashed says whether the
// archive's content was hashed.
func (c *Cache) get(key string) (m *meta, index []byte, hashed bool, err error) {
	mb, err := readOwned(c.metaPath(key), maxMetaBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, errMiss
	}
	if err != nil {
		return nil, nil, false, err
	}
	if m, err = decodeMeta(mb); err != nil {
		return nil, nil, false, fmt.Errorf("initramfs: cache record %s: %w", c.metaPath(key), err)
	}
	p := c.archivePath(key)
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, errMiss
	}
	if err != nil {
		return nil, nil, false, fmt.Errorf("initramfs: cache: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, false, fmt.Errorf("initramfs: cache: %w", err)
	}
	if err := checkPrivate(p, f, fi); err != nil {
		return nil, nil, false, err
	}
	if fi.Size() != m.size {
		return nil, nil, false, fmt.Errorf("initramfs: cache file %s holds %d bytes, its record says %d: truncated or replaced", p, fi.Size(), m.size)
	}
	if m.index != "" {
		if index, err = readOwned(c.indexPath(key), maxIndex); err != nil {
			return nil, nil, false, fmt.Errorf("initramfs: cache index of %s: %w", key, err)
		}
		if got := sha256.Sum256(index); hex.EncodeToString(got[:]) != m.index {
			return nil, nil, false, fmt.Errorf("initramfs: cache index %s does not match its record: corrupt or replaced", c.indexPath(key))
		}
	}
	id, settled := identityOf(fi)
	if settled && readRecordLine(c.okPath(key)) == id {
		now := time.Now()
		_ = os.Chtimes(c.okPath(key), now, now) // LRU order; a read-only cache still serves
		return m, index, false, nil
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, nil, true, fmt.Errorf("initramfs: cache file %s: %w", p, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != m.sum {
		return nil, nil, true, fmt.Errorf("initramfs: cache file %s has SHA-256 %s, its record says %s: corrupt or replaced", p, got, m.sum)
	}
	if !settled {
		id = "unsettled" // matches no identity; its time still orders eviction
	}
	c.writeRecord(c.okPath(key), id)
	return m, index, true, nil
}

// readOwned reads a cache file no larger than limit after checking its
// owner and mode.
func readOwned(p string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkPrivate(p, f, fi); err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("initramfs: cache file %s is larger than %d bytes: remove it", p, limit)
	}
	return io.ReadAll(f)
}

// put moves the archive tmp (a temporary file in the cache directory,
// closed) into place for key with its record, then evicts.
func (c *Cache) put(key, tmp string, m *meta, index []byte) error {
	if err := os.Chmod(tmp, trustfs.PrivateFile); err != nil {
		return fmt.Errorf("initramfs: cache: %w", err)
	}
	_ = os.Remove(c.okPath(key))
	if err := os.Rename(tmp, c.archivePath(key)); err != nil {
		return fmt.Errorf("initramfs: cache: %w", err)
	}
	m.index = ""
	if index != nil {
		sum := sha256.Sum256(index)
		m.index = hex.EncodeToString(sum[:])
		if err := c.writeFile(c.indexPath(key), string(index)); err != nil {
			return err
		}
	}
	if err := c.writeFile(c.metaPath(key), m.encode()); err != nil {
		return err
	}
	// The content was hashed as it was written: record this file's
	// identity, so the next launch need not hash it again (once settled).
	if fi, err := os.Lstat(c.archivePath(key)); err == nil {
		id, settled := identityOf(fi)
		if !settled {
			id = "unsettled"
		}
		c.writeRecord(c.okPath(key), id)
	}
	return c.evict(key)
}

// writeFile writes content to path by temporary file and rename, 0400.
func (c *Cache) writeFile(path, content string) error {
	if err := trustfs.WriteFile(path, tempPrefix+"rec-", trustfs.PrivateFile, true, []byte(content)); err != nil {
		return fmt.Errorf("initramfs: cache: write %s: %w", path, err)
	}
	return nil
}

// writeRecord writes an identity record; failures are ignored (a cache
// hpcvmm cannot write still serves, hashing at every launch).
func (c *Cache) writeRecord(path string, lines ...string) {
	_ = c.writeFile(path, recordMagic+strings.Join(lines, "\n")+"\n")
}

// readRecordLine returns the first line of an identity record, "" when
// there is none or it could have been written by someone else.
func readRecordLine(path string) string {
	lines := readRecord(path)
	if len(lines) == 0 {
		return ""
	}
	return lines[0]
}

func readRecord(path string) []string {
	b, err := readOwned(path, 4096)
	if err != nil || !bytes.HasPrefix(b, []byte(recordMagic)) {
		return nil
	}
	return strings.Split(strings.TrimSuffix(string(b[len(recordMagic):]), "\n"), "\n")
}

// identityOf returns fi's identity, and false when it changed too recently
// to be recorded (within racyWindow).
func identityOf(fi fs.FileInfo) (string, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", false
	}
	newest := time.Unix(0, max(st.Mtim.Nano(), st.Ctim.Nano()))
	return fmt.Sprintf("dev %d ino %d size %d mtime %d ctime %d", st.Dev, st.Ino, st.Size, st.Mtim.Nano(), st.Ctim.Nano()),
		time.Since(newest) >= racyWindow
}

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

// forget removes the hash records of IMAGE at path (a file or a
// directory): after a walk found IMAGE other than its key said, the next
// launch hashes it again instead of failing the same way.
func (c *Cache) forget(path string) {
	abs, _ := filepath.Abs(path)
	_ = os.Remove(c.treeRecordPath(abs))
	if fi, err := os.Stat(abs); err == nil {
		id, _ := identityOf(fi)
		_ = os.Remove(c.fileRecordPath(abs, id))
	}
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
	return c.openSHA256(f, path)
}

// openSHA256 is FileSHA256 of the open file f, named path in the record
// (a firmware file opened beneath its directory: firmware.go).
func (c *Cache) openSHA256(f *os.File, path string) (sum [sha256.Size]byte, hashed bool, err error) {
	fi, err := f.Stat()
	if err != nil {
		return sum, false, err
	}
	abs, _ := filepath.Abs(path)
	id, settled := identityOf(fi)
	rec := c.fileRecordPath(abs, id)
	if settled {
		if lines := readRecord(rec); len(lines) == 3 && lines[0] == abs && lines[1] == id {
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
		c.writeRecord(rec, abs, id, hex.EncodeToString(sum[:]))
	}
	return sum, true, nil
}

// evict removes least recently used entries until the cache fits its
// bound, never keep nor an entry used within evictGrace; and leftovers:
// temporary files over staleTemp old, records whose entry is gone, file
// hash records unused for a month.
func (c *Cache) evict(keep string) error {
	des, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("initramfs: cache: %w", err)
	}
	var entries []evict.Entry
	var total int64
	for _, de := range des {
		name := de.Name()
		p := filepath.Join(c.dir, name)
		fi, err := de.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		switch {
		case strings.HasPrefix(name, tempPrefix):
			if time.Since(fi.ModTime()) > staleTemp {
				_ = os.Remove(p)
			}
		case strings.HasSuffix(name, archiveExt):
			key := strings.TrimSuffix(name, archiveExt)
			used := fi.ModTime()
			if ok, err := os.Stat(c.okPath(key)); err == nil && ok.ModTime().After(used) {
				used = ok.ModTime()
			}
			entries = append(entries, evict.Entry{Name: key, Size: fi.Size(), Used: used})
			total += fi.Size()
		case strings.HasSuffix(name, metaExt), strings.HasSuffix(name, okExt), strings.HasSuffix(name, indexExt):
			key := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, metaExt), okExt), indexExt)
			if _, err := os.Lstat(c.archivePath(key)); errors.Is(err, fs.ErrNotExist) && time.Since(fi.ModTime()) > staleTemp {
				_ = os.Remove(p)
			}
		case strings.HasPrefix(name, hashPrefix) && strings.HasSuffix(name, hashExt),
			strings.HasPrefix(name, treePrefix) && strings.HasSuffix(name, treeExt), strings.HasPrefix(name, refsPrefix) && strings.HasSuffix(name, refsExt):
			if time.Since(fi.ModTime()) > 30*24*time.Hour {
				_ = os.Remove(p)
			}
		}
	}
	inUse := func(e evict.Entry) bool { return e.Name == keep || time.Since(e.Used) < evictGrace }
	err = evict.Oldest(entries, total, c.max, inUse, func(e evict.Entry) error {
		if err := os.Remove(c.archivePath(e.Name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		_ = os.Remove(c.metaPath(e.Name))
		_ = os.Remove(c.okPath(e.Name))
		_ = os.Remove(c.indexPath(e.Name))
		return nil
	})
	if err != nil {
		return fmt.Errorf("initramfs: cache: evict: %w", err)
	}
	return nil
}

// normalizedSet is names normalized (kmodules.Normalize) and sorted, for
// the cache key: the order and spelling of a set do not change the archive.
func normalizedSet(names []string) []string {
	out := make([]string, 0, len(names))
	for _, m := range names {
		out = append(out, kmodules.Normalize(m))
	}
	slices.Sort(out)
	return out
}

// cacheKey hashes what the archive is built from (see the package doc)
// but the firmware files, which the key of firmware.go's fwPlan adds.
func cacheKey(cfg Config, cache *Cache) (key, agentSum string, err error) {
	imKey, err := cfg.Image.KeyUsing(cache)
	if err != nil {
		return "", "", err
	}
	sum, _, err := cache.FileSHA256(cfg.Agent)
	if err != nil {
		return "", "", fmt.Errorf("initramfs: agent %s: %w", cfg.Agent, err)
	}
	mods := cfg.Modules
	if mods == nil {
		mods = kmodules.DefaultModules
	}
	norm := normalizedSet(mods)
	aliases := slices.Clone(cfg.Modaliases)
	slices.Sort(aliases)
	hostDir := cfg.HostModules
	if hostDir == "" {
		hostDir = kmodules.DefaultHostDir
	}
	hostDir, _ = filepath.Abs(hostDir)
	h := sha256.New()
	fmt.Fprintf(h, "%s\nimage %s\nagent %x\nrelease %q\nmodules %q\noptional %q\nexclude %q\nmodaliases %q\nhost %q %s\nfirmware %q require %q\n",
		formatVersion, imKey, sum, cfg.Release, norm, normalizedSet(cfg.Optional), normalizedSet(cfg.Exclude), aliases,
		hostDir, kmodules.HostState(hostDir, cfg.Release), cfg.firmwareDirs(), cfg.RequireFirmware)
	return hex.EncodeToString(h.Sum(nil)), hex.EncodeToString(sum[:]), nil
}
