package boot

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type mpCPU struct {
	APICID, Version, Flags uint8
}

type mpIntr struct {
	Type            uint8
	Flags           uint16
	SrcBus, SrcIRQ  uint8
	DstAPIC, DstPin uint8
}

type mpTable struct {
	CfgAddr    uint32
	LAPIC      uint32
	Length     int
	Entries    int
	CPUs       []mpCPU
	Buses      map[uint8]string
	IOAPICID   uint8
	IOAPICVer  uint8
	IOAPICAddr uint32
	IOAPICs    int
	Intrs      []mpIntr
	LIntrs     []mpIntr
}

func sum8(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return s
}

// parseMPTable decodes an MP table the way Linux's mpparse.c does: find the
// floating pointer, check both checksums, then walk the typed entries.
func parseMPTable(t *testing.T, mem *fakeMem, addr uint64) mpTable {
	t.Helper()
	le := binary.LittleEndian
	mpf, err := mem.Slice(addr, 16)
	require.NoError(t, err)
	require.Equal(t, "_MP_", string(mpf[:4]))
	require.Equal(t, byte(1), mpf[8], "floating pointer length in paragraphs")
	require.Equal(t, byte(4), mpf[9], "spec revision 1.4")
	require.Zero(t, sum8(mpf), "floating pointer checksum")
	require.Zero(t, mpf[11], "feature byte 1: a configuration table is present")

	var tab mpTable
	tab.CfgAddr = le.Uint32(mpf[4:])
	hdr, err := mem.Slice(uint64(tab.CfgAddr), 44)
	require.NoError(t, err)
	require.Equal(t, "PCMP", string(hdr[:4]))
	tab.Length = int(le.Uint16(hdr[4:]))
	require.Equal(t, byte(4), hdr[6])
	tab.Entries = int(le.Uint16(hdr[34:]))
	tab.LAPIC = le.Uint32(hdr[36:])
	cfg, err := mem.Slice(uint64(tab.CfgAddr), uint64(tab.Length))
	require.NoError(t, err)
	require.Zero(t, sum8(cfg), "configuration table checksum")

	tab.Buses = map[uint8]string{}
	off := 44
	lastType := byte(0)
	for n := 0; n < tab.Entries; n++ {
		require.Less(t, off, tab.Length, "entry %d starts past the table", n)
		e := cfg[off:]
		require.GreaterOrEqual(t, e[0], lastType, "entries must be sorted by type")
		lastType = e[0]
		switch e[0] {
		case 0:
			tab.CPUs = append(tab.CPUs, mpCPU{APICID: e[1], Version: e[2], Flags: e[3]})
			off += 20
		case 1:
			tab.Buses[e[1]] = string(e[2:8])
			off += 8
		case 2:
			tab.IOAPICs++
			tab.IOAPICID, tab.IOAPICVer = e[1], e[2]
			assert.Equal(t, byte(1), e[3]&1, "IOAPIC enabled")
			tab.IOAPICAddr = le.Uint32(e[4:])
			off += 8
		case 3, 4:
			in := mpIntr{Type: e[1], Flags: le.Uint16(e[2:]), SrcBus: e[4], SrcIRQ: e[5], DstAPIC: e[6], DstPin: e[7]}
			if e[0] == 3 {
				tab.Intrs = append(tab.Intrs, in)
			} else {
				tab.LIntrs = append(tab.LIntrs, in)
			}
			off += 8
		default:
			t.Fatalf("unknown MP entry type %d at offset %d", e[0], off)
		}
	}
	require.Equal(t, tab.Length, off, "base table length matches the entries")
	return tab
}

func TestWriteMPTable(t *testing.T) {
	for _, cpus := range []int{1, 4} {
		t.Run(fmt.Sprintf("%dcpu", cpus), func(t *testing.T) {
			mem := newFakeMem(1 << 20)
			require.NoError(t, WriteMPTable(mem, 0x9fc00, cpus))
			tab := parseMPTable(t, mem, 0x9fc00)

			assert.Equal(t, uint32(0x9fc10), tab.CfgAddr)
			assert.Equal(t, uint32(0xfee00000), tab.LAPIC)
			require.Len(t, tab.CPUs, cpus)
			for i, c := range tab.CPUs {
				assert.Equal(t, uint8(i), c.APICID)
				assert.Equal(t, uint8(1), c.Flags&1, "cpu %d enabled", i)
				assert.Equal(t, i == 0, c.Flags&2 != 0, "only cpu 0 is the BSP")
				assert.NotZero(t, c.Version)
			}
			assert.Equal(t, map[uint8]string{0: "ISA   "}, tab.Buses)
			assert.Equal(t, 1, tab.IOAPICs)
			assert.Equal(t, uint8(cpus), tab.IOAPICID)
			assert.Equal(t, uint8(0x11), tab.IOAPICVer)
			assert.Equal(t, uint32(0xfec00000), tab.IOAPICAddr)

			require.Len(t, tab.Intrs, 16)
			for irq, in := range tab.Intrs {
				// KVM's default routing sends GSI n to IOAPIC pin n; the
				// in-kernel PIT raises GSI 0.
				assert.Equal(t, mpIntr{Type: MPIntINT, SrcBus: 0, SrcIRQ: uint8(irq), DstAPIC: uint8(cpus), DstPin: uint8(irq)}, in)
			}
			assert.Equal(t, []mpIntr{
				{Type: MPIntExtINT, DstAPIC: 0xff, DstPin: 0},
				{Type: MPIntNMI, DstAPIC: 0xff, DstPin: 1},
			}, tab.LIntrs)
			assert.Equal(t, MPTableSize(cpus, MPOptions{}), 16+tab.Length)
			// 1 and 4 CPUs fit the 1 KiB EBDA slot.
			assert.LessOrEqual(t, 0x9fc00+16+tab.Length, 0xa0000)
		})
	}
}

func TestWriteMPTableOptions(t *testing.T) {
	mem := newFakeMem(1 << 20)
	opts := MPOptions{
		IRQ0Pin: 2,
		Buses:   []MPBus{{ID: 1, Type: "PCI"}},
		Interrupts: []MPInterrupt{
			{Type: MPIntINT, Flags: MPPolarityActiveLow | MPTriggerLevel, SrcBus: 1, SrcIRQ: 3 << 2 /* device 3, INTA */, DstPin: 16},
		},
	}
	require.NoError(t, WriteMPTableWithOptions(mem, 0x9fc00, 2, opts))
	tab := parseMPTable(t, mem, 0x9fc00)
	assert.Equal(t, map[uint8]string{0: "ISA   ", 1: "PCI   "}, tab.Buses)
	// IRQ 0 on pin 2, no entry for the cascade IRQ 2, then the PCI entry.
	require.Len(t, tab.Intrs, 16)
	assert.Equal(t, mpIntr{Type: MPIntINT, SrcIRQ: 0, DstAPIC: 2, DstPin: 2}, tab.Intrs[0])
	assert.Equal(t, mpIntr{Type: MPIntINT, SrcIRQ: 1, DstAPIC: 2, DstPin: 1}, tab.Intrs[1])
	assert.Equal(t, mpIntr{Type: MPIntINT, SrcIRQ: 3, DstAPIC: 2, DstPin: 3}, tab.Intrs[2])
	assert.Equal(t, mpIntr{Type: MPIntINT, Flags: 0xf, SrcBus: 1, SrcIRQ: 12, DstAPIC: 2, DstPin: 16}, tab.Intrs[15])
	assert.Equal(t, MPTableSize(2, opts), 16+tab.Length)
}

func TestWriteMPTableMaxCPUs(t *testing.T) {
	// 254 vCPUs spill past the 1 KiB EBDA slot into the reserved legacy hole;
	// the table must still be well formed.
	mem := newFakeMem(1 << 20)
	require.NoError(t, WriteMPTable(mem, 0x9fc00, MaxCPUs))
	tab := parseMPTable(t, mem, 0x9fc00)
	assert.Len(t, tab.CPUs, MaxCPUs)
	assert.Equal(t, uint8(MaxCPUs), tab.IOAPICID)
	assert.Less(t, 0x9fc00+16+tab.Length, 0x100000)
}

func TestWriteMPTableRejects(t *testing.T) {
	mem := newFakeMem(1 << 20)
	cases := []struct {
		name string
		addr uint64
		cpus int
		opts MPOptions
		want string
	}{
		{"zero cpus", 0x9fc00, 0, MPOptions{}, "0 vCPUs is outside 1..254"},
		{"255 cpus", 0x9fc00, 255, MPOptions{}, "255 vCPUs"},
		{"unaligned", 0x9fc08, 1, MPOptions{}, "not 16-byte aligned"},
		{"outside memory", 0xffff0, 4, MPOptions{}, "outside RAM"},
		{"irq0 pin", 0x9fc00, 1, MPOptions{IRQ0Pin: 1}, "pin 0 or 2"},
		{"dup bus", 0x9fc00, 1, MPOptions{Buses: []MPBus{{ID: 0, Type: "PCI"}}}, "used twice"},
		{"long bus type", 0x9fc00, 1, MPOptions{Buses: []MPBus{{ID: 1, Type: "PCIEXPR"}}}, "1 to 6 characters"},
		{"unknown bus", 0x9fc00, 1, MPOptions{Interrupts: []MPInterrupt{{SrcBus: 3}}}, "source bus 3"},
		{"bad pin", 0x9fc00, 1, MPOptions{Interrupts: []MPInterrupt{{DstPin: 24}}}, "pin 24"},
		{"bad type", 0x9fc00, 1, MPOptions{Interrupts: []MPInterrupt{{Type: 4}}}, "type 4"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := WriteMPTableWithOptions(mem, tc.addr, tc.cpus, tc.opts)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestWriteMPTablePCIBusZero checks the layout Linux needs for PCI INTx: PCI
// bus 0 as MP bus 0 (Linux compares the device's bus number with the MP bus
// ID), ISA moved to ID 1 with its IRQ and local interrupt entries following.
func TestWriteMPTablePCIBusZero(t *testing.T) {
	mem := newFakeMem(1 << 20)
	opts := MPOptions{
		ISABus: 1,
		Buses:  []MPBus{{ID: 0, Type: "PCI"}},
		Interrupts: []MPInterrupt{
			{Type: MPIntINT, Flags: MPPolarityActiveLow | MPTriggerLevel, SrcBus: 0, SrcIRQ: 8 << 2, DstPin: 16},
		},
	}
	require.NoError(t, WriteMPTableWithOptions(mem, 0x9fc00, 1, opts))
	tab := parseMPTable(t, mem, 0x9fc00)
	assert.Equal(t, map[uint8]string{1: "ISA   ", 0: "PCI   "}, tab.Buses)
	require.Len(t, tab.Intrs, 17)
	for irq := 0; irq < 16; irq++ {
		assert.Equal(t, uint8(1), tab.Intrs[irq].SrcBus, "ISA IRQ %d's source bus", irq)
	}
	assert.Equal(t, mpIntr{Type: MPIntINT, Flags: 0xf, SrcBus: 0, SrcIRQ: 32, DstAPIC: 1, DstPin: 16}, tab.Intrs[16])
	for _, l := range tab.LIntrs {
		assert.Equal(t, uint8(1), l.SrcBus, "local interrupt entries name the ISA bus")
	}
	assert.ErrorContains(t, WriteMPTableWithOptions(mem, 0x9fc00, 1, MPOptions{ISABus: 1, Buses: []MPBus{{ID: 1, Type: "PCI"}}}), "used twice")
}
