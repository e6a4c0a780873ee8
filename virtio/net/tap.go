package net

import (
	"errors"
	"fmt"
	"hash/fnv"
	stdnet "net"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// Backend is the host side of the device: one packet file descriptor per
// queue pair, where every read returns and every write takes one packet
// prefixed by a HeaderSize-byte virtio-net header (a TAP queue with
// IFF_VNET_HDR and TUNSETVNETHDRSZ 12). TAP implements it; tests use
// socket pairs.
type Backend interface {
	// QueueFDs returns the non-blocking packet fds, one per queue pair.
	QueueFDs() []int
	// SetOffload sets the offloads (uapi.TunF*) the guest accepts.
	SetOffload(flags uint32) error
	// EnableQueue attaches (on) or detaches queue pair i, so the host
	// delivers received packets only to pairs the guest uses.
	EnableQueue(i int, on bool) error
}

// TAP is a TAP interface opened with one queue per queue pair. When the
// interface did not exist, OpenTAP creates it (non-persistent) and brings
// it up; the kernel removes it when the last queue closes, so what hpcvmm
// created disappears on exit even when hpcvmm is killed.
type TAP struct {
	name     string
	queues   []*uapi.TAPQueue
	fds      []int
	attached []bool
	created  bool
	multi    bool
}

// OpenTAP attaches to TAP interface name with queues queues, creating it
// when absent. Errors say what to do: no permission to create, TAP busy,
// name taken by another kind of interface, multi-queue mismatch.
func OpenTAP(name string, queues int) (_ *TAP, err error) {
	if err := ValidateTAPName(name); err != nil {
		return nil, err
	}
	if queues < 1 {
		return nil, fmt.Errorf("tap %s: %d queues: need at least 1", name, queues)
	}
	exists, err := uapi.InterfaceExists(name)
	if err != nil {
		return nil, fmt.Errorf("tap %s: %w", name, err)
	}
	t := &TAP{name: name, created: !exists, multi: queues > 1}
	defer func() {
		if err != nil {
			t.Close()
		}
	}()
	flags := uint16(uapi.IFFTap | uapi.IFFNoPI | uapi.IFFVnetHdr)
	if t.multi {
		flags |= uapi.IFFMultiQueue
	}
	q, err := uapi.OpenTAPQueue(name, flags)
	if err != nil && exists && queues == 1 && errors.Is(err, unix.EINVAL) {
		// An existing multi_queue TAP accepts one queue too, but only
		// when asked in its own mode.
		flags |= uapi.IFFMultiQueue
		var err2 error
		if q, err2 = uapi.OpenTAPQueue(name, flags); err2 == nil {
			err, t.multi = nil, true
		}
	}
	if err != nil {
		return nil, tapOpenError(name, queues, exists, err)
	}
	t.add(q)
	for i := 1; i < queues; i++ {
		q, err := uapi.OpenTAPQueue(name, flags)
		if err != nil {
			return nil, fmt.Errorf("tap %s: queue %d of %d: %w", name, i, queues, tapOpenError(name, queues, true, err))
		}
		t.add(q)
	}
	if _, ifFlags, err := t.queues[0].Interface(); err != nil {
		return nil, fmt.Errorf("tap %s: %w", name, err)
	} else if ifFlags&uapi.IFFVnetHdr == 0 {
		return nil, fmt.Errorf("tap %s: the kernel did not enable IFF_VNET_HDR", name)
	}
	for i, q := range t.queues {
		if err := q.SetVnetHdrSize(HeaderSize); err != nil {
			return nil, fmt.Errorf("tap %s: queue %d: %w", name, i, err)
		}
	}
	if err := t.SetOffload(0); err != nil {
		return nil, err
	}
	if t.created {
		if err := uapi.SetInterfaceUp(name); err != nil {
			return nil, fmt.Errorf("tap %s: bring up the interface hpcvmm created: %w", name, err)
		}
	}
	return t, nil
}

func (t *TAP) add(q *uapi.TAPQueue) {
	t.queues = append(t.queues, q)
	t.fds = append(t.fds, q.FD())
	t.attached = append(t.attached, true)
}

func tapOpenError(name string, queues int, exists bool, err error) error {
	mq := ""
	if queues > 1 {
		mq = " multi_queue"
	}
	switch {
	case errors.Is(err, uapi.ErrOpenTunDevice) && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM)):
		// Not the TAP's owner check: the device node itself is closed to
		// this user (a host without udev's default rule).
		return fmt.Errorf("tap %s: this user may not open /dev/net/tun, which every user may open where udev's default rules make it 0666: chmod 0666 /dev/net/tun: %w", name, err)
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENXIO):
		return fmt.Errorf("tap %s: %w: the host has no TUN/TAP driver; load it with `modprobe tun`", name, err)
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		if !exists {
			return fmt.Errorf("tap %s: does not exist and hpcvmm may not create it (needs CAP_NET_ADMIN): create it first with `ip tuntap add dev %s mode tap user $(id -un)%s` and bring it up, or run hpcvmm as root: %w", name, name, mq, err)
		}
		return fmt.Errorf("tap %s: exists but this user may not attach to it: recreate it with `ip tuntap add dev %s mode tap user $(id -un)%s`: %w", name, name, mq, err)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("tap %s: busy: another process (another VM?) has it open; stop that process or choose another TAP: %w", name, err)
	case errors.Is(err, unix.EINVAL) && exists:
		return fmt.Errorf("tap %s: exists but is not a TAP interface, or its multi_queue mode does not fit queues=%d (a TAP for queues>1 needs `ip tuntap add dev %s mode tap multi_queue`): %w", name, queues, name, err)
	case errors.Is(err, unix.E2BIG):
		return fmt.Errorf("tap %s: too many queues attached already: %w", name, err)
	}
	return fmt.Errorf("tap %s: %w", name, err)
}

// ValidateTAPName checks an interface name the way the kernel does
// (dev_valid_name): 1-15 bytes, not . or .., no '/', ':' or whitespace.
func ValidateTAPName(name string) error {
	switch {
	case name == "":
		return errors.New("no TAP name: pass tap=NAME, e.g. tap=tap0")
	case len(name) >= unix.IFNAMSIZ:
		return fmt.Errorf("TAP name %q is %d bytes: interface names have at most %d", name, len(name), unix.IFNAMSIZ-1)
	case name == "." || name == "..":
		return fmt.Errorf("TAP name %q is not a valid interface name", name)
	case strings.ContainsAny(name, "/: \t\n\r\v\f"):
		return fmt.Errorf("TAP name %q contains '/', ':' or whitespace, which interface names cannot", name)
	}
	return nil
}

// Name returns the interface name.
func (t *TAP) Name() string { return t.name }

// Created reports whether hpcvmm created the interface (and the kernel
// removes it when the TAP closes).
func (t *TAP) Created() bool { return t.created }

// MTU returns the interface's MTU.
func (t *TAP) MTU() (int, error) { return uapi.InterfaceMTU(t.name) }

// QueueFDs implements Backend.
func (t *TAP) QueueFDs() []int { return t.fds }

// SetOffload implements Backend (TUNSETOFFLOAD, per interface).
func (t *TAP) SetOffload(flags uint32) error {
	if len(t.queues) == 0 {
		return fmt.Errorf("tap %s: closed", t.name)
	}
	if err := t.queues[0].SetOffload(flags); err != nil {
		return fmt.Errorf("tap %s: %w", t.name, err)
	}
	return nil
}

// EnableQueue implements Backend with TUNSETQUEUE. A single-queue TAP has
// only pair 0, always attached.
func (t *TAP) EnableQueue(i int, on bool) error {
	if i < 0 || i >= len(t.queues) {
		return fmt.Errorf("tap %s: queue %d of %d", t.name, i, len(t.queues))
	}
	if !t.multi || t.attached[i] == on {
		return nil
	}
	if err := t.queues[i].SetQueueAttached(on); err != nil {
		return fmt.Errorf("tap %s: queue %d: %w", t.name, i, err)
	}
	t.attached[i] = on
	return nil
}

// Close closes every queue. If hpcvmm created the interface, the kernel
// deletes it now.
func (t *TAP) Close() error {
	var errs []error
	for _, q := range t.queues {
		errs = append(errs, q.Close())
	}
	t.queues, t.fds, t.attached = nil, nil, nil
	return errors.Join(errs...)
}

// MACOUI is the prefix of derived MAC addresses: locally administered
// (bit 1 of the first byte), unicast (bit 0 clear), "hp" after it.
var MACOUI = [3]byte{0x02, 0x68, 0x70}

// DeriveMAC returns a stable MAC for a VM's interface from a key (the TAP
// name): MACOUI followed by 24 bits of the key's FNV-1a hash. The same
// configuration always gets the same address, so guest-side DHCP leases
// and neighbour caches survive restarts.
func DeriveMAC(key string) stdnet.HardwareAddr {
	h := fnv.New32a()
	h.Write([]byte(key))
	s := h.Sum32()
	return stdnet.HardwareAddr{MACOUI[0], MACOUI[1], MACOUI[2], byte(s >> 16), byte(s >> 8), byte(s)}
}

// ParseMAC parses a unicast Ethernet MAC address (six hex bytes separated
// by ':' or '-').
func ParseMAC(s string) (stdnet.HardwareAddr, error) {
	m, err := stdnet.ParseMAC(s)
	if err != nil || len(m) != 6 {
		return nil, fmt.Errorf("MAC %q is not six hex bytes: write it like 02:68:70:00:00:01", s)
	}
	if m[0]&1 != 0 {
		return nil, fmt.Errorf("MAC %q is a multicast address: the first byte must be even (e.g. 02:...)", s)
	}
	if m[0]|m[1]|m[2]|m[3]|m[4]|m[5] == 0 {
		return nil, fmt.Errorf("MAC %q is all zeros: give a real address, e.g. 02:68:70:00:00:01", s)
	}
	return m, nil
}
