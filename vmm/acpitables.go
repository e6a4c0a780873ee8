package vmm

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/acpi"
	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/platform"
)

// guestNode is the guest's one NUMA proximity domain: all guest RAM and
// every vCPU are bound to one host node (placement), so the guest has one
// node, and the host bridge (with every passed-through device) is in it,
// which is where the host's device is too.
const guestNode = 0

// acpiPlatform describes this VM to the ACPI table builder: the vCPUs'
// APIC IDs from the CPU topology, RAM from the address-space model, the
// PCIe host bridge with ECAM and the BAR windows, the hardware-reduced
// power registers and the GED power button (shutdown.go), the legacy
// devices the guest uses.
func (vm *VM) acpiPlatform(w addrspace.Windows) acpi.Platform {
	p := acpi.Platform{
		RSDPAddr: boot.ACPIAreaStart,
		IOAPIC:   acpi.IOAPIC{ID: 0, Addr: boot.IOAPICAddr, GSIBase: 0, Pins: boot.IOAPICPins},
		PCI: acpi.PCIHostBridge{
			// Only the buses that exist (pci.Root.LastBus says why); the
			// e820 reservation still covers all of ECAM, so the guest
			// never places anything in the rest.
			ECAMBase: addrspace.ECAMBase, BusStart: 0, BusEnd: vm.dev.pci.LastBus(),
			IO:     acpi.Window{Base: w.IO.GPA, Size: w.IO.Size},
			MMIO32: acpi.Window{Base: w.Mem32.GPA, Size: w.Mem32.Size},
			MMIO64: acpi.Window{Base: w.Mem64.GPA, Size: w.Mem64.Size},
			Node:   guestNode,
			// Every slot's INTx pins arrive on the slot's one IOAPIC pin,
			// as the passthrough devices are wired (intxPin).
			INTxGSI: func(slot, _ int) uint32 { return uint32(intxPin(slot)) },
		},
		Reset: acpi.ResetRegister{Port: platform.ACPIResetPort, Value: platform.ACPIResetValue},
		Sleep: acpi.SleepRegisters{ControlPort: platform.ACPISleepControlPort, StatusPort: platform.ACPISleepStatusPort,
			S5Type: platform.ACPISleepTypeS5},
		GED:    &acpi.GED{Base: addrspace.GEDBase, GSI: gedGSI},
		Legacy: acpi.LegacyDevices{COM1: true, I8042: true, CMOSRTC: true},
	}
	for _, v := range vm.topology.VCPUs {
		p.CPUs = append(p.CPUs, acpi.CPU{APICID: v.APICID, Node: guestNode})
	}
	for _, r := range addrspace.RAM(vm.cfg.Memory) {
		p.Memory = append(p.Memory, acpi.MemoryRange{Base: r.GPA, Size: r.Size, Node: guestNode})
	}
	return p
}

// acpiTables builds the tables for boot.Load: the RSDP at the start of the
// BIOS area, the rest right after it.
func (vm *VM) acpiTables(w addrspace.Windows) (*boot.ACPI, error) {
	t, err := acpi.Build(vm.acpiPlatform(w), boot.ACPIAreaStart+acpi.RSDPLen+12) // 16-byte aligned after the RSDP
	if err != nil {
		return nil, err
	}
	return &boot.ACPI{RSDPAddr: t.RSDP.Addr, Regions: []boot.ACPIRegion{
		{GPA: t.RSDP.Addr, Data: t.RSDP.Data},
		{GPA: t.Base, Data: t.Blob},
	}}, nil
}

// chooseTopology decides the guest's CPU topology: the pinned host CPUs'
// (cputopo.Mirror) unless the Config asks for a flat one, the guest has no
// ACPI (the MP table numbers APIC IDs 0..n-1) or vCPUs share host CPUs. A host whose topology cannot
// be read gets a flat guest, with a warning.
func (vm *VM) chooseTopology(h *host.Host) (cputopo.Topology, error) {
	if len(vm.cfg.APICIDs) > 0 {
		return cputopo.WithAPICIDs(vm.cfg.APICIDs)
	}
	if vm.cfg.NoACPI || vm.cfg.Topology == TopologyFlat {
		return cputopo.Flat(vm.cfg.CPUs)
	}
	if !distinctCPUs(vm.place.vcpuCPUs) {
		// Two vCPUs on one host CPU take turns; shown as SMT siblings
		// they would mislead the guest's scheduler (cputopo.Mirror).
		vm.log.Info("vCPUs share host CPUs: the guest gets a flat topology (single-thread cores), not the host's")
		return cputopo.Flat(vm.cfg.CPUs)
	}
	tops, err := h.CPUTopologies(vm.place.vcpuCPUs)
	if err != nil {
		vm.log.Warn("host CPU topology unreadable: the guest gets a flat one (--topology flat)", "err", err)
		return cputopo.Flat(vm.cfg.CPUs)
	}
	cpus := make([]cputopo.HostCPU, len(tops))
	for i, t := range tops {
		cpus[i] = cputopo.HostCPU{CPU: t.CPU, Package: t.Package, Core: t.Core, LLC: t.LLC}
	}
	top, err := cputopo.Mirror(cpus)
	if err != nil {
		return top, err
	}
	packages := map[int]bool{}
	for _, v := range top.VCPUs {
		packages[v.Package] = true
	}
	vm.log.Info("guest CPU topology mirrors the host's", "threads_per_core", top.ThreadsPerCore,
		"packages", len(packages), "apic_ids", fmt.Sprint(top.APICIDs()))
	return top, nil
}
