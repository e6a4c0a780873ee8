package vmm

import (
	"context"
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/platform"
)

// gedGSI is the GSI of the ACPI Generic Event Device: ISA IRQ 5, free on
// this platform, edge-triggered and active high like every ISA IRQ, so a
// KVM_IRQ_LINE pulse is one event. (PCI INTx uses GSIs 16-23.)
const gedGSI = 5

// addACPIDevices wires the hardware-reduced ACPI registers the FADT names
// (sleep control/status, reset) and the GED that carries the power button.
func (vm *VM) addACPIDevices() error {
	vm.dev.acpiPM = platform.NewACPIPM(func() {
		vm.log.Info("guest powered off through the ACPI sleep control register (S5)")
		vm.stop(errGuestPoweroff)
	}, func() {
		vm.log.Info("guest reset through the ACPI reset register")
		vm.stop(errGuestReset)
	})
	if err := vm.dev.pio.Register(platform.ACPISleepControlPort, platform.ACPIPortsSize, "acpi pm", vm.dev.acpiPM); err != nil {
		return err
	}
	vm.dev.ged = platform.NewGED(func() {
		// An edge on an ISA IRQ: raise and lower the line.
		if err := vm.vm.IRQLine(gedGSI, true); err != nil {
			vm.log.Warn("ACPI GED interrupt", "gsi", gedGSI, "err", err)
			return
		}
		_ = vm.vm.IRQLine(gedGSI, false)
	})
	vm.dev.ged.OnRead = func(events uint32) {
		// Only reads that return a press are logged: the guest can read
		// the register as often as it likes, but only hpcvmm presses.
		if events != 0 {
			vm.log.Info("guest read the ACPI GED events", "events", fmt.Sprintf("%#x", events))
		}
	}
	return vm.dev.mmio.Register(addrspace.GEDBase, platform.GEDSize, "acpi ged", vm.dev.ged)
}

// PressPowerButton raises an ACPI power-button event in the guest, as a
// press of a real machine's button: an ACPI guest shuts down cleanly (if
// its userspace handles the button) and powers off, ending Run with nil.
func (vm *VM) PressPowerButton() error {
	if vm.dev.ged == nil {
		return fmt.Errorf("vmm: the guest has no ACPI power button")
	}
	vm.log.Info("ACPI power button pressed")
	vm.dev.ged.Press(platform.GEDPowerButton)
	return nil
}

// Shutdown asks the guest to shut down with the ACPI power button and waits
// until it has powered off (or reset) and the VM stopped, or until ctx is
// done. It returns nil once the guest is down; ctx's error if the guest did
// not get there in time, in which case the caller stops the VM hard by
// cancelling Run's context. Run must be running (in another goroutine).
func (vm *VM) Shutdown(ctx context.Context) error {
	if err := vm.PressPowerButton(); err != nil {
		return err
	}
	select {
	case <-vm.stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("vmm: the guest did not power off after the ACPI power button: %w", context.Cause(ctx))
	}
}
