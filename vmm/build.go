package vmm

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// New's build step, once the input and the host have been checked. Each stores
// what it acquires in the VM as soon as it has it, so VM.Close (New's
// unwinding) releases it on any later failure.

// openKVM opens /dev/kvm, checks the capabilities hpcvmm needs and reads
// the CPUID the host supports.
func (vm *VM) openKVM() error {
	var err error
	if vm.kvm, err = uapi.OpenKVM(); err != nil {
		return err
	}
	if err := setupFault("open /dev/kvm"); err != nil {
		return err
	}
	if err := vm.kvm.RequireCaps(RequiredKVMCaps...); err != nil {
		return err
	}
	limit, why := VCPULimit(vm.kvm, vm.cfg.NoACPI)
	if vm.cfg.CPUs > limit {
		return fieldErr("CPUs", "%d vCPUs: %s", vm.cfg.CPUs, why)
	}
	if err := checkVCPUIDs(vm.kvm, vm.topology, limit); err != nil {
		return err
	}
	// Before KVM_GET_SUPPORTED_CPUID: KVM reports AMX only to a process
	// holding the guest permission.
	vm.requestGuestXSAVE()
	if vm.supported, err = vm.kvm.SupportedCPUID(); err != nil {
		return err
	}
	vm.log.Debug("host CPU", "physical_address_bits", physAddrBits(vm.supported))
	return nil
}

// requestGuestXSAVE asks for the guest permission of the dynamically
// enabled XSAVE features (AMX tile data, arch_prctl
// ARCH_REQ_XCOMP_GUEST_PERM, Linux 5.17+), as QEMU and Cloud Hypervisor
// do: without it KVM leaves AMX out of KVM_GET_SUPPORTED_CPUID, and a
// guest on a Sapphire Rapids or later host runs its matrix kernels on
// AVX-512 instead. The permission is the process's; asking twice is
// harmless. A CPU or kernel without the feature answers EOPNOTSUPP or
// EINVAL, which only means there is nothing to give.
func (vm *VM) requestGuestXSAVE() {
	err := uapi.RequestGuestXCompPerm(uapi.XFeatureXTileData)
	switch {
	case err == nil:
		perm, _ := uapi.GuestXCompPerm()
		vm.log.Debug("guest XSAVE permission includes AMX tile data", "xcomp_guest_perm", fmt.Sprintf("%#x", perm))
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.ENOSYS):
		vm.log.Debug("no dynamic XSAVE features (AMX) on this CPU or kernel", "err", err)
	default:
		vm.log.Warn("guest permission for AMX refused: the guest gets no AMX", "err", err)
	}
}

// build is New's third step, once the input and the host have been
// checked: it opens KVM, runs the steps from the KVM VM to the devices on
// the PCI bus, and loads the kernel. The long steps that do not depend on
// each other overlap, so the time to the first KVM_RUN approaches the
// longest branch rather than the sum of the steps:
//
//	open KVM → KVM VM → vCPUs → ┬ guest RAM (prefault) ─────────────────────────────┬→ RAM memslots → devices → image → (load kernel)
//	                            └ bind devices → VFIO open and reset (per device) → DMA-map guest RAM ┘
//
// The KVM VM and its vCPUs come first, before the prefault rather than
// beside it: creating the VM registers an MMU notifier and each vCPU maps
// its kvm_run page, both under the process's mmap lock for writing, which
// waits for every prefault worker's page clear in flight (the workers hold
// it for reading) and meanwhile holds up the others. Measured in L1 with a
// 1 GiB guest on 1 GiB pages: 159 ms and 41 ms one after the other, 974 ms
// and 13.8 s beside the prefault. Both take milliseconds on their own.
// The KVM-VFIO device needs the VM, and a device joins it before it is
// opened (the kernel hands the VM to the device's driver at open, as QEMU
// orders it); DMA mapping pins guest RAM, so it waits for the prefault,
// whose NUMA binding must come before the first touch.
func (vm *VM) build(tl *timeline, roots hostRoots, in *bootInput) error {
	if err := tl.run("open KVM", vm.openKVM); err != nil {
		return err
	}
	if err := tl.run("KVM VM", vm.createKVMVM); err != nil {
		return err
	}
	if err := tl.run("vCPUs", vm.createVCPUs); err != nil {
		return err
	}
	ramReady := newGate()
	err := tl.concurrently(
		func() (err error) {
			defer func() { ramReady.open(err) }()
			return tl.run("guest RAM", vm.setUpRAM)
		},
		func() error {
			if err := tl.run("bind devices", func() error { return vm.prepareHostDevices(roots.sysRoot, roots.procRoot) }); err != nil {
				return err
			}
			if vm.dev.pt == nil {
				return nil
			}
			if err := vm.openPassthrough(tl); err != nil {
				return err
			}
			if err := ramReady.wait(); err != nil {
				return err
			}
			return tl.run("DMA-map guest RAM", vm.mapGuestRAM)
		},
	)
	if err != nil {
		return err
	}
	if err := tl.run("RAM memslots", vm.addRAMSlots); err != nil {
		return err
	}
	if err := tl.run("devices", vm.addDevices); err != nil {
		return err
	}
	if err := tl.run("image", vm.addPMEM); err != nil {
		return err
	}
	return tl.run("load kernel", func() error {
		kernel, err := in.kernel.wait()
		if err != nil {
			return err
		}
		return vm.loadKernel(kernel, in.initrd, in.ram)
	})
}

// setUpRAM reserves, binds and prefaults guest RAM before anything maps
// it, so a short hugepage pool fails here and not as a SIGBUS in the guest.
func (vm *VM) setUpRAM() error {
	memStart := time.Now()
	var err error
	vm.mem, err = guestmem.New(guestmem.Options{
		Size:         vm.cfg.Memory,
		PageSize:     vm.cfg.pageSize(),
		Node:         vm.place.node,
		PrefaultCPUs: vm.prefaultCPUs,
		Workers:      vm.prefaultWorkers,
		Progress:     vm.cfg.Progress,
	})
	if err != nil {
		return fmt.Errorf("guest RAM: %w", err)
	}
	if err := setupFault("guest RAM"); err != nil {
		return err
	}
	d, workers := vm.mem.PrefaultStats()
	vm.log.Info("guest RAM ready", "size", guestmem.FormatSize(vm.cfg.Memory), "page", vm.cfg.pageSize().String(),
		"prefault", d.Round(time.Millisecond), "workers", workers, "setup", time.Since(memStart).Round(time.Millisecond))
	return nil
}

// createKVMVM creates the KVM VM with its in-kernel interrupt controllers
// and PIT.
func (vm *VM) createKVMVM() error {
	var err error
	if vm.vm, err = vm.kvm.CreateVM(); err != nil {
		return err
	}
	if err := setupFault("create VM"); err != nil {
		return err
	}
	if err := vm.vm.SetTSSAddr(tssAddr); err != nil {
		return err
	}
	if err := vm.vm.SetIdentityMapAddr(identityMapAddr); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := vm.vm.CreateIRQChip(); err != nil {
		return err
	}
	if err := setupFault("create IRQ chip"); err != nil {
		return err
	}
	if err := vm.enableX2APIC(); err != nil {
		return err
	}
	vm.applyCPUMode()
	if err := vm.vm.CreatePIT2(); err != nil {
		return err
	}
	return setupFault("create PIT")
}

// createVCPUs creates every vCPU with its CPUID and MSRs; the BSP's boot
// registers come with the kernel (loadKernel).
func (vm *VM) createVCPUs() error {
	for i := 0; i < vm.cfg.CPUs; i++ {
		c, err := vm.newVCPU(i, vm.supported)
		if err != nil {
			return err
		}
		vm.cpus = append(vm.cpus, c)
	}
	return nil
}

// addRAMSlots gives KVM guest RAM, one memslot per region; the slots
// above them are the BAR mappings'.
func (vm *VM) addRAMSlots() error {
	for i, r := range vm.mem.Regions() {
		if err := vm.vm.SetUserMemoryRegion(uapi.UserspaceMemoryRegion{
			Slot: uint32(i), GuestPhysAddr: r.GPA, Memory: r.Data,
		}); err != nil {
			return err
		}
		if err := setupFault(fmt.Sprintf("RAM memslot %d", i)); err != nil {
			return err
		}
	}
	vm.dev.slots = &memslots{vm: vm.vm, next: uint32(len(vm.mem.Regions()))}
	return nil
}

// prepareHostDevices binds the passthrough devices to vfio-pci where
// asked and gives InfiniBand VFs their identities.
func (vm *VM) prepareHostDevices(sysRoot, procRoot string) error {
	if err := vm.bindDevices(sysRoot, procRoot); err != nil {
		return err
	}
	if err := setupFault("bind devices"); err != nil {
		return err
	}
	return vm.setVFIdentities(sysRoot, procRoot)
}

// loadKernel writes the kernel, initrd, command line, zero page and ACPI
// tables (which describe the devices, so they come last) into guest RAM
// and puts the BSP at the kernel's entry point.
func (vm *VM) loadKernel(kernel *boot.Kernel, initrd []byte, ram []boot.RAMRange) error {
	params := boot.Params{Kernel: kernel, Initrd: initrd, Cmdline: vm.cfg.Cmdline, RAM: ram, CPUs: vm.cfg.CPUs, MP: vm.mpOptions()}
	if !vm.cfg.NoACPI {
		var err error
		if params.ACPI, err = vm.acpiTables(vm.windows); err != nil {
			return fmt.Errorf("ACPI tables: %w", err)
		}
		// Linux uses MMCONFIG only where the firmware reserved it.
		params.Reserved = []boot.E820Entry{{Addr: addrspace.ECAMBase, Size: pci.ECAMSize}}
	}
	if r := vm.windows.PMEM; r.Size > 0 {
		params.PMEM = []boot.RAMRange{{GPA: r.GPA, Size: r.Size}}
	}
	bsp, err := boot.Load(vm.mem, params)
	if err != nil {
		return fmt.Errorf("load kernel: %w", err)
	}
	if err := setupFault("load kernel"); err != nil {
		return err
	}
	if err := setBootRegisters(vm.cpus[0].cpu, bsp); err != nil {
		return err
	}
	return setupFault("boot registers")
}
