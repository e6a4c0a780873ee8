package ninep

import (
	"encoding/binary"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// dotlTrunc is 9P2000.L's truncate-on-open flag (P9_DOTL_TRUNC, the value
// of Linux's O_TRUNC), which Tlopen carries beside the access mode.
const dotlTrunc = 0o1000

// kindName names a node kind the server never opens, for its refusal.
func kindName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFCHR, unix.S_IFBLK:
		return "device node"
	case unix.S_IFIFO:
		return "FIFO"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFLNK:
		return "symbolic link"
	}
	return "special file"
}

// Open implements p9.File. A directory is opened through its own O_PATH
// descriptor ("." beneath it); a regular file by name beneath its parent,
// O_NOFOLLOW and O_NONBLOCK (a FIFO swapped in cannot block the server),
// and used only if it is still the very inode that was walked. Anything
// else (device nodes, FIFOs, sockets, symbolic links) is never opened.
func (f *file) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	acc := mode & p9.OpenFlagsModeMask
	if acc == p9.OpenFlagsModeMask {
		return p9.QID{}, 0, linux.EINVAL
	}
	writes := acc != p9.ReadOnly || mode&dotlTrunc != 0
	if writes && f.a.ro {
		return p9.QID{}, 0, f.a.readOnly("open for writing")
	}
	var fd int
	var err error
	switch f.mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if writes {
			return p9.QID{}, 0, linux.EISDIR
		}
		fd, err = openBeneath(f.n.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
	case unix.S_IFREG:
		fd, err = f.reopen(int(acc))
	default:
		return p9.QID{}, 0, f.a.refuse("open of a "+kindName(f.mode), linux.EACCES)
	}
	if err != nil {
		return p9.QID{}, 0, err
	}
	if mode&dotlTrunc != 0 {
		if err := unix.Ftruncate(fd, 0); err != nil {
			unix.Close(fd)
			return p9.QID{}, 0, errno(err)
		}
	}
	st, err := statFD(fd)
	if err != nil {
		unix.Close(fd)
		return p9.QID{}, 0, errno(err)
	}
	f.openFD, f.openFlags = fd, mode
	return qidOf(&st, f.a.rootDev), 0, nil
}

// reopen opens the regular file f names for I/O with access mode acc and
// checks that it is the inode f holds: a rename on the host between the
// walk and the open must not hand the guest another file. What it opens
// is beneath the parent either way (resolveBeneath), so the check is
// about the right file, not about confinement.
func (f *file) reopen(acc int) (int, error) {
	parent, name := f.where()
	if parent == nil {
		return -1, linux.EISDIR // only the root has no parent
	}
	defer parent.decRef()
	fd, err := openBeneath(parent.fd, name, acc|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, errno(err)
	}
	if err := f.sameNode(fd); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// sameNode checks that fd is the inode f holds and a regular file.
func (f *file) sameNode(fd int) error {
	got, err := statFD(fd)
	if err != nil {
		return errno(err)
	}
	want, err := statFD(f.n.fd)
	if err != nil {
		return errno(err)
	}
	if got.Dev != want.Dev || got.Ino != want.Ino {
		return f.a.refuse("open raced by a rename", linux.ESTALE)
	}
	if got.Mode&unix.S_IFMT != unix.S_IFREG {
		return f.a.refuse("open of a "+kindName(got.Mode), linux.EACCES)
	}
	return nil
}

// ReadAt implements p9.File.
func (f *file) ReadAt(p []byte, offset int64) (int, error) {
	if f.openFD < 0 || !f.isRegular() {
		return 0, linux.EBADF
	}
	n, err := unix.Pread(f.openFD, p, offset)
	if err != nil {
		return 0, errno(err)
	}
	return n, nil
}

// WriteAt implements p9.File.
func (f *file) WriteAt(p []byte, offset int64) (int, error) {
	if f.a.ro {
		return 0, f.a.readOnly("write")
	}
	if f.openFD < 0 || !f.isRegular() {
		return 0, linux.EBADF
	}
	n, err := unix.Pwrite(f.openFD, p, offset)
	if err != nil {
		return n, errno(err)
	}
	return n, nil
}

func (f *file) isRegular() bool { return f.mode&unix.S_IFMT == unix.S_IFREG }

// FSync implements p9.File.
func (f *file) FSync() error {
	if f.openFD < 0 {
		return linux.EBADF
	}
	return errno(unix.Fsync(f.openFD))
}

// Lock implements p9.File with flock(2) on the open file, never blocking
// the server: a lock held elsewhere is LockStatusBlocked, and the guest's
// kernel retries. (The v9fs client turns flock and fcntl locks into
// whole-file requests; byte ranges are not kept apart.)
func (f *file) Lock(_ int, typ p9.LockType, _ p9.LockFlags, _, _ uint64, _ string) (p9.LockStatus, error) {
	if f.openFD < 0 {
		return p9.LockStatusError, linux.EBADF
	}
	how := unix.LOCK_NB
	switch typ {
	case p9.ReadLock:
		how |= unix.LOCK_SH
	case p9.WriteLock:
		how |= unix.LOCK_EX
	case p9.Unlock:
		how = unix.LOCK_UN
	default:
		return p9.LockStatusError, linux.EINVAL
	}
	switch err := unix.Flock(f.openFD, how); err {
	case nil:
		return p9.LockStatusOK, nil
	case unix.EWOULDBLOCK:
		return p9.LockStatusBlocked, nil
	default:
		return p9.LockStatusError, errno(err)
	}
}

// direntHeader is a Dirent's size on the wire before its name: QID (13),
// offset (8), type (1), name length (2).
const direntHeader = 24

// Readdir implements p9.File: entries from the directory stream at the
// cookie offset (0: the start; otherwise the Offset of the last entry the
// guest got), as many as fit count bytes. "." and ".." are left out: the
// guest's kernel makes its own.
func (f *file) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if f.openFD < 0 || !f.isDir() {
		return nil, linux.EBADF
	}
	if offset != f.dirOff {
		if _, err := unix.Seek(f.openFD, int64(offset), 0); err != nil {
			return nil, errno(err)
		}
		f.dirOff = offset
	}
	buf := make([]byte, min(max(int(count), 512), 64<<10))
	var out p9.Dirents
	used := 0
	for {
		n, err := unix.Getdents(f.openFD, buf)
		if err != nil {
			return out, errno(err)
		}
		if n == 0 {
			return out, nil
		}
		for b := buf[:n]; len(b) >= 19; {
			reclen := int(binary.NativeEndian.Uint16(b[16:]))
			if reclen < 19 || reclen > len(b) {
				return out, linux.EIO
			}
			ino := binary.NativeEndian.Uint64(b[0:])
			off := binary.NativeEndian.Uint64(b[8:])
			typ := b[18]
			name := cString(b[19:reclen])
			b = b[reclen:]
			if name == "." || name == ".." {
				f.dirOff = off
				continue
			}
			if used+direntHeader+len(name) > int(count) {
				// Does not fit: the next call starts here.
				_, err := unix.Seek(f.openFD, int64(f.dirOff), 0)
				return out, errno(err)
			}
			used += direntHeader + len(name)
			qt := direntType(typ)
			out = append(out, p9.Dirent{QID: p9.QID{Type: qt, Path: ino}, Offset: off, Type: qt, Name: name})
			f.dirOff = off
		}
	}
}

func cString(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// direntType is the QID type of a getdents64 d_type.
func direntType(t byte) p9.QIDType {
	switch t {
	case unix.DT_DIR:
		return p9.TypeDir
	case unix.DT_LNK:
		return p9.TypeSymlink
	}
	return p9.TypeRegular
}
