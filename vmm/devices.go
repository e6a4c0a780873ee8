package vmm

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
)

// devices is every device model of a VM, the buses they sit on and the
// host resources behind them (eventfds, TAPs, VFIO files, the container),
// as Firecracker's device_manager keeps them apart from the VM. New's
// "devices" step (addDevices) and the passthrough steps before it fill it
// in, storing each thing the moment it exists; close releases whatever is
// there, so it is correct on a VM built half-way.
//
// The adding steps are VM methods: they need the KVM VM, guest RAM, the
// Config and VM.stop (a guest reset or poweroff stops the VM), which the
// devices do not own.
type devices struct {
	pio, mmio                   bus.Bus
	unhandledPIO, unhandledMMIO *platform.Unhandled
	serial                      *platform.Serial
	serialEvent                 int // eventfd wired to GSI 4 by KVM_IRQFD; -1 until then
	irq                         *irqRouter
	pci                         *pci.Root
	console                     *console.Console
	transports                  []*transport.Transport
	acpiPM                      *platform.ACPIPM
	ged                         *platform.GED // ACPI power button
	pt                          *passthrough  // nil without passthrough devices
	slots                       *memslots     // KVM slots for BAR mappings and the image
	// pmem is the read-only image (Config.PMEM), open from checkInput
	// on; VM.Close unmaps and closes it after the KVM VM, whose
	// memslots point at its mappings.
	pmem *pmemImage
}

// close stops the device threads and releases the devices' host resources,
// before the vCPUs, the KVM VM and guest RAM go (VM.Close): the virtio
// transports with their TAPs and the console first (their workers touch
// guest RAM), then the passthrough devices, the KVM-VFIO device and the
// container (closePassthrough), then the serial eventfd. Giving rebound
// devices back to their drivers (restoreHost) waits until every fd of the
// VM is closed.
func (d *devices) close(log *slog.Logger) error {
	var errs []error
	for _, t := range d.transports {
		errs = append(errs, t.Close())
		errs = append(errs, closeNet(t))
	}
	if d.console != nil {
		errs = append(errs, d.console.Close())
	}
	errs = append(errs, d.closePassthrough(log))
	if d.serialEvent >= 0 {
		errs = append(errs, unix.Close(d.serialEvent))
		d.serialEvent = -1
	}
	return errors.Join(errs...)
}

// closePassthrough releases the devices (each reset after use), the
// KVM-VFIO device and the container (unmapping all DMA); restoreHost gives
// every rebound device back to its driver later.
func (d *devices) closePassthrough(log *slog.Logger) error {
	pt := d.pt
	if pt == nil {
		return nil
	}
	var errs []error
	closeDeviceFiles(pt.files)
	pt.files = nil
	for _, pd := range pt.pcidevs {
		// What the guest's BAR accesses cost: MSI-X table/PBA accesses
		// trap by design, any other count is an exit a memslot should
		// have avoided.
		for _, st := range pd.TrapStats() {
			log.Info("passthrough BAR accesses that exited to hpcvmm", "device", pd.Name(), "bar", st.Index,
				"msix", st.MSIX, "other", st.Other)
		}
		errs = append(errs, pd.Close())
	}
	if pt.kv != nil {
		errs = append(errs, pt.kv.Close())
	}
	if pt.ctr != nil {
		// Unmaps guest RAM (and any BAR still mapped): part of the cost of
		// ending a VM, so logged.
		start := time.Now()
		errs = append(errs, pt.ctr.Close())
		log.Info("VFIO container closed", "took", time.Since(start).Round(time.Microsecond))
	}
	return errors.Join(errs...)
}

// addDevices wires the platform devices and the PCI bus with every device
// on it, and writes the NCCL topology file.
func (vm *VM) addDevices() error {
	if err := vm.addPlatformDevices(); err != nil {
		return err
	}
	if err := vm.addPCI(physAddrBits(vm.supported)); err != nil {
		return fmt.Errorf("PCI: %w", err)
	}
	return vm.writeNCCLTopology(vm.supported)
}

// addPlatformDevices wires the UART, the i8042 reset line and the catch-all
// for unclaimed accesses.
func (vm *VM) addPlatformDevices() error {
	d := &vm.dev
	d.unhandledPIO = platform.NewUnhandled(vm.log, "port I/O")
	d.unhandledMMIO = platform.NewUnhandled(vm.log, "MMIO")

	efd, err := irq.NewEventFD()
	if err != nil {
		return fmt.Errorf("serial IRQ: %w", err)
	}
	d.serialEvent = efd
	if err := setupFault("serial eventfd"); err != nil {
		return err
	}
	if err := vm.vm.IRQFD(efd, serialIRQ, -1); err != nil {
		return fmt.Errorf("serial IRQ %d: %w", serialIRQ, err)
	}
	if err := setupFault("serial irqfd"); err != nil {
		return err
	}
	d.serial = platform.NewSerial(vm.cfg.Stdout, func() {
		// An irqfd write is an edge on GSI 4: what an ISA UART does.
		_ = irq.SignalEventFD(efd)
	})
	if err := d.pio.Register(serialBase, 8, "serial0", d.serial); err != nil {
		return err
	}
	if err := d.pio.Register(platform.RTCIndexPort, platform.RTCSize, "cmos rtc", platform.NewRTC(nil)); err != nil {
		return err
	}
	kbd := platform.NewI8042(func() { vm.stop(errGuestReset) })
	if err := d.pio.Register(i8042DataPort, 1, "i8042 data", kbd.DataPort()); err != nil {
		return err
	}
	if err := d.pio.Register(i8042CmdPort, 1, "i8042 command", kbd.CommandPort()); err != nil {
		return err
	}
	if vm.cfg.NoACPI {
		return nil
	}
	return vm.addACPIDevices()
}

// SetConsoleSize tells the guest the console's new size (rows, columns),
// e.g. after SIGWINCH. It does nothing without a virtio console.
func (vm *VM) SetConsoleSize(rows, cols uint16) {
	if vm.dev.console != nil {
		vm.dev.console.SetSize(rows, cols)
	}
}

// NotifyExits counts virtqueue doorbells that reached hpcvmm as MMIO exits
// instead of being absorbed by their ioeventfd: zero when the data path
// stays in KVM.
func (vm *VM) NotifyExits() uint64 {
	var n uint64
	for _, t := range vm.dev.transports {
		n += t.NotifyExits()
	}
	return n
}
