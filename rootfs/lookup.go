package rootfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
)

// ErrNotFound and ErrNotExecutable are what LookPath's errors wrap when
// COMMAND is missing from IMAGE or is there but cannot be executed (the
// distinction hpcvmm's exit statuses 127 and 126 make).
var (
	ErrNotFound      = errors.New("not found")
	ErrNotExecutable = errors.New("not executable")
)

// DefaultPath is the PATH a job's COMMAND is looked up in when the job's
// environment sets none: the one Docker and the Linux distributions use.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// maxLinks bounds the symlinks one lookup follows, as Linux's MAXSYMLINKS.
const maxLinks = 40

// PageSize and EntryOverhead are how Usage counts the guest memory an
// unpacked tree takes in the initramfs's tmpfs: each file's content in
// whole pages, plus about a kilobyte per entry for its inode and dentry.
const (
	PageSize      = 4096
	EntryOverhead = 1024
)

// Usage is the size of IMAGE's tree unpacked.
type Usage struct {
	// Entries counts the entries (files, directories, links, nodes).
	Entries int64
	// Bytes is the regular files' content (hard links count again: the
	// initramfs holds each as a copy).
	Bytes int64
	// Memory is what the tree takes unpacked in a tmpfs: every file's
	// content rounded up to PageSize, plus EntryOverhead per entry.
	Memory int64
	// Archive is what the tree takes in a newc archive (package
	// initramfs): per entry a 110-byte header, its name (a deep tree's
	// synthesized parents included: issue 30 item 4 found names, not
	// content, filling a cache) and its content or link target, each
	// padded to 4 bytes.
	Archive int64
}

// NewcSize is the bytes a newc archive record of a name and size bytes
// of content takes.
func NewcSize(name string, size int64) int64 {
	return (110+int64(len(name))+1+3)&^3 + (size+3)&^3
}

func (u *Usage) add(e *Entry, size int64) {
	u.Entries++
	u.Bytes += size
	u.Memory += EntryOverhead + (size+PageSize-1)/PageSize*PageSize
	if e.Mode&fs.ModeSymlink != 0 {
		size = int64(len(e.Link))
	}
	u.Archive += NewcSize(e.Name, size)
}

// Usage returns the size of IMAGE's tree unpacked. A directory is walked
// with Lstat (nothing read); archives and container images are read
// through once, together with the index lookups use.
func (im *Image) Usage() (Usage, error) {
	if im.format != FormatDir {
		if err := im.buildIndex(); err != nil {
			return Usage{}, err
		}
		return im.usage, nil
	}
	var u Usage
	err := im.Walk(func(e *Entry, _ io.Reader) error {
		u.add(e, e.Size)
		return nil
	})
	return u, err
}

// buildIndex reads an archive or container image once for the metadata of
// every entry (the content is skipped), so lookups can resolve names and
// symlinks inside it.
func (im *Image) buildIndex() error {
	if im.idx != nil || im.idxErr != nil {
		return im.idxErr
	}
	ix := newIndexer()
	err := im.walk(func(e *Entry, content io.Reader) error {
		ix.add(e)
		if content != nil && isExecutable(e) {
			ix.sp.reset(content)
			ix.noteInterp(e)
		}
		return nil
	})
	if err != nil {
		im.idxErr = err
		return err
	}
	im.idx, im.interp, im.usage = ix.idx, ix.interp, ix.usage
	return nil
}

// indexer collects the metadata of a walk, and the ELF interpreter of
// each executable (read through sp: its headers only).
type indexer struct {
	idx    map[string]*Entry
	interp map[string]string
	usage  Usage
	sp     streamPrefix
	er     elfReader
}

func newIndexer() *indexer {
	return &indexer{idx: map[string]*Entry{}, interp: map[string]string{}}
}

// noteInterp records the interpreter of e, whose content sp reads.
func (ix *indexer) noteInterp(e *Entry) {
	if s := ix.er.interp(&ix.sp); s != "" {
		ix.interp[e.Name] = s
	}
}

func (ix *indexer) add(e *Entry) {
	delete(ix.interp, e.Name) // a later entry of the name replaces the file
	c := *e
	size := c.Size
	if c.Hardlink {
		if t := ix.idx[c.Link]; t != nil {
			size = t.Size
		}
	}
	if old := ix.idx[c.Name]; old != nil && old.IsDir() && c.IsDir() {
		// A directory yielded again (synthetic first, then its own
		// metadata): one entry.
		ix.idx[c.Name] = &c
		return
	}
	ix.usage.add(&c, size)
	ix.idx[c.Name] = &c
}

// lstat returns the entry called name (clean, relative) without following
// it if it is a symlink, or fs.ErrNotExist. Hard links come back as their
// target's entry under their own name.
func (im *Image) lstat(name string) (*Entry, error) {
	if name == "" {
		return &Entry{Mode: fs.ModeDir | 0o755}, nil
	}
	if im.format == FormatDir {
		dir, fi, err := lstatBeneath(im.path, name)
		if err != nil {
			return nil, err
		}
		defer dir.Close()
		var e Entry
		if err := dirEntry(dir, path.Base(name), name, fi, im.path, &e); err != nil {
			return nil, err
		}
		return &e, nil
	}
	if err := im.buildIndex(); err != nil {
		return nil, err
	}
	e := im.idx[name]
	if e == nil {
		return nil, fs.ErrNotExist
	}
	if e.Hardlink {
		if t := im.idx[e.Link]; t != nil {
			c := *t
			c.Name = name
			return &c, nil
		}
	}
	return e, nil
}

// resolve follows name (absolute or relative to the image root) through
// the image's own symlinks, the last component's too, and returns the
// clean relative name it ends at and that entry. Absolute link targets
// and ".." stop at the image root, as they would in the guest's root.
func (im *Image) resolve(name string) (string, *Entry, error) {
	var done []string
	rest := strings.Split(name, "/")
	links := 0
	e, _ := im.lstat("")
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(done) > 0 {
				done = done[:len(done)-1]
			}
			e, _ = im.lstat(strings.Join(done, "/"))
			continue
		}
		cur := path.Join(strings.Join(done, "/"), c)
		ce, err := im.lstat(cur)
		if err != nil {
			return cur, nil, err
		}
		if ce.Mode&fs.ModeSymlink != 0 {
			if links++; links > maxLinks {
				return cur, nil, fmt.Errorf("%s: more than %d symbolic links", name, maxLinks)
			}
			if strings.HasPrefix(ce.Link, "/") {
				done = done[:0]
			}
			rest = append(strings.Split(ce.Link, "/"), rest...)
			e, _ = im.lstat(strings.Join(done, "/"))
			continue
		}
		if len(rest) > 0 && !ce.IsDir() && hasMore(rest) {
			return cur, nil, fmt.Errorf("%s: %s is not a directory: %w", name, cur, fs.ErrNotExist)
		}
		done = append(done, c)
		e = ce
	}
	return strings.Join(done, "/"), e, nil
}

// hasMore reports whether path components remain that name something
// (not only "" or ".").
func hasMore(rest []string) bool {
	for _, c := range rest {
		if c != "" && c != "." {
			return true
		}
	}
	return false
}

// Stat returns the entry name (a path inside the image) resolves to, its
// symlinks followed inside the image, and the resolved name; an error
// wrapping fs.ErrNotExist when there is none.
func (im *Image) Stat(name string) (string, *Entry, error) {
	return im.resolve(name)
}

// LookPath finds cmd in IMAGE as execvp would in the guest: a cmd with a
// slash is taken as it is (relative to the root), otherwise each
// absolute directory of pathList (colon-separated, like $PATH; relative
// ones are skipped: the guest's working directory is not known here) is
// tried. It returns the path found, as the guest will see it. Its error
// wraps ErrNotFound when no candidate exists and ErrNotExecutable when one
// exists but is not a regular file with an execute bit (as execvp, a later
// executable candidate still wins).
func (im *Image) LookPath(cmd, pathList string) (string, error) {
	if cmd == "" {
		return "", fmt.Errorf("rootfs: image %s: empty command: %w", im.path, ErrNotFound)
	}
	var candidates []string
	if strings.Contains(cmd, "/") {
		candidates = []string{path.Join("/", cmd)}
	} else {
		for _, dir := range strings.Split(pathList, ":") {
			if strings.HasPrefix(dir, "/") {
				candidates = append(candidates, path.Join(dir, cmd))
			}
		}
	}
	var notExec string
	for _, c := range candidates {
		_, e, err := im.resolve(c)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("rootfs: image %s: look up %s: %w", im.path, c, err)
		}
		if !e.Mode.IsRegular() || e.Mode.Perm()&0o111 == 0 {
			if notExec == "" {
				notExec = c
			}
			continue
		}
		return c, nil
	}
	if notExec != "" {
		return "", fmt.Errorf("rootfs: image %s: command %s is %w (not a regular file with an execute bit)", im.path, notExec, ErrNotExecutable)
	}
	if strings.Contains(cmd, "/") {
		return "", fmt.Errorf("rootfs: image %s: command %s: %w in the image", im.path, cmd, ErrNotFound)
	}
	return "", fmt.Errorf("rootfs: image %s: command %s: %w in PATH %s of the image", im.path, cmd, ErrNotFound, pathList)
}

// ReadFiles returns the content of the named files (paths inside the
// image; symlinks followed inside it) that exist and are regular files,
// keyed by the names as given; others are absent from the map. A file
// over maxEach bytes is an error. An archive or container image is read
// through once for all of them.
func (im *Image) ReadFiles(names []string, maxEach int64) (map[string][]byte, error) {
	out := map[string][]byte{}
	want := map[string][]string{} // resolved name → names asked
	for _, n := range names {
		r, e, err := im.resolve(n)
		if errors.Is(err, fs.ErrNotExist) || (err == nil && !e.Mode.IsRegular()) {
			continue
		}
		if err != nil {
			return nil, im.wrap(err)
		}
		if e.Size > maxEach {
			return nil, fmt.Errorf("rootfs: image %s: %s is %d bytes, more than the %d expected", im.path, n, e.Size, maxEach)
		}
		if im.format != FormatDir {
			if ie := im.idx[r]; ie != nil && ie.Hardlink {
				r = ie.Link
			}
		}
		want[r] = append(want[r], n)
	}
	if len(want) == 0 {
		return out, nil
	}
	if im.format == FormatDir {
		for r, asked := range want {
			dir, fi, err := lstatBeneath(im.path, r)
			if err != nil {
				return nil, fmt.Errorf("rootfs: image %s: %w", im.path, err)
			}
			f, err := openAt(dir, path.Base(r), fi, 0)
			dir.Close()
			if err != nil {
				return nil, fmt.Errorf("rootfs: image %s: %w", im.path, err)
			}
			b, err := io.ReadAll(&exactReader{r: f, left: min(fi.Size(), maxEach), name: f.Name()})
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("rootfs: image %s: %w", im.path, err)
			}
			for _, n := range asked {
				out[n] = b
			}
		}
		return out, nil
	}
	err := im.Walk(func(e *Entry, content io.Reader) error {
		asked, ok := want[e.Name]
		if !ok || content == nil {
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(content, maxEach))
		if err != nil {
			return fmt.Errorf("rootfs: image %s: %s: %w", im.path, e.Name, err)
		}
		for _, n := range asked {
			out[n] = b
		}
		return nil
	})
	return out, err
}

// wrap names IMAGE in err unless err names it already.
func (im *Image) wrap(err error) error {
	if strings.HasPrefix(err.Error(), "rootfs: ") {
		return err
	}
	return fmt.Errorf("rootfs: image %s: %w", im.path, err)
}
