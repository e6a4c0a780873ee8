package initramfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/filecache"
	"github.com/hpcvmm/hpcvmm/kmodules"
)

// The cache keeps built archives by package filecache's rules (its
// package doc: a private directory per user, 0400 entries written by
// temporary file and rename, verified on read, least recently used
// entries evicted beyond a bound, file hashes remembered by identity).
// An entry is "<key>.cpio", the archive, "<key>.meta", a text record of
// its SHA-256, size and what Build reports about it, and for an archive or
// container IMAGE "<key>.index", the image's index (rootfs.SaveIndex:
// lookups on a hit read nothing of IMAGE), its SHA-256 in the record; the
// record is written last.

const (
	metaMagic    = "hpcvmm-initramfs v1\n"
	archiveExt   = ".cpio"
	metaExt      = filecache.MetaExt
	indexExt     = ".index"
	maxIndex     = 1 << 30
	maxMetaBytes = 64 << 10
)

// RecordAfter is how long a file must have gone unchanged before the cache
// records its identity (filecache.RecordAfter).
const RecordAfter = filecache.RecordAfter

// racyWindow is RecordAfter, a variable for tests.
var racyWindow = RecordAfter

// evictGrace is how recently used an entry must be to be safe from
// eviction: a launch between Build and mapping the archive. A variable for
// tests.
var evictGrace = 10 * time.Minute

// Cache is a directory of built initramfs archives. It implements
// rootfs.HashMemo (FileSHA256, TreeMemo).
type Cache struct {
	*filecache.Cache
}

// OpenCache returns the cache in dir ("": the user's own,
// cachedir.Default), created 0700 with its missing parents, refusing a
// directory that is a symlink, not owned by root or the caller, or
// writable by group or others, and making one of the caller's that others
// may read 0700 (an older hpcvmm made it 0755). maxBytes bounds its size
// (0: DefaultCacheMax).
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheMax
	}
	fc, err := filecache.Open(dir, filecache.Options{
		Name: "initramfs", Kind: cachedir.Initramfs, DataExt: archiveExt, SideExts: []string{metaExt, indexExt},
		Setting: "Config.CacheDir", Max: maxBytes, Settle: racyWindow, Grace: evictGrace,
		// The firmware names each key's modules named (firmware.go).
		Records: []filecache.Record{{Prefix: refsPrefix, Ext: refsExt}},
	})
	if err != nil {
		return nil, err
	}
	return &Cache{fc}, nil
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

func (c *Cache) archivePath(key string) string { return c.Path(key, archiveExt) }
func (c *Cache) metaPath(key string) string    { return c.Path(key, metaExt) }
func (c *Cache) indexPath(key string) string   { return c.Path(key, indexExt) }

// errMiss is get's error when there is no entry.
var errMiss = filecache.ErrMiss

// get returns the entry for key after checking it (filecache's Verify),
// with its image index when it keeps one; errMiss when there is none,
// another error when it is unusable. hashed says whether the archive's
// content was hashed.
func (c *Cache) get(key string) (m *meta, index []byte, hashed bool, err error) {
	mb, err := c.ReadOwned(c.metaPath(key), maxMetaBytes)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, false, errMiss
	}
	if err != nil {
		return nil, nil, false, err
	}
	if m, err = decodeMeta(mb); err != nil {
		return nil, nil, false, fmt.Errorf("initramfs: cache record %s: %w", c.metaPath(key), err)
	}
	if m.index != "" {
		if index, err = c.ReadOwned(c.indexPath(key), maxIndex); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, nil, false, fmt.Errorf("initramfs: cache index of %s: %w", key, err)
		}
	}
	if hashed, err = c.Verify(key, m.size, m.sum); err != nil {
		return nil, nil, hashed, err
	}
	if m.index != "" {
		if got := sha256.Sum256(index); index == nil || hex.EncodeToString(got[:]) != m.index {
			return nil, nil, hashed, fmt.Errorf("initramfs: cache index %s does not match its record: corrupt or replaced", c.indexPath(key))
		}
	}
	return m, index, hashed, nil
}

// put moves the archive tmp (a temporary file in the cache directory,
// closed) into place for key with its index and record, then evicts.
func (c *Cache) put(key, tmp string, m *meta, index []byte) error {
	var files []filecache.File
	m.index = ""
	if index != nil {
		sum := sha256.Sum256(index)
		m.index = hex.EncodeToString(sum[:])
		files = append(files, filecache.File{Ext: indexExt, Content: index})
	}
	files = append(files, filecache.File{Ext: metaExt, Content: []byte(m.encode())})
	return c.Put(key, tmp, files...)
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

// cacheKey hashes what the archive is built from; see the package doc.
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
	fmt.Fprintf(h, "%s\nimage %s\nagent %x\nrelease %q\nmodules %q\noptional %q\nexclude %q\nmodaliases %q\nhost %q %s\n",
		formatVersion, imKey, sum, cfg.Release, norm, normalizedSet(cfg.Optional), normalizedSet(cfg.Exclude), aliases,
		hostDir, kmodules.HostState(hostDir, cfg.Release))
	return hex.EncodeToString(h.Sum(nil)), hex.EncodeToString(sum[:]), nil
}
