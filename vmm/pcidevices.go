package vmm

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
)

// barSpaceError adds the fix to a BAR placement failure, in the words
// preflight's bar-space checks use for the same layout.
func barSpaceError(err error, physBits int) error {
	var pe *addrspace.PlanError
	if !errors.As(err, &pe) {
		return err
	}
	if pe.BAR.Kind == addrspace.Mem64 {
		return fmt.Errorf("%w: use less --memory or pass fewer devices (the host CPU's %d-bit physical address width is fixed)", err, physBits)
	}
	return fmt.Errorf("%w: pass fewer devices with 32-bit BARs", err)
}

// reservedForBARs lists what no memory BAR may be moved over by the guest:
// RAM (a BAR's memslot would shadow it, or KVM refuses the overlap), ECAM,
// the IOAPIC, and the LAPIC page with the MSI window around it (a BAR there
// would take the guest's interrupt writes).
func reservedForBARs(memory, image uint64) []pci.Reserved {
	var out []pci.Reserved
	for _, r := range addrspace.RAM(memory) {
		out = append(out, pci.Reserved{Name: "guest RAM", Base: r.GPA, Size: r.Size})
	}
	if r := addrspace.PMEM(memory, image); r.Size > 0 {
		out = append(out, pci.Reserved{Name: "the read-only image (pmem)", Base: r.GPA, Size: r.Size})
	}
	return append(out,
		pci.Reserved{Name: "ECAM", Base: addrspace.ECAMBase, Size: pci.ECAMSize},
		pci.Reserved{Name: "the IOAPIC", Base: boot.IOAPICAddr, Size: 0x1000},
		pci.Reserved{Name: "the LAPIC and MSI window", Base: boot.LAPICAddr, Size: 1 << 20})
}

// PCI slots of hpcvmm's own devices on bus 0 (slot 0 is the host bridge).
const consoleSlot = 1

// addPCI builds the PCI root complex with its configuration mechanisms and
// hpcvmm's virtio devices, then places every BAR the way firmware would,
// since there is none: the 64-bit window runs from above guest RAM up to
// the guest's physical address limit (the host's: large GPU BARs need it).
func (vm *VM) addPCI(physBits int) error {
	vm.dev.irq = newIRQRouter(vm.vm)
	vm.dev.irq.extDestID = vm.needsX2APIC()
	onError := func(err error) { vm.refusals.Refuse("pci", err) }
	vm.dev.pci = pci.NewRoot(pci.RootConfig{MMIO: &vm.dev.mmio, PIO: &vm.dev.pio, OnError: onError, Reserved: reservedForBARs(vm.cfg.Memory, uint64(vm.cfg.PMEM.Size))})
	if err := vm.dev.pio.Register(pci.ConfigIOPort, pci.ConfigIOSize, "pci conf1", vm.dev.pci.ConfigIO()); err != nil {
		return err
	}
	if err := vm.dev.mmio.Register(addrspace.ECAMBase, pci.ECAMSize, "pci ecam", vm.dev.pci.ECAM()); err != nil {
		return err
	}
	if vm.cfg.Console == ConsoleVirtio {
		con, err := console.New(vm.cfg.Stdin, vm.cfg.Stdout, console.Options{
			Rows: vm.cfg.ConsoleRows, Cols: vm.cfg.ConsoleCols,
			OnError: func(err error) { vm.refusals.Refuse("virtio-console", err) },
			Ports:   vm.cfg.ConsolePorts,
		})
		if err != nil {
			return fmt.Errorf("virtio-console: %w", err)
		}
		vm.dev.console = con
		if err := setupFault("virtio-console"); err != nil {
			return err
		}
		tr, err := transport.New(con, transport.Config{
			Memory: vm.mem, Router: vm.dev.irq, Notifier: vm.dev.irq,
			OnError: func(err error) { vm.refusals.Refuse("virtio-console", err) },
		})
		if err != nil {
			return fmt.Errorf("virtio-console: %w", err)
		}
		vm.dev.transports = append(vm.dev.transports, tr)
		if err := setupFault("virtio-console transport"); err != nil {
			return err
		}
		if err := vm.dev.pci.AddDevice(consoleSlot, "virtio-console", tr); err != nil {
			return err
		}
	}
	if err := vm.addNets(); err != nil {
		return err
	}
	if err := vm.addPassthroughDevices(); err != nil {
		return err
	}
	w, err := assignBARs(vm.dev.pci, vm.cfg.Memory, uint64(vm.cfg.PMEM.Size), physBits)
	if err != nil {
		return err
	}
	vm.windows = w
	if err := setupFault("assign BARs"); err != nil {
		return err
	}
	vm.log.Debug("PCI windows", "mmio32", w.Mem32.String(), "mmio64", w.Mem64.String(), "io", w.IO.String(), "phys_bits", physBits)
	return nil
}

// assignBARs places every BAR on root in the windows of a guest with memory
// bytes of RAM and physBits physical address bits: the same addrspace
// windows and Plan that preflight's bar-space checks use.
func assignBARs(root *pci.Root, memory, image uint64, physBits int) (addrspace.Windows, error) {
	w, err := addrspace.NewWindowsPMEM(memory, image, uint(physBits))
	if err != nil {
		return w, err
	}
	if err := root.AssignBuses(); err != nil {
		return w, err
	}
	if err := root.AssignBARs(w); err != nil {
		return w, barSpaceError(err, physBits)
	}
	return w, nil
}
