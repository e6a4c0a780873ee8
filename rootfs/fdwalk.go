package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A directory IMAGE is walked by file descriptor (issue 30 item 3): each
// directory is held open while its entries are read, every entry is
// stat'ed with fstatat relative to that descriptor without following a
// symlink, a subdirectory is opened with openat(O_DIRECTORY|O_NOFOLLOW)
// and checked to be the directory fstatat saw, and a regular file with
// openat(O_NOFOLLOW) likewise. No path component is ever resolved again,
// so a directory swapped for a symlink mid-walk (renameat2
// RENAME_EXCHANGE by IMAGE's owner, timed with inotify) is either seen as
// the symlink it became (yielded as a link, never followed) or makes the
// walk fail; it never leads the walk out of IMAGE. filepath.WalkDir, used
// before, re-resolved every path from IMAGE's root and followed a swapped
// intermediate directory.

// Limits on a name in IMAGE (issue 30 item 4): a name the guest's kernel
// could not create (PATH_MAX) is refused, and so is one deeper than
// MaxDepth components, since every entry's parents are written before it
// and a deep name's synthesized parents grow with the square of its depth
// (a 10 KiB tar holding one name 4,000 levels deep became a 16 MB
// initramfs).
const (
	// MaxName is PATH_MAX: the longest name (in bytes, without the
	// leading "/") an entry or a symlink target may have.
	MaxName = 4096
	// MaxDepth is the most components an entry's name may have: far
	// deeper than any real root file system (Debian's deepest paths have
	// about 15).
	MaxDepth = 256
)

// checkNameLimits refuses a name (clean, relative) over MaxName bytes or
// MaxDepth components.
func checkNameLimits(name string) error {
	if len(name) > MaxName {
		return fmt.Errorf("entry %q… is %d bytes long, more than PATH_MAX (%d)", name[:64], len(name), MaxName)
	}
	if d := strings.Count(name, "/") + 1; d > MaxDepth {
		return fmt.Errorf("entry %q… is %d directories deep, more than hpcvmm's limit of %d", name[:min(len(name), 64)], d, MaxDepth)
	}
	return nil
}

// statInfo is an fs.FileInfo from fstatat: Sys is a *syscall.Stat_t, as
// os.Lstat's is.
type statInfo struct {
	name string
	st   syscall.Stat_t
}

func (s *statInfo) Name() string       { return s.name }
func (s *statInfo) Size() int64        { return s.st.Size }
func (s *statInfo) ModTime() time.Time { return time.Unix(s.st.Mtim.Unix()) }
func (s *statInfo) IsDir() bool        { return s.Mode().IsDir() }
func (s *statInfo) Sys() any           { return &s.st }

// Mode converts st_mode as package os does.
func (s *statInfo) Mode() fs.FileMode {
	m := fs.FileMode(s.st.Mode & 0o777)
	switch s.st.Mode & syscall.S_IFMT {
	case syscall.S_IFBLK:
		m |= fs.ModeDevice
	case syscall.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case syscall.S_IFDIR:
		m |= fs.ModeDir
	case syscall.S_IFIFO:
		m |= fs.ModeNamedPipe
	case syscall.S_IFLNK:
		m |= fs.ModeSymlink
	case syscall.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if s.st.Mode&syscall.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if s.st.Mode&syscall.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if s.st.Mode&syscall.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

// fstatat stats name in the directory dirfd without following a symlink.
func fstatat(dirfd int, name string) (*statInfo, error) {
	var st unix.Stat_t
	for {
		err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	ts := func(t unix.Timespec) syscall.Timespec { return syscall.Timespec{Sec: t.Sec, Nsec: t.Nsec} }
	return &statInfo{name: name, st: syscall.Stat_t{Dev: st.Dev, Ino: st.Ino, Nlink: st.Nlink, Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Rdev: st.Rdev, Size: st.Size, Blksize: st.Blksize, Blocks: st.Blocks, Atim: ts(st.Atim), Mtim: ts(st.Mtim), Ctim: ts(st.Ctim)}}, nil
}

// sameFile reports whether the open file f is the file fi describes.
func sameFile(f *os.File, fi fs.FileInfo) (bool, fs.FileInfo) {
	now, err := f.Stat()
	if err != nil {
		return false, nil
	}
	a, ok1 := now.Sys().(*syscall.Stat_t)
	b, ok2 := fi.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && a.Dev == b.Dev && a.Ino == b.Ino && now.Mode().Type() == fi.Mode().Type(), now
}

// openAt opens name in the directory dir without following a symlink
// (flags adds O_DIRECTORY or not) and checks it is the file fi describes.
func openAt(dir *os.File, name string, fi fs.FileInfo, flags int) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(int(dir.Fd()), name, flags|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("open %s/%s: %w (changed while the image was read?)", dir.Name(), name, err)
	}
	f := os.NewFile(uintptr(fd), dir.Name()+"/"+name)
	if ok, _ := sameFile(f, fi); !ok {
		f.Close()
		return nil, fmt.Errorf("%s changed while the image was read", f.Name())
	}
	return f, nil
}

// openRoot opens IMAGE's root directory.
func openRoot(root string) (*os.File, error) {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	return os.NewFile(uintptr(fd), root), nil
}

// walkFD calls visit for every entry under the open directory dir (whose
// entries are named prefix+name), in lexical order, a directory before
// what it holds: fi from fstatat relative to dir, and dir itself, from
// which visit opens the entry (openAt) if it wants its content.
func walkFD(dir *os.File, prefix string, visit func(dir *os.File, name, rel string, fi fs.FileInfo) error) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		rel := prefix + name
		if err := checkNameLimits(rel); err != nil {
			return err
		}
		fi, err := fstatat(int(dir.Fd()), name)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed since it was listed, as WalkDir skips it
		}
		if err != nil {
			return fmt.Errorf("stat %s/%s: %w", dir.Name(), name, err)
		}
		if err := visit(dir, name, rel, fi); err != nil {
			return err
		}
		if !fi.IsDir() {
			continue
		}
		sub, err := openAt(dir, name, fi, unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		err = walkFD(sub, rel+"/", visit)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// walkTree walks the directory IMAGE root by descriptor (walkFD).
func walkTree(root string, visit func(dir *os.File, name, rel string, fi fs.FileInfo) error) error {
	f, err := openRoot(root)
	if err != nil {
		return err
	}
	defer f.Close()
	return walkFD(f, "", visit)
}

// lstatBeneath stats rel (clean, relative, not "") inside the directory
// root without following a symlink anywhere: every directory on the way
// is opened relative to its parent with O_NOFOLLOW. It returns the entry's
// parent directory, open (the caller closes it), and the entry's fi.
func lstatBeneath(root, rel string) (*os.File, fs.FileInfo, error) {
	dir, err := openRoot(root)
	if err != nil {
		return nil, nil, err
	}
	parts := strings.Split(rel, "/")
	for _, p := range parts[:len(parts)-1] {
		fi, err := fstatat(int(dir.Fd()), p)
		if err == nil && !fi.IsDir() {
			err = syscall.ENOTDIR
		}
		if err != nil {
			dir.Close()
			return nil, nil, &fs.PathError{Op: "lstat", Path: root + "/" + rel, Err: err}
		}
		sub, err := openAt(dir, p, fi, unix.O_DIRECTORY)
		dir.Close()
		if err != nil {
			return nil, nil, err
		}
		dir = sub
	}
	fi, err := fstatat(int(dir.Fd()), parts[len(parts)-1])
	if err != nil {
		dir.Close()
		return nil, nil, &fs.PathError{Op: "lstat", Path: root + "/" + rel, Err: err}
	}
	return dir, fi, nil
}

// readlinkAt reads the symlink name in dir.
func readlinkAt(dir *os.File, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(int(dir.Fd()), name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink %s/%s: %w", dir.Name(), name, err)
		}
		if n < len(buf) {
			return string(buf[:n]), nil
		}
		if len(buf) > MaxName {
			return "", fmt.Errorf("symlink %s/%s has a target longer than PATH_MAX (%d)", dir.Name(), name, MaxName)
		}
		buf = make([]byte, 2*len(buf))
	}
}
