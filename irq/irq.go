// Package irq owns how interrupts and doorbells cross between devices and
// KVM without hpcvmm on the data path: the Router a device uses to route an
// MSI message to a GSI and bind an eventfd to it (KVM_SET_GSI_ROUTING,
// KVM_IRQFD), the Notifier that turns guest doorbell writes into eventfd
// signals (KVM_IOEVENTFD), the eventfd helpers both sides use, and Vectors,
// one irqfd per MSI-X vector with KVM's masking order. It knows nothing of
// PCI config space or of the VM that implements Router and Notifier: devices
// (virtio, vfio) and the VM's wiring both import it, never each other.
package irq

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// Router is what the VM provides so MSI-X vectors reach the guest
// through KVM without hpcvmm on the data path: a GSI routed to an MSI message
// (KVM_SET_GSI_ROUTING; the VM keeps the table, since every change replaces
// the whole of it) and an eventfd bound to that GSI (KVM_IRQFD).
type Router interface {
	// AllocGSI reserves a GSI for an MSI route.
	AllocGSI() (uint32, error)
	// SetMSIRoute points gsi at the MSI message (address low/high, data).
	SetMSIRoute(gsi uint32, addrLo, addrHi, data uint32) error
	// AssignIRQFD makes a write to eventFD inject gsi.
	AssignIRQFD(eventFD int, gsi uint32) error
	// DeassignIRQFD undoes AssignIRQFD.
	DeassignIRQFD(eventFD int, gsi uint32) error
}

// Notifier is what the VM provides so guest doorbell writes signal an eventfd
// inside KVM (KVM_IOEVENTFD on the MMIO bus) instead of exiting to hpcvmm.
type Notifier interface {
	// RegisterIOEventFD binds writes of length bytes at addr (0 = any length)
	// to eventFD, only those carrying datamatch when useDatamatch.
	RegisterIOEventFD(addr uint64, length uint32, eventFD int, datamatch uint64, useDatamatch bool) error
	// UnregisterIOEventFD removes a binding made with the same arguments.
	UnregisterIOEventFD(addr uint64, length uint32, eventFD int, datamatch uint64, useDatamatch bool) error
}

// NewEventFD returns a close-on-exec, non-blocking eventfd.
func NewEventFD() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return -1, fmt.Errorf("irq: eventfd: %w", err)
	}
	return fd, nil
}

var eventOne = [8]byte{1}

// SignalEventFD adds 1 to an eventfd. EAGAIN (the counter is at its
// maximum) means the reader has plenty to see already, so it is not an error.
func SignalEventFD(fd int) error {
	_, err := unix.Write(fd, eventOne[:])
	if err != nil && !errors.Is(err, unix.EAGAIN) {
		return err
	}
	return nil
}

// DrainEventFD resets an eventfd's counter and reports whether it was set.
// buf must have room for 8 bytes; passing it in keeps the call
// allocation-free.
func DrainEventFD(fd int, buf []byte) bool {
	n, err := unix.Read(fd, buf[:8])
	return err == nil && n == 8
}

type irqfdVector struct {
	fd       int
	gsi      uint32
	hasGSI   bool
	assigned bool
	// routed is the message gsi's route carries (valid once hasRoute):
	// unmasking with the same message needs only the irqfd, not a new
	// routing table in KVM.
	routed   MSIMessage
	hasRoute bool
}

// Vectors is an msix.Target that delivers each vector through its own eventfd
// bound to a KVM GSI: Signal is one eventfd write, and the guest's masking
// is applied to KVM's routing with the ordering that never injects a stale
// or masked message: when masking, deassign the irqfd before touching the
// route; when unmasking, set the route and then assign the irqfd.
//
// A vector signalled while masked keeps its signal in the eventfd's counter
// (no irqfd reads it): TakePending finds it for the PBA, and assigning the
// irqfd on unmask makes KVM deliver it.
type Vectors struct {
	router  Router
	name    string
	onError func(error)
	vecs    []irqfdVector
	drain   [8]byte
}

// NewVectors creates one eventfd per vector for the device called name (in
// errors, e.g. "0000:01:00.0 MSI-X"). onError (may be nil) hears about
// routing failures, which have no other way out of a guest MMIO write.
func NewVectors(router Router, name string, vectors int, onError func(error)) (*Vectors, error) {
	t := &Vectors{router: router, name: name, onError: onError, vecs: make([]irqfdVector, vectors)}
	for i := range t.vecs {
		t.vecs[i].fd = -1
	}
	for i := range t.vecs {
		fd, err := NewEventFD()
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("irq: %s vector %d: %w", name, i, err)
		}
		t.vecs[i].fd = fd
	}
	return t, nil
}

func (t *Vectors) report(err error) {
	if t.onError != nil {
		t.onError(err)
	}
}

// VectorChanged implements msix.Target.
func (t *Vectors) VectorChanged(vector int, msg MSIMessage) {
	if vector < 0 || vector >= len(t.vecs) {
		return
	}
	v := &t.vecs[vector]
	if !msg.Masked && !ValidMSIAddress(msg.Addr) {
		// A message KVM would turn into some interrupt anyway (it decodes
		// the destination from any address): refused, the vector stays
		// off until the guest writes a valid one.
		t.report(fmt.Errorf("irq: %s: guest unmasked vector %d with address %#x outside the MSI window 0xfee00000-0xfeefffff (data %#x): refused, vector left masked", t.name, vector, msg.Addr, msg.Data))
		msg.Masked = true
	}
	if msg.Masked {
		// The route stays in KVM's table untouched: with no irqfd on it
		// nothing uses it, and leaving it saves a table push now and,
		// when the message is unchanged, at unmask.
		if v.assigned {
			if err := t.router.DeassignIRQFD(v.fd, v.gsi); err != nil {
				t.report(fmt.Errorf("irq: %s: mask vector %d (gsi %d): %w", t.name, vector, v.gsi, err))
				return
			}
			v.assigned = false
		}
		return
	}
	if !v.hasGSI {
		gsi, err := t.router.AllocGSI()
		if err != nil {
			t.report(fmt.Errorf("irq: %s: vector %d of %d: allocate GSI: %w", t.name, vector, len(t.vecs), err))
			return
		}
		v.gsi, v.hasGSI = gsi, true
	}
	route := MSIMessage{Addr: msg.Addr, Data: msg.Data}
	if !v.hasRoute || v.routed != route {
		if err := t.router.SetMSIRoute(v.gsi, uint32(msg.Addr), uint32(msg.Addr>>32), msg.Data); err != nil {
			v.hasRoute = false // KVM's table may hold either message now
			t.report(fmt.Errorf("irq: %s: vector %d: route gsi %d to %#x/%#x: %w", t.name, vector, v.gsi, msg.Addr, msg.Data, err))
			return
		}
		v.routed, v.hasRoute = route, true
	}
	if !v.assigned {
		if err := t.router.AssignIRQFD(v.fd, v.gsi); err != nil {
			t.report(fmt.Errorf("irq: %s: unmask vector %d (gsi %d): %w", t.name, vector, v.gsi, err))
			return
		}
		v.assigned = true
	}
}

// TakePending reports whether vector was signalled while its irqfd was
// not assigned (masked, or never unmasked) and clears that signal: it was
// left in the eventfd's counter, since no irqfd consumed it. Devices call
// it to show a masked vector's pending bit in the PBA; once they have
// taken the signal, they re-deliver it with Signal after unmasking. It
// returns false for an assigned vector, whose signals KVM delivered.
// Allocation-free.
func (t *Vectors) TakePending(vector int) bool {
	if vector < 0 || vector >= len(t.vecs) {
		return false
	}
	v := &t.vecs[vector]
	if v.assigned || v.fd < 0 {
		return false
	}
	return DrainEventFD(v.fd, t.drain[:])
}

// ControlChanged implements msix.Target; per-vector effective masks already
// carry the enable and function-mask state.
func (t *Vectors) ControlChanged(enabled, functionMasked bool) {}

// Signal implements msix.Target: one eventfd write, no allocation.
func (t *Vectors) Signal(vector int) {
	if vector < 0 || vector >= len(t.vecs) {
		return
	}
	if err := SignalEventFD(t.vecs[vector].fd); err != nil {
		t.report(fmt.Errorf("irq: %s: signal vector %d: %w", t.name, vector, err))
	}
}

// EventFD returns vector's eventfd (for tests and diagnostics).
func (t *Vectors) EventFD(vector int) int { return t.vecs[vector].fd }

// Close deassigns every irqfd and closes the eventfds. GSIs stay reserved in
// the VM's table: the VM is going away when devices close.
func (t *Vectors) Close() error {
	var errs []error
	for i := range t.vecs {
		v := &t.vecs[i]
		if v.assigned {
			if err := t.router.DeassignIRQFD(v.fd, v.gsi); err != nil {
				errs = append(errs, fmt.Errorf("irq: %s: close vector %d: %w", t.name, i, err))
			}
			v.assigned = false
		}
		if v.fd >= 0 {
			unix.Close(v.fd)
			v.fd = -1
		}
	}
	return errors.Join(errs...)
}

// ValidMSIAddress reports whether a guest MSI address is one an x86 CPU
// takes as an interrupt: the 0xFEExxxxx window, upper half zero (with the
// extended destination ID the extra bits sit in address bits 11:5, still
// inside the window).
func ValidMSIAddress(addr uint64) bool { return addr>>20 == 0xfee }

// MSIMessage is one MSI or MSI-X vector as the guest programmed it. Masked
// is the effective mask: the entry's mask bit, the function mask, or MSI-X
// disabled.
type MSIMessage struct {
	Addr   uint64
	Data   uint32
	Masked bool
}
