package vmm

import (
	"fmt"
	"strings"

	"github.com/hpcvmm/hpcvmm/acpi"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// maxXAPICID is the largest APIC ID an xAPIC (8-bit, 0xff broadcast)
// addresses; vCPUs above it exist only in x2APIC mode, and the MADT lists
// them as x2APIC entries.
const maxXAPICID = acpi.MaxXAPICID

// needsX2APIC reports whether some vCPU's APIC ID is beyond the xAPIC range:
// then KVM's x2APIC API is on (enableX2APIC, or New failed), the guest is
// offered the extended destination ID and starts in x2APIC mode.
func (vm *VM) needsX2APIC() bool { return vm.topology.MaxAPICID() > maxXAPICID }

// enableX2APIC prepares KVM for vCPUs with APIC IDs above 254, before any
// vCPU exists (KVM refuses the capability after): 32-bit APIC IDs in MSI
// routes and no 0xff broadcast quirk. The guest then learns of KVM's
// extended destination ID (guestCPUID) and addresses MSIs to any vCPU;
// irqRouter translates them.
//
// IOAPIC-routed interrupts (the UART, the ACPI GED, PCI INTx) are the
// limit: KVM's in-kernel IOAPIC takes only the 8-bit destination of a
// redirection entry and drops the extended bits Linux puts beside it, so
// such an interrupt aimed at a vCPU above 254 would go astray. hpcvmm keeps
// the in-kernel IOAPIC (a userspace one would put every legacy interrupt
// through hpcvmm) and instead keeps those interrupts on low vCPUs: it adds
// irqaffinity= with the vCPUs whose APIC IDs fit 8 bits to the guest's
// command line, which is where Linux places every interrupt it does not
// spread itself; MSI-X queues, which it does spread, work on every vCPU.
func (vm *VM) enableX2APIC() error {
	if !vm.needsX2APIC() {
		return nil
	}
	if err := vm.vm.EnableCap(uapi.CapX2APICAPI, uapi.X2APICAPIUse32BitIDs|uapi.X2APICAPIDisableBroadcastQuirk); err != nil {
		return fmt.Errorf("vCPUs with APIC IDs above %d need KVM's x2APIC API (KVM_CAP_X2APIC_API, Linux 4.7+): %w", maxXAPICID, err)
	}
	vm.log.Info("x2APIC: KVM takes 32-bit APIC IDs; the guest gets the extended MSI destination ID",
		"max_apic_id", vm.topology.MaxAPICID(), "irqaffinity", vm.lowAPICCPUs())
	return nil
}

// IA32_APIC_BASE (MSR 0x1b) bits.
const (
	msrIA32APICBase = 0x1b
	apicBaseBSP     = 1 << 8
	apicBaseX2APIC  = 1 << 10 // EXTD
	apicBaseEnable  = 1 << 11
	apicBaseDefault = 0xfee00000
)

// x2APICBaseMSR starts a vCPU with its local APIC already in x2APIC mode,
// as firmware does for a machine with APIC IDs above 254 (SeaBIOS, OVMF):
// Linux parses the MADT before it would switch to x2APIC itself, and while
// it still runs the xAPIC driver it drops every x2APIC entry above 254 as
// invalid ("x2apic entry ignored"), so without this the guest never sees
// those vCPUs. Seeing x2APIC enabled at entry, it keeps x2APIC mode.
func x2APICBaseMSR(bsp bool) uapi.MSREntry {
	v := uint64(apicBaseDefault | apicBaseEnable | apicBaseX2APIC)
	if bsp {
		v |= apicBaseBSP
	}
	return uapi.MSREntry{Index: msrIA32APICBase, Data: v}
}

// lowAPICCPUs lists, in the guest's CPU numbering (vCPU index: the MADT
// order), the vCPUs an 8-bit IOAPIC destination reaches.
func (vm *VM) lowAPICCPUs() string {
	var cpus []string
	for i, v := range vm.topology.VCPUs {
		if v.APICID <= maxXAPICID {
			cpus = append(cpus, fmt.Sprint(i))
		}
	}
	return strings.Join(cpus, ",")
}

// withIRQAffinity adds irqaffinity= for a guest with vCPUs above the xAPIC
// range, unless the command line already sets it.
func (vm *VM) withIRQAffinity(cmdline string) string {
	if !vm.needsX2APIC() || strings.Contains(cmdline, "irqaffinity=") {
		return cmdline
	}
	return strings.TrimSpace(cmdline + " irqaffinity=" + vm.lowAPICCPUs())
}
