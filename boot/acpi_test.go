package boot

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadACPIReplacesMPTable(t *testing.T) {
	rsdp := []byte("RSD PTR \x00")
	tables := []byte("XSDT....")
	ecam := E820Entry{Addr: 0xe0000000, Size: 0x10000000}
	ram := []RAMRange{{0, testRAM}, {4 << 30, 1 << 30}}
	mem, _ := loadSynth(t, Params{RAM: ram, CPUs: 300, Reserved: []E820Entry{ecam},
		ACPI: &ACPI{RSDPAddr: 0xe0000, Regions: []ACPIRegion{{0xe0000, rsdp}, {0xe0040, tables}}}})
	assert.Equal(t, uint64(0xe0000), mem.u64(ZeroPageAddr+bpACPIRSDPAddr), "boot_params.acpi_rsdp_addr")
	assert.Equal(t, rsdp, mem.ram[0xe0000:0xe0000+len(rsdp)])
	assert.Equal(t, tables, mem.ram[0xe0040:0xe0040+len(tables)])
	assert.True(t, allZero(mem.ram[MPTableAddr:MPTableAddr+16]), "no MP table: 300 vCPUs would not fit one")

	// e820: the ECAM window is reserved, in address order between low and high RAM.
	n := int(mem.u8(ZeroPageAddr + bpE820Entries))
	var got []E820Entry
	for i := range n {
		e := uint64(ZeroPageAddr + bpE820Table + i*e820EntrySize)
		got = append(got, E820Entry{Addr: mem.u64(e), Size: mem.u64(e + 8), Type: mem.u32(e + 16)})
	}
	require.Len(t, got, 5)
	assert.Equal(t, E820Entry{Addr: 0xe0000000, Size: 0x10000000, Type: E820Reserved}, got[3])
	assert.Equal(t, uint64(4<<30), got[4].Addr)
	for i := 1; i < len(got); i++ {
		assert.LessOrEqual(t, got[i-1].End(), got[i].Addr, "sorted, not overlapping")
	}
}

func TestACPIPlacementIsValidated(t *testing.T) {
	p := Params{Kernel: synthKernel(t, nil), RAM: []RAMRange{{0, testRAM}}, CPUs: 1}
	p.ACPI = &ACPI{RSDPAddr: 0xe0008}
	assert.ErrorContains(t, Check(p, 0), "16-byte aligned")
	p.ACPI = &ACPI{RSDPAddr: 0xe0000, Regions: []ACPIRegion{{0xf0000, make([]byte, 0x10001)}}}
	assert.ErrorContains(t, Check(p, 0), "do not fit")
	p.ACPI = &ACPI{RSDPAddr: 0xe0000, Regions: []ACPIRegion{{0x9f000, make([]byte, 16)}}}
	assert.ErrorContains(t, Check(p, 0), "do not fit")
	p.ACPI.Regions = []ACPIRegion{{0xe0000, make([]byte, ACPIAreaSize)}}
	assert.NoError(t, Check(p, 0))
}
