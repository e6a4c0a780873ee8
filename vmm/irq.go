package vmm

import (
	"fmt"
	"sync"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// The in-kernel IOAPIC has 24 pins; GSIs above them are free for MSI routes.
const (
	ioapicPins = 24
	picPins    = 16
	// maxRoutes is KVM_MAX_IRQ_ROUTES on x86: the most entries one
	// KVM_SET_GSI_ROUTING table may hold, and one above the highest GSI.
	// The default routes count against it: GSIs 0-15 take two entries
	// each (PIC and IOAPIC), 16-23 one.
	maxRoutes = 4096
	// maxMSIRoutes is what is left for MSI routes: 4096 - 40 = 4056.
	maxMSIRoutes = maxRoutes - picPins - ioapicPins
)

// routingVM is the part of a KVM VM the router drives; *uapi.VM implements
// it, and tests record the calls.
type routingVM interface {
	SetGSIRouting(entries []uapi.IRQRoutingEntry) error
	IRQFD(eventFD int, gsi uint32, resampleFD int) error
	IRQFDDeassign(eventFD int, gsi uint32) error
	IOEventFD(e uapi.IOEventFD) error
}

// irqRouter owns the VM's GSI routing table. KVM_SET_GSI_ROUTING replaces
// the whole table on every call, so every route the VM has — the default
// PIC/IOAPIC pins and each device's MSI routes — lives here and is sent
// again on each change. It implements irq.Router and irq.Notifier
// for the device models, which then deliver interrupts by irqfd and take
// doorbells by ioeventfd without the VMM on the data path. Changes are rare
// (the guest programming an MSI-X vector), so a mutex is fine.
type irqRouter struct {
	vm routingVM
	mu sync.Mutex
	// +checklocks:mu
	nextGSI uint32
	// +checklocks:mu
	msi map[uint32]uapi.IRQRoutingEntry // GSI -> MSI route
	// extDestID is set when KVM takes 32-bit APIC IDs in MSI routes
	// (CapX2APICAPI) and the guest was offered KVM's extended destination
	// ID: SetMSIRoute then moves destination bits 14:8 from the guest's
	// address bits 11:5 to address_hi, where KVM reads them.
	extDestID bool
}

func newIRQRouter(vm routingVM) *irqRouter {
	return &irqRouter{vm: vm, nextGSI: ioapicPins, msi: map[uint32]uapi.IRQRoutingEntry{}}
}

// defaultRoutes reproduces the routing KVM_CREATE_IRQCHIP installs: GSIs
// 0-15 to both PICs and the IOAPIC, 16-23 to the IOAPIC only. Replacing the
// table without them would disconnect the PIT and the UART.
func defaultRoutes() []uapi.IRQRoutingEntry {
	out := make([]uapi.IRQRoutingEntry, 0, picPins+ioapicPins)
	for gsi := uint32(0); gsi < ioapicPins; gsi++ {
		if gsi < picPins {
			chip := uint32(uapi.IRQChipPICMaster)
			if gsi >= 8 {
				chip = uapi.IRQChipPICSlave
			}
			e := uapi.IRQRoutingEntry{GSI: gsi, Type: uapi.IRQRoutingIRQChip}
			e.IRQChip.Chip, e.IRQChip.Pin = chip, gsi%8
			out = append(out, e)
		}
		e := uapi.IRQRoutingEntry{GSI: gsi, Type: uapi.IRQRoutingIRQChip}
		e.IRQChip.Chip, e.IRQChip.Pin = uapi.IRQChipIOAPIC, gsi
		out = append(out, e)
	}
	return out
}

// AllocGSI reserves a GSI for an MSI route. Each GSI holds one route for
// the VM's lifetime, so the budget is KVM's table size less the default
// routes; the caller (irq.Vectors) adds the device and vector to the error.
func (r *irqRouter) AllocGSI() (uint32, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if used := r.nextGSI - ioapicPins; used >= maxMSIRoutes {
		return 0, fmt.Errorf("irq routing: all %d MSI routes are in use: KVM's routing table holds %d entries (KVM_MAX_IRQ_ROUTES), %d of them the PIC/IOAPIC routes; give the VM fewer devices or the guest fewer vectors",
			maxMSIRoutes, maxRoutes, maxRoutes-maxMSIRoutes)
	}
	g := r.nextGSI
	r.nextGSI++
	return g, nil
}

// SetMSIRoute points gsi at an MSI message and pushes the table to KVM,
// unless gsi already has exactly that route: KVM_SET_GSI_ROUTING copies
// and rebuilds the whole table (and waits for an SRCU grace period), so a
// route KVM already holds is not sent again.
func (r *irqRouter) SetMSIRoute(gsi uint32, addrLo, addrHi, data uint32) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if gsi < ioapicPins || gsi >= r.nextGSI {
		return fmt.Errorf("irq routing: GSI %d is not an MSI GSI allocated by AllocGSI", gsi)
	}
	if r.extDestID {
		addrLo, addrHi = extendedDestination(addrLo, addrHi)
	}
	e := uapi.IRQRoutingEntry{GSI: gsi, Type: uapi.IRQRoutingMSI}
	e.MSI.AddressLo, e.MSI.AddressHi, e.MSI.Data = addrLo, addrHi, data
	old, had := r.msi[gsi]
	if had && old == e {
		return nil
	}
	r.msi[gsi] = e
	if err := r.pushLocked(); err != nil {
		// KVM kept the previous table: so does the router.
		if had {
			r.msi[gsi] = old
		} else {
			delete(r.msi, gsi)
		}
		return err
	}
	return nil
}

// +checklocks:r.mu
func (r *irqRouter) pushLocked() error {
	table := defaultRoutes()
	for _, e := range r.msi {
		table = append(table, e)
	}
	return r.vm.SetGSIRouting(table)
}

// AssignIRQFD makes a write to eventFD inject gsi.
func (r *irqRouter) AssignIRQFD(eventFD int, gsi uint32) error { return r.vm.IRQFD(eventFD, gsi, -1) }

// DeassignIRQFD undoes AssignIRQFD.
func (r *irqRouter) DeassignIRQFD(eventFD int, gsi uint32) error {
	return r.vm.IRQFDDeassign(eventFD, gsi)
}

// RegisterIOEventFD binds guest MMIO writes at addr to eventFD inside KVM.
func (r *irqRouter) RegisterIOEventFD(addr uint64, length uint32, eventFD int, datamatch uint64, useDatamatch bool) error {
	return r.vm.IOEventFD(ioevent(addr, length, eventFD, datamatch, useDatamatch, false))
}

// UnregisterIOEventFD removes a binding made by RegisterIOEventFD.
func (r *irqRouter) UnregisterIOEventFD(addr uint64, length uint32, eventFD int, datamatch uint64, useDatamatch bool) error {
	return r.vm.IOEventFD(ioevent(addr, length, eventFD, datamatch, useDatamatch, true))
}

func ioevent(addr uint64, length uint32, fd int, datamatch uint64, useDatamatch, deassign bool) uapi.IOEventFD {
	e := uapi.IOEventFD{Addr: addr, Len: length, FD: fd, Datamatch: datamatch}
	if useDatamatch {
		e.Flags |= uapi.IOEventFDFlagDatamatch
	}
	if deassign {
		e.Flags |= uapi.IOEventFDFlagDeassign
	}
	return e
}

// extendedDestination translates an MSI address written by a guest that uses
// KVM's extended destination ID (KVM_FEATURE_MSI_EXT_DEST_ID: destination
// bits 14:8 in address bits 11:5, which the x86 MSI format leaves
// reserved) into the form KVM's x2APIC API routes take: destination bits
// 31:8 in address_hi bits 31:8, address bits 11:5 clear. Without it an MSI
// aimed at APIC ID 256 would reach APIC ID 0.
func extendedDestination(addrLo, addrHi uint32) (lo, hi uint32) {
	ext := (addrLo >> 5) & 0x7f
	if ext == 0 {
		return addrLo, addrHi
	}
	return addrLo &^ (0x7f << 5), addrHi&^0x7f00 | ext<<8
}
