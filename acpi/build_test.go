package acpi

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// testPlatform is a VM with ncpu vCPUs (APIC IDs 0..ncpu-1) split evenly
// over nodes NUMA nodes of 1 GiB each, with or without a 64-bit window.
func testPlatform(ncpu, nodes int, mmio64 bool) Platform {
	p := Platform{
		RSDPAddr: 0xe0000,
		IOAPIC:   IOAPIC{ID: 0, Addr: 0xfec00000, Pins: 24},
		PCI: PCIHostBridge{
			ECAMBase: 0xb0000000, BusEnd: 0xff,
			IO:     Window{Base: 0x1000, Size: 0xf000},
			MMIO32: Window{Base: 0xc0000000, Size: 0x3ec00000},
		},
		ISAIRQ0ToGSI2: true,
		Reset:         ResetRegister{Port: 0x3c0, Value: 1},
		Sleep:         SleepRegisters{ControlPort: 0x3c1, StatusPort: 0x3c2, S5Type: 5},
		GED:           &GED{Base: 0xfed00000, GSI: 9},
		Legacy:        LegacyDevices{COM1: true, I8042: true, PS2Mouse: true, CMOSRTC: true},
	}
	if mmio64 {
		p.PCI.MMIO64 = Window{Base: 0x80_0000_0000, Size: 0x80_0000_0000}
	}
	for i := range ncpu {
		p.CPUs = append(p.CPUs, CPU{APICID: uint32(i), Node: uint32(i * nodes / ncpu)})
	}
	p.Memory = []MemoryRange{{Base: 0, Size: 0xa0000}, {Base: 0x100000, Size: 1<<30 - 0x100000}}
	for n := 1; n < nodes; n++ {
		p.Memory = append(p.Memory, MemoryRange{Base: uint64(n) << 32, Size: 1 << 30, Node: uint32(n)})
	}
	return p
}

// platformVariants are the table sets the structural test and the iasl
// disassembly run over: 1, 255 and 300 vCPUs (300 has x2APIC entries), with
// and without a 64-bit window, 1 and 2 NUMA nodes, and a minimal platform
// with the RSDP in the blob, no NUMA tables and ECAM above 4 GiB.
func platformVariants() map[string]Platform {
	v := map[string]Platform{}
	for _, ncpu := range []int{1, 255, 300} {
		for _, nodes := range []int{1, 2} {
			for _, w64 := range []bool{false, true} {
				name := seqName("cpus", ncpu) + seqName("-nodes", nodes) + map[bool]string{false: "-no64", true: "-mmio64"}[w64]
				v[name] = testPlatform(ncpu, nodes, w64)
			}
		}
	}
	smt := testPlatform(288, 1, true)
	smt.CPUs = smtCPUs(288) // x2APIC entries only (allX2APIC)
	v["cpus288-smt-x2apic-only"] = smt
	m := testPlatform(4, 1, true)
	m.RSDPAddr = 0
	m.NoNUMATables = true
	m.GED = nil
	m.Reset = ResetRegister{}
	m.Sleep = SleepRegisters{}
	m.Legacy = LegacyDevices{}
	m.ISAIRQ0ToGSI2 = false
	m.PCI.IO = Window{}
	m.PCI.ECAMBase = 0x40_0000_0000
	v["minimal-rsdp-in-blob"] = m
	return v
}

const testBase = 0x7ff00000

func TestBuildStructure(t *testing.T) {
	for name, p := range platformVariants() {
		t.Run(name, func(t *testing.T) {
			ts, err := Build(p, testBase)
			require.NoError(t, err)
			checkTables(t, p, ts)
		})
	}
}

func checkTables(t *testing.T, p Platform, ts Tables) {
	end := ts.Base + uint64(len(ts.Blob))
	// RSDP: both checksums, XSDT address.
	r := ts.RSDP.Data
	require.Len(t, r, RSDPLen)
	assert.Equal(t, "RSD PTR ", string(r[:8]))
	assert.Zero(t, sum(r[:20]), "RSDP checksum")
	assert.Zero(t, sum(r), "RSDP extended checksum")
	assert.EqualValues(t, 2, r[15])
	if p.RSDPAddr != 0 {
		assert.Equal(t, p.RSDPAddr, ts.RSDP.Addr)
	} else {
		assert.Equal(t, ts.Base, ts.RSDP.Addr)
	}
	xsdt, ok := ts.Find("XSDT")
	require.True(t, ok)
	assert.Equal(t, xsdt.Addr, binary.LittleEndian.Uint64(r[24:]))

	// Every table: inside the blob, not overlapping, checksum, length.
	var prevEnd uint64
	for _, tb := range ts.Tables {
		assert.GreaterOrEqual(t, tb.Addr, ts.Base, tb.Signature)
		assert.GreaterOrEqual(t, tb.Addr, prevEnd, "%s overlaps the previous table", tb.Signature)
		assert.LessOrEqual(t, tb.Addr+uint64(len(tb.Data)), end, tb.Signature)
		prevEnd = tb.Addr + uint64(len(tb.Data))
		assert.Equal(t, tb.Data, ts.Blob[tb.Addr-ts.Base:][:len(tb.Data)], "%s in blob", tb.Signature)
		if tb.Signature == "RSD PTR " {
			continue
		}
		assert.Equal(t, tb.Signature, string(tb.Data[:4]))
		assert.EqualValues(t, len(tb.Data), binary.LittleEndian.Uint32(tb.Data[4:]), tb.Signature)
		assert.Zero(t, sum(tb.Data), "%s checksum", tb.Signature)
		assert.Equal(t, "HPCVMM", string(tb.Data[10:16]))
	}

	// XSDT lists every table but itself, the DSDT and the RSDP.
	var listed []uint64
	for off := HeaderLen; off < len(xsdt.Data); off += 8 {
		listed = append(listed, binary.LittleEndian.Uint64(xsdt.Data[off:]))
	}
	var want []uint64
	for _, tb := range ts.Tables {
		switch tb.Signature {
		case "XSDT", "DSDT", "RSD PTR ":
		default:
			want = append(want, tb.Addr)
		}
	}
	assert.Equal(t, want, listed)

	// FADT: revision 6, 276 bytes, X_DSDT, flags, registers.
	fadt, ok := ts.Find("FACP")
	require.True(t, ok)
	require.Len(t, fadt.Data, 276)
	assert.EqualValues(t, 6, fadt.Data[8])
	dsdt, ok := ts.Find("DSDT")
	require.True(t, ok)
	assert.EqualValues(t, 2, dsdt.Data[8], "DSDT revision 2: 64-bit integers")
	assert.Equal(t, dsdt.Addr, binary.LittleEndian.Uint64(fadt.Data[140:]))
	assert.Zero(t, binary.LittleEndian.Uint32(fadt.Data[40:]), "32-bit DSDT")
	flags := binary.LittleEndian.Uint32(fadt.Data[112:])
	assert.NotZero(t, flags&(1<<20), "HW_REDUCED_ACPI")
	assert.Equal(t, p.Reset.Port != 0, flags&(1<<10) != 0, "RESET_REG_SUP")
	assert.EqualValues(t, p.Reset.Port, binary.LittleEndian.Uint64(fadt.Data[120:]))
	assert.Equal(t, p.Reset.Value, fadt.Data[128])
	arch := binary.LittleEndian.Uint16(fadt.Data[109:])
	assert.Equal(t, p.Legacy.I8042, arch&2 != 0, "8042 flag")
	assert.Equal(t, !p.Legacy.CMOSRTC, arch&(1<<5) != 0, "CMOS RTC not present")
	assert.EqualValues(t, p.Sleep.ControlPort, binary.LittleEndian.Uint64(fadt.Data[248:]))
	assert.EqualValues(t, p.Sleep.StatusPort, binary.LittleEndian.Uint64(fadt.Data[260:]))

	// MADT entries.
	apic, ok := ts.Find("APIC")
	require.True(t, ok)
	assert.EqualValues(t, 0xfee00000, binary.LittleEndian.Uint32(apic.Data[36:]))
	counts := map[byte]int{}
	for off := HeaderLen + 8; off < len(apic.Data); off += int(apic.Data[off+1]) {
		require.NotZero(t, apic.Data[off+1])
		counts[apic.Data[off]]++
	}
	xapic := 0
	if !allX2APIC(p.CPUs) {
		for _, c := range p.CPUs {
			if c.APICID <= MaxXAPICID {
				xapic++
			}
		}
	}
	assert.Equal(t, xapic, counts[0], "Local APIC entries")
	assert.Equal(t, len(p.CPUs)-xapic, counts[9], "Local x2APIC entries")
	assert.Equal(t, 1, counts[1], "IOAPIC")
	assert.Equal(t, map[bool]int{true: 1}[p.ISAIRQ0ToGSI2], counts[2], "IRQ0 override")
	assert.Equal(t, min(1, xapic), counts[4], "Local APIC NMI")
	assert.Equal(t, min(1, len(p.CPUs)-xapic), counts[10], "Local x2APIC NMI")

	_, hasSRAT := ts.Find("SRAT")
	_, hasSLIT := ts.Find("SLIT")
	assert.Equal(t, !p.NoNUMATables, hasSRAT)
	assert.Equal(t, !p.NoNUMATables, hasSLIT)
}

func sum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return s
}
