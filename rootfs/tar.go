package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"strings"

	"github.com/klauspost/compress/zstd"
)

// compression of a tar IMAGE
type compression int

const (
	compressNone compression = iota
	compressGzip
	compressZstd
)

var (
	magicGzip = []byte{0x1f, 0x8b}
	magicZstd = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

func sniffCompression(head []byte) compression {
	switch {
	case bytes.HasPrefix(head, magicGzip):
		return compressGzip
	case bytes.HasPrefix(head, magicZstd):
		return compressZstd
	}
	return compressNone
}

// decompressor returns r's decompressed stream.
func decompressor(r io.Reader, c compression) (io.ReadCloser, error) {
	switch c {
	case compressGzip:
		return gzip.NewReader(r)
	case compressZstd:
		d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(1<<30))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return io.NopCloser(r), nil
}

// walkTar yields the entries of the tar stream r through a normalizer.
// image names IMAGE in errors; what names the stream's origin (IMAGE, or
// "the flattened layers of IMAGE").
func walkTar(r io.Reader, image string, fn func(*Entry, io.Reader) error) error {
	n := newNormalizer(image, fn)
	tr := tar.NewReader(r)
	var e Entry
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("rootfs: image %s: read tar: %w: the archive is corrupt or truncated", image, err)
		}
		if err := tarEntry(hdr, image, &e); err != nil {
			return err
		}
		if e.Name == "" {
			continue // the root itself: the initramfs's root is the kernel's
		}
		var content io.Reader
		if e.IsRegular() {
			content = tr
		}
		if err := n.add(&e, content); err != nil {
			return err
		}
	}
}

// tarEntry fills e from hdr, or says why the entry is refused.
func tarEntry(hdr *tar.Header, image string, e *Entry) error {
	name, err := cleanName(hdr.Name)
	if err != nil {
		return fmt.Errorf("rootfs: image %s: %w: such an entry would escape the root; rebuild the image without it", image, err)
	}
	if err := checkNameLimits(name); err != nil {
		return fmt.Errorf("rootfs: image %s: %w: rebuild the image without it", image, err)
	}
	if len(hdr.Linkname) > MaxName {
		return fmt.Errorf("rootfs: image %s: entry %q links to a target of %d bytes, more than PATH_MAX (%d): rebuild the image without it", image, hdr.Name[:min(len(hdr.Name), 64)], len(hdr.Linkname), MaxName)
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 0xffffffff || hdr.Gid > 0xffffffff {
		return fmt.Errorf("rootfs: image %s: entry %q has owner %d:%d, outside 0..2^32-1: the archive is corrupt", image, hdr.Name, hdr.Uid, hdr.Gid)
	}
	*e = Entry{Name: name, UID: hdr.Uid, GID: hdr.Gid, Mode: fs.FileMode(hdr.Mode).Perm()}
	if hdr.Mode&04000 != 0 {
		e.Mode |= fs.ModeSetuid
	}
	if hdr.Mode&02000 != 0 {
		e.Mode |= fs.ModeSetgid
	}
	if hdr.Mode&01000 != 0 {
		e.Mode |= fs.ModeSticky
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse: // the reader turns the old TypeRegA into TypeReg
		if hdr.Size < 0 {
			return fmt.Errorf("rootfs: image %s: entry %q has a negative size: the archive is corrupt", image, hdr.Name)
		}
		e.Size = hdr.Size
	case tar.TypeDir:
		e.Mode |= fs.ModeDir
	case tar.TypeSymlink:
		if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
			return fmt.Errorf("rootfs: image %s: symlink %q has an empty target or one with a NUL byte: the archive is corrupt", image, hdr.Name)
		}
		e.Mode |= fs.ModeSymlink
		e.Link = hdr.Linkname
	case tar.TypeLink:
		target, err := cleanName(hdr.Linkname)
		if err != nil || target == "" {
			return fmt.Errorf("rootfs: image %s: hard link %q: target %q escapes the image root or is the root: rebuild the image without it", image, hdr.Name, hdr.Linkname)
		}
		e.Hardlink, e.Link = true, target
	case tar.TypeChar:
		e.Mode |= fs.ModeDevice | fs.ModeCharDevice
		e.DevMajor, e.DevMinor = uint32(hdr.Devmajor), uint32(hdr.Devminor)
	case tar.TypeBlock:
		e.Mode |= fs.ModeDevice
		e.DevMajor, e.DevMinor = uint32(hdr.Devmajor), uint32(hdr.Devminor)
	case tar.TypeFifo:
		e.Mode |= fs.ModeNamedPipe
	default:
		return fmt.Errorf("rootfs: image %s: entry %q has tar type %q, which an initramfs cannot hold: rebuild the image without it", image, hdr.Name, hdr.Typeflag)
	}
	return nil
}

// hashingReader hashes what it reads.
type hashingReader struct {
	r io.Reader
	h hash.Hash
}

func (h *hashingReader) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	h.h.Write(p[:n])
	return n, err
}
