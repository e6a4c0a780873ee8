package harness

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// cpio "newc" (SVR4, no CRC) is the format the kernel unpacks into the
// initramfs. Writing it here keeps the harness free of a cpio(1) dependency
// and of an extra module.

// newcMagic starts every newc header.
const newcMagic = "070701"

// CPIOWriter writes a newc archive entry by entry. Parent directories must be
// written before their contents; Image does that ordering for callers.
type CPIOWriter struct {
	w   *bufio.Writer
	ino uint32
	n   int64 // bytes written, to compute the 4-byte padding
}

// NewCPIOWriter returns a writer that emits a newc archive to w. Call Close to
// write the trailer.
func NewCPIOWriter(w io.Writer) *CPIOWriter {
	return &CPIOWriter{w: bufio.NewWriterSize(w, 1<<20)}
}

// Dir writes a directory entry.
func (c *CPIOWriter) Dir(name string, perm os.FileMode) error {
	return c.header(name, 0o040000|uint32(perm.Perm()), 2, 0)
}

// Symlink writes a symbolic link name → target.
func (c *CPIOWriter) Symlink(name, target string) error {
	if err := c.header(name, 0o120000|0o777, 1, int64(len(target))); err != nil {
		return err
	}
	return c.data(strings.NewReader(target), int64(len(target)))
}

// File writes a regular file whose content is read from r, which must yield
// exactly size bytes.
func (c *CPIOWriter) File(name string, perm os.FileMode, size int64, r io.Reader) error {
	if err := c.header(name, 0o100000|uint32(perm.Perm()), 1, size); err != nil {
		return err
	}
	return c.data(r, size)
}

// Close writes the trailer entry and flushes.
func (c *CPIOWriter) Close() error {
	if err := c.header("TRAILER!!!", 0, 1, 0); err != nil {
		return err
	}
	return c.w.Flush()
}

func (c *CPIOWriter) header(name string, mode uint32, nlink uint32, size int64) error {
	if size > 0xffffffff {
		return fmt.Errorf("cpio: %s: %d bytes exceeds the newc limit of 4 GiB", name, size)
	}
	c.ino++
	// Fields: ino mode uid gid nlink mtime filesize devmajor devminor
	// rdevmajor rdevminor namesize check. mtime 0 keeps archives reproducible.
	hdr := fmt.Sprintf("%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		newcMagic, c.ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, 0, 0, len(name)+1, 0)
	if err := c.write([]byte(hdr)); err != nil {
		return err
	}
	if err := c.write(append([]byte(name), 0)); err != nil {
		return err
	}
	return c.pad()
}

func (c *CPIOWriter) data(r io.Reader, size int64) error {
	n, err := io.Copy(c.w, io.LimitReader(r, size))
	c.n += n
	if err != nil {
		return fmt.Errorf("cpio: copying data: %w", err)
	}
	if n != size {
		return fmt.Errorf("cpio: data shorter than its header says: %d of %d bytes", n, size)
	}
	return c.pad()
}

func (c *CPIOWriter) write(b []byte) error {
	n, err := c.w.Write(b)
	c.n += int64(n)
	if err != nil {
		return fmt.Errorf("cpio: write: %w", err)
	}
	return nil
}

// pad aligns the stream to 4 bytes, as newc requires after names and data.
func (c *CPIOWriter) pad() error {
	if rem := c.n % 4; rem != 0 {
		return c.write(make([]byte, 4-rem))
	}
	return nil
}
