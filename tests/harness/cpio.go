package harness

import (
	"bufio"
	"fmt"
	"io"
	"os"

	"github.com/u-root/u-root/pkg/cpio"
)

// The initramfs images are cpio "newc" (SVR4, no CRC) archives, the format
// the kernel unpacks. The records are written by u-root's pkg/cpio, the
// library the project's design names for test initramfs images: its newc
// writer and reader are tested upstream (and against GNU cpio there), so the
// harness keeps only the ordering and the metadata policy below, not a
// format implementation of its own. TestImageReadableByCPIO still
// cross-checks the result with the system cpio(1).

// CPIOWriter writes a newc archive entry by entry through u-root's
// cpio.Newc writer. Parent directories must be written before their
// contents; Image does that ordering for callers.
//
// Metadata is fixed so archives are reproducible and unpack the same on
// every host: uid/gid 0, mtime 0, one link each, and inode numbers counting
// up from 1 (u-root leaves them to the caller; distinct numbers keep the
// kernel's hard-link detection from ever pairing two entries).
type CPIOWriter struct {
	buf *bufio.Writer
	rw  cpio.RecordWriter
	ino uint64
}

// NewCPIOWriter returns a writer that emits a newc archive to w. Call Close to
// write the trailer.
func NewCPIOWriter(w io.Writer) *CPIOWriter {
	buf := bufio.NewWriterSize(w, 1<<20)
	return &CPIOWriter{buf: buf, rw: cpio.Newc.Writer(buf)}
}

// Dir writes a directory entry.
func (c *CPIOWriter) Dir(name string, perm os.FileMode) error {
	return c.write(cpio.Record{Info: c.info(name, cpio.S_IFDIR|uint64(perm.Perm()), 2)})
}

// Symlink writes a symbolic link name → target.
func (c *CPIOWriter) Symlink(name, target string) error {
	rec := cpio.Symlink(name, target)
	rec.Info = c.info(name, rec.Mode, 1)
	rec.FileSize = uint64(len(target))
	return c.write(rec)
}

// File writes a regular file whose content is read from r, which must yield
// exactly size bytes. An r that is also an io.Closer is closed once copied.
func (c *CPIOWriter) File(name string, perm os.FileMode, size int64, r io.ReaderAt) error {
	if size < 0 || size > 0xffffffff {
		return fmt.Errorf("cpio: %s: %d bytes does not fit newc's 32-bit size field (4 GiB)", name, size)
	}
	info := c.info(name, cpio.S_IFREG|uint64(perm.Perm()), 1)
	info.FileSize = uint64(size)
	return c.write(cpio.Record{ReaderAt: r, Info: info})
}

// Close writes the trailer entry and flushes.
func (c *CPIOWriter) Close() error {
	if err := cpio.WriteTrailer(c.rw); err != nil {
		return fmt.Errorf("cpio: trailer: %w", err)
	}
	if err := c.buf.Flush(); err != nil {
		return fmt.Errorf("cpio: write: %w", err)
	}
	return nil
}

func (c *CPIOWriter) info(name string, mode, nlink uint64) cpio.Info {
	c.ino++
	return cpio.Info{Ino: c.ino, Mode: mode, NLink: nlink, Name: name}
}

func (c *CPIOWriter) write(rec cpio.Record) error {
	if err := c.rw.WriteRecord(rec); err != nil {
		return fmt.Errorf("cpio: %s: %w", rec.Name, err)
	}
	return nil
}
