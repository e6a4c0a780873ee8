// Package pcitest provides test doubles for the VM services the PCI layer
// needs (MSI routing and irqfds, ioeventfds) and a guest-side accessor for
// configuration mechanism #1, as a guest kernel uses it.
package pcitest

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/hpcvmm/hpcvmm/vmm/bus"
	"github.com/hpcvmm/hpcvmm/vmm/pci"
)

// Route is one MSI route the fake router holds.
type Route struct{ AddrLo, AddrHi, Data uint32 }

// Router is a fake pci.InterruptRouter that records the routing table, the
// irqfd bindings and the order of calls (Log).
type Router struct {
	mu     sync.Mutex
	next   uint32
	Routes map[uint32]Route
	IRQFDs map[int]uint32 // eventfd -> gsi
	Log    []string
	// Fail, if set, makes every call return it.
	Fail error
}

var _ pci.InterruptRouter = (*Router)(nil)

// NewRouter returns an empty fake router whose GSIs start at 24 (after the
// IOAPIC pins, as the real VM's would).
func NewRouter() *Router {
	return &Router{next: 24, Routes: map[uint32]Route{}, IRQFDs: map[int]uint32{}}
}

// AllocGSI implements pci.InterruptRouter.
func (r *Router) AllocGSI() (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Fail != nil {
		return 0, r.Fail
	}
	g := r.next
	r.next++
	r.Log = append(r.Log, fmt.Sprintf("alloc %d", g))
	return g, nil
}

// SetMSIRoute implements pci.InterruptRouter.
func (r *Router) SetMSIRoute(gsi uint32, addrLo, addrHi, data uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Fail != nil {
		return r.Fail
	}
	r.Routes[gsi] = Route{addrLo, addrHi, data}
	r.Log = append(r.Log, fmt.Sprintf("route %d %#x %#x", gsi, addrLo, data))
	return nil
}

// AssignIRQFD implements pci.InterruptRouter.
func (r *Router) AssignIRQFD(fd int, gsi uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Fail != nil {
		return r.Fail
	}
	if _, dup := r.IRQFDs[fd]; dup {
		return fmt.Errorf("fake router: irqfd %d already assigned", fd)
	}
	r.IRQFDs[fd] = gsi
	r.Log = append(r.Log, fmt.Sprintf("assign %d", gsi))
	return nil
}

// DeassignIRQFD implements pci.InterruptRouter.
func (r *Router) DeassignIRQFD(fd int, gsi uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Fail != nil {
		return r.Fail
	}
	if g, ok := r.IRQFDs[fd]; !ok || g != gsi {
		return fmt.Errorf("fake router: irqfd %d not assigned to gsi %d", fd, gsi)
	}
	delete(r.IRQFDs, fd)
	r.Log = append(r.Log, fmt.Sprintf("deassign %d", gsi))
	return nil
}

// Assigned reports whether fd is bound to a GSI and the route it uses.
func (r *Router) Assigned(fd int) (Route, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.IRQFDs[fd]
	if !ok {
		return Route{}, false
	}
	return r.Routes[g], true
}

// TakeLog returns and clears the call log.
func (r *Router) TakeLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.Log
	r.Log = nil
	return l
}

// IOEvent is one registered ioeventfd.
type IOEvent struct {
	Addr      uint64
	Length    uint32
	FD        int
	Datamatch uint64
	UseMatch  bool
}

// Notifier is a fake pci.Notifier keyed by address.
type Notifier struct {
	mu     sync.Mutex
	Events map[uint64]IOEvent
}

var _ pci.Notifier = (*Notifier)(nil)

// NewNotifier returns an empty fake notifier.
func NewNotifier() *Notifier { return &Notifier{Events: map[uint64]IOEvent{}} }

// RegisterIOEventFD implements pci.Notifier.
func (n *Notifier) RegisterIOEventFD(addr uint64, length uint32, fd int, dm uint64, use bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.Events[addr]; dup {
		return fmt.Errorf("fake notifier: %#x already registered", addr)
	}
	n.Events[addr] = IOEvent{addr, length, fd, dm, use}
	return nil
}

// UnregisterIOEventFD implements pci.Notifier.
func (n *Notifier) UnregisterIOEventFD(addr uint64, length uint32, fd int, dm uint64, use bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.Events[addr]; !ok || e != (IOEvent{addr, length, fd, dm, use}) {
		return fmt.Errorf("fake notifier: %#x len %d fd %d not registered", addr, length, fd)
	}
	delete(n.Events, addr)
	return nil
}

// Lookup returns the ioeventfd at addr.
func (n *Notifier) Lookup(addr uint64) (IOEvent, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.Events[addr]
	return e, ok
}

// Len returns the number of registrations.
func (n *Notifier) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.Events)
}

// Conf1 performs configuration accesses through ports 0xcf8/0xcfc on a
// port-I/O bus, the way Linux's pci_conf1_read/write do.
type Conf1 struct{ PIO *bus.Bus }

func conf1Addr(dev, fn, reg int) uint32 {
	return 0x80000000 | uint32(dev)<<11 | uint32(fn)<<8 | uint32(reg&0xfc) | uint32(reg&0xf00)<<16
}

// Read reads n (1, 2, 4) bytes at reg of 00:dev.fn.
func (c Conf1) Read(dev, fn, reg, n int) uint32 {
	var a [4]byte
	binary.LittleEndian.PutUint32(a[:], conf1Addr(dev, fn, reg))
	c.PIO.Write(pci.ConfigIOPort, a[:])
	var d [4]byte
	c.PIO.Read(pci.ConfigIOPort+4+uint64(reg&3), d[:n])
	return binary.LittleEndian.Uint32(d[:])
}

// Write writes the low n bytes of v at reg of 00:dev.fn.
func (c Conf1) Write(dev, fn, reg, n int, v uint32) {
	var a [4]byte
	binary.LittleEndian.PutUint32(a[:], conf1Addr(dev, fn, reg))
	c.PIO.Write(pci.ConfigIOPort, a[:])
	var d [4]byte
	binary.LittleEndian.PutUint32(d[:], v)
	c.PIO.Write(pci.ConfigIOPort+4+uint64(reg&3), d[:n])
}

// FindCapabilities walks the capability list as Linux's
// __pci_find_next_cap_ttl does (status bit, pointer at 0x34, low two bits
// masked, at most 48 hops, stop below 0x40) and returns the offsets of the
// capabilities with ID id.
func (c Conf1) FindCapabilities(dev, id int) []int {
	var out []int
	if c.Read(dev, 0, pci.RegStatus, 2)&pci.StatusCapList == 0 {
		return nil
	}
	pos := int(c.Read(dev, 0, pci.RegCapPtr, 1))
	for ttl := 48; ttl > 0; ttl-- {
		if pos < 0x40 {
			break
		}
		pos &^= 3
		ent := c.Read(dev, 0, pos, 2)
		if ent&0xff == 0xff {
			break
		}
		if int(ent&0xff) == id {
			out = append(out, pos)
		}
		pos = int(ent >> 8)
	}
	return out
}
