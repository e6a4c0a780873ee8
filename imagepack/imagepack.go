// Package imagepack converts a job's IMAGE (package rootfs: a container
// image in an OCI layout or a docker/podman save archive, a tar archive,
// a directory) into a SquashFS file, once, and keeps it in a cache, so a
// job boots it as read-only persistent memory (package imagefile, issue
// 31) instead of copying the whole tree into an initramfs, and a warm
// launch reads nothing of the image.
//
// The writer is squashfs-tools' mksquashfs, run as a program on a tar
// stream (-tar: the code of sqfstar, whose 4.5.1 rejects a compression
// level, see toolName): rootfs streams the image's flattened, validated
// entries (names, modes, owners, symbolic and hard links, devices, FIFOs;
// layers' whiteouts applied) as a tar into its standard input, and it
// writes the file system image straight into a temporary file of the
// cache. Nothing of the image is ever extracted onto the host's file
// system. A program rather than a Go writer: squashfs-tools is the
// reference writer the guest kernel's reader is tested against and
// compresses on every CPU, where the Go writers either stage the tree in
// a directory on disk before they write (go-diskfs's squashfs: its
// workspace, an extraction by another name) or write metadata
// uncompressed, zlib only, without devices or FIFOs, in sorted order
// (gokrazy's and distri's internal writers). SquashFS rather
// than EROFS: erofs-utils 1.5 (Debian 12) reads a directory only, so the
// image would be extracted onto the host first, with its owners, devices
// and setuid files (what this package exists to avoid), and the one
// compressor Debian 12's kernel reads for EROFS, lz4hc, writes at 2–4
// MB/s and compresses less (below).
//
// The SquashFS is reproducible (the same image gives the same bytes:
// every time stamp 0, the root directory 0755 root's, no extended
// attributes: rootfs carries none, so file capabilities are lost, as in
// the initramfs), compressed with zstd at level 3 in 128 KiB blocks. zstd
// because the guest kernel (Debian 12's 6.1: CONFIG_SQUASHFS_ZSTD=y) has it
// and it both writes and reads several times faster than gzip; level 3
// because level 15 (mksquashfs's default for zstd) is ten times slower for
// 2% less; 128 KiB blocks because a read decompresses a whole block (small
// files share fragment blocks, and the kernel caches three): a job's
// start-up reads of small files took half the time of 1 MiB blocks', for
// 1% more bytes and a rate within the noise.
//
// Measured on the project's 2-core dev VM while another engineer's
// emulated test run kept it busy (load 6–8), so absolute rates are low
// and vary ±40% between runs; two runs each (BenchmarkConvert,
// BenchmarkMksquashfsTree, BenchmarkMkfsErofsTree: a 266 MiB image of
// 1,000 files of 4 KiB to 1 MiB in 20 directories, half pseudo-random,
// half text-like; MB/s of the files' bytes, 10^6 bytes a second; out/in
// the output's size over the files'):
//
//	conversion                                       MB/s     out/in
//	tar → mksquashfs -tar, zstd-3, 128 KiB (chosen)  57–94    0.660
//	tar → mksquashfs -tar, zstd-3, 1 MiB             65–105   0.653
//	tar → mksquashfs -tar, zstd-15, 128 KiB          5.8      0.645
//	tar → mksquashfs -tar, zstd-15, 1 MiB            3.1      0.642
//	tar → mksquashfs -tar, gzip-9, 128 KiB           18–28    0.658
//	tar → mksquashfs -tar, gzip-6, 1 MiB             18–35    0.652
//	OCI layout (one gzip layer) → zstd-3, 128 KiB    66–79    0.660
//	extracted tree → mksquashfs, zstd-3, 128 KiB     76–92    0.660
//	extracted tree → mksquashfs, gzip-9, 128 KiB     8–28     0.658
//	extracted tree → mkfs.erofs, uncompressed        98–372   1.000
//	extracted tree → mkfs.erofs, lz4hc               1.9–3.9  0.831
//
// Streaming costs nothing measurable against mksquashfs reading the
// extracted tree (which does not count the extraction); the stream
// allocates per entry and per walk, never per chunk of content
// (BenchmarkPack -benchmem: 45 allocations for a tar of one 16 MiB or
// one 64 MiB file alike, the walk's and the copy's 1 MiB buffers among
// them; 0.6–1.2 GB/s through rootfs's checked walk into io.Discard). Reading the
// result through the kernel (BenchmarkSquashfsReads: a fresh loop mount,
// the 400 small files in a shuffled order, 200 random 4 KiB reads of the
// 1 MiB files): zstd-3 128 KiB 0.74–0.80 s, zstd-3 1 MiB 1.41–1.74 s,
// gzip-9 128 KiB 2.9–4.9 s.
//
// mksquashfs is looked for in fixed directories, never $PATH, and must be
// writable by root or hpcvmm's user alone; it runs as hpcvmm's process
// does (root for a Slurm step acting for a job's user), with an empty
// environment, reads only its standard input and writes only the
// temporary file, named by its absolute path in the cache directory,
// which no other user can write. Without squashfs-tools, Convert fails
// with a one-line error saying to install it; when mksquashfs fails, the
// error carries its last line.
//
// The cache (package filecache's rules, cachedir.Images by default: one
// per user, 0700, entries 0400, written by temporary file and rename,
// verified on every hit, least recently used entries evicted beyond the
// bound) keys an entry by the image's key (rootfs.Image.Key: a container
// image's config digest, read at Open with its manifest and index; a
// tar's SHA-256, remembered by the file's identity; a directory's tree
// hash) and the conversion's settings, so a warm launch of an unchanged
// OCI layout or tar reads none of its layers or bytes. An entry is
// "<key>.sqfs", "<key>.index" (the image's index: COMMAND lookups on a
// hit read nothing of the image) and "<key>.meta", the record (the
// SQuashFS's SHA-256 and size, the index's SHA-256). A hit is used only
// after its size, its SHA-256 (or the identity recorded when it was last
// hashed) and imagefile.Detect have accepted it; anything else is
// converted again.
package imagepack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/filecache"
	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// The conversion's settings (see the package doc for why these).
const (
	// Compressor is mksquashfs's -comp.
	Compressor = "zstd"
	// CompressionLevel is zstd's level (-Xcompression-level).
	CompressionLevel = 3
	// BlockSize is the SquashFS data block size (-b), in bytes.
	BlockSize = 128 << 10
	// formatVersion changes whenever the conversion would write another
	// file system for the same image, so older entries are never served.
	formatVersion = "hpcvmm-imagepack v1"
)

// DefaultCacheMax bounds the cache: a few converted container images of
// the 5–20 GiB NGC kind.
const DefaultCacheMax = 64 << 30

const (
	dataExt  = ".sqfs"
	indexExt = ".index"
	metaExt  = filecache.MetaExt
	maxIndex = 1 << 30
	maxMeta  = 4096
	// metaMagic starts an entry's record.
	metaMagic = formatVersion + "\n"
)

// settle and grace are filecache's Options.Settle and Grace, variables
// for tests.
var (
	settle = filecache.RecordAfter
	grace  = 10 * time.Minute
)

// Cache is a directory of converted images. It implements
// rootfs.HashMemo, so an image's key comes from remembered hashes.
type Cache struct {
	*filecache.Cache
}

// OpenCache returns the cache in dir ("": the user's own,
// cachedir.Default(cachedir.Images)), created 0700 with its missing
// parents; a directory that is a symlink, not owned by root or the caller
// or writable by group or others is refused. maxBytes bounds it (0:
// DefaultCacheMax).
func OpenCache(dir string, maxBytes int64) (*Cache, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultCacheMax
	}
	fc, err := filecache.Open(dir, filecache.Options{
		Name: "imagepack", Kind: cachedir.Images, DataExt: dataExt, SideExts: []string{metaExt, indexExt},
		Setting: "image cache directory", Max: maxBytes, Settle: settle, Grace: grace,
	})
	if err != nil {
		return nil, err
	}
	return &Cache{fc}, nil
}

// Result is a converted image in the cache.
type Result struct {
	// Path is the SquashFS file: what the VM maps (vmm.Config.PMEM).
	// Entries used in the last 10 minutes are never evicted, so it stays
	// until the VM has opened it.
	Path string
	// Hit reports that it came from the cache: nothing was converted.
	Hit bool
	// Key is the cache key (hex).
	Key string
	// Size is the file's size in bytes.
	Size int64
	// Image is what imagefile.Detect found in the file.
	Image imagefile.Image
	// Replaced says why an entry for the key was unusable and converted
	// again ("" when there was none or it was used), for the log.
	Replaced string
}

// meta is an entry's record.
type meta struct {
	sum   string // SHA-256 of the SquashFS, hex
	size  int64
	index string // SHA-256 of the index, hex; "" for a directory IMAGE
}

func (m *meta) encode() []byte {
	return fmt.Appendf(nil, "%ssha256 %s\nsize %d\nindex %s\n", metaMagic, m.sum, m.size, m.index)
}

func decodeMeta(b []byte) (*meta, error) {
	rest, ok := bytes.CutPrefix(b, []byte(metaMagic))
	if !ok {
		return nil, errors.New("no " + formatVersion + " record")
	}
	m := &meta{}
	for _, line := range strings.Split(string(rest), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "sha256":
			m.sum = v
		case "size":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("record line %q: %w", line, err)
			}
			m.size = n
		case "index":
			m.index = v
		}
	}
	if len(m.sum) != 64 || m.size <= 0 {
		return nil, errors.New("record without a SHA-256 or size")
	}
	return m, nil
}

// key is the cache key of im: its content key and the conversion's
// settings.
func key(im *rootfs.Image, c *Cache) (string, error) {
	k, err := im.KeyUsing(c)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s\nimage %s\nsettings %s\n", formatVersion, k, chosen)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Lookup is Convert without converting: im's converted image from the
// cache, or nil (and no error) when the cache holds no usable entry (a
// later Convert's Result.Replaced says why an entry was unusable). On a
// hit, im's lookups (LookPath, Usage) read nothing of an archive or
// container image from then on, so a caller that checks COMMAND before
// converting calls Lookup first.
func Lookup(im *rootfs.Image, c *Cache) (*Result, error) {
	res, err := lookup(im, c)
	if err != nil || !res.Hit {
		return nil, err
	}
	return res, nil
}

// lookup computes im's key and checks the cache's entry for it: res.Hit
// when it is usable, res.Replaced saying why when there is one that is
// not.
func lookup(im *rootfs.Image, c *Cache) (*Result, error) {
	if im == nil || c == nil {
		return nil, errors.New("imagepack: no image or no cache: open them with rootfs.Open and OpenCache")
	}
	k, err := key(im, c)
	if err != nil {
		return nil, err
	}
	res := &Result{Key: k, Path: c.Path(k, dataExt)}
	m, index, err := c.get(k)
	if err == nil {
		res.Image, err = detect(res.Path, m.size)
	}
	if err == nil && index != nil {
		if lerr := im.LoadIndex(bytes.NewReader(index)); lerr != nil {
			err = fmt.Errorf("imagepack: cache index of %s: %w", k, lerr)
		}
	}
	switch {
	case err == nil:
		res.Hit, res.Size = true, m.size
	case !errors.Is(err, filecache.ErrMiss):
		res.Replaced = err.Error()
	}
	return res, nil
}

// get returns key's record and index after filecache's checks of the
// SquashFS (owner, mode, size, SHA-256 or recorded identity).
func (c *Cache) get(key string) (*meta, []byte, error) {
	mb, err := c.ReadOwned(c.Path(key, metaExt), maxMeta)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, filecache.ErrMiss
	}
	if err != nil {
		return nil, nil, err
	}
	m, err := decodeMeta(mb)
	if err != nil {
		return nil, nil, fmt.Errorf("imagepack: cache record %s: %w", c.Path(key, metaExt), err)
	}
	if _, err := c.Verify(key, m.size, m.sum); err != nil {
		return nil, nil, err
	}
	if m.index == "" {
		return m, nil, nil
	}
	index, err := c.ReadOwned(c.Path(key, indexExt), maxIndex)
	if err != nil {
		return nil, nil, fmt.Errorf("imagepack: cache index of %s: %w", key, err)
	}
	if sum := sha256.Sum256(index); hex.EncodeToString(sum[:]) != m.index {
		return nil, nil, fmt.Errorf("imagepack: cache index %s does not match its record: corrupt or replaced", c.Path(key, indexExt))
	}
	return m, index, nil
}

// detect checks that the file at p, of size bytes, is the bare SquashFS a
// conversion writes (imagefile.Detect: superblock, tables inside the
// file).
func detect(p string, size int64) (imagefile.Image, error) {
	f, err := os.Open(p)
	if err != nil {
		return imagefile.Image{}, fmt.Errorf("imagepack: cache: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return imagefile.Image{}, fmt.Errorf("imagepack: cache: %w", err)
	}
	if fi.Size() != size {
		return imagefile.Image{}, fmt.Errorf("imagepack: cache file %s holds %d bytes, its record says %d: truncated or replaced", p, fi.Size(), size)
	}
	img, err := imagefile.Detect(p, f, size)
	if err != nil {
		return imagefile.Image{}, fmt.Errorf("imagepack: cache: %w", err)
	}
	if img.FSType != imagefile.SquashFS || img.Container != imagefile.Bare || img.Offset != 0 {
		return imagefile.Image{}, fmt.Errorf("imagepack: cache file %s holds a %s %s at %d, not a bare SquashFS: corrupt or replaced", p, img.Container, img.FSType, img.Offset)
	}
	return img, nil
}

// Convert returns im as a SquashFS file in c: the cache's entry when it
// holds a usable one for im's key (Result.Hit, nothing of im read beyond
// its key: see the package doc), else converted with sqfstar (which must
// be installed: a one-line error says so), stored and returned. Nothing
// outside c's directory is written; a conversion that fails leaves nothing
// there. ctx stops a conversion (sqfstar is killed). log (nil: none) gets
// a line for a hit, a replaced entry and a conversion with its rate.
func Convert(ctx context.Context, im *rootfs.Image, c *Cache, log *slog.Logger) (*Result, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	res, err := lookup(im, c)
	if err != nil {
		return nil, err
	}
	if res.Hit {
		log.Info("imagepack: cache hit, nothing converted", "image", im.Path(), "squashfs", res.Path, "MiB", mib(res.Size))
		return res, nil
	}
	if res.Replaced != "" {
		log.Warn("imagepack: cache entry unusable, converting again", "image", im.Path(), "why", res.Replaced)
	}
	tool, err := findTool()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	st, err := convert(ctx, im, c, res.Key, tool, chosen)
	if err != nil {
		if strings.Contains(err.Error(), "changed while hpcvmm read it") {
			// The hash records chose a key the files do not match: the next
			// launch hashes them again rather than failing the same way.
			c.Forget(im.Path())
		}
		return nil, err
	}
	res.Size, res.Image = st.size, st.image
	secs := time.Since(start).Seconds()
	log.Info("imagepack: converted", "image", im.Path(), "squashfs", res.Path, "in_MiB", mib(st.in), "out_MiB", mib(st.size),
		"seconds", fmt.Sprintf("%.1f", secs), "MiB_per_s", fmt.Sprintf("%.0f", float64(st.in)/(1<<20)/max(secs, 1e-3)))
	if st.sockets > 0 {
		log.Warn("imagepack: sockets left out (a tar has no form for them)", "image", im.Path(), "count", st.sockets)
	}
	return res, nil
}

// hashFile returns the SHA-256 of f's first size bytes.
func hashFile(f *os.File, size int64) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
