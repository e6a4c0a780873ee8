package initramfs

import (
	"bufio"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"
)

// archive writes a newc archive to a file through u-root's pkg/cpio, with
// the project's fixed metadata (mtime 0, one link each, inode numbers
// counting up from 1, as tests/harness/cpio.go): the same inputs give the
// same bytes, so two launches that build one key at once write identical
// files. It remembers where each regular file's content lies, so a hard
// link can be written as a copy of it (see Build).
type archive struct {
	f    *os.File
	buf  *bufio.Writer
	cnt  *countWriter
	rw   cpio.RecordWriter
	ino  uint64
	data map[string][2]int64 // regular file name → offset and size of its content in the file
	dirs map[string]bool     // directory names written
	all  map[string]bool     // every name written
}

// countWriter counts the archive's bytes and refuses any write past
// limit (when set) with over's error: the builder checks each entry
// against the bound before writing it, and this catches what it does not
// (synthesized module directories, the console node).
type countWriter struct {
	w     io.Writer
	n     int64
	limit int64
	over  func() error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.limit > 0 && c.n+int64(len(p)) > c.limit {
		return 0, c.over()
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func newArchive(f *os.File) *archive {
	buf := bufio.NewWriterSize(f, 1<<20)
	cnt := &countWriter{w: buf}
	return &archive{f: f, buf: buf, cnt: cnt, rw: cpio.Newc.Writer(cnt),
		data: map[string][2]int64{}, dirs: map[string]bool{}, all: map[string]bool{}}
}

// size is the bytes written so far.
func (a *archive) size() int64 { return a.cnt.n }

func (a *archive) info(name string, mode, nlink uint64, uid, gid int) cpio.Info {
	a.ino++
	return cpio.Info{Ino: a.ino, Mode: mode, NLink: nlink, Name: name, UID: uint64(uid), GID: uint64(gid)}
}

func (a *archive) write(rec cpio.Record) error {
	if err := a.rw.WriteRecord(rec); err != nil {
		return fmt.Errorf("initramfs: write %s: %w", rec.Name, err)
	}
	a.all[rec.Name] = true
	return nil
}

// unixMode turns a Go file mode into the kernel's st_mode bits.
func unixMode(m fs.FileMode) uint64 {
	mode := uint64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= cpio.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		mode |= cpio.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		mode |= cpio.S_ISVTX
	}
	switch {
	case m.IsDir():
		mode |= cpio.S_IFDIR
	case m&fs.ModeSymlink != 0:
		mode |= cpio.S_IFLNK
	case m&fs.ModeDevice != 0 && m&fs.ModeCharDevice != 0:
		mode |= cpio.S_IFCHR
	case m&fs.ModeDevice != 0:
		mode |= cpio.S_IFBLK
	case m&fs.ModeNamedPipe != 0:
		mode |= cpio.S_IFIFO
	case m&fs.ModeSocket != 0:
		mode |= cpio.S_IFSOCK
	default:
		mode |= cpio.S_IFREG
	}
	return mode
}

// dir writes a directory.
func (a *archive) dir(name string, perm fs.FileMode, uid, gid int) error {
	a.dirs[name] = true
	return a.write(cpio.Record{Info: a.info(name, unixMode(perm|fs.ModeDir), 2, uid, gid)})
}

// ensureDirs writes the parents of name that are not written yet.
func (a *archive) ensureDirs(name string) error {
	for i := 0; i < len(name); i++ {
		if name[i] == '/' && !a.all[name[:i]] {
			if err := a.dir(name[:i], 0o755, 0, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// symlink writes a symbolic link name → target.
func (a *archive) symlink(name, target string, uid, gid int) error {
	rec := cpio.Symlink(name, target)
	rec.Info = a.info(name, rec.Mode, 1, uid, gid)
	rec.FileSize = uint64(len(target))
	return a.write(rec)
}

// node writes a device node, FIFO or socket.
func (a *archive) node(name string, m fs.FileMode, uid, gid int, major, minor uint32) error {
	info := a.info(name, unixMode(m), 1, uid, gid)
	info.Rmajor, info.Rminor = uint64(major), uint64(minor)
	return a.write(cpio.Record{Info: info})
}

// file writes a regular file whose content r yields: exactly size bytes.
func (a *archive) file(name string, m fs.FileMode, uid, gid int, size int64, r io.Reader) error {
	if size < 0 || size > 0xffffffff {
		return fmt.Errorf("initramfs: %s: %d bytes do not fit newc's 32-bit size field (4 GiB): leave the file out of the image", name, size)
	}
	info := a.info(name, unixMode(m), 1, uid, gid)
	info.FileSize = uint64(size)
	// newc: a 110-byte header, the name and its NUL padded to 4 bytes,
	// then the content.
	off := a.size() + (110+int64(len(name))+1+3)&^3
	var ra io.ReaderAt
	if size > 0 {
		ra = &seqReaderAt{r: r}
	} else {
		ra = strings.NewReader("")
	}
	if err := a.write(cpio.Record{ReaderAt: ra, Info: info}); err != nil {
		return err
	}
	a.data[name] = [2]int64{off, size}
	return nil
}

// copyOf writes name as a regular file with the content of the earlier
// regular file target, read back from the archive.
func (a *archive) copyOf(name, target string, m fs.FileMode, uid, gid int) error {
	loc, ok := a.data[target]
	if !ok {
		return fmt.Errorf("initramfs: hard link %s: its target %s was not written as a regular file", name, target)
	}
	if err := a.buf.Flush(); err != nil {
		return fmt.Errorf("initramfs: write: %w", err)
	}
	return a.file(name, m, uid, gid, loc[1], io.NewSectionReader(a.f, loc[0], loc[1]))
}

// close writes the trailer and flushes.
func (a *archive) close() error {
	if err := cpio.WriteTrailer(a.rw); err != nil {
		return fmt.Errorf("initramfs: trailer: %w", err)
	}
	if err := a.buf.Flush(); err != nil {
		return fmt.Errorf("initramfs: write: %w", err)
	}
	return nil
}

// seqReaderAt lets u-root's writer, which reads content through a
// ReaderAt from offset 0 onwards, read a stream.
type seqReaderAt struct {
	r   io.Reader
	pos int64
}

func (s *seqReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off != s.pos {
		return 0, fmt.Errorf("initramfs: content read out of order (at %d, expected %d)", off, s.pos)
	}
	n, err := s.r.Read(p)
	s.pos += int64(n)
	return n, err
}
