package vfio

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// intxState wires INTx: VFIO signals trigger when the device asserts its
// pin (and masks it, INTx being level-triggered); KVM raises gsi from that
// eventfd and, when the guest EOIs, signals resample, which is VFIO's unmask
// eventfd. hpcvmm is on neither path.
//
// The resampling irqfd exists only while INTx is on. KVM holds the line
// high from a trigger until the guest's EOI, so a device that switches to
// MSI/MSI-X with its INTx asserted would leave the IOAPIC pin (shared by
// the slots that rotate onto it) stuck high; deassigning the irqfd makes
// KVM lower the line and drop any trigger still counted in the eventfd.
type intxState struct {
	trigger, resample int
	gsi               uint32
	router            INTxRouter
	assigned          bool
	on                bool
}

// setupInterrupts creates the eventfds for MSI-X, MSI and INTx and turns
// INTx on (the state of a device after reset).
func (p *PCIDevice) setupInterrupts() error {
	if (p.msix != nil || p.msi != nil) && p.cfg.Router == nil {
		return fmt.Errorf("vfio: %s: the device has MSI/MSI-X but no interrupt router was given", p.cfg.Name)
	}
	if m := p.msix; m != nil {
		t, err := irq.NewVectors(p.cfg.Router, p.cfg.Name+" MSI-X", m.n, p.cfg.OnError)
		if err != nil {
			return fmt.Errorf("vfio: %s: MSI-X: %w", p.cfg.Name, err)
		}
		m.irqfds, m.target = t, t
		m.fds = make([]int32, min(m.n, int(m.vfioCount)))
		for i := range m.fds {
			m.fds[i] = int32(t.EventFD(i))
		}
	}
	// MSI's eventfds (up to 32) are made when the guest first enables MSI
	// (msiState.vectors): drivers of devices with MSI-X never do.
	if p.cfg.INTx == nil || p.vc.val[pci.RegInterruptPin] == 0 {
		return nil
	}
	x := &intxState{trigger: -1, resample: -1, gsi: p.cfg.INTxGSI, router: p.cfg.INTx}
	p.intx = x
	var err error
	if x.trigger, err = irq.NewEventFD(); err != nil {
		return fmt.Errorf("vfio: %s: INTx: %w", p.cfg.Name, err)
	}
	if x.resample, err = irq.NewEventFD(); err != nil {
		return fmt.Errorf("vfio: %s: INTx: %w", p.cfg.Name, err)
	}
	if err := p.intxOn(); err != nil {
		return err
	}
	return nil
}

// intxOn assigns the resampling irqfd and hands VFIO the trigger and unmask
// eventfds, unless MSI or MSI-X is in use (VFIO allows one interrupt type
// at a time). The irqfd goes first so no assertion is signalled before KVM
// listens.
func (p *PCIDevice) intxOn() error {
	x := p.intx
	if x == nil || x.on || (p.msix != nil && p.msix.vfioOn) || (p.msi != nil && p.msi.on != 0) {
		return nil
	}
	if !x.assigned {
		if err := x.router.AssignResampleIRQFD(x.trigger, x.resample, x.gsi); err != nil {
			return fmt.Errorf("vfio: %s: INTx irqfd on GSI %d: %w", p.cfg.Name, x.gsi, err)
		}
		x.assigned = true
	}
	if err := p.dev.SetIRQEventFDs(uapi.VFIOPCIINTxIRQIndex, 0, uapi.VFIOIRQSetActionTrigger, []int32{int32(x.trigger)}); err != nil {
		return fmt.Errorf("vfio: %s: enable INTx: %w", p.cfg.Name, err)
	}
	if err := p.dev.SetIRQEventFDs(uapi.VFIOPCIINTxIRQIndex, 0, uapi.VFIOIRQSetActionUnmask, []int32{int32(x.resample)}); err != nil {
		p.dev.DisableIRQs(uapi.VFIOPCIINTxIRQIndex)
		return fmt.Errorf("vfio: %s: INTx unmask eventfd: %w", p.cfg.Name, err)
	}
	x.on = true
	return nil
}

// intxBack turns INTx on again after MSI or MSI-X is disabled; a failure
// has no caller to return to (a guest config write), so it is reported.
func (p *PCIDevice) intxBack() {
	if err := p.intxOn(); err != nil {
		p.report(err)
	}
}

// intxOff disables INTx in VFIO and then deassigns the resampling irqfd
// (before MSI or MSI-X is enabled): see intxState for why the irqfd goes.
func (p *PCIDevice) intxOff() {
	x := p.intx
	if x == nil {
		return
	}
	if x.on {
		if err := p.dev.DisableIRQs(uapi.VFIOPCIINTxIRQIndex); err != nil {
			p.report(fmt.Errorf("vfio: %s: disable INTx: %w", p.cfg.Name, err))
		}
		x.on = false
	}
	if x.assigned {
		if err := x.router.DeassignIRQFD(x.trigger, x.gsi); err != nil {
			p.report(fmt.Errorf("vfio: %s: INTx irqfd off GSI %d: %w", p.cfg.Name, x.gsi, err))
			return
		}
		x.assigned = false
	}
}

func (x *intxState) close(p *PCIDevice) error {
	var errs []error
	if x.on {
		errs = append(errs, p.dev.DisableIRQs(uapi.VFIOPCIINTxIRQIndex))
		x.on = false
	}
	if x.assigned {
		errs = append(errs, x.router.DeassignIRQFD(x.trigger, x.gsi))
		x.assigned = false
	}
	for _, fd := range []*int{&x.trigger, &x.resample} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	return errors.Join(errs...)
}
