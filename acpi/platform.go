package acpi

import (
	"errors"
	"fmt"
	"slices"
)

// CPU is one vCPU: its local APIC ID and its NUMA proximity domain. Its
// index in Platform.CPUs is its ACPI processor UID.
type CPU struct {
	APICID uint32
	Node   uint32
}

// MemoryRange is guest RAM [Base, Base+Size) in proximity domain Node.
type MemoryRange struct {
	Base, Size   uint64
	Node         uint32
	Hotpluggable bool
}

// Window is an address range [Base, Base+Size); Size 0 means none.
type Window struct {
	Base, Size uint64
}

func (w Window) end() uint64 { return w.Base + w.Size }

// IOAPIC is the I/O APIC the MADT declares.
type IOAPIC struct {
	ID      uint8
	Addr    uint32 // MMIO base, 0xfec00000 on a PC
	GSIBase uint32 // GSI of pin 0
	Pins    uint32 // redirection entries: 24 for KVM's IOAPIC
}

// PCIHostBridge describes the PCIe root complex \_SB.PCI0 and its ECAM.
type PCIHostBridge struct {
	// ECAMBase is the address of bus 0's configuration space; buses
	// BusStart..BusEnd take 1 MiB each from there.
	ECAMBase         uint64
	BusStart, BusEnd uint8
	// IO is the I/O port window forwarded to PCI (below 0x10000, not
	// covering the 0xcf8-0xcff configuration ports).
	IO Window
	// MMIO32 is the memory window below 4 GiB.
	MMIO32 Window
	// MMIO64 is the memory window above 4 GiB; Size 0 leaves it out.
	MMIO64 Window
	// Node is the host bridge's proximity domain (_PXM).
	Node uint32
	// INTxGSI returns the GSI that INTx pin (0-3 for INTA-INTD) of device
	// slot (0-31) raises. Nil means DefaultINTxGSI.
	INTxGSI func(slot, pin int) uint32
}

// DefaultINTxGSI is the PC-style swizzle over IOAPIC pins 16-23: INTA of
// slot s on GSI 16+s%8, each next pin one further, so neighbouring slots
// spread over the pins (vmm's intxPin for INTA).
func DefaultINTxGSI(slot, pin int) uint32 { return uint32(16 + (slot+pin)%8) }

func (p *PCIHostBridge) intxGSI(slot, pin int) uint32 {
	if p.INTxGSI == nil {
		return DefaultINTxGSI(slot, pin)
	}
	return p.INTxGSI(slot, pin)
}

// ResetRegister is the FADT reset register (§4.8.3.6): an 8-bit write of
// Value to I/O port Port must reset the VM. Linux tries it first on reboot
// (reboot=acpi, the default order) and falls back to the i8042. Port 0
// leaves it out.
type ResetRegister struct {
	Port  uint16
	Value uint8
}

// SleepRegisters are the hardware-reduced sleep registers (§4.8.3.7), each
// an 8-bit I/O port; ControlPort 0 leaves them and \_S5 out.
//
// Sleep control: the OS writes SLP_EN (bit 5) | SLP_TYP << 2 (bits 2-4);
// a write with SLP_EN set and SLP_TYP equal to S5Type must power the VM
// off. Linux writes 0x20|S5Type<<2 (acpi_hw_extended_sleep).
//
// Sleep status: bit 7 is WAK_STS, which the OS clears by writing 1 before
// sleeping; a VM that never wakes reads it as 0. Linux requires both
// registers for S5 on hardware-reduced ACPI. They may share one port.
type SleepRegisters struct {
	ControlPort uint16
	StatusPort  uint16
	S5Type      uint8 // 0-7; 5 is conventional
}

// Sleep control register bits (§4.8.3.7).
const (
	SleepEnable    = 1 << 5
	SleepTypeShift = 2
	WakeStatus     = 1 << 7
)

// GEDRegisterLen is the size of the GED event register.
const GEDRegisterLen = 4

// GED is the Generic Event Device (ACPI0013) that delivers the power
// button.
//
// Event register: 32 bits at Base (SystemMemory), read with 32-bit
// accesses. A read returns the pending events and clears them (read to
// clear); writes are ignored. Bit 0 (GEDPowerButton) is a power button
// press; other bits are reserved and read 0. To raise an event the VMM sets
// its bit and then signals an edge on GSI (edge triggered, active high,
// exclusive); the guest's _EVT reads the register and notifies
// \_SB.PWRB with 0x80 for bit 0.
type GED struct {
	Base uint64
	GSI  uint32
}

// LegacyDevices selects the PC legacy devices the DSDT declares, at their
// fixed PC/AT resources.
type LegacyDevices struct {
	COM1     bool // 16550 UART, ports 0x3f8-0x3ff, ISA IRQ 4
	I8042    bool // keyboard controller, ports 0x60/0x64, ISA IRQ 1; sets FADT's 8042 flag
	PS2Mouse bool // i8042 auxiliary port, ISA IRQ 12 (with I8042)
	CMOSRTC  bool // MC146818 RTC, ports 0x70-0x71, ISA IRQ 8; clear sets FADT's "CMOS RTC not present"
}

// Platform describes the VM that the tables describe.
type Platform struct {
	// OEMTableID goes into every header (up to 8 characters); empty
	// means "HPCVMM".
	OEMTableID string
	// RSDPAddr is where the caller puts the RSDP: 16-byte aligned, e.g.
	// in the BIOS scan area 0xe0000-0xfffff and/or passed to Linux in
	// boot_params.acpi_rsdp_addr. Zero puts it at the start of the blob.
	RSDPAddr uint64
	// CPUs lists the vCPUs, boot CPU first (UID = index). When a CPU with
	// an APIC ID up to MaxXAPICID comes after the first 255, whose UIDs
	// fit a Local APIC entry, every CPU gets x2APIC entries.
	CPUs []CPU
	// Memory lists guest RAM for the SRAT (required unless NoNUMATables).
	Memory []MemoryRange
	// Distances is the SLIT matrix over proximity domains 0..N-1: 10 on
	// the diagonal, more than 10 elsewhere. Nil means 10 local and 20
	// remote over the domains CPUs, memory and the host bridge use.
	Distances [][]uint8
	// NoNUMATables leaves out SRAT, SLIT and _PXM.
	NoNUMATables bool
	IOAPIC       IOAPIC
	// ISAIRQ0ToGSI2 adds the PC's Interrupt Source Override of ISA IRQ 0
	// (the PIT) to GSI 2. Leave it false when the VMM keeps KVM's default
	// routing of GSI 0 to IOAPIC pin 0 (boot's MP table default).
	ISAIRQ0ToGSI2 bool
	PCI           PCIHostBridge
	Reset         ResetRegister
	Sleep         SleepRegisters
	// GED adds the Generic Event Device and the power button; nil
	// leaves both out.
	GED    *GED
	Legacy LegacyDevices
}

// MaxCPUs is the largest vCPU count Build accepts: the largest
// KVM_MAX_VCPUS x86 KVM can be configured with.
const MaxCPUs = 4096

// maxX2APICID: 0xffffffff is the invalid x2APIC ID Linux skips.
const maxX2APICID = 0xfffffffe

// validate reports the first inconsistency of p.
func (p *Platform) validate() error {
	if len(p.OEMTableID) > 8 {
		return fmt.Errorf("OEM table ID %q longer than 8 characters", p.OEMTableID)
	}
	for i := 0; i < len(p.OEMTableID); i++ {
		if c := p.OEMTableID[i]; c < 0x20 || c > 0x7e {
			return fmt.Errorf("OEM table ID %q is not printable ASCII", p.OEMTableID)
		}
	}
	if p.RSDPAddr%16 != 0 {
		return fmt.Errorf("RSDP address %#x is not 16-byte aligned", p.RSDPAddr)
	}
	if err := p.validateCPUs(); err != nil {
		return err
	}
	if err := p.validateMemory(); err != nil {
		return err
	}
	if err := p.validatePCI(); err != nil {
		return err
	}
	if err := p.validateInterrupts(); err != nil {
		return err
	}
	if p.Sleep.ControlPort != 0 && p.Sleep.StatusPort == 0 {
		return errors.New("sleep control port without a sleep status port: Linux needs both for S5")
	}
	if p.Sleep.S5Type > 7 {
		return fmt.Errorf("S5 sleep type %d does not fit SLP_TYP's 3 bits", p.Sleep.S5Type)
	}
	if p.GED != nil && (p.GED.Base == 0 || p.GED.Base%4 != 0) {
		return fmt.Errorf("GED register base %#x is zero or not 4-byte aligned", p.GED.Base)
	}
	if p.Legacy.PS2Mouse && !p.Legacy.I8042 {
		return errors.New("PS/2 mouse without the i8042")
	}
	return p.validateNUMA()
}

func (p *Platform) validateCPUs() error {
	if len(p.CPUs) == 0 {
		return errors.New("no CPUs")
	}
	if len(p.CPUs) > MaxCPUs {
		return fmt.Errorf("%d CPUs, at most %d", len(p.CPUs), MaxCPUs)
	}
	seen := make(map[uint32]int, len(p.CPUs))
	for i, c := range p.CPUs {
		if j, dup := seen[c.APICID]; dup {
			return fmt.Errorf("CPUs %d and %d share APIC ID %d", j, i, c.APICID)
		}
		seen[c.APICID] = i
		if c.APICID > maxX2APICID {
			return fmt.Errorf("CPU %d: APIC ID %#x is the invalid x2APIC ID", i, c.APICID)
		}
	}
	return nil
}

func (p *Platform) validateMemory() error {
	if len(p.Memory) == 0 && !p.NoNUMATables {
		return errors.New("no memory ranges for the SRAT")
	}
	sorted := slices.Clone(p.Memory)
	for i, m := range sorted {
		if m.Size == 0 || m.Base+m.Size < m.Base {
			return fmt.Errorf("memory range %d [%#x, +%#x) is empty or wraps", i, m.Base, m.Size)
		}
	}
	slices.SortFunc(sorted, func(a, b MemoryRange) int {
		if a.Base < b.Base {
			return -1
		}
		if a.Base > b.Base {
			return 1
		}
		return 0
	})
	for i := 1; i < len(sorted); i++ {
		if a, b := sorted[i-1], sorted[i]; b.Base < a.Base+a.Size {
			return fmt.Errorf("memory ranges [%#x, %#x) and [%#x, %#x) overlap", a.Base, a.Base+a.Size, b.Base, b.Base+b.Size)
		}
	}
	return nil
}

func (p *Platform) validatePCI() error {
	pci := &p.PCI
	if pci.BusStart > pci.BusEnd {
		return fmt.Errorf("PCI bus range %d-%d is empty", pci.BusStart, pci.BusEnd)
	}
	if pci.ECAMBase == 0 || pci.ECAMBase%(1<<ecamBusShift) != 0 {
		return fmt.Errorf("ECAM base %#x is zero or not 1 MiB aligned", pci.ECAMBase)
	}
	if end := pci.ECAMBase + uint64(pci.BusEnd+1)<<ecamBusShift; end < pci.ECAMBase {
		return fmt.Errorf("ECAM at %#x for buses up to %d wraps", pci.ECAMBase, pci.BusEnd)
	}
	for _, w := range []struct {
		name  string
		win   Window
		limit uint64
	}{
		{"I/O", pci.IO, 1 << 16},
		{"32-bit MMIO", pci.MMIO32, 1 << 32},
		{"64-bit MMIO", pci.MMIO64, 0},
	} {
		if w.win.Size == 0 {
			continue
		}
		if w.win.end() < w.win.Base || w.win.end() == 0 || w.limit != 0 && w.win.end() > w.limit {
			return fmt.Errorf("PCI %s window [%#x, +%#x) wraps or exceeds %#x", w.name, w.win.Base, w.win.Size, w.limit)
		}
	}
	if w := pci.IO; w.Size != 0 && w.Base < pciConfigIO+8 && w.end() > pciConfigIO {
		return fmt.Errorf("PCI I/O window [%#x, %#x) covers the configuration ports 0xcf8-0xcff", w.Base, w.end())
	}
	return nil
}

// validateInterrupts checks that every GSI the tables name is an IOAPIC
// pin and that the GED's edge interrupt is not shared.
func (p *Platform) validateInterrupts() error {
	io := p.IOAPIC
	if io.Addr == 0 || io.Pins == 0 || io.Pins > 240 {
		return fmt.Errorf("IOAPIC at %#x with %d pins: want an address and 1-240 pins", io.Addr, io.Pins)
	}
	onIOAPIC := func(gsi uint32) bool { return gsi >= io.GSIBase && gsi-io.GSIBase < io.Pins }
	used := map[uint32]string{}
	isa := func(on bool, irq uint32, what string) {
		if on {
			used[irq] = what
		}
	}
	isa(p.ISAIRQ0ToGSI2, 2, "ISA IRQ 0 (PIT)")
	isa(p.Legacy.COM1, com1IRQ, "COM1")
	isa(p.Legacy.I8042, i8042KbdIRQ, "i8042 keyboard")
	isa(p.Legacy.PS2Mouse, i8042AuxIRQ, "i8042 mouse")
	isa(p.Legacy.CMOSRTC, rtcIRQ, "RTC")
	for gsi, what := range used {
		if !onIOAPIC(gsi) {
			return fmt.Errorf("%s on GSI %d: not an IOAPIC pin (GSI base %d, %d pins)", what, gsi, io.GSIBase, io.Pins)
		}
	}
	for slot := range 32 {
		for pin := range 4 {
			gsi := p.PCI.intxGSI(slot, pin)
			if !onIOAPIC(gsi) {
				return fmt.Errorf("PCI slot %d INT%c on GSI %d: not an IOAPIC pin", slot, 'A'+pin, gsi)
			}
			if what, ok := used[gsi]; ok && what != "PCI INTx" {
				return fmt.Errorf("PCI slot %d INT%c on GSI %d, which %s uses", slot, 'A'+pin, gsi, what)
			}
			used[gsi] = "PCI INTx"
		}
	}
	if g := p.GED; g != nil {
		if !onIOAPIC(g.GSI) {
			return fmt.Errorf("GED on GSI %d: not an IOAPIC pin", g.GSI)
		}
		if what, ok := used[g.GSI]; ok {
			return fmt.Errorf("GED on GSI %d, which %s uses", g.GSI, what)
		}
	}
	return nil
}

// numaDomains is one more than the largest proximity domain in use.
func (p *Platform) numaDomains() int {
	n := p.PCI.Node
	for _, c := range p.CPUs {
		n = max(n, c.Node)
	}
	for _, m := range p.Memory {
		n = max(n, m.Node)
	}
	return int(n) + 1
}

// maxNUMADomains bounds the default SLIT (N×N bytes).
const maxNUMADomains = 1024

func (p *Platform) validateNUMA() error {
	if p.NoNUMATables {
		return nil
	}
	n := p.numaDomains()
	if p.Distances == nil {
		if n > maxNUMADomains {
			return fmt.Errorf("proximity domain %d: at most %d domains", n-1, maxNUMADomains)
		}
		return nil
	}
	if len(p.Distances) < n {
		return fmt.Errorf("distance matrix covers %d domains, proximity domain %d is in use", len(p.Distances), n-1)
	}
	for i, row := range p.Distances {
		if len(row) != len(p.Distances) {
			return fmt.Errorf("distance matrix row %d has %d entries, want %d", i, len(row), len(p.Distances))
		}
		for j, d := range row {
			// §5.2.17: 10 is local; 0-9 are reserved. Linux's slit_valid
			// also wants every remote distance above 10.
			if i == j && d != slitLocalDistance || i != j && d <= slitLocalDistance {
				return fmt.Errorf("distance %d→%d is %d: want 10 on the diagonal and more than 10 elsewhere", i, j, d)
			}
		}
	}
	return nil
}

// distances returns p.Distances or the default matrix.
func (p *Platform) distances() [][]uint8 {
	if p.Distances != nil {
		return p.Distances
	}
	n := p.numaDomains()
	d := make([][]uint8, n)
	for i := range d {
		d[i] = make([]uint8, n)
		for j := range d[i] {
			d[i][j] = 20
		}
		d[i][i] = slitLocalDistance
	}
	return d
}
