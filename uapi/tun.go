package uapi

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TUN/TAP ioctl numbers (linux/if_tun.h). TUNSETIFF and TUNGETIFF take a
// struct ifreq although the macros declare int and unsigned int: the number
// encodes the declared size, which abi_net_test.go checks.
const (
	tunType = 'T'

	iowTUN uintptr = iocWrite<<iocDirShift | tunType<<iocTypeShift
	iorTUN uintptr = iocRead<<iocDirShift | tunType<<iocTypeShift

	tunSetIFF       = iowTUN | 4<<iocSizeShift | 202
	tunSetPersist   = iowTUN | 4<<iocSizeShift | 203
	tunSetOwner     = iowTUN | 4<<iocSizeShift | 204
	tunSetGroup     = iowTUN | 4<<iocSizeShift | 206
	tunSetOffload   = iowTUN | 4<<iocSizeShift | 208
	tunGetIFF       = iorTUN | 4<<iocSizeShift | 210
	tunSetVnetHdrSz = iowTUN | 4<<iocSizeShift | 216
	tunSetQueue     = iowTUN | 4<<iocSizeShift | 217
)

// TUNSETIFF / TUNSETQUEUE flags (linux/if_tun.h).
const (
	IFFTap         = 0x0002
	IFFNoPI        = 0x1000
	IFFVnetHdr     = 0x4000
	IFFMultiQueue  = 0x0100
	IFFAttachQueue = 0x0200
	IFFDetachQueue = 0x0400
	// IFFPersist is set in TUNGETIFF's flags for a persistent interface
	// (TUNSETPERSIST): it outlives its last queue.
	IFFPersist = 0x0800
)

// TUNSETOFFLOAD flags: the offloads the reader of the TAP (the guest)
// accepts in packets the kernel hands it.
const (
	TunFCsum   = 0x01
	TunFTSO4   = 0x02
	TunFTSO6   = 0x04
	TunFTSOECN = 0x08
	TunFUFO    = 0x10
)

// ifreq mirrors struct ifreq (linux/if.h) as the TUN ioctls use it: the
// interface name and the flags member of the union.
type ifreq struct {
	Name  [unix.IFNAMSIZ]byte
	Flags uint16
	_     [22]byte
}

func newIfreq(name string) (ifreq, error) {
	var r ifreq
	if len(name) == 0 || len(name) >= unix.IFNAMSIZ {
		return r, fmt.Errorf("interface name %q: want 1-%d bytes", name, unix.IFNAMSIZ-1)
	}
	copy(r.Name[:], name)
	return r, nil
}

func (r *ifreq) name() string {
	for i, c := range r.Name {
		if c == 0 {
			return string(r.Name[:i])
		}
	}
	return string(r.Name[:])
}

// TAPQueue is one queue of a TAP interface: an open /dev/net/tun attached
// with TUNSETIFF. Reads and writes carry one packet each, in non-blocking
// mode. The zero value is not usable; Close releases the queue (and, for a
// non-persistent interface, the last Close removes the interface).
type TAPQueue struct {
	fd int
}

// OpenTAPQueue opens /dev/net/tun non-blocking and attaches it to interface
// name with flags (IFFTap|IFFNoPI|IFFVnetHdr, plus IFFMultiQueue for a
// multi-queue interface). When no interface has that name the kernel creates
// a non-persistent one (CAP_NET_ADMIN needed). Errors wrap the errno:
// EPERM (no permission to create or attach), EBUSY (a single-queue TAP
// already attached elsewhere), EINVAL (name taken by a non-TAP interface, or
// multi-queue mode mismatch).
func OpenTAPQueue(name string, flags uint16) (*TAPQueue, error) {
	r, err := newIfreq(name)
	if err != nil {
		return nil, fmt.Errorf("tun: TUNSETIFF: %w", err)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOpenTunDevice, err)
	}
	r.Flags = flags
	if _, err := ioctlPtr(fd, tunSetIFF, unsafe.Pointer(&r)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: TUNSETIFF (name %q, flags %#x): %w", name, flags, err)
	}
	return &TAPQueue{fd: fd}, nil
}

// ErrOpenTunDevice is what OpenTAPQueue's error wraps (errors.Is) when
// /dev/net/tun itself could not be opened, before any TAP was asked for:
// callers tell a device node closed to the user from a TAP it may not
// attach to.
var ErrOpenTunDevice = errors.New("tun: open /dev/net/tun")

// ErrTAPExists is returned by CreatePersistentTAP when the name is a
// persistent TAP already: it was not made now, and nothing was changed.
var ErrTAPExists = errors.New("tun: a persistent TAP of that name exists already")

// CreatePersistentTAP creates TAP interface name (IFFTap|IFFNoPI|IFFVnetHdr
// plus extra, e.g. IFFMultiQueue) that outlives this call (TUNSETPERSIST),
// owned by uid and gid (TUNSETOWNER, TUNSETGROUP), so that a process of
// that user attaches to it with TUNSETIFF without CAP_NET_ADMIN. Creating
// needs CAP_NET_ADMIN. A TUNSETIFF on a name that is a persistent TAP
// already attaches to it instead of creating: the flags TUNGETIFF returns
// then carry IFFPersist, and ErrTAPExists is returned with the interface
// untouched (it is detached again by the close). The interface is left
// down, on no bridge.
func CreatePersistentTAP(name string, extra uint16, uid, gid uint32) error {
	q, err := OpenTAPQueue(name, IFFTap|IFFNoPI|IFFVnetHdr|extra)
	if err != nil {
		return err
	}
	defer q.Close()
	if _, flags, err := q.Interface(); err != nil {
		return err
	} else if flags&IFFPersist != 0 {
		return fmt.Errorf("%w: %s", ErrTAPExists, name)
	}
	for _, c := range []struct {
		req  uintptr
		name string
		arg  uintptr
	}{{tunSetOwner, "TUNSETOWNER", uintptr(uid)}, {tunSetGroup, "TUNSETGROUP", uintptr(gid)}, {tunSetPersist, "TUNSETPERSIST", 1}} {
		if _, err := ioctl(q.fd, c.req, c.arg); err != nil {
			return fmt.Errorf("tun: %s (%s, %d): %w", c.name, name, c.arg, err)
		}
	}
	return nil
}

// NewTAPQueueFD wraps an already-attached TUN/TAP file descriptor (e.g.
// passed in by a management stack); the TAPQueue owns it from now on.
func NewTAPQueueFD(fd int) *TAPQueue { return &TAPQueue{fd: fd} }

// FD returns the queue's file descriptor, for poll, read and write.
func (t *TAPQueue) FD() int { return t.fd }

// Close closes the queue.
func (t *TAPQueue) Close() error {
	if t.fd < 0 {
		return nil
	}
	err := unix.Close(t.fd)
	t.fd = -1
	if err != nil {
		return fmt.Errorf("tun: close: %w", err)
	}
	return nil
}

// Interface returns the attached interface's name and TUN flags
// (TUNGETIFF).
func (t *TAPQueue) Interface() (string, uint16, error) {
	var r ifreq
	if _, err := ioctlPtr(t.fd, tunGetIFF, unsafe.Pointer(&r)); err != nil {
		return "", 0, fmt.Errorf("tun: TUNGETIFF (fd %d): %w", t.fd, err)
	}
	return r.name(), r.Flags, nil
}

// SetOffload tells the kernel which offloads (TunF*) the packets it hands
// this interface's reader may use (TUNSETOFFLOAD; per interface).
func (t *TAPQueue) SetOffload(flags uint32) error {
	if _, err := ioctl(t.fd, tunSetOffload, uintptr(flags)); err != nil {
		return fmt.Errorf("tun: TUNSETOFFLOAD (fd %d, flags %#x): %w", t.fd, flags, err)
	}
	return nil
}

// SetVnetHdrSize sets the size of the virtio-net header that precedes
// every packet (TUNSETVNETHDRSZ): 12 for virtio 1.x.
func (t *TAPQueue) SetVnetHdrSize(size int) error {
	v := int32(size)
	if _, err := ioctlPtr(t.fd, tunSetVnetHdrSz, unsafe.Pointer(&v)); err != nil {
		return fmt.Errorf("tun: TUNSETVNETHDRSZ (fd %d, %d): %w", t.fd, size, err)
	}
	return nil
}

// SetQueueAttached attaches (true) or detaches (false) this queue of a
// multi-queue interface (TUNSETQUEUE): the kernel delivers received
// packets only to attached queues.
func (t *TAPQueue) SetQueueAttached(attached bool) error {
	r := ifreq{Flags: IFFDetachQueue}
	if attached {
		r.Flags = IFFAttachQueue
	}
	if _, err := ioctlPtr(t.fd, tunSetQueue, unsafe.Pointer(&r)); err != nil {
		return fmt.Errorf("tun: TUNSETQUEUE (fd %d, attach %v): %w", t.fd, attached, err)
	}
	return nil
}

// Writev writes one packet gathered from iov (writev(2)), retrying EINTR.
// It does not allocate: the caller owns the iovec array.
func Writev(fd int, iov []unix.Iovec) (int, error) {
	if len(iov) == 0 {
		return 0, nil
	}
	for {
		n, _, errno := unix.Syscall(unix.SYS_WRITEV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		switch errno {
		case 0:
			return int(n), nil
		case unix.EINTR:
			continue
		default:
			return int(n), errno
		}
	}
}

// InterfaceExists reports whether a network interface called name exists
// in the calling thread's network namespace (SIOCGIFINDEX).
func InterfaceExists(name string) (bool, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return false, fmt.Errorf("interface %q: %w", name, err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("interface %q: socket: %w", name, err)
	}
	defer unix.Close(s)
	err = unix.IoctlIfreq(s, unix.SIOCGIFINDEX, ifr)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ENODEV):
		return false, nil
	}
	return false, fmt.Errorf("interface %q: SIOCGIFINDEX: %w", name, err)
}

// InterfaceMTU returns an interface's MTU (SIOCGIFMTU).
func InterfaceMTU(name string) (int, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, fmt.Errorf("interface %q: %w", name, err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("interface %q: socket: %w", name, err)
	}
	defer unix.Close(s)
	if err := unix.IoctlIfreq(s, unix.SIOCGIFMTU, ifr); err != nil {
		return 0, fmt.Errorf("interface %q: SIOCGIFMTU: %w", name, err)
	}
	return int(ifr.Uint32()), nil
}

// SetInterfaceUp sets IFF_UP on an interface (SIOCGIFFLAGS, SIOCSIFFLAGS).
func SetInterfaceUp(name string) error {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return fmt.Errorf("interface %q: %w", name, err)
	}
	s, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("interface %q: socket: %w", name, err)
	}
	defer unix.Close(s)
	if err := unix.IoctlIfreq(s, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("interface %q: SIOCGIFFLAGS: %w", name, err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(s, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("interface %q: SIOCSIFFLAGS up: %w", name, err)
	}
	return nil
}
