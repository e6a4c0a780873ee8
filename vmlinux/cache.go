package vmlinux

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/evict"
	"github.com/hpcvmm/hpcvmm/trustfs"
)

// DefaultCacheDir is where hpcvmm run as root keeps decompressed kernels
// unless told otherwise (--kernel-cache); every other user has a cache of
// their own (cachedir.Default, which OpenCache uses for "").
const DefaultCacheDir = "/var/cache/hpcvmm/kernels"

// DefaultCacheMax bounds the cache's size: about a dozen distribution
// kernels.
const DefaultCacheMax = 1 << 30

// Cache file layout: a text header, then the vmlinux.
//
//	hpcvmm-vmlinux v1
//	sha256 <64 hex digits of the vmlinux>
//	size <bytes of the vmlinux>
//	<empty line>
//	<vmlinux>
//
// The file is named <SHA-256 of the bzImage>.vmlinux. The header records the
// content's hash so a read detects a file truncated, corrupted or replaced
// behind hpcvmm's back; the name ties it to the bzImage it came from.
const (
	cacheMagic     = "hpcvmm-vmlinux v1\n"
	cacheSuffix    = ".vmlinux"
	tempPrefix     = ".tmp-"
	maxHeaderBytes = 256
	// staleTemp is how old a temporary file must be before a later
	// launch removes it: far longer than any decompression takes, so a
	// concurrent launch's file in progress is never taken.
	staleTemp = time.Hour
)

// ErrMiss is Get's error when the cache holds no entry for the key.
var ErrMiss = errors.New("vmlinux: not in the kernel cache")

// Key identifies a bzImage: the SHA-256 of its bytes.
type Key [sha256.Size]byte

// KeyOf returns the cache key of a bzImage.
func KeyOf(bzImage []byte) Key { return sha256.Sum256(bzImage) }

// String is the key in hex, as the cache file is named.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// Cache is a directory of decompressed kernels, safe for concurrent
// launches on one node: entries are written to a temporary file and renamed
// into place, so a reader sees a whole file or none, and two launches that
// miss at once both write the same bytes.
type Cache struct {
	dir string
	max int64
}

// OpenCache returns the cache in dir ("": the user's own,
// cachedir.Default), creating the directory and its missing parents (0700,
// owned by the caller) when it is missing. It refuses a directory that another
// user could write to, or that is owned by someone other than root or the
// caller, because whoever can write there chooses the kernel every VM on
// the node boots. maxBytes bounds the cache's total size (0:
// DefaultCacheMax).
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	if dir == "" {
		var err error
		if dir, err = cachedir.Default(cachedir.Kernels); err != nil {
			return nil, fmt.Errorf("vmlinux: kernel cache: %w", err)
		}
	}
	if maxBytes <= 0 {
		maxBytes = DefaultCacheMax
	}
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("vmlinux: kernel cache %q is not an absolute path: pass an absolute --kernel-cache", dir)
	}
	dir = filepath.Clean(dir)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, trustfs.PrivateDir); err != nil {
			return nil, fmt.Errorf("vmlinux: create kernel cache: %w: pass --kernel-cache with a directory you own, or --kernel-decompress=guest", err)
		}
	}
	if err := checkOwned(dir, true); err != nil {
		return nil, err
	}
	return &Cache{dir: dir, max: maxBytes}, nil
}

// Dir is the cache directory.
func (c *Cache) Dir() string { return c.dir }

// Path is the file that holds key's vmlinux.
func (c *Cache) Path(key Key) string { return filepath.Join(c.dir, key.String()+cacheSuffix) }

// checkOwned refuses a path that is a symbolic link, not of the expected
// kind, owned by another user than root or the caller, or writable by group
// or others.
func checkOwned(path string, dir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("vmlinux: kernel cache: %w", err)
	}
	return checkInfo(path, fi, dir)
}

func checkInfo(path string, fi fs.FileInfo, dir bool) error {
	bad := trustfs.Check(path, fi, dir)
	if bad == nil {
		return nil
	}
	what, fix := "file", "remove it"
	if dir {
		what, fix = "directory", "chown root "+path+"; chmod go-w "+path+", or pass another --kernel-cache"
	}
	return bad.Explain(trustfs.Wording{
		Subject:  "vmlinux: kernel cache " + what + " " + path,
		Kind:     what,
		Fix:      fix,
		ModeRisk: ", who could choose the kernel VMs boot",
	})
}

// Entry is a cache entry mapped into memory: the vmlinux is read straight
// from the page cache into guest RAM, without a copy on hpcvmm's heap that
// would stay in its resident memory until the garbage collector returns it.
// The file is replaced only by rename, never rewritten in place, so the
// mapping stays valid while another launch updates the cache.
type Entry struct {
	mapping []byte
	body    []byte
	hashed  bool
}

// Hashed reports whether Get hashed the content, rather than trusting the
// record of an earlier hash of the same, unchanged file.
func (e *Entry) Hashed() bool { return e.hashed }

// Bytes is the vmlinux; valid until Close.
func (e *Entry) Bytes() []byte { return e.body }

// Close unmaps the entry.
func (e *Entry) Close() error {
	if e.mapping == nil {
		return nil
	}
	err := unix.Munmap(e.mapping)
	e.mapping, e.body = nil, nil
	return err
}

// Get returns the vmlinux cached for key after checking the file (a
// regular file owned by root or the caller, not writable by others), its
// header and the SHA-256 of its content — unless the cache recorded that
// this very file, unchanged since, matched its hash before (identity.go).
// It returns ErrMiss when there is no entry; any other error means the
// entry is unusable (and Put will replace it). A hit refreshes the time
// eviction orders by (on the record, so the entry's own times stay as
// hashed). Close the entry when its bytes are no longer needed.
func (c *Cache) Get(key Key) (*Entry, error) {
	path := c.Path(key)
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrMiss
	}
	if err != nil {
		return nil, fmt.Errorf("vmlinux: kernel cache: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("vmlinux: kernel cache: %w", err)
	}
	if err := checkInfo(path, fi, false); err != nil {
		return nil, err
	}
	if fi.Size() > MaxSize+maxHeaderBytes {
		return nil, fmt.Errorf("vmlinux: kernel cache file %s is %d bytes, more than a kernel (%d): remove it", path, fi.Size(), MaxSize+maxHeaderBytes)
	}
	if fi.Size() == 0 {
		return nil, fmt.Errorf("vmlinux: kernel cache file %s is empty: remove it", path)
	}
	buf, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("vmlinux: kernel cache file %s: mmap: %w", path, err)
	}
	e := &Entry{mapping: buf}
	if trusted(path, fi) {
		e.body, _, err = parseEntry(buf)
	} else {
		e.hashed = true
		if e.body, err = verify(buf); err == nil {
			c.rememberVerified(path, fi)
		}
	}
	if err != nil {
		_ = e.Close()
		return nil, fmt.Errorf("vmlinux: kernel cache file %s: %w", path, err)
	}
	if !e.hashed {
		now := time.Now()
		_ = os.Chtimes(verifiedPath(path), now, now) // LRU order only; a read-only cache still serves
	}
	return e, nil
}

// Verify checks a cache file's header and the SHA-256 of its content and
// returns the vmlinux it holds. Tests and tools use it to check a file
// independently of Get.
func Verify(file []byte) ([]byte, error) { return verify(file) }

func verify(buf []byte) ([]byte, error) {
	body, sum, err := parseEntry(buf)
	if err != nil {
		return nil, err
	}
	got := sha256.Sum256(body)
	if want, err := hex.DecodeString(sum); err != nil || !bytes.Equal(want, got[:]) {
		return nil, fmt.Errorf("content SHA-256 %x does not match the header's %q: corrupt or replaced", got, sum)
	}
	return body, nil
}

// parseEntry checks a cache file's header and size and returns the
// vmlinux and the SHA-256 (hex) the header records for it.
func parseEntry(buf []byte) (body []byte, sum string, err error) {
	end := bytes.Index(buf[:min(len(buf), maxHeaderBytes)], []byte("\n\n"))
	if !bytes.HasPrefix(buf, []byte(cacheMagic)) || end < 0 {
		return nil, "", errors.New("no hpcvmm-vmlinux v1 header: not a kernel cache file, or from another hpcvmm version")
	}
	var size string
	for _, line := range strings.Split(string(buf[len(cacheMagic):end]), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "sha256":
			sum = v
		case "size":
			size = v
		}
	}
	body = buf[end+2:]
	n, err := strconv.ParseUint(size, 10, 64)
	if err != nil || n != uint64(len(body)) {
		return nil, "", fmt.Errorf("header says size %q, the file holds %d bytes: truncated or corrupt", size, len(body))
	}
	return body, sum, nil
}

// Put stores vmlinux for key: written to a temporary file in the cache
// directory, synced, made read-only for its owner (0400) and renamed over
// the entry, so concurrent readers see the old file or the new one, never
// a part. It
// then evicts the least recently used entries beyond the size bound.
func (c *Cache) Put(key Key, vmlinux []byte) error {
	sum := sha256.Sum256(vmlinux)
	header := fmt.Sprintf("%ssha256 %x\nsize %d\n\n", cacheMagic, sum, len(vmlinux))
	// The new file has a new identity; an old entry's record goes with it.
	_ = os.Remove(verifiedPath(c.Path(key)))
	if err := trustfs.WriteFile(c.Path(key), tempPrefix+key.String()[:16]+"-", trustfs.PrivateFile, true, []byte(header), vmlinux); err != nil {
		return fmt.Errorf("vmlinux: kernel cache: %w", err)
	}
	return c.evict(c.Path(key))
}

// evict removes the least recently used entries until the cache fits its
// bound, never keep (the entry just written), and temporary files a crashed
// launch left behind.
func (c *Cache) evict(keep string) error {
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return fmt.Errorf("vmlinux: kernel cache: %w", err)
	}
	var files []evict.Entry
	var total int64
	for _, e := range entries {
		path := filepath.Join(c.dir, e.Name())
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), tempPrefix):
			if time.Since(fi.ModTime()) > staleTemp {
				_ = os.Remove(path)
			}
		case strings.HasSuffix(e.Name(), cacheSuffix):
			used := fi.ModTime() // written; a record's time says when last read
			if rec, err := os.Stat(verifiedPath(path)); err == nil && rec.ModTime().After(used) {
				used = rec.ModTime()
			}
			files = append(files, evict.Entry{Name: path, Size: fi.Size(), Used: used})
			total += fi.Size()
		case strings.HasSuffix(e.Name(), verifiedSuffix):
			if _, err := os.Lstat(strings.TrimSuffix(path, verifiedSuffix)); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(path) // its entry is gone
			}
		case strings.HasPrefix(e.Name(), keyPrefix) && strings.HasSuffix(e.Name(), keySuffix):
			// A bzImage's key outlives its entry only briefly: a
			// launch records the key before its Put.
			if lines := readRecord(path); len(lines) == 2 && time.Since(fi.ModTime()) > staleTemp {
				if _, err := os.Lstat(filepath.Join(c.dir, lines[1]+cacheSuffix)); errors.Is(err, fs.ErrNotExist) {
					_ = os.Remove(path)
				}
			}
		}
	}
	err = evict.Oldest(files, total, c.max, func(f evict.Entry) bool { return f.Name == keep }, func(f evict.Entry) error {
		if err := os.Remove(f.Name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		_ = os.Remove(verifiedPath(f.Name))
		return nil
	})
	if err != nil {
		return fmt.Errorf("vmlinux: kernel cache: evict: %w", err)
	}
	return nil
}
