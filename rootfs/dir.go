package rootfs

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// walkDir yields the tree under root (a host directory) by file
// descriptor (fdwalk.go): every entry stat'ed relative to its open parent,
// never followed, in lexical order (parents first). A regular file is
// opened relative to its parent with O_NOFOLLOW and checked to be the file
// fstatat saw, so a file swapped for a symlink mid-walk is refused rather
// than followed, and a directory swapped for one is never entered. Hard
// links are yielded as separate regular files (their content twice).
func walkDir(root, image string, fn func(*Entry, io.Reader) error) error {
	return walkDirHashing(root, image, fn, nil)
}

// walkDirHashing is walkDir that, with key non-nil, also writes each
// entry into key as Image.Key hashes a directory: its metadata, and a
// regular file's content SHA-256 from the bytes fn was given (the rest,
// if fn stops early, read here).
func walkDirHashing(root, image string, fn func(*Entry, io.Reader) error, key io.Writer) error {
	var e Entry
	err := walkTree(root, func(dir *os.File, name, rel string, fi fs.FileInfo) error {
		if err := dirEntry(dir, name, rel, fi, image, &e); err != nil {
			return err
		}
		if key != nil {
			dirKeyEntry(key, &e)
		}
		if !e.IsRegular() {
			return fn(&e, nil)
		}
		r := &lazyFile{dir: dir, name: name, fi: fi, image: image}
		defer r.close()
		if key != nil {
			r.sum = sha256.New()
		}
		if err := fn(&e, r); err != nil {
			return err
		}
		if key != nil {
			if _, err := io.Copy(io.Discard, r); err != nil {
				return err
			}
			var sum [sha256.Size]byte
			r.sum.Sum(sum[:0])
			dirKeySum(key, sum)
		}
		return nil
	})
	if err != nil && !strings.HasPrefix(err.Error(), "rootfs: ") {
		return fmt.Errorf("rootfs: image %s: %w", image, err)
	}
	return err
}

// lazyFile opens a directory IMAGE's regular file (name in the open
// directory dir) on its first Read, so a walk that only wants metadata
// (Usage) opens nothing.
type lazyFile struct {
	dir   *os.File
	name  string
	fi    fs.FileInfo
	image string
	f     *os.File
	r     *exactReader
	sum   hash.Hash // when set, what is read is hashed
}

func (l *lazyFile) Read(p []byte) (int, error) {
	if l.r == nil {
		f, err := openAt(l.dir, l.name, l.fi, 0)
		if err != nil {
			return 0, fmt.Errorf("rootfs: image %s: %w", l.image, err)
		}
		l.f, l.r = f, &exactReader{r: f, left: l.fi.Size(), name: f.Name()}
	}
	n, err := l.r.Read(p)
	if l.sum != nil {
		l.sum.Write(p[:n])
	}
	return n, err
}

func (l *lazyFile) close() {
	if l.f != nil {
		_ = l.f.Close()
	}
}

// dirEntry fills e from the stat information fi of the entry name of the
// open directory dir, rel its name in IMAGE.
func dirEntry(dir *os.File, name, rel string, fi fs.FileInfo, image string, e *Entry) error {
	*e = Entry{Name: rel, Mode: fi.Mode()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.UID, e.GID = int(st.Uid), int(st.Gid)
		if fi.Mode()&fs.ModeDevice != 0 {
			e.DevMajor, e.DevMinor = unix.Major(st.Rdev), unix.Minor(st.Rdev)
		}
	}
	switch {
	case fi.Mode().IsRegular():
		e.Size = fi.Size()
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := readlinkAt(dir, name)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			// No longer a symlink (or gone) since it was stat'ed: the
			// image changed under the walk.
			return fmt.Errorf("rootfs: image %s changed while hpcvmm read it (%s): launch again once it is written", image, rel)
		}
		if err != nil {
			return fmt.Errorf("rootfs: image %s: %w", image, err)
		}
		e.Link = target
	}
	return nil
}

// exactReader yields exactly left bytes of r: a file that shrank since it
// was stat'ed is an error, bytes it grew by are not read.
type exactReader struct {
	r    io.Reader
	left int64
	name string
}

var errShrank = errors.New("file shrank while the image was read")

func (x *exactReader) Read(p []byte) (int, error) {
	if x.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > x.left {
		p = p[:x.left]
	}
	n, err := x.r.Read(p)
	x.left -= int64(n)
	if errors.Is(err, io.EOF) && x.left > 0 {
		return n, fmt.Errorf("%s: %w", x.name, errShrank)
	}
	if x.left == 0 && err == nil {
		err = io.EOF
	}
	if errors.Is(err, io.EOF) && x.left == 0 && n > 0 {
		return n, nil
	}
	return n, err
}
