package ninep

import (
	"sync"
	"sync/atomic"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"golang.org/x/sys/unix"
)

// resolveBeneath is how every name the guest sends is resolved on the
// host: one component at a time below a directory descriptor of ours, no
// symbolic link followed (the guest's or anyone's), no magic link, never
// above the descriptor. Mounts below SRC are crossed (RESOLVE_NO_XDEV is
// not set): a bind of a home directory shows its automounts, as a bind
// mount would.
const resolveBeneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// node is one host inode the server holds: an O_PATH descriptor (or, for a
// file the guest created, its open descriptor) shared by the files that
// name it as themselves or as their parent, closed when the last lets go.
// Counting here rather than trusting the p9 library's fid references keeps
// a descriptor number from being closed and reused while a child still
// resolves names below it.
type node struct {
	fd   int
	refs atomic.Int32
}

func newNode(fd int) *node {
	n := &node{fd: fd}
	n.refs.Store(1)
	return n
}

func (n *node) incRef() *node {
	n.refs.Add(1)
	return n
}

func (n *node) decRef() {
	if n.refs.Add(-1) == 0 {
		_ = unix.Close(n.fd)
	}
}

// validName is a single path component the guest may name: the p9 library
// already refuses "", ".", ".." and names with "/"; checked again here so
// that nothing reaches a syscall that could step out of its directory
// whatever the library does. NUL would cut the name short in the kernel.
func validName(name string) bool {
	if name == "" || name == "." || name == ".." || len(name) > 255 {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] == '/' || name[i] == 0 {
			return false
		}
	}
	return true
}

// openBeneath opens name below directory dirfd with openat2 under
// resolveBeneath, O_NOFOLLOW and O_CLOEXEC added to flags.
func openBeneath(dirfd int, name string, flags int, mode uint32) (int, error) {
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Mode:    uint64(mode),
		Resolve: resolveBeneath,
	}
	for {
		fd, err := unix.Openat2(dirfd, name, &how)
		if err == unix.EINTR || err == unix.EAGAIN && flags&unix.O_PATH != 0 {
			// EAGAIN: RESOLVE_* lookups retry when a rename raced
			// them (the kernel's seqlock check); bounded by the race.
			continue
		}
		return fd, err
	}
}

// statFD stats the node of fd itself (an O_PATH descriptor of a symbolic
// link included: AT_EMPTY_PATH, never following).
func statFD(fd int) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(fd, "", &st, unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// qidOf is the QID of a stat result: the inode number as the path, with
// the device folded into the high bits so that two mounts below SRC do not
// hand the guest the same QID for different files.
func qidOf(st *unix.Stat_t, rootDev uint64) p9.QID {
	path := st.Ino
	if st.Dev != rootDev {
		path ^= st.Dev << 48
	}
	return p9.QID{Type: p9.FileMode(st.Mode).QIDType(), Path: path}
}

// errno turns a syscall error into the errno the guest is given.
func errno(err error) error {
	if err == nil {
		return nil
	}
	if e, ok := err.(unix.Errno); ok {
		return linux.Errno(e)
	}
	return linux.EIO
}

// counter bounds the files one connection holds (fids, and the nodes the
// library keeps for walks in progress).
type counter struct {
	mu  sync.Mutex
	n   int
	max int
}

func (c *counter) take() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n >= c.max {
		return false
	}
	c.n++
	return true
}

func (c *counter) give() {
	c.mu.Lock()
	c.n--
	c.mu.Unlock()
}
