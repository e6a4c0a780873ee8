package acpi

import (
	"encoding/binary"
	"fmt"
)

// HeaderLen is the size of the System Description Table header (§5.2.6).
const HeaderLen = 36

// Identity of the tables' creator, written into every header.
const (
	oemID           = "HPCVMM"
	defaultOEMTable = "HPCVMM"
	creatorID       = "HPCV"
	creatorRevision = 1
	oemRevision     = 1
)

// header holds the per-table fields of the System Description Table header
// (§5.2.6); the length and checksum are computed by Table.
type header struct {
	Signature  string // 4 characters, e.g. "APIC"
	Revision   uint8
	OEMTableID string // up to 8 characters, space padded
}

// table serializes hdr in front of body, filling in the length and the
// checksum byte that makes all bytes of the table sum to zero.
func table(hdr header, oemTableID string, body []byte) ([]byte, error) {
	if len(hdr.Signature) != 4 {
		return nil, fmt.Errorf("acpi: table signature %q is not 4 characters", hdr.Signature)
	}
	if len(oemTableID) > 8 {
		return nil, fmt.Errorf("acpi: OEM table ID %q longer than 8 characters", oemTableID)
	}
	b := make([]byte, HeaderLen, HeaderLen+len(body))
	copy(b[0:4], hdr.Signature)
	binary.LittleEndian.PutUint32(b[4:], uint32(HeaderLen+len(body)))
	b[8] = hdr.Revision
	copy(b[10:16], padRight(oemID, 6))
	copy(b[16:24], padRight(oemTableID, 8))
	binary.LittleEndian.PutUint32(b[24:], oemRevision)
	copy(b[28:32], creatorID)
	binary.LittleEndian.PutUint32(b[32:], creatorRevision)
	b = append(b, body...)
	b[9] = checksum(b)
	return b, nil
}

// padRight pads s with spaces to n bytes, as OEM IDs are by convention.
func padRight(s string, n int) []byte {
	b := []byte(s)
	for len(b) < n {
		b = append(b, ' ')
	}
	return b
}

// checksum returns the byte that, added to the sum of b (whose checksum
// byte must be zero while summing), makes it zero modulo 256.
func checksum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return -s
}

// RSDP layout (§5.2.5.3), revision 2: the ACPI 1.0 part (20 bytes, covered
// by the first checksum) and the extended part (36 bytes, covered by the
// extended checksum).
const (
	RSDPLen      = 36
	rsdpV1Len    = 20
	rsdpRevision = 2
)

// rsdp returns the Root System Description Pointer for an XSDT at xsdt. The
// RSDT address stays zero: an OS reads the XSDT when the revision is 2 or
// more (Linux: acpi_tb_parse_root_table).
func rsdp(xsdt uint64) []byte {
	b := make([]byte, RSDPLen)
	copy(b[0:8], "RSD PTR ")
	copy(b[9:15], padRight(oemID, 6))
	b[15] = rsdpRevision
	binary.LittleEndian.PutUint32(b[20:], RSDPLen)
	binary.LittleEndian.PutUint64(b[24:], xsdt)
	b[8] = checksum(b[:rsdpV1Len])
	b[32] = checksum(b)
	return b
}

// xsdt lists the 64-bit addresses of the tables other than the DSDT, which
// the FADT points at (§5.2.8).
func xsdt(oemTableID string, addrs []uint64) ([]byte, error) {
	var body []byte
	for _, a := range addrs {
		body = binary.LittleEndian.AppendUint64(body, a)
	}
	return table(header{Signature: "XSDT", Revision: 1}, oemTableID, body)
}

// gas is a Generic Address Structure (§5.2.3.2): where a fixed register
// lives.
type gas struct {
	Space     RegionSpace // SystemMemory or SystemIO
	BitWidth  uint8
	BitOffset uint8
	// AccessSize: 1 byte, 2 word, 3 dword, 4 qword access.
	AccessSize uint8
	Address    uint64
}

// ioByteRegister is the gas of an 8-bit I/O port accessed bytewise.
func ioByteRegister(port uint16) gas {
	return gas{Space: SystemIO, BitWidth: 8, AccessSize: 1, Address: uint64(port)}
}

// put writes the 12-byte structure at the start of dst.
func (g gas) put(dst []byte) {
	dst[0], dst[1], dst[2], dst[3] = byte(g.Space), g.BitWidth, g.BitOffset, g.AccessSize
	binary.LittleEndian.PutUint64(dst[4:12], g.Address)
}

// FADT layout, revision 6 (§5.2.9, Table 5.9): 276 bytes.
const (
	fadtLen            = 276
	fadtRevision       = 6
	fadtMinorRevision  = 5 // ACPI 6.5: the layout is unchanged since 6.0
	fadtIAPCBootArch   = 109
	fadtFlags          = 112
	fadtResetReg       = 116
	fadtResetValue     = 128
	fadtMinorVersion   = 131
	fadtXDSDT          = 140
	fadtSleepControl   = 244
	fadtSleepStatus    = 256
	fadtHypervisorID   = 268
	fadtPreferredPMPrf = 45
)

// FADT Fixed Feature Flags (§5.2.9, Table 5.10).
const (
	fadtWBINVD         = 1 << 0
	fadtPowerButton    = 1 << 4 // no fixed-feature power button
	fadtSleepButton    = 1 << 5 // no fixed-feature sleep button
	fadtResetRegSup    = 1 << 10
	fadtHWReducedACPI  = 1 << 20
	pmProfileEntServer = 4 // Preferred_PM_Profile: Enterprise Server
)

// IA-PC Boot Architecture Flags (§5.2.9.3, Table 5.11).
const (
	bootArch8042      = 1 << 1 // an 8042 at 0x60/0x64: Linux probes the i8042
	bootArchNoVGA     = 1 << 2 // do not probe VGA: the guest has none
	bootArchNoCMOSRTC = 1 << 5 // no CMOS RTC at 0x70: Linux then skips it
)

// fadtConfig is what the FADT says about the platform.
type fadtConfig struct {
	oemTableID  string
	dsdt        uint64
	reset       *gas // nil: no reset register
	resetValue  uint8
	sleepCtl    *gas // nil: no sleep registers (no S5 via ACPI)
	sleepStatus *gas
	i8042       bool
	cmosRTC     bool
}

// fadt builds a hardware-reduced FADT (§4.1, §5.2.9): no PM1/GPE blocks, no
// SCI, no FACS; the OS powers off through the sleep control register and
// resets through the reset register. The hypervisor vendor identity field
// is the 8-byte "HPCVMM" padded with NULs (§5.2.9: any vendor-chosen
// value).
func fadt(c fadtConfig) ([]byte, error) {
	b := make([]byte, fadtLen-HeaderLen)
	at := func(off int) []byte { return b[off-HeaderLen:] }
	at(fadtPreferredPMPrf)[0] = pmProfileEntServer
	// DSDT (32-bit) stays zero: X_DSDT wins and Linux warns when both are
	// set and disagree.
	flags := uint32(fadtWBINVD | fadtPowerButton | fadtSleepButton | fadtHWReducedACPI)
	if c.reset != nil {
		flags |= fadtResetRegSup
		c.reset.put(at(fadtResetReg))
		at(fadtResetValue)[0] = c.resetValue
	}
	binary.LittleEndian.PutUint32(at(fadtFlags), flags)
	var arch uint16 = bootArchNoVGA
	if c.i8042 {
		arch |= bootArch8042
	}
	if !c.cmosRTC {
		arch |= bootArchNoCMOSRTC
	}
	binary.LittleEndian.PutUint16(at(fadtIAPCBootArch), arch)
	at(fadtMinorVersion)[0] = fadtMinorRevision
	binary.LittleEndian.PutUint64(at(fadtXDSDT), c.dsdt)
	if c.sleepCtl != nil {
		c.sleepCtl.put(at(fadtSleepControl))
		c.sleepStatus.put(at(fadtSleepStatus))
	}
	copy(at(fadtHypervisorID), oemID)
	return table(header{Signature: "FACP", Revision: fadtRevision}, c.oemTableID, b)
}

// MCFG (PCI Firmware Specification 3.2 §4.1.2): 8 reserved bytes, then one
// 16-byte allocation per ECAM region.
func mcfg(oemTableID string, ecamBase uint64, busStart, busEnd uint8) ([]byte, error) {
	body := make([]byte, 8, 8+16)
	body = binary.LittleEndian.AppendUint64(body, ecamBase) // address of bus 0
	body = binary.LittleEndian.AppendUint16(body, 0)        // PCI segment group
	body = append(body, busStart, busEnd, 0, 0, 0, 0)
	return table(header{Signature: "MCFG", Revision: 1}, oemTableID, body)
}
