package ninep

import (
	"fmt"
	"os"
	"sync"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// DefaultMaxFids is the default bound on the files one connection holds:
// fids and the intermediate nodes of walks, one host descriptor each.
const DefaultMaxFids = 65536

// Options are the bounds and reports of one export's server.
type Options struct {
	// MaxMessageSize bounds every message (the msize the guest may
	// negotiate, and the size field of every request before it is read);
	// 0 is DefaultMessageSize. At most MaxMessageSizeLimit.
	MaxMessageSize uint32
	// MaxFids bounds the files one connection holds; 0 is DefaultMaxFids.
	MaxFids int
	// Refused, when set, is told of every refused request with a short
	// kind ("open of a device node", "mknod", "write to a read-only
	// bind", ...): escape attempts and what the export never serves. It
	// is called on the request's goroutine; the caller rate-limits
	// (RateLimiter).
	Refused func(what string)
	// Logf, when set, receives the p9 library's own log: protocol errors
	// and handler panics it recovered (a bug here: tests assert none).
	Logf func(format string, args ...any)
}

// attacher serves one export: the root descriptor and the rules, or a
// FileSet's nodes (set; root nil).
type attacher struct {
	root    *node
	set     *setFS
	rootDev uint64
	ro      bool
	o       Options
	fids    counter
}

// NewAttacher returns the confined attacher of the directory root (an
// O_PATH or ordinary descriptor of a directory, which the attacher
// duplicates; the caller keeps and closes its own). ro refuses every
// request that changes anything with EROFS. Every file the attacher hands
// out names a host node by descriptor, found one component at a time
// beneath root (package documentation).
func NewAttacher(root *os.File, ro bool, o Options) (p9.Attacher, error) {
	return newAttacher(root, ro, o)
}

func newAttacher(root *os.File, ro bool, o Options) (*attacher, error) {
	if root == nil {
		return nil, fmt.Errorf("ninep: no export root descriptor")
	}
	fd, err := unix.FcntlInt(root.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ninep: export root %s: %w", root.Name(), err)
	}
	st, err := statFD(fd)
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
		unix.Close(fd)
		if err == nil {
			err = unix.ENOTDIR
		}
		return nil, fmt.Errorf("ninep: export root %s is not a directory we can use: %w", root.Name(), err)
	}
	if o.MaxFids <= 0 {
		o.MaxFids = DefaultMaxFids
	}
	return &attacher{root: newNode(fd), rootDev: st.Dev, ro: ro, o: o, fids: counter{max: o.MaxFids}}, nil
}

// refuse reports a refusal of kind what and returns err for the guest.
func (a *attacher) refuse(what string, err error) error {
	if a.o.Refused != nil {
		a.o.Refused(what)
	}
	return err
}

// readOnly is the refusal of a changing request on a read-only export.
func (a *attacher) readOnly(op string) error {
	return a.refuse(op+" on a read-only bind", linux.EROFS)
}

// Attach implements p9.Attacher: the export's root.
func (a *attacher) Attach() (p9.File, error) {
	if a.set != nil {
		return a.newSetEntry(-1)
	}
	return a.newFile(a.root.incRef(), nil, "")
}

// close lets go of the attacher's own reference to the root or the set's
// nodes (its files keep theirs).
func (a *attacher) close() {
	if a.set != nil {
		a.set.close()
		return
	}
	a.root.decRef()
}

// newSetAttacher serves fs, read-only.
func newSetAttacher(fs *setFS, o Options) *attacher {
	if o.MaxFids <= 0 {
		o.MaxFids = DefaultMaxFids
	}
	return &attacher{set: fs, ro: true, o: o, fids: counter{max: o.MaxFids}}
}

// newFile wraps n (whose reference it takes over) as a file named name in
// parent (nil for the root, whose reference it takes over too), within
// the connection's bound.
func (a *attacher) newFile(n, parent *node, name string) (*file, error) {
	if !a.fids.take() {
		n.decRef()
		if parent != nil {
			parent.decRef()
		}
		return nil, a.refuse("more files than the fid bound", linux.EMFILE)
	}
	st, err := statFD(n.fd)
	if err != nil {
		a.fids.give()
		n.decRef()
		if parent != nil {
			parent.decRef()
		}
		return nil, errno(err)
	}
	return &file{a: a, n: n, parent: parent, name: name, mode: st.Mode, openFD: -1}, nil
}

// file is one node the guest holds. mu guards parent and name, which a
// rename changes; the node itself never changes.
type file struct {
	p9.DefaultWalkGetAttr
	a    *attacher
	n    *node
	mode uint32 // the node's type bits at walk time (they cannot change)

	mu     sync.Mutex
	parent *node // nil for the root
	name   string

	openFD    int // -1 until Open or Create
	openFlags p9.OpenFlags
	dirOff    uint64 // where openFD's directory stream stands
	closed    bool
}

func (f *file) isDir() bool { return f.mode&unix.S_IFMT == unix.S_IFDIR }

// where returns the node's parent (with a reference the caller drops) and
// name, or nil for the root.
func (f *file) where() (*node, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.parent == nil {
		return nil, ""
	}
	return f.parent.incRef(), f.name
}

// Walk implements p9.File: each name a single component beneath this
// directory, opened O_PATH without following anything. The library walks
// one name per call and refuses "..": the guest's kernel resolves ".."
// in its own dentry cache and never sends it, so the server never
// resolves ".." on the host, and at the root it has nowhere to go.
func (f *file) Walk(names []string) ([]p9.QID, p9.File, error) {
	if len(names) == 0 {
		parent, name := f.where()
		nf, err := f.a.newFile(f.n.incRef(), parent, name)
		if err != nil {
			return nil, nil, err
		}
		return nil, nf, nil
	}
	cur := f
	var qids []p9.QID
	for i, name := range names {
		next, qid, err := cur.walkOne(name)
		if i > 0 {
			cur.Close()
		}
		if err != nil {
			return nil, nil, err
		}
		qids = append(qids, qid)
		cur = next
	}
	return qids, cur, nil
}

// walkOne opens name beneath f.
func (f *file) walkOne(name string) (*file, p9.QID, error) {
	if !validName(name) {
		return nil, p9.QID{}, f.a.refuse("walk to a name that is not one component", linux.EINVAL)
	}
	if !f.isDir() {
		return nil, p9.QID{}, linux.ENOTDIR
	}
	fd, err := openBeneath(f.n.fd, name, unix.O_PATH, 0)
	if err != nil {
		if err == unix.EXDEV {
			return nil, p9.QID{}, f.a.refuse("walk out of the bind", linux.EACCES)
		}
		return nil, p9.QID{}, errno(err)
	}
	nf, err := f.a.newFile(newNode(fd), f.n.incRef(), name)
	if err != nil {
		return nil, p9.QID{}, err
	}
	st, err := statFD(fd)
	if err != nil {
		nf.Close()
		return nil, p9.QID{}, errno(err)
	}
	return nf, qidOf(&st, f.a.rootDev), nil
}

// WalkGetAttr implements p9.File: a walk and the attributes of where it
// ends, in one round trip.
func (f *file) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	return walkGetAttr(f, names)
}

// walkGetAttr is WalkGetAttr for any p9.File: Walk, then GetAttr of the
// file it ends at (closed again when that fails).
func walkGetAttr(f p9.File, names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	qids, nf, err := f.Walk(names)
	if err != nil {
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	_, mask, attr, err := nf.GetAttr(p9.AttrMaskAll)
	if err != nil {
		nf.Close()
		return nil, nil, p9.AttrMask{}, p9.Attr{}, err
	}
	return qids, nf, mask, attr, nil
}

// Close implements p9.File.
func (f *file) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	parent := f.parent
	f.parent = nil
	f.mu.Unlock()
	if f.openFD >= 0 {
		unix.Close(f.openFD)
		f.openFD = -1
	}
	f.n.decRef()
	if parent != nil {
		parent.decRef()
	}
	f.a.fids.give()
	return nil
}

// Renamed implements p9.File: the library tells a file its new place
// after a rename it served.
func (f *file) Renamed(newDir p9.File, newName string) {
	d, ok := newDir.(*file)
	if !ok || d.a != f.a {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	old := f.parent
	f.parent, f.name = d.n.incRef(), newName
	if old != nil {
		old.decRef()
	}
}

// Rename implements p9.File; the server always calls RenameAt instead.
func (f *file) Rename(p9.File, string) error { return linux.ENOSYS }

// GetAttr implements p9.File.
func (f *file) GetAttr(req p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	st, err := statFD(f.n.fd)
	if err != nil {
		return p9.QID{}, p9.AttrMask{}, p9.Attr{}, errno(err)
	}
	attr := p9.Attr{
		Mode: p9.FileMode(st.Mode), UID: p9.UID(st.Uid), GID: p9.GID(st.Gid), NLink: p9.NLink(st.Nlink),
		RDev: p9.Dev(st.Rdev), Size: uint64(st.Size), BlockSize: uint64(st.Blksize), Blocks: uint64(st.Blocks),
		ATimeSeconds: uint64(st.Atim.Sec), ATimeNanoSeconds: uint64(st.Atim.Nsec),
		MTimeSeconds: uint64(st.Mtim.Sec), MTimeNanoSeconds: uint64(st.Mtim.Nsec),
		CTimeSeconds: uint64(st.Ctim.Sec), CTimeNanoSeconds: uint64(st.Ctim.Nsec),
	}
	mask := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, RDev: true, ATime: true,
		MTime: true, CTime: true, INo: true, Size: true, Blocks: true}
	return qidOf(&st, f.a.rootDev), mask, attr, nil
}

// StatFS implements p9.File.
func (f *file) StatFS() (p9.FSStat, error) {
	var s unix.Statfs_t
	if err := unix.Fstatfs(f.n.fd, &s); err != nil {
		return p9.FSStat{}, errno(err)
	}
	return p9.FSStat{
		Type: uint32(s.Type), BlockSize: uint32(s.Bsize), Blocks: s.Blocks, BlocksFree: s.Bfree,
		BlocksAvailable: s.Bavail, Files: s.Files, FilesFree: s.Ffree,
		FSID: uint64(uint32(s.Fsid.Val[0])) | uint64(uint32(s.Fsid.Val[1]))<<32, NameLength: uint32(s.Namelen),
	}, nil
}

// Readlink implements p9.File: the link's text, never followed.
func (f *file) Readlink() (string, error) {
	if f.mode&unix.S_IFMT != unix.S_IFLNK {
		return "", linux.EINVAL
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(f.n.fd, "", buf)
	if err != nil {
		return "", errno(err)
	}
	return string(buf[:n]), nil
}

// Extended attributes are not served: reading them needs a path or an
// open descriptor of every node kind (a symbolic link has neither without
// /proc's magic links), and nothing a job needs rests on them.

// SetXattr implements p9.File.
func (f *file) SetXattr(string, []byte, p9.XattrFlags) error {
	if f.a.ro {
		return f.a.readOnly("setxattr")
	}
	return linux.EOPNOTSUPP
}

// GetXattr implements p9.File.
func (f *file) GetXattr(string) ([]byte, error) { return nil, linux.EOPNOTSUPP }

// ListXattrs implements p9.File.
func (f *file) ListXattrs() ([]string, error) { return nil, linux.EOPNOTSUPP }

// RemoveXattr implements p9.File.
func (f *file) RemoveXattr(string) error {
	if f.a.ro {
		return f.a.readOnly("removexattr")
	}
	return linux.EOPNOTSUPP
}
