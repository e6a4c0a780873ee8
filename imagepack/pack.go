package imagepack

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// packer writes rootfs entries as the tar stream mksquashfs reads.
// mksquashfs keeps the first entry of a name and ignores any later one
// ("already exists in the tar file, ignoring"), where tar's extraction
// (and the initramfs the guest would otherwise unpack) lets the last one
// win; and it creates a missing parent directory itself, taking the
// metadata of a directory entry that comes after the directory's
// contents. So:
//
//   - directories are written last, once each, with the metadata of their
//     last entry (0755 root's for one the image never lists: rootfs's
//     Synthetic parents), parents first, in the order the walk first
//     yielded them;
//   - a plain tar IMAGE may list a file twice (tar --append): the first
//     pass stops at the duplicate (seen), and convert counts the
//     occurrences and walks again with skip, so the last one is written
//     (mutate.Extract yields each name of a container image once, a
//     directory walk each file once); a hard link to an entry that a
//     later one replaces is refused (the link would name the earlier
//     file, which is not written; mksquashfs 4.5.1 crashes on a link to
//     a name it has not seen);
//   - a socket (in a directory IMAGE) has no tar form and means nothing
//     in the guest: left out and counted.
type packer struct {
	tw    *tar.Writer
	image string
	buf   []byte // content copy buffer, reused: no allocation per file

	dirs     map[string]*tar.Header
	dirOrder []string

	// seen holds the names of the non-directories written, when the
	// image may hold duplicates (a plain tar): a second one stops the pass
	// with errDuplicate.
	seen map[string]bool
	// skip, on the second pass, counts the occurrences of a name still to
	// come (only names that occur more than once); one is written when it
	// is the last.
	skip map[string]int

	sockets int
}

// errDuplicate stops a pass that met a name twice; Convert then counts
// the occurrences and converts again.
var errDuplicate = errors.New("imagepack: a name occurs twice")

func newPacker(w io.Writer, image string, dedupe bool, skip map[string]int) *packer {
	p := &packer{tw: tar.NewWriter(w), image: image, buf: make([]byte, 1<<20),
		dirs: map[string]*tar.Header{}, skip: skip}
	if dedupe && skip == nil {
		p.seen = map[string]bool{}
	}
	return p
}

// tarMode is e's permission and set-id/sticky bits as a tar header holds
// them.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// entry is the walk's callback (rootfs.Image.WalkKeyed).
func (p *packer) entry(e *rootfs.Entry, content io.Reader) error {
	if e.IsDir() {
		p.dir(e)
		return nil
	}
	if p.skip != nil {
		if n := p.skip[e.Name]; n > 0 {
			p.skip[e.Name] = n - 1
			if n > 1 {
				return nil // a later entry of this name wins
			}
		}
		// The link's target must be written already: not an occurrence
		// left out for a later one, nor the link's own name (whose
		// earlier entries were left out for this one).
		if e.Hardlink && (p.skip[e.Link] > 0 || e.Link == e.Name) {
			return fmt.Errorf("imagepack: image %s: hard link %q points to %q before a later entry of that name replaces it: rebuild the archive without duplicate entries", p.image, e.Name, e.Link)
		}
	}
	if p.seen != nil {
		if p.seen[e.Name] {
			return errDuplicate
		}
		p.seen[e.Name] = true
	}
	hdr := tar.Header{Name: e.Name, Mode: tarMode(e.Mode), Uid: e.UID, Gid: e.GID}
	switch {
	case e.Hardlink:
		hdr.Typeflag, hdr.Linkname = tar.TypeLink, e.Link
	case e.Mode.IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, e.Size
	case e.Mode&fs.ModeSymlink != 0:
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, e.Link
	case e.Mode&fs.ModeDevice != 0 && e.Mode&fs.ModeCharDevice != 0:
		hdr.Typeflag, hdr.Devmajor, hdr.Devminor = tar.TypeChar, int64(e.DevMajor), int64(e.DevMinor)
	case e.Mode&fs.ModeDevice != 0:
		hdr.Typeflag, hdr.Devmajor, hdr.Devminor = tar.TypeBlock, int64(e.DevMajor), int64(e.DevMinor)
	case e.Mode&fs.ModeNamedPipe != 0:
		hdr.Typeflag = tar.TypeFifo
	default: // a socket
		p.sockets++
		return nil
	}
	if err := p.tw.WriteHeader(&hdr); err != nil {
		return p.writeFailed(e.Name, err)
	}
	if hdr.Typeflag != tar.TypeReg || hdr.Size == 0 {
		return nil
	}
	// io.LimitedReader has no WriteTo and tar.Writer no ReadFrom: the copy
	// goes through p.buf.
	n, err := io.CopyBuffer(p.tw, io.LimitReader(content, hdr.Size), p.buf)
	if err != nil {
		if errors.As(err, new(writeError)) || errors.As(err, new(*boundError)) {
			return err
		}
		return fmt.Errorf("imagepack: image %s: read %s: %w", p.image, e.Name, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("imagepack: image %s: %s ended after %d of its %d bytes: the image changed while hpcvmm read it, or is corrupt", p.image, e.Name, n, hdr.Size)
	}
	return nil
}

// dir remembers a directory's metadata, the last entry's winning; a
// synthetic parent only until the image lists the directory.
func (p *packer) dir(e *rootfs.Entry) {
	h, ok := p.dirs[e.Name]
	if !ok {
		h = &tar.Header{Typeflag: tar.TypeDir, Name: e.Name + "/", Mode: 0o755}
		p.dirs[e.Name] = h
		p.dirOrder = append(p.dirOrder, e.Name)
	}
	if !e.Synthetic {
		h.Mode, h.Uid, h.Gid = tarMode(e.Mode), e.UID, e.GID
	}
}

// writeFailed is the error of a header the tar writer did not write: the
// sink's own (mksquashfs gone, the bound) as it is, else the header's.
func (p *packer) writeFailed(name string, err error) error {
	if errors.As(err, new(writeError)) || errors.As(err, new(*boundError)) {
		return err
	}
	return fmt.Errorf("imagepack: image %s: entry %q: %w: rebuild the image without it", p.image, name, err)
}

// close writes the directories and the tar's end.
func (p *packer) close() error {
	for _, name := range p.dirOrder {
		if err := p.tw.WriteHeader(p.dirs[name]); err != nil {
			return p.writeFailed(name, err)
		}
	}
	if err := p.tw.Close(); err != nil {
		return p.writeFailed("", err)
	}
	return nil
}

// writeError marks a failed write to mksquashfs's pipe: its cause is
// mksquashfs's (it exited, or was stopped), which Convert reports instead.
type writeError struct{ err error }

func (w writeError) Error() string { return "imagepack: write to mksquashfs: " + w.err.Error() }
func (w writeError) Unwrap() error { return w.err }

// boundError is the refusal of a tar stream past its bound.
type boundError struct {
	image string
	bound int64
	why   string
}

func (b *boundError) Error() string {
	return fmt.Sprintf("imagepack: image %s is larger than %d MiB unpacked, %s: use a smaller image, or a cache with a larger bound", b.image, mib(b.bound), b.why)
}

// sink is the tar stream's end: it counts the bytes written to mksquashfs,
// refuses any past limit (boundError) and marks the pipe's errors as
// writeErrors.
type sink struct {
	w     io.Writer
	n     int64
	limit int64
	over  *boundError
}

func (s *sink) Write(b []byte) (int, error) {
	if s.n+int64(len(b)) > s.limit {
		return 0, s.over
	}
	n, err := s.w.Write(b)
	s.n += int64(n)
	if err != nil {
		return n, writeError{err}
	}
	return n, nil
}

func mib(n int64) int64 { return (n + 1<<20 - 1) >> 20 }

// countDuplicates walks im and returns, for every non-directory name that
// occurs more than once, how often it occurs: the second pass's skip.
func countDuplicates(im *rootfs.Image) (map[string]int, error) {
	counts := map[string]int{}
	err := im.WalkKeyed(func(e *rootfs.Entry, _ io.Reader) error {
		if !e.IsDir() {
			counts[e.Name]++
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for n, c := range counts {
		if c < 2 {
			delete(counts, n)
		}
	}
	return counts, nil
}
