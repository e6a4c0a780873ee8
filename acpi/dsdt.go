package acpi

// Legacy devices' fixed resources (PC/AT).
const (
	com1Port     = 0x3f8
	com1IRQ      = 4
	i8042Data    = 0x60
	i8042Command = 0x64
	i8042KbdIRQ  = 1
	i8042AuxIRQ  = 12
	rtcPort      = 0x70
	rtcIRQ       = 8
	pciConfigIO  = 0xcf8 // configuration mechanism #1: 0xcf8-0xcff
	ecamBusShift = 20    // 1 MiB of ECAM per bus
)

// PCIeOSCUUID is the _OSC UUID of PCI host bridges (PCI Firmware
// Specification 3.3 §4.5.1).
const PCIeOSCUUID = "33db4d5b-1ff7-401c-9657-7441c03dd766"

// _OSC status bits in capabilities DWORD 1 (ACPI §6.2.11).
const (
	oscUnrecognizedUUID     = 1 << 2
	oscUnrecognizedRevision = 1 << 3
)

// GEDPowerButton is the bit of the GED event register that reports a
// power button press (see GED).
const GEDPowerButton = 1 << 0

// notifyButtonPressed is the notify value of a button device (§4.8.3.1).
const notifyButtonPressed = 0x80

// dsdtTerms returns the DSDT body for p, which Build has validated.
func dsdtTerms(p *Platform) []Term {
	sb := []Term{pciHostBridge(p), motherboardResources(p)}
	if p.Legacy.COM1 {
		sb = append(sb, Device("COM1",
			Name("_HID", eisaID("PNP0501")),
			Name("_UID", Zero),
			Name("_CRS", ResourceTemplate(
				IO{Decode16: true, Min: com1Port, Max: com1Port, Length: 8},
				IRQNoFlags{IRQs: []uint8{com1IRQ}},
			))))
	}
	if p.Legacy.I8042 {
		sb = append(sb, Device("PS2K",
			Name("_HID", eisaID("PNP0303")),
			Name("_CRS", ResourceTemplate(
				IO{Decode16: true, Min: i8042Data, Max: i8042Data, Length: 1},
				IO{Decode16: true, Min: i8042Command, Max: i8042Command, Length: 1},
				IRQNoFlags{IRQs: []uint8{i8042KbdIRQ}},
			))))
		if p.Legacy.PS2Mouse {
			sb = append(sb, Device("PS2M",
				Name("_HID", eisaID("PNP0F13")),
				Name("_CRS", ResourceTemplate(IRQNoFlags{IRQs: []uint8{i8042AuxIRQ}}))))
		}
	}
	if p.Legacy.CMOSRTC {
		sb = append(sb, Device("RTC",
			Name("_HID", eisaID("PNP0B00")),
			Name("_CRS", ResourceTemplate(
				IO{Decode16: true, Min: rtcPort, Max: rtcPort, Length: 2},
				IRQNoFlags{IRQs: []uint8{rtcIRQ}},
			))))
	}
	if p.GED != nil {
		sb = append(sb, powerButton(), ged(p.GED))
	}
	terms := []Term{Scope(`\_SB`, sb...)}
	if p.Sleep.ControlPort != 0 {
		// \_S5: SLP_TYPa, SLP_TYPb (§7.4.2); an OS writes SLP_TYPa to
		// the sleep control register to power off.
		s5 := Integer(p.Sleep.S5Type)
		terms = append(terms, Name(`\_S5`, Package(s5, s5, Zero, Zero)))
	}
	return terms
}

// pciHostBridge is \_SB.PCI0, the PCIe root complex (PCI Firmware
// Specification §4.1.1): its bus range, the config-mechanism ports, the
// windows it forwards, INTx routing and _OSC.
func pciHostBridge(p *Platform) Term {
	pci := &p.PCI
	crs := []Resource{
		WordBusNumber(uint16(pci.BusStart), uint16(pci.BusEnd)),
		IO{Decode16: true, Min: pciConfigIO, Max: pciConfigIO, Alignment: 1, Length: 8},
	}
	if w := pci.IO; w.Size != 0 {
		crs = append(crs, WordIO(uint16(w.Base), uint16(w.Base+w.Size-1)))
	}
	if w := pci.MMIO32; w.Size != 0 {
		crs = append(crs, DWordMemory(uint32(w.Base), uint32(w.Base+w.Size-1), NonCacheable, true))
	}
	if w := pci.MMIO64; w.Size != 0 {
		// Cacheable (not Prefetchable) as QEMU: Linux then places
		// prefetchable and non-prefetchable 64-bit BARs in it.
		crs = append(crs, QWordMemory(w.Base, w.Base+w.Size-1, Cacheable, true))
	}
	terms := []Term{
		Name("_HID", eisaID("PNP0A08")), // PCI Express root bridge
		Name("_CID", eisaID("PNP0A03")), // compatible: PCI root bridge
		Name("_SEG", Zero),
		Name("_UID", Zero),
		Name("_BBN", Integer(pci.BusStart)),
	}
	if !p.NoNUMATables {
		terms = append(terms, Name("_PXM", Integer(pci.Node)))
	}
	return Device("PCI0", append(terms,
		Name("_CRS", ResourceTemplate(crs...)),
		Name("_PRT", pciRouting(pci)),
		pciOSC(),
	)...)
}

// pciRouting is _PRT (§6.2.13): for every device slot 0-31 and pin INTA-
// INTD, the GSI it raises. With Source Zero the entry names a GSI directly,
// which Linux programs level triggered and active low, as PCI INTx is.
func pciRouting(pci *PCIHostBridge) Term {
	entries := make([]Term, 0, 32*4)
	for slot := range 32 {
		for pin := range 4 {
			entries = append(entries, Package(
				Integer(uint64(slot)<<16|0xffff), // _ADR: any function of slot
				Integer(pin),
				Zero,
				Integer(pci.intxGSI(slot, pin)),
			))
		}
	}
	return Package(entries...)
}

// pciOSC grants every control the OS requests: the VMM emulates neither
// firmware-first error handling nor firmware hotplug, so native PCIe
// hotplug, PME, AER and capability-structure control all belong to the OS.
// Without _OSC Linux keeps those services off. DWORD 3 (control) is
// returned as the OS wrote it; an unknown UUID or revision is flagged in
// DWORD 1.
func pciOSC() Term {
	return Method("_OSC", 4, false,
		CreateDWordField(Arg(3), Zero, "CDW1"),
		If(LEqual(Arg(0), UUID(PCIeOSCUUID)),
			If(LNotEqual(Arg(1), One),
				Or(Path("CDW1"), Integer(oscUnrecognizedRevision), Path("CDW1"))),
		),
		Else(Or(Path("CDW1"), Integer(oscUnrecognizedUUID), Path("CDW1"))),
		Return(Arg(3)),
	)
}

// motherboardResources is \_SB.MBRD (PNP0C02), reserving the ECAM region:
// Linux uses MCFG only when its region lies in such a motherboard resource
// ("MMCONFIG ... reserved in ACPI motherboard resources", pci_mmcfg).
func motherboardResources(p *Platform) Term {
	pci := &p.PCI
	base := pci.ECAMBase + uint64(pci.BusStart)<<ecamBusShift
	size := uint64(int(pci.BusEnd)-int(pci.BusStart)+1) << ecamBusShift
	var r Resource
	if base+size <= 1<<32 {
		r = Memory32Fixed{Writable: true, Base: uint32(base), Length: uint32(size)}
	} else {
		q := QWordMemory(base, base+size-1, NonCacheable, true)
		q.Consumer = true
		r = q
	}
	return Device("MBRD",
		Name("_HID", eisaID("PNP0C02")),
		Name("_UID", Zero),
		Name("_CRS", ResourceTemplate(r)),
	)
}

// powerButton is \_SB.PWRB, a control-method power button (§4.8.3.1.2):
// hardware-reduced ACPI has no fixed-feature button, so GED notifies it.
func powerButton() Term {
	return Device("PWRB",
		Name("_HID", eisaID("PNP0C0C")),
		Name("_UID", Zero),
	)
}

// ged is \_SB.GED0, the Generic Event Device (§5.6.9): on its interrupt the
// OS runs _EVT, which reads the event register and notifies the devices
// whose bits are set. Its _CRS holds only the interrupt: Linux's GED driver
// (drivers/acpi/evged.c) rejects other resources. The register is mapped
// through an OperationRegion instead.
func ged(g *GED) Term {
	return Device("GED0",
		Name("_HID", String("ACPI0013")),
		Name("_UID", Zero),
		Name("_CRS", ResourceTemplate(Interrupt{
			Consumer: true, EdgeTriggered: true, GSIs: []uint32{g.GSI},
		})),
		OperationRegion("GDST", SystemMemory, Integer(g.Base), Integer(GEDRegisterLen)),
		Field("GDST", DWordAcc, false, Preserve, FieldUnit{"GDAT", 32}),
		Method("_EVT", 1, true,
			Store(Path("GDAT"), Local(0)),
			If(And(Local(0), Integer(GEDPowerButton), nil),
				Notify(Path(`\_SB.PWRB`), Integer(notifyButtonPressed))),
		),
	)
}
