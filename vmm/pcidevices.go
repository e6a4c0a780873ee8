package vmm

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
	"github.com/hpcvmm/hpcvmm/vmm/pci"
)

// PCI slots of hpcvmm's own devices on bus 0 (slot 0 is the host bridge).
const consoleSlot = 1

// addPCI builds the PCI root complex with its configuration mechanisms and
// hpcvmm's virtio devices, then places every BAR the way firmware would,
// since there is none: the 64-bit window runs from above guest RAM up to
// the guest's physical address limit (the host's: large GPU BARs need it).
func (vm *VM) addPCI(physBits int) error {
	vm.irq = newIRQRouter(vm.vm)
	onError := func(err error) { vm.log.Warn("pci", "err", err) }
	vm.pci = pci.NewRoot(pci.RootConfig{MMIO: &vm.mmio, PIO: &vm.pio, OnError: onError})
	if err := vm.pio.Register(pci.ConfigIOPort, pci.ConfigIOSize, "pci conf1", vm.pci.ConfigIO()); err != nil {
		return err
	}
	if err := vm.mmio.Register(pci.ECAMBase, pci.ECAMSize, "pci ecam", vm.pci.ECAM()); err != nil {
		return err
	}
	if vm.cfg.Console == ConsoleVirtio {
		con, err := console.New(vm.cfg.Stdin, vm.cfg.Stdout, console.Options{
			Rows: vm.cfg.ConsoleRows, Cols: vm.cfg.ConsoleCols,
			OnError: func(err error) { vm.log.Warn("virtio-console", "err", err) },
		})
		if err != nil {
			return fmt.Errorf("virtio-console: %w", err)
		}
		vm.console = con
		tr, err := transport.New(con, transport.Config{
			Memory: vm.mem, Router: vm.irq, Notifier: vm.irq,
			OnError: func(err error) { vm.log.Warn("virtio-console", "err", err) },
		})
		if err != nil {
			return fmt.Errorf("virtio-console: %w", err)
		}
		vm.transports = append(vm.transports, tr)
		if err := vm.pci.AddDevice(consoleSlot, "virtio-console", tr); err != nil {
			return err
		}
	}
	if err := vm.addNets(); err != nil {
		return err
	}
	if err := vm.addPassthroughDevices(); err != nil {
		return err
	}
	m32, err := pci.NewAllocator("32-bit MMIO window", pci.Window32Base, pci.Window32Size, false)
	if err != nil {
		return err
	}
	base64, size64, err := pci.Window64(vm.mem.End(), uint(physBits))
	if err != nil {
		return err
	}
	if err := vm.check64BitWindow(size64, physBits); err != nil {
		return err
	}
	m64, err := pci.NewAllocator("64-bit MMIO window", base64, size64, false)
	if err != nil {
		return err
	}
	io, err := pci.NewAllocator("I/O window", pci.IOWindowBase, pci.IOWindowSize, true)
	if err != nil {
		return err
	}
	vm.log.Debug("PCI windows", "mmio32", fmt.Sprintf("%#x+%#x", uint64(pci.Window32Base), uint64(pci.Window32Size)),
		"mmio64", fmt.Sprintf("%#x+%#x", base64, size64), "phys_bits", physBits)
	return vm.pci.AssignBARs(m32, m64, io)
}

// SetConsoleSize tells the guest the console's new size (rows, columns),
// e.g. after SIGWINCH. It does nothing without a virtio console.
func (vm *VM) SetConsoleSize(rows, cols uint16) {
	if vm.console != nil {
		vm.console.SetSize(rows, cols)
	}
}

// NotifyExits counts virtqueue doorbells that reached hpcvmm as MMIO exits
// instead of being absorbed by their ioeventfd: zero when the data path
// stays in KVM.
func (vm *VM) NotifyExits() uint64 {
	var n uint64
	for _, t := range vm.transports {
		n += t.NotifyExits()
	}
	return n
}

// closeDevices stops the device threads before guest RAM goes away.
func (vm *VM) closeDevices() error {
	var errs []error
	for _, t := range vm.transports {
		errs = append(errs, t.Close())
		errs = append(errs, closeNet(t))
	}
	if vm.console != nil {
		errs = append(errs, vm.console.Close())
	}
	return errors.Join(errs...)
}
