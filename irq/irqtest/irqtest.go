// Package irqtest provides test doubles for the VM services devices use to
// deliver interrupts and receive doorbells: a Router that records MSI routes
// and irqfd bindings in call order, and a Notifier that records ioeventfds.
package irqtest

import (
	"fmt"
	"sync"

	"github.com/hpcvmm/hpcvmm/irq"
)

// Route is one MSI route the fake router holds.
type Route struct{ AddrLo, AddrHi, Data uint32 }

// Router is a fake irq.Router that records the routing table, the
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

var _ irq.Router = (*Router)(nil)

// NewRouter returns an empty fake router whose GSIs start at 24 (after the
// IOAPIC pins, as the real VM's would).
func NewRouter() *Router {
	return &Router{next: 24, Routes: map[uint32]Route{}, IRQFDs: map[int]uint32{}}
}

// AllocGSI implements irq.Router.
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

// SetMSIRoute implements irq.Router.
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

// AssignIRQFD implements irq.Router.
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

// DeassignIRQFD implements irq.Router.
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

// Notifier is a fake irq.Notifier keyed by address.
type Notifier struct {
	mu     sync.Mutex
	Events map[uint64]IOEvent
}

var _ irq.Notifier = (*Notifier)(nil)

// NewNotifier returns an empty fake notifier.
func NewNotifier() *Notifier { return &Notifier{Events: map[uint64]IOEvent{}} }

// RegisterIOEventFD implements irq.Notifier.
func (n *Notifier) RegisterIOEventFD(addr uint64, length uint32, fd int, dm uint64, use bool) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.Events[addr]; dup {
		return fmt.Errorf("fake notifier: %#x already registered", addr)
	}
	n.Events[addr] = IOEvent{addr, length, fd, dm, use}
	return nil
}

// UnregisterIOEventFD implements irq.Notifier.
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
