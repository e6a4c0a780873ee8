package ninep

import (
	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// guestMode is the permission part of a mode the guest asks for: no
// set-user-ID bit ever, set-group-ID only on directories (where it means
// "inherit the group"). The server may run as root when hpcvmm does
// without a job user to drop to; a guest must not be able to leave a
// set-ID program on the host.
func guestMode(m p9.FileMode, dir bool) uint32 {
	mode := uint32(m) & 0o7777 &^ unix.S_ISUID
	if !dir {
		mode &^= unix.S_ISGID
	}
	return mode
}

// dirOp checks that f is a directory the guest may change with op and
// that name is one component.
func (f *file) dirOp(op, name string) error {
	if f.a.ro {
		return f.a.readOnly(op)
	}
	if !f.isDir() {
		return linux.ENOTDIR
	}
	if !validName(name) {
		return f.a.refuse(op+" of a name that is not one component", linux.EINVAL)
	}
	return nil
}

// Create implements p9.File: a new regular file, always O_CREAT|O_EXCL
// (Tlcreate follows a lookup that found nothing), so no existing node, a
// FIFO or device included, is ever opened by it. The owner is the
// server's; the guest's uid and gid are not applied.
func (f *file) Create(name string, flags p9.OpenFlags, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.File, p9.QID, uint32, error) {
	if err := f.dirOp("create", name); err != nil {
		return nil, p9.QID{}, 0, err
	}
	acc := int(flags & p9.OpenFlagsModeMask)
	if acc == int(p9.OpenFlagsModeMask) {
		return nil, p9.QID{}, 0, linux.EINVAL
	}
	fd, err := openBeneath(f.n.fd, name, acc|unix.O_CREAT|unix.O_EXCL, guestMode(perm, false))
	if err != nil {
		return nil, p9.QID{}, 0, errno(err)
	}
	// The node's descriptor: a second one of the same open file, so that
	// Close's two closes stay independent.
	nodeFD, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, p9.QID{}, 0, errno(err)
	}
	nf, err := f.a.newFile(newNode(nodeFD), f.n.incRef(), name)
	if err != nil {
		unix.Close(fd)
		return nil, p9.QID{}, 0, err
	}
	nf.openFD, nf.openFlags = fd, flags
	st, err := statFD(fd)
	if err != nil {
		nf.Close()
		return nil, p9.QID{}, 0, errno(err)
	}
	return nf, qidOf(&st, f.a.rootDev), 0, nil
}

// Mkdir implements p9.File.
func (f *file) Mkdir(name string, perm p9.FileMode, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.dirOp("mkdir", name); err != nil {
		return p9.QID{}, err
	}
	if err := unix.Mkdirat(f.n.fd, name, guestMode(perm, true)); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.qidAt(name)
}

// Symlink implements p9.File: a link with whatever text the guest gives;
// the server never follows one, so its target matters only to the guest.
func (f *file) Symlink(target, name string, _ p9.UID, _ p9.GID) (p9.QID, error) {
	if err := f.dirOp("symlink", name); err != nil {
		return p9.QID{}, err
	}
	if len(target) >= unix.PathMax || containsNUL(target) {
		return p9.QID{}, linux.ENAMETOOLONG
	}
	if err := unix.Symlinkat(target, f.n.fd, name); err != nil {
		return p9.QID{}, errno(err)
	}
	return f.qidAt(name)
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// qidAt is the QID of name in directory f, not following it.
func (f *file) qidAt(name string) (p9.QID, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(f.n.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return p9.QID{}, errno(err)
	}
	return qidOf(&st, f.a.rootDev), nil
}

// Mknod implements p9.File: always refused. Device nodes would reach host
// devices; FIFOs and sockets are host IPC endpoints the server would never
// open anyway.
func (f *file) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	if f.a.ro {
		return p9.QID{}, f.a.readOnly("mknod")
	}
	return p9.QID{}, f.a.refuse("mknod", linux.EPERM)
}

// Link implements p9.File: a hard link named newName in directory f to
// target, a file the guest walked to in this export (so both ends are
// beneath SRC), by its parent and name with no symbolic link followed.
func (f *file) Link(target p9.File, newName string) error {
	if err := f.dirOp("link", newName); err != nil {
		return err
	}
	t, ok := target.(*file)
	if !ok || t.a != f.a {
		return f.a.refuse("link to a file of another export", linux.EXDEV)
	}
	if t.isDir() {
		return linux.EPERM
	}
	parent, name := t.where()
	if parent == nil {
		return linux.EPERM
	}
	defer parent.decRef()
	// The name must still be the node the guest holds: a host-side rename
	// since the walk would link another file (beneath SRC all the same).
	var st unix.Stat_t
	if err := unix.Fstatat(parent.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return errno(err)
	}
	if want, err := statFD(t.n.fd); err != nil || want.Dev != st.Dev || want.Ino != st.Ino {
		return f.a.refuse("link raced by a rename", linux.ESTALE)
	}
	return errno(unix.Linkat(parent.fd, name, f.n.fd, newName, 0))
}

// RenameAt implements p9.File: by directory descriptors of this export on
// both sides.
func (f *file) RenameAt(oldName string, newDir p9.File, newName string) error {
	if err := f.dirOp("rename", oldName); err != nil {
		return err
	}
	d, ok := newDir.(*file)
	if !ok || d.a != f.a {
		return f.a.refuse("rename into another export", linux.EXDEV)
	}
	if err := d.dirOp("rename", newName); err != nil {
		return err
	}
	return errno(unix.Renameat(f.n.fd, oldName, d.n.fd, newName))
}

// UnlinkAt implements p9.File.
func (f *file) UnlinkAt(name string, flags uint32) error {
	if err := f.dirOp("unlink", name); err != nil {
		return err
	}
	return errno(unix.Unlinkat(f.n.fd, name, int(flags)&unix.AT_REMOVEDIR))
}

// SetAttr implements p9.File: mode and size through a verified open of
// the node (a directory through "." beneath it), times and owner through
// its parent and name without following, or its own descriptor. An owner
// or group other than the server's own is refused with EPERM; a mode
// loses its set-user-ID bit (guestMode).
func (f *file) SetAttr(valid p9.SetAttrMask, attr p9.SetAttr) error {
	if f.a.ro {
		return f.a.readOnly("setattr")
	}
	if valid.UID || valid.GID {
		if err := f.chown(valid, attr); err != nil {
			return err
		}
	}
	if valid.Permissions || valid.Size {
		if err := f.chmodTruncate(valid, attr); err != nil {
			return err
		}
	}
	if valid.ATime || valid.MTime {
		return f.utimes(valid, attr)
	}
	return nil
}

func (f *file) chown(valid p9.SetAttrMask, attr p9.SetAttr) error {
	uid, gid := -1, -1
	if valid.UID && attr.UID.Ok() {
		if int(attr.UID) != unix.Geteuid() {
			return f.a.refuse("chown to another user", linux.EPERM)
		}
		uid = int(attr.UID)
	}
	if valid.GID && attr.GID.Ok() {
		gid = int(attr.GID)
	}
	return errno(unix.Fchownat(f.n.fd, "", uid, gid, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW))
}

func (f *file) chmodTruncate(valid p9.SetAttrMask, attr p9.SetAttr) error {
	var fd int
	var err error
	switch {
	case f.isDir() && !valid.Size:
		fd, err = openBeneath(f.n.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		err = errno(err)
	case f.isRegular():
		acc := unix.O_RDONLY
		if valid.Size {
			acc = unix.O_WRONLY
		}
		fd, err = f.reopen(acc)
	case f.isDir():
		return linux.EISDIR
	default:
		// A symbolic link has no mode of its own to change; other
		// kinds are never opened.
		return linux.EOPNOTSUPP
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if valid.Permissions {
		if err := unix.Fchmod(fd, guestMode(attr.Permissions, f.isDir())); err != nil {
			return errno(err)
		}
	}
	if valid.Size {
		return errno(unix.Ftruncate(fd, int64(attr.Size)))
	}
	return nil
}

func (f *file) utimes(valid p9.SetAttrMask, attr p9.SetAttr) error {
	ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
	if valid.ATime {
		ts[0] = unix.Timespec{Nsec: unix.UTIME_NOW}
		if valid.ATimeNotSystemTime {
			ts[0] = unix.Timespec{Sec: int64(attr.ATimeSeconds), Nsec: int64(attr.ATimeNanoSeconds)}
		}
	}
	if valid.MTime {
		ts[1] = unix.Timespec{Nsec: unix.UTIME_NOW}
		if valid.MTimeNotSystemTime {
			ts[1] = unix.Timespec{Sec: int64(attr.MTimeSeconds), Nsec: int64(attr.MTimeNanoSeconds)}
		}
	}
	if f.isDir() {
		return errno(unix.UtimesNanoAt(f.n.fd, ".", ts, 0))
	}
	parent, name := f.where()
	if parent == nil {
		return linux.EPERM
	}
	defer parent.decRef()
	return errno(unix.UtimesNanoAt(parent.fd, name, ts, unix.AT_SYMLINK_NOFOLLOW))
}
