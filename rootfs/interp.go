package rootfs

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"path"
	"slices"
)

// A dynamic COMMAND needs its ELF interpreter (PT_INTERP, the dynamic
// loader: /lib64/ld-linux-x86-64.so.2) in the guest as much as itself:
// without it execve fails with ENOENT, which reads as a command not found.
// Interp names it, so a caller checks it in IMAGE before boot as it looks
// COMMAND up. Only the ELF header, the program headers and the
// interpreter's name are read: never a whole file.

// interpPrefixMax bounds what is read of a file for its interpreter: the
// program headers and the name lie in its first page in what linkers
// write (the name at 0x318 in GNU ld's x86-64 output); a PT_INTERP beyond
// it is left unknown.
const interpPrefixMax = 64 << 10

// pathMax is Linux's PATH_MAX, the longest interpreter name the kernel
// takes (binfmt_elf: p_filesz from 2 to PATH_MAX, NUL-terminated).
const pathMax = 4096

// elfReader reads an ELF file's interpreter (interp) with buffers it
// keeps from file to file: the index reads every executable's.
type elfReader struct {
	hdr  [64]byte // an ELF header, or one program header
	name []byte
	last string // the last interpreter found: most files of an image share one
}

// interp returns the interpreter a file's PT_INTERP names, read from r as
// Linux's binfmt_elf reads it: the first PT_INTERP of an ELF file of
// either class and byte order. "" for a file that is no ELF, has no
// PT_INTERP (static), or whose headers the kernel would refuse (then
// execve says ENOEXEC in the guest, and the guest is where to say it).
// Reads stay inside r's first interpPrefixMax bytes: the ELF header, the
// program headers up to the PT_INTERP, its name.
func (er *elfReader) interp(r io.ReaderAt) string {
	h := er.hdr[:]
	if !readAt(r, h[:elf.EI_NIDENT], 0) || string(h[:4]) != elf.ELFMAG {
		return ""
	}
	var bo binary.ByteOrder
	switch elf.Data(h[elf.EI_DATA]) {
	case elf.ELFDATA2LSB:
		bo = binary.LittleEndian
	case elf.ELFDATA2MSB:
		bo = binary.BigEndian
	default:
		return ""
	}
	// The fields' offsets in Elf64_Ehdr/Elf32_Ehdr and _Phdr (elf(5)).
	class := elf.Class(h[elf.EI_CLASS])
	var phoff, phentsize, phnum uint64
	switch class {
	case elf.ELFCLASS64:
		if !readAt(r, h[:64], 0) {
			return ""
		}
		phoff, phentsize, phnum = bo.Uint64(h[32:]), uint64(bo.Uint16(h[54:])), uint64(bo.Uint16(h[56:]))
		if phentsize != 56 {
			return ""
		}
	case elf.ELFCLASS32:
		if !readAt(r, h[:52], 0) {
			return ""
		}
		phoff, phentsize, phnum = uint64(bo.Uint32(h[28:])), uint64(bo.Uint16(h[42:])), uint64(bo.Uint16(h[44:]))
		if phentsize != 32 {
			return ""
		}
	default:
		return ""
	}
	if phnum == 0 || phoff >= interpPrefixMax || phnum*phentsize > interpPrefixMax-phoff {
		return ""
	}
	for i := range phnum {
		p := h[:phentsize]
		if !readAt(r, p, int64(phoff+i*phentsize)) {
			return ""
		}
		var off, size uint64
		if elf.ProgType(bo.Uint32(p)) != elf.PT_INTERP {
			continue
		}
		if class == elf.ELFCLASS64 {
			off, size = bo.Uint64(p[8:]), bo.Uint64(p[32:])
		} else {
			off, size = uint64(bo.Uint32(p[4:])), uint64(bo.Uint32(p[16:]))
		}
		if size < 2 || size > pathMax || off >= interpPrefixMax || size > interpPrefixMax-off {
			return ""
		}
		er.name = slices.Grow(er.name[:0], int(size))[:size]
		name := er.name
		if !readAt(r, name, int64(off)) || name[size-1] != 0 || bytes.IndexByte(name[:size-1], 0) >= 0 {
			return ""
		}
		if string(name[:size-1]) != er.last {
			er.last = string(name[:size-1])
		}
		return er.last
	}
	return ""
}

// readAt fills p from r at off.
func readAt(r io.ReaderAt, p []byte, off int64) bool {
	n, err := r.ReadAt(p, off)
	return n == len(p) && (err == nil || err == io.EOF)
}

// elfInterp is elfReader.interp with buffers of its own.
func elfInterp(r io.ReaderAt) string {
	var er elfReader
	return er.interp(r)
}

// streamPrefix is an io.ReaderAt over the first interpPrefixMax bytes of
// a stream (an archive entry's content) that reads only as far as asked.
// Read in front of it passes the stream through (Walk's caller reading
// the content) and keeps what it passes, for the ReadAt calls after the
// last Read. While fewer than interpPrefixMax bytes are kept, every byte
// consumed from the stream is kept, so buf is always the stream's start.
// Its buffer is reused from entry to entry (reset).
type streamPrefix struct {
	r   io.Reader
	buf []byte
	err error
}

func (s *streamPrefix) reset(r io.Reader) { s.r, s.buf, s.err = r, s.buf[:0], nil }

// Read passes the stream through, keeping what fits of it.
func (s *streamPrefix) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if keep := min(n, interpPrefixMax-len(s.buf)); keep > 0 {
		s.buf = append(s.buf, p[:keep]...)
	}
	return n, err
}

func (s *streamPrefix) ReadAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	if off < 0 || end > interpPrefixMax {
		return 0, errors.New("rootfs: read beyond the prefix kept of a file")
	}
	if have := len(s.buf); int64(have) < end && s.err == nil {
		s.buf = slices.Grow(s.buf, int(end)-have)
		n, err := io.ReadFull(s.r, s.buf[have:end])
		s.buf, s.err = s.buf[:have+n], err
	}
	if off >= int64(len(s.buf)) {
		return 0, io.EOF
	}
	n := copy(p, s.buf[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Interp returns the ELF interpreter the file name (a path inside the
// image, its symlinks followed inside it) asks for, "" when it is no
// dynamic ELF executable or cannot be told; the error wraps
// fs.ErrNotExist when name is not in the image. A directory IMAGE's file
// is opened beneath it and its headers read; an archive's or container
// image's come from its index (recorded when it was built, or LoadIndex).
func (im *Image) Interp(name string) (string, error) {
	r, e, err := im.resolve(name)
	if err != nil {
		return "", im.wrap(err)
	}
	if !e.Mode.IsRegular() {
		return "", nil
	}
	if im.format != FormatDir {
		if ie := im.idx[r]; ie != nil && ie.Hardlink {
			r = ie.Link
		}
		return im.interp[r], nil
	}
	dir, fi, err := lstatBeneath(im.path, r)
	if err != nil {
		return "", im.wrap(err)
	}
	f, err := openAt(dir, path.Base(r), fi, 0)
	dir.Close()
	if err != nil {
		return "", im.wrap(err)
	}
	defer f.Close()
	return elfInterp(f), nil
}

// isExecutable says whether e is a regular file some user may execute:
// the only ones whose interpreter the index records.
func isExecutable(e *Entry) bool {
	return e.IsRegular() && e.Mode.Perm()&0o111 != 0
}
