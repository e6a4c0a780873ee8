// Package rootfs opens the root file system a job runs in (hpcvmm run
// --rootfs IMAGE) and yields its flattened tree as a stream of entries,
// for package initramfs to turn into the guest's initramfs.
//
// IMAGE is a directory, a tar archive (plain, gzip or zstd), an OCI image
// layout directory (oci-layout and index.json) or a `docker save`/`podman
// save` archive (a tar holding manifest.json). Container images are read
// with github.com/google/go-containerregistry (layout, tarball) and their
// layers flattened in order, whiteouts and opaque directories applied, by
// its mutate.Extract: the reference implementation of the image spec's
// layer semantics, maintained with the registry tooling that writes these
// images.
//
// Nothing is ever written to the host's file system: entries are streamed
// to the caller, so an entry named "../x" or "/x" cannot escape anything —
// it is refused all the same, with the entry and IMAGE named, because such
// an image is broken or hostile. Symbolic links stay links (their targets,
// absolute ones included, are resolved in the guest, never on the host); a
// directory IMAGE is walked by file descriptor, each entry stat'ed and
// opened relative to its open parent without following a symlink
// (fdwalk.go), so no path component is resolved twice. Lookups inside the image (LookPath, ReadFiles) resolve
// symlinks against the image's own root.
package rootfs

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"sync"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// Format is the kind of IMAGE.
type Format int

// The formats Open recognises.
const (
	// FormatDir is a directory holding the root file system.
	FormatDir Format = iota + 1
	// FormatTar is a tar archive of the root file system, plain, gzip or
	// zstd compressed.
	FormatTar
	// FormatOCILayout is an OCI image layout directory.
	FormatOCILayout
	// FormatDockerArchive is the tar archive `docker save` or `podman
	// save` writes.
	FormatDockerArchive
)

func (f Format) String() string {
	switch f {
	case FormatDir:
		return "directory"
	case FormatTar:
		return "tar archive"
	case FormatOCILayout:
		return "OCI image layout"
	case FormatDockerArchive:
		return "docker save archive"
	}
	return fmt.Sprintf("Format(%d)", int(f))
}

// Image is an opened IMAGE. Its methods may be called from one goroutine
// at a time.
type Image struct {
	path   string // as the caller named it
	format Format
	comp   compression // FormatTar
	img    v1.Image    // FormatOCILayout, FormatDockerArchive

	keyOnce sync.Once
	key     Key
	keyErr  error
	keyDone bool // key computed: walks check what they read against it

	// What the key was computed from, for the walks' checks: a tar's
	// SHA-256, a container image's config digest (set by Open).
	fileSum   [sha256.Size]byte
	cfgDigest v1.Hash

	idx    map[string]*Entry // FormatTar and container images: metadata of every entry, built once
	interp map[string]string // with idx: the ELF interpreter of each executable that has one (Interp)
	idxErr error
	usage  Usage
}

// Open detects IMAGE's format and opens it. Errors name IMAGE and say what
// to do; nothing is read beyond what detection needs (a tar archive's
// entry headers, a layout's index and manifest).
func Open(image string) (*Image, error) {
	return OpenAs(image, func(p string) (*os.File, error) { return os.OpenFile(p, os.O_RDONLY|unix.O_NONBLOCK, 0) })
}

// OpenAs is Open whose first access to IMAGE is an open through open: hpcvmm
// passes one that opens with the rights of the user it acts for (package
// asuser), so IMAGE that user cannot open is refused here, before anything
// is read. open must not block on a FIFO (O_NONBLOCK). The later reads
// (the archive's entries, a directory's walk) still open by path with
// hpcvmm's own rights.
func OpenAs(image string, open func(string) (*os.File, error)) (*Image, error) {
	f, err := open(image)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("rootfs: image %s does not exist: pass a directory, a tar archive, an OCI image layout or a docker save archive", image)
	}
	if err != nil {
		return nil, fmt.Errorf("rootfs: image %s: %w", image, err)
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("rootfs: image %s: %w", image, err)
	}
	im := &Image{path: image}
	if fi.IsDir() {
		if isFile(path.Join(image, "oci-layout")) && isFile(path.Join(image, "index.json")) {
			im.format = FormatOCILayout
			if im.img, err = openLayout(image); err != nil {
				return nil, fmt.Errorf("rootfs: image %s: OCI image layout: %w: check the layout (e.g. skopeo inspect oci:%s)", image, err, image)
			}
			if im.cfgDigest, err = configDigest(im.img); err != nil {
				return nil, fmt.Errorf("rootfs: image %s: OCI image layout: %w", image, err)
			}
			return im, nil
		}
		im.format = FormatDir
		return im, nil
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("rootfs: image %s is a %v, not a directory or an archive file", image, fi.Mode().Type())
	}
	return im, im.detectArchive()
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// detectArchive tells a tar (plain or compressed) from a docker save
// archive, and refuses anything else.
func (im *Image) detectArchive() error {
	f, err := os.Open(im.path)
	if err != nil {
		return fmt.Errorf("rootfs: image %s: %w", im.path, err)
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	im.comp = sniffCompression(head)
	notKnown := fmt.Errorf("rootfs: image %s is not a known format (not a directory, tar, tar.gz, tar.zst, OCI image layout or docker save archive): pass one of those", im.path)
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("rootfs: image %s: %w", im.path, err)
	}
	if im.comp != compressNone {
		d, err := decompressor(bufio.NewReader(f), im.comp)
		if err != nil {
			return notKnown
		}
		defer d.Close()
		hdr, err := tar.NewReader(d).Next()
		if err != nil {
			return fmt.Errorf("rootfs: image %s: a compressed file that does not hold a tar archive (%v): pass a tar.gz or tar.zst of the root file system", im.path, err)
		}
		if looksLikeDockerArchive(hdr.Name) {
			return fmt.Errorf("rootfs: image %s looks like a compressed docker save archive (first entry %q): decompress it first, docker archives are read uncompressed", im.path, hdr.Name)
		}
		im.format = FormatTar
		return nil
	}
	// An uncompressed tar: scan its headers (Seek skips the contents) for
	// a top-level manifest.json, which makes it a docker save archive.
	tr := tar.NewReader(f)
	first := true
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if first {
				return notKnown
			}
			break
		}
		if err != nil {
			if first {
				return notKnown
			}
			return fmt.Errorf("rootfs: image %s: read tar: %w: the archive is corrupt or truncated", im.path, err)
		}
		first = false
		if c := path.Clean(hdr.Name); c == "manifest.json" {
			im.format = FormatDockerArchive
			if im.img, err = openDockerArchive(im.path); err != nil {
				return fmt.Errorf("rootfs: image %s: docker save archive: %w: save exactly one image (docker save IMAGE:TAG)", im.path, err)
			}
			if im.cfgDigest, err = configDigest(im.img); err != nil {
				return fmt.Errorf("rootfs: image %s: docker save archive: %w", im.path, err)
			}
			return nil
		}
	}
	im.format = FormatTar
	return nil
}

// looksLikeDockerArchive reports whether a tar's first entry name is one
// docker or podman save writes at the top level.
func looksLikeDockerArchive(name string) bool {
	c := path.Clean(name)
	if c == "manifest.json" || c == "oci-layout" || c == "repositories" || c == "index.json" || c == "blobs" || strings.HasPrefix(c, "blobs/") {
		return true
	}
	first, _, _ := strings.Cut(c, "/")
	if len(first) == 64 {
		_, err := hex.DecodeString(first)
		return err == nil
	}
	return false
}

// Path is IMAGE as given to Open.
func (im *Image) Path() string { return im.path }

// Format is IMAGE's format.
func (im *Image) Format() Format { return im.format }

// Close releases the image. (Nothing is held open between calls today; it
// is here so callers need not change when something is.)
func (im *Image) Close() error { return nil }

// Walk yields IMAGE's flattened tree, parents before children (see
// Entry.Synthetic). content reads a regular file's Size bytes and is valid
// only during the call; it is nil for every other entry. An error from fn
// stops the walk and is returned as is.
//
// A complete walk of an archive or container image also keeps the tree's
// metadata (see SaveIndex), so lookups after it read nothing again.
func (im *Image) Walk(fn func(e *Entry, content io.Reader) error) error {
	if im.format == FormatDir || im.idx != nil {
		return im.walk(fn)
	}
	ix := newIndexer()
	err := im.walk(func(e *Entry, content io.Reader) error {
		ix.add(e)
		if content == nil || !isExecutable(e) {
			return fn(e, content)
		}
		// An executable's start is kept as fn reads it, for its ELF
		// interpreter.
		ix.sp.reset(content)
		if err := fn(e, &ix.sp); err != nil {
			return err
		}
		ix.noteInterp(e)
		return nil
	})
	if err == nil && im.idx == nil {
		im.idx, im.interp, im.usage = ix.idx, ix.interp, ix.usage
	}
	return err
}

func (im *Image) walk(fn func(e *Entry, content io.Reader) error) error {
	switch im.format {
	case FormatDir:
		return walkDir(im.path, im.path, fn)
	case FormatTar:
		f, err := os.Open(im.path)
		if err != nil {
			return fmt.Errorf("rootfs: image %s: %w", im.path, err)
		}
		defer f.Close()
		// The file's bytes are hashed as they are read, so a walk after Key
		// checks it read the very file the key names (a file rewritten in
		// between would otherwise be cached under another file's key).
		raw := &hashingReader{r: f, h: sha256.New()}
		d, err := decompressor(bufio.NewReaderSize(raw, 1<<20), im.comp)
		if err != nil {
			return fmt.Errorf("rootfs: image %s: %w", im.path, err)
		}
		defer d.Close()
		if err := walkTar(d, im.path, fn); err != nil {
			return err
		}
		if !im.keyDone {
			return nil
		}
		if _, err := io.Copy(io.Discard, raw); err != nil {
			return fmt.Errorf("rootfs: image %s: %w", im.path, err)
		}
		var got [sha256.Size]byte
		raw.h.Sum(got[:0])
		if got != im.fileSum {
			return fmt.Errorf("rootfs: image %s changed while hpcvmm read it (SHA-256 %x, then %x): launch again once it is written", im.path, im.fileSum, got)
		}
		return nil
	case FormatOCILayout, FormatDockerArchive:
		err := walkImage(im.img, im.cfgDigest, im.path, fn)
		switch {
		case err == nil || strings.HasPrefix(err.Error(), "rootfs: "):
			return err
		case strings.Contains(err.Error(), "unsafe tar path"):
			// mutate.Extract's refusal of a "../" entry
			return fmt.Errorf("rootfs: image %s: a layer has an entry that climbs out of the image root (%w): such an entry would escape the root; rebuild the image without it", im.path, err)
		}
		return fmt.Errorf("rootfs: image %s: a layer is corrupt or unreadable: %w: pull or save the image again", im.path, err)
	}
	return fmt.Errorf("rootfs: image %s: not opened", im.path)
}

// Key identifies an image's content for caches.
type Key [sha256.Size]byte

// String is the key in hex.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// keyVersion changes whenever what Walk yields for the same bytes would
// change, so caches keyed by Key never serve an older rendering.
const keyVersion = "hpcvmm-rootfs-key v1\n"

// keyDir hashes a directory IMAGE: each entry's metadata as Walk yields
// it, and each regular file's content SHA-256, from memo when it has one.
func (im *Image) keyDir(h io.Writer, memo HashMemo) error {
	var tm TreeMemo
	if memo != nil {
		tm = memo.TreeMemo(im.path)
		defer tm.Close()
	}
	buf := make([]byte, 1<<20)
	var e Entry
	err := walkTree(im.path, func(dir *os.File, name, rel string, fi fs.FileInfo) error {
		if err := dirEntry(dir, name, rel, fi, im.path, &e); err != nil {
			return err
		}
		dirKeyEntry(h, &e)
		if !e.IsRegular() {
			return nil
		}
		open := func() (io.ReadCloser, error) {
			f, err := openAt(dir, name, fi, 0)
			if err != nil {
				return nil, err
			}
			return struct {
				io.Reader
				io.Closer
			}{&exactReader{r: f, left: fi.Size(), name: f.Name()}, f}, nil
		}
		var sum [sha256.Size]byte
		var err error
		if tm != nil {
			sum, err = tm.Sum(e.Name, fi, open)
		} else {
			sum, err = readSum(open, buf)
		}
		if err != nil {
			return fmt.Errorf("rootfs: image %s: %w", im.path, err)
		}
		dirKeySum(h, sum)
		return nil
	})
	if err != nil && !strings.HasPrefix(err.Error(), "rootfs: ") {
		return fmt.Errorf("rootfs: image %s: %w", im.path, err)
	}
	return err
}

// dirKeyEntry and dirKeySum write an entry's metadata and a regular
// file's content SHA-256 into a directory IMAGE's key hash.
func dirKeyEntry(h io.Writer, e *Entry) {
	fmt.Fprintf(h, "%q %o %d %d %d %q %t %d %d\n", e.Name, uint32(e.Mode), e.UID, e.GID, e.Size, e.Link, e.Hardlink, e.DevMajor, e.DevMinor)
}

func dirKeySum(h io.Writer, sum [sha256.Size]byte) { fmt.Fprintf(h, "%x\n", sum) }

// keyHeader starts a key hash.
func (im *Image) keyHeader() hash.Hash {
	h := sha256.New()
	io.WriteString(h, keyVersion)
	fmt.Fprintf(h, "%s\n", im.format)
	return h
}

// WalkKeyed is Walk that also checks that what it yields is what Key
// named (computing Key first if it was not): a directory IMAGE's entries
// and contents are hashed as they are yielded (content fn does not read is
// read here) and the result compared with the key; a tar IMAGE's bytes
// are hashed as they are read; a container image's layers are checked
// against its config, whose digest is the key. If IMAGE changed since
// Key, the walk fails ("changed while hpcvmm read it") instead of yielding
// a tree that a cache would store under another tree's key.
func (im *Image) WalkKeyed(fn func(e *Entry, content io.Reader) error) error {
	if _, err := im.Key(); err != nil {
		return err
	}
	if im.format != FormatDir {
		return im.Walk(fn)
	}
	h := im.keyHeader()
	if err := walkDirHashing(im.path, im.path, fn, h); err != nil {
		return err
	}
	var got Key
	h.Sum(got[:0])
	if got != im.key {
		return fmt.Errorf("rootfs: image %s changed while hpcvmm read it: launch again once it is written", im.path)
	}
	return nil
}

// readSum hashes what open yields.
func readSum(open func() (io.ReadCloser, error), buf []byte) (sum [sha256.Size]byte, err error) {
	r, err := open()
	if err != nil {
		return sum, err
	}
	defer r.Close()
	fh := sha256.New()
	if _, err := io.CopyBuffer(fh, r, buf); err != nil {
		return sum, err
	}
	fh.Sum(sum[:0])
	return sum, nil
}

// Key returns a key of IMAGE's content, computed once per Image:
//
//   - an OCI image layout or a docker save archive: from the image's
//     config digest (the image ID; a few KiB hashed at Open): the config's
//     diff_ids name every layer's uncompressed content, and every walk
//     checks each layer against them, so the key covers the whole tree;
//   - a tar archive: the SHA-256 of the file (about 0.5 s per GiB on one
//     core with SHA extensions, or a remembered hash, see KeyUsing), and
//     every walk after Key hashes the file again as it reads it;
//   - a directory: a SHA-256 over every entry's name, type, mode, owner,
//     size, link target and its content's SHA-256 — the whole tree is read
//     and hashed (0.7 s for 512 MiB on this project's 2-core AMD EPYC dev
//     VM: BenchmarkBuild512MiBDir in package initramfs), except for files
//     KeyUsing's memo remembers unchanged, where only the Lstat walk
//     remains. WalkKeyed checks a walk against it.
//
// A cache keyed by Key must fill an entry only from WalkKeyed (or, for
// archives and container images, any walk after Key), never from a walk
// that could see another tree than the key names.
func (im *Image) Key() (Key, error) { return im.KeyUsing(nil) }

// HashMemo hashes files, remembering earlier results by file identity
// (package initramfs's cache keeps the records), so a warm launch need not
// read a tar IMAGE or a directory IMAGE's files again.
type HashMemo interface {
	// FileSHA256 returns the SHA-256 of the file at path; hashed reports
	// whether the file was read.
	FileSHA256(path string) (sum [sha256.Size]byte, hashed bool, err error)
	// TreeMemo returns the memo for the files of the directory IMAGE
	// root.
	TreeMemo(root string) TreeMemo
}

// TreeMemo remembers the SHA-256 of a directory IMAGE's files.
type TreeMemo interface {
	// Sum returns the SHA-256 of the regular file name (relative to the
	// root) that fi (from Lstat) describes, calling open to read it only
	// when no earlier hash of the same, unchanged file is remembered.
	Sum(name string, fi fs.FileInfo, open func() (io.ReadCloser, error)) ([sha256.Size]byte, error)
	// Close stores what was learnt.
	Close()
}

// KeyUsing is Key with a tar or docker save archive's SHA-256 taken from
// memo (nil: computed). It gives the same key as Key.
func (im *Image) KeyUsing(memo HashMemo) (Key, error) {
	im.keyOnce.Do(func() { im.key, im.keyErr = im.computeKey(memo) })
	return im.key, im.keyErr
}

func (im *Image) computeKey(memo HashMemo) (Key, error) {
	h := im.keyHeader()
	switch im.format {
	case FormatOCILayout, FormatDockerArchive:
		fmt.Fprintf(h, "config %s\n", im.cfgDigest)
	case FormatTar:
		var sum [sha256.Size]byte
		var err error
		if memo != nil {
			sum, _, err = memo.FileSHA256(im.path)
		} else {
			sum, err = fileSHA256(im.path)
		}
		if err != nil {
			return Key{}, fmt.Errorf("rootfs: image %s: %w", im.path, err)
		}
		im.fileSum = sum
		fmt.Fprintf(h, "%x\n", sum)
	case FormatDir:
		if err := im.keyDir(h, memo); err != nil {
			return Key{}, err
		}
	}
	var k Key
	h.Sum(k[:0])
	im.keyDone = true
	return k, nil
}

func fileSHA256(p string) (sum [sha256.Size]byte, err error) {
	f, err := os.Open(p)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	h.Sum(sum[:0])
	return sum, nil
}
