package rootfs

import (
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// Entry is one file of an image's flattened tree. Walk yields entries in
// an order where every directory comes before what it holds.
type Entry struct {
	// Name is the entry's path relative to the image root: slash-separated,
	// clean, never "." and never leaving the root ("..", a leading "/").
	Name string
	// Mode holds the type (fs.ModeDir, fs.ModeSymlink, fs.ModeDevice with
	// or without fs.ModeCharDevice, fs.ModeNamedPipe, fs.ModeSocket, or none
	// for a regular file), the permission bits and setuid/setgid/sticky.
	Mode fs.FileMode
	// Size is the content's length of a regular file (not a hard link), 0
	// for every other kind.
	Size int64
	// UID and GID own the entry.
	UID, GID int
	// Link is a symbolic link's target, verbatim (it may be absolute or
	// climb with "..": it is resolved in the guest, never on the host), or a
	// hard link's target: the Name of an earlier regular-file entry.
	Link string
	// Hardlink marks a hard link to Link; it carries no content.
	Hardlink bool
	// DevMajor and DevMinor number a device node.
	DevMajor, DevMinor uint32
	// Synthetic marks a directory the image holds no entry for (yet):
	// archives may list a file before its parent, or never list the parent,
	// so Walk yields the parent first, 0755 and root-owned. If the archive
	// lists the directory later, Walk yields it again with its own metadata.
	Synthetic bool
}

// IsDir reports whether e is a directory.
func (e *Entry) IsDir() bool { return e.Mode.IsDir() }

// IsRegular reports whether e is a regular file with content (not a hard
// link).
func (e *Entry) IsRegular() bool { return e.Mode.IsRegular() && !e.Hardlink }

// cleanName turns an archive's entry name into an Entry name, or says why
// the name is refused. "./x", "x/", "a/../x" are accepted as "x"; an
// absolute name, one that climbs out of the root, or one holding a NUL (the
// initramfs's names are NUL-terminated) is refused. The root itself cleans
// to "".
func cleanName(name string) (string, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("entry %q has a NUL byte in its name", name)
	}
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("entry %q is an absolute path, which would escape the image root", name)
	}
	c := path.Clean(name)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("entry %q climbs out of the image root with \"..\"", name)
	}
	if c == "." {
		return "", nil
	}
	return c, nil
}

// kinds of names a normalizer has yielded
const (
	kindDir = iota + 1
	kindSyntheticDir
	kindRegular
	kindOther
)

// normalizer turns a stream of archive entries into Walk's stream: names
// cleaned and checked, parents yielded before children (synthesized where
// the archive lists none), a non-directory never yielded where a directory
// already stands (as an overlay's upper directory hides a lower file), and
// nothing yielded below a non-directory (a symlink there would redirect the
// guest's unpacking elsewhere).
type normalizer struct {
	image string
	seen  map[string]uint8
	fn    func(*Entry, io.Reader) error
	synth Entry
}

func newNormalizer(image string, fn func(*Entry, io.Reader) error) *normalizer {
	return &normalizer{image: image, seen: map[string]uint8{}, fn: fn}
}

// add yields e (its Name already cleaned, not the root) and any parent not
// yet yielded; content is e's content for a regular file.
func (n *normalizer) add(e *Entry, content io.Reader) error {
	if err := n.parents(e.Name); err != nil {
		return err
	}
	prev := n.seen[e.Name]
	switch {
	case e.IsDir():
		if prev != 0 && prev != kindDir && prev != kindSyntheticDir {
			return fmt.Errorf("rootfs: image %s: directory entry %q replaces a file of the same name that an earlier entry wrote: the archive is inconsistent", n.image, e.Name)
		}
		n.seen[e.Name] = kindDir
	case prev == kindDir || prev == kindSyntheticDir:
		return nil // the directory stands; its contents may already be yielded
	case e.Hardlink:
		if n.seen[e.Link] != kindRegular {
			return fmt.Errorf("rootfs: image %s: entry %q is a hard link to %q, which is not a regular file earlier in the image", n.image, e.Name, e.Link)
		}
		n.seen[e.Name] = kindRegular
	case e.Mode.IsRegular():
		n.seen[e.Name] = kindRegular
	default:
		n.seen[e.Name] = kindOther
	}
	return n.fn(e, content)
}

func (n *normalizer) parents(name string) error {
	for i := 0; i < len(name); i++ {
		if name[i] != '/' {
			continue
		}
		dir := name[:i]
		switch n.seen[dir] {
		case kindDir, kindSyntheticDir:
			continue
		case 0:
			n.seen[dir] = kindSyntheticDir
			n.synth = Entry{Name: dir, Mode: fs.ModeDir | 0o755, Synthetic: true}
			if err := n.fn(&n.synth, nil); err != nil {
				return err
			}
		default:
			return fmt.Errorf("rootfs: image %s: entry %q lies below %q, which is not a directory: the archive is inconsistent", n.image, name, dir)
		}
	}
	return nil
}
