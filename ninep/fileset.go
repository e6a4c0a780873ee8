package ninep

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// A FileSet export serves a fixed set of host files, scattered over host
// directories, as one flat read-only directory: the host NVIDIA driver's
// libraries and programs in a job's guest (issue 32), without copying
// them into guest RAM and without exposing the directories they lie in.
//
// The guest reaches exactly the set: the root is synthetic (no host
// directory behind it), a walk from it finds only the set's names, and a
// file of the set is the confined node of the directory export: its
// O_PATH|O_NOFOLLOW descriptor, opened by hpcvmm before the job, and its
// host directory's, through which Open reopens it by name (openat2
// beneath it, no link followed) and serves it only if it is still the
// inode hpcvmm opened (ESTALE otherwise: the driver was replaced meanwhile).
// Nothing is walked below a file; every change is EROFS.
//
// Links are symbolic links within the directory (libcuda.so.1 ->
// libcuda.so.580.159.04), their text a name of the set, made up here and
// never followed on the host (the guest kernel resolves them within the
// mount). Symbolic links rather than the same file under two names: a
// guest's ldconfig then sees the layout it makes itself (the soname a link
// to the versioned file) and has nothing to change, and the guest's page
// cache holds one copy of a library whichever name a program opens.

// SetLink is a symbolic link of a FileSet: Name, holding Target, a name
// of the set (a file's or another link's).
type SetLink struct{ Name, Target string }

// FileSet is a fixed set of host files and links (OpenFileSet), to serve
// as one flat read-only directory (Export.Files).
type FileSet struct {
	dirs  []*os.File // each file's host directory, O_PATH|O_DIRECTORY
	files []setFile  // by name
	links []SetLink  // by name
}

// setFile is one file of a set: its name (its host name too), the index
// of its directory in dirs, and its O_PATH|O_NOFOLLOW descriptor.
type setFile struct {
	name string
	dir  int
	f    *os.File
}

// MaxSetEntries bounds a FileSet: the driver has about 60 libraries and
// programs, and each file costs the file server a descriptor.
const MaxSetEntries = 512

// OpenFileSet opens the regular files at paths (absolute) and checks the
// links: names are the files' base names, unique across files and links,
// each a single component; a link's target must be a name of the set.
// Nothing stays open on error. The caller closes the set after the file
// server has started (Spawn gives the child its own descriptors).
func OpenFileSet(paths []string, links []SetLink) (*FileSet, error) {
	if len(paths)+len(links) > MaxSetEntries {
		return nil, fmt.Errorf("ninep: %d files and links, at most %d", len(paths)+len(links), MaxSetEntries)
	}
	s := &FileSet{}
	names := map[string]bool{}
	dirIndex := map[string]int{}
	for _, p := range paths {
		name := filepath.Base(p)
		if !filepath.IsAbs(p) || filepath.Clean(p) != p || !validName(name) {
			s.Close()
			return nil, fmt.Errorf("ninep: file set: %q is not an absolute, clean path of a file", p)
		}
		if names[name] {
			s.Close()
			return nil, fmt.Errorf("ninep: file set: two files named %s: a flat directory holds one", name)
		}
		names[name] = true
		dir := filepath.Dir(p)
		i, ok := dirIndex[dir]
		if !ok {
			fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				s.Close()
				return nil, fmt.Errorf("ninep: file set: directory %s: %w", dir, err)
			}
			i = len(s.dirs)
			dirIndex[dir] = i
			s.dirs = append(s.dirs, os.NewFile(uintptr(fd), dir))
		}
		fd, err := openBeneath(int(s.dirs[i].Fd()), name, unix.O_PATH, 0)
		if err == nil {
			if st, serr := statFD(fd); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
				unix.Close(fd)
				err = errors.Join(serr, errors.New("not a regular file (a symbolic link is not followed)"))
			}
		}
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("ninep: file set: %s: %w", p, err)
		}
		s.files = append(s.files, setFile{name: name, dir: i, f: os.NewFile(uintptr(fd), p)})
	}
	for _, l := range links {
		if !validName(l.Name) || names[l.Name] {
			s.Close()
			return nil, fmt.Errorf("ninep: file set: link %q: not one path component, or a name the set already has", l.Name)
		}
		names[l.Name] = true
	}
	for _, l := range links {
		if !names[l.Target] || l.Target == l.Name {
			s.Close()
			return nil, fmt.Errorf("ninep: file set: link %s -> %q: the target must be another name of the set", l.Name, l.Target)
		}
	}
	s.links = slices.Clone(links)
	sort.Slice(s.files, func(i, j int) bool { return s.files[i].name < s.files[j].name })
	sort.Slice(s.links, func(i, j int) bool { return s.links[i].Name < s.links[j].Name })
	return s, nil
}

// Names are the set's names, files and links, sorted.
func (s *FileSet) Names() []string {
	var out []string
	for _, f := range s.files {
		out = append(out, f.name)
	}
	for _, l := range s.links {
		out = append(out, l.Name)
	}
	slices.Sort(out)
	return out
}

// Close closes the set's descriptors.
func (s *FileSet) Close() error {
	for _, d := range s.dirs {
		d.Close()
	}
	for _, f := range s.files {
		f.f.Close()
	}
	s.dirs, s.files = nil, nil
	return nil
}

// setFS is a FileSet on the server's side: the nodes of its directories
// and files (the child's own descriptors).
type setFS struct {
	dirs  []*node
	files []setNode
	links []SetLink
}

type setNode struct {
	name      string
	dir, file *node
}

// newSetFS takes over the descriptors of dirs and files (files[i]'s
// directory is dirs[dirOf[i]]), duplicated so the caller keeps its own.
func newSetFS(dirs []*os.File, files []*os.File, names []string, dirOf []int, links []SetLink) (*setFS, error) {
	fs := &setFS{links: links}
	dup := func(f *os.File) (*node, error) {
		fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("ninep: file set %s: %w", f.Name(), err)
		}
		return newNode(fd), nil
	}
	for _, d := range dirs {
		n, err := dup(d)
		if err != nil {
			fs.close()
			return nil, err
		}
		fs.dirs = append(fs.dirs, n)
	}
	for i, f := range files {
		n, err := dup(f)
		if err != nil {
			fs.close()
			return nil, err
		}
		fs.files = append(fs.files, setNode{name: names[i], dir: fs.dirs[dirOf[i]], file: n})
	}
	return fs, nil
}

func (fs *setFS) close() {
	for _, n := range fs.dirs {
		n.decRef()
	}
	for _, f := range fs.files {
		f.file.decRef()
	}
}

// Synthetic QIDs of the set's root and links: the top bit set, which
// qidOf's inode numbers (folded with a device below bit 63) do not reach
// on any file system Linux has.
const setQIDBase = 1 << 63

// setEntry is the root of a FileSet export or one of its links: nothing
// on the host behind it. Every changing request is EROFS; what a root or
// a link cannot do is the errno a directory or link would give.
type setEntry struct {
	p9.DefaultWalkGetAttr
	a      *attacher
	link   int // -1: the root; else the index in a.set.links
	closed bool
}

func (e *setEntry) qid() p9.QID {
	if e.link < 0 {
		return p9.QID{Type: p9.TypeDir, Path: setQIDBase}
	}
	return p9.QID{Type: p9.TypeSymlink, Path: setQIDBase + 1 + uint64(e.link)}
}

func (a *attacher) newSetEntry(link int) (*setEntry, error) {
	if !a.fids.take() {
		return nil, a.refuse("more files than the fid bound", linux.EMFILE)
	}
	return &setEntry{a: a, link: link}, nil
}

// Walk implements p9.File: from the root, one name of the set; nothing
// below a file or link.
func (e *setEntry) Walk(names []string) ([]p9.QID, p9.File, error) {
	if len(names) == 0 {
		ne, err := e.a.newSetEntry(e.link)
		return nil, ne, err
	}
	if e.link >= 0 || len(names) > 1 {
		return nil, nil, linux.ENOTDIR
	}
	name := names[0]
	if !validName(name) {
		return nil, nil, e.a.refuse("walk to a name that is not one component", linux.EINVAL)
	}
	set := e.a.set
	if i, ok := slices.BinarySearchFunc(set.files, name, func(f setNode, n string) int { return cmpString(f.name, n) }); ok {
		f := set.files[i]
		nf, err := e.a.newFile(f.file.incRef(), f.dir.incRef(), f.name)
		if err != nil {
			return nil, nil, err
		}
		st, err := statFD(f.file.fd)
		if err != nil {
			nf.Close()
			return nil, nil, errno(err)
		}
		return []p9.QID{qidOf(&st, e.a.rootDev)}, nf, nil
	}
	if i, ok := slices.BinarySearchFunc(set.links, name, func(l SetLink, n string) int { return cmpString(l.Name, n) }); ok {
		ne, err := e.a.newSetEntry(i)
		if err != nil {
			return nil, nil, err
		}
		return []p9.QID{ne.qid()}, ne, nil
	}
	return nil, nil, linux.ENOENT
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// WalkGetAttr implements p9.File.
func (e *setEntry) WalkGetAttr(names []string) ([]p9.QID, p9.File, p9.AttrMask, p9.Attr, error) {
	return walkGetAttr(e, names)
}

// GetAttr implements p9.File: a directory of mode 0555 or a link of 0777,
// root's, with the set's link count and size.
func (e *setEntry) GetAttr(p9.AttrMask) (p9.QID, p9.AttrMask, p9.Attr, error) {
	attr := p9.Attr{Mode: p9.ModeDirectory | 0o555, NLink: 2, BlockSize: 4096}
	if e.link >= 0 {
		attr = p9.Attr{Mode: p9.ModeSymlink | 0o777, NLink: 1, Size: uint64(len(e.a.set.links[e.link].Target)), BlockSize: 4096}
	}
	mask := p9.AttrMask{Mode: true, NLink: true, UID: true, GID: true, Size: true, INo: true}
	return e.qid(), mask, attr, nil
}

// Open implements p9.File: the root for reading its entries; a link is
// never opened (the guest resolves it).
func (e *setEntry) Open(mode p9.OpenFlags) (p9.QID, uint32, error) {
	if mode&p9.OpenFlagsModeMask != p9.ReadOnly || mode&dotlTrunc != 0 {
		return p9.QID{}, 0, e.a.readOnly("open for writing")
	}
	if e.link >= 0 {
		return p9.QID{}, 0, e.a.refuse("open of a symbolic link", linux.EACCES)
	}
	return e.qid(), 0, nil
}

// Readdir implements p9.File: the set's entries in name order, the
// offset of each its position + 1, as many as fit count bytes.
func (e *setEntry) Readdir(offset uint64, count uint32) (p9.Dirents, error) {
	if e.link >= 0 {
		return nil, linux.ENOTDIR
	}
	set := e.a.set
	type ent struct {
		name string
		qid  p9.QID
	}
	var all []ent
	for _, f := range set.files {
		st, err := statFD(f.file.fd)
		if err != nil {
			return nil, errno(err)
		}
		all = append(all, ent{f.name, qidOf(&st, e.a.rootDev)})
	}
	for i, l := range set.links {
		all = append(all, ent{l.Name, p9.QID{Type: p9.TypeSymlink, Path: setQIDBase + 1 + uint64(i)}})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	var out p9.Dirents
	used := 0
	for i := offset; i < uint64(len(all)); i++ {
		en := all[i]
		if used+direntHeader+len(en.name) > int(count) {
			break
		}
		used += direntHeader + len(en.name)
		out = append(out, p9.Dirent{QID: en.qid, Offset: i + 1, Type: en.qid.Type, Name: en.name})
	}
	return out, nil
}

// Readlink implements p9.File.
func (e *setEntry) Readlink() (string, error) {
	if e.link < 0 {
		return "", linux.EINVAL
	}
	return e.a.set.links[e.link].Target, nil
}

// Close implements p9.File.
func (e *setEntry) Close() error {
	if !e.closed {
		e.closed = true
		e.a.fids.give()
	}
	return nil
}

// StatFS implements p9.File: 9P's own magic; nothing to count.
func (e *setEntry) StatFS() (p9.FSStat, error) {
	return p9.FSStat{Type: 0x01021997, BlockSize: 4096, NameLength: 255}, nil
}

// ReadAt implements p9.File.
func (e *setEntry) ReadAt([]byte, int64) (int, error) { return 0, linux.EISDIR }

// FSync implements p9.File.
func (e *setEntry) FSync() error { return nil }

// Lock implements p9.File.
func (e *setEntry) Lock(int, p9.LockType, p9.LockFlags, uint64, uint64, string) (p9.LockStatus, error) {
	return p9.LockStatusError, linux.EBADF
}

// GetXattr implements p9.File.
func (e *setEntry) GetXattr(string) ([]byte, error) { return nil, linux.EOPNOTSUPP }

// ListXattrs implements p9.File.
func (e *setEntry) ListXattrs() ([]string, error) { return nil, linux.EOPNOTSUPP }

// Renamed implements p9.File (nothing of a set is ever renamed).
func (e *setEntry) Renamed(p9.File, string) {}

// The changing requests: EROFS, reported as a read-only bind's are.

// SetAttr implements p9.File.
func (e *setEntry) SetAttr(p9.SetAttrMask, p9.SetAttr) error { return e.a.readOnly("setattr") }

// WriteAt implements p9.File.
func (e *setEntry) WriteAt([]byte, int64) (int, error) { return 0, e.a.readOnly("write") }

// SetXattr implements p9.File.
func (e *setEntry) SetXattr(string, []byte, p9.XattrFlags) error { return e.a.readOnly("setxattr") }

// RemoveXattr implements p9.File.
func (e *setEntry) RemoveXattr(string) error { return e.a.readOnly("removexattr") }

// Create implements p9.File.
func (e *setEntry) Create(string, p9.OpenFlags, p9.FileMode, p9.UID, p9.GID) (p9.File, p9.QID, uint32, error) {
	return nil, p9.QID{}, 0, e.a.readOnly("create")
}

// Mkdir implements p9.File.
func (e *setEntry) Mkdir(string, p9.FileMode, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, e.a.readOnly("mkdir")
}

// Symlink implements p9.File.
func (e *setEntry) Symlink(string, string, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, e.a.readOnly("symlink")
}

// Link implements p9.File.
func (e *setEntry) Link(p9.File, string) error { return e.a.readOnly("link") }

// Mknod implements p9.File.
func (e *setEntry) Mknod(string, p9.FileMode, uint32, uint32, p9.UID, p9.GID) (p9.QID, error) {
	return p9.QID{}, e.a.readOnly("mknod")
}

// Rename implements p9.File.
func (e *setEntry) Rename(p9.File, string) error { return e.a.readOnly("rename") }

// RenameAt implements p9.File.
func (e *setEntry) RenameAt(string, p9.File, string) error { return e.a.readOnly("rename") }

// UnlinkAt implements p9.File.
func (e *setEntry) UnlinkAt(string, uint32) error { return e.a.readOnly("unlink") }
