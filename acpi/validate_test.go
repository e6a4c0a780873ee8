package acpi

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBuildRejectsBadPlatforms(t *testing.T) {
	cases := map[string]func(p *Platform){
		"no CPUs":            func(p *Platform) { p.CPUs = nil },
		"duplicate APIC IDs": func(p *Platform) { p.CPUs = []CPU{{APICID: 3}, {APICID: 3}} },
		"invalid x2APIC ID":  func(p *Platform) { p.CPUs = []CPU{{APICID: 0xffffffff}} },
		"too many CPUs": func(p *Platform) {
			p.CPUs = make([]CPU, MaxCPUs+1)
			for i := range p.CPUs {
				p.CPUs[i].APICID = uint32(i)
			}
		},
		"overlapping memory": func(p *Platform) {
			p.Memory = append(p.Memory, MemoryRange{Base: 0x200000, Size: 0x1000})
		},
		"empty memory range": func(p *Platform) { p.Memory[0].Size = 0 },
		"no memory for SRAT": func(p *Platform) { p.Memory = nil },
		"bus range":          func(p *Platform) { p.PCI.BusStart, p.PCI.BusEnd = 5, 4 },
		"ECAM unaligned":     func(p *Platform) { p.PCI.ECAMBase = 0xb0001000 },
		"ECAM wraps":         func(p *Platform) { p.PCI.ECAMBase = 0xfffffffffff00000 },
		"IO window > 64K":    func(p *Platform) { p.PCI.IO = Window{Base: 0x1000, Size: 0x10000} },
		"IO window on CF8":   func(p *Platform) { p.PCI.IO = Window{Base: 0xc00, Size: 0x400} },
		"MMIO32 past 4G":     func(p *Platform) { p.PCI.MMIO32 = Window{Base: 0xc0000000, Size: 0x80000000} },
		"MMIO64 wraps":       func(p *Platform) { p.PCI.MMIO64 = Window{Base: 1 << 63, Size: 1 << 63} },
		"no IOAPIC":          func(p *Platform) { p.IOAPIC = IOAPIC{} },
		"INTx off IOAPIC":    func(p *Platform) { p.PCI.INTxGSI = func(int, int) uint32 { return 24 } },
		"INTx on COM1 IRQ":   func(p *Platform) { p.PCI.INTxGSI = func(int, int) uint32 { return 4 } },
		"GED off IOAPIC":     func(p *Platform) { p.GED.GSI = 30 },
		"GED shares INTx":    func(p *Platform) { p.GED.GSI = 16 },
		"GED shares COM1":    func(p *Platform) { p.GED.GSI = 4 },
		"GED unaligned":      func(p *Platform) { p.GED.Base = 0xfed00002 },
		"ISA IRQ off IOAPIC": func(p *Platform) { p.IOAPIC.GSIBase = 16 },
		"sleep without status": func(p *Platform) {
			p.Sleep.StatusPort = 0
		},
		"S5 type":             func(p *Platform) { p.Sleep.S5Type = 8 },
		"mouse without i8042": func(p *Platform) { p.Legacy.I8042 = false },
		"distance diagonal":   func(p *Platform) { p.Distances = [][]uint8{{10, 20}, {20, 11}} },
		"distance remote":     func(p *Platform) { p.Distances = [][]uint8{{10, 10}, {20, 10}} },
		"distance ragged":     func(p *Platform) { p.Distances = [][]uint8{{10, 20}, {20}} },
		"distance too small":  func(p *Platform) { p.Distances = [][]uint8{{10}} },
		"too many nodes":      func(p *Platform) { p.CPUs[0].Node = maxNUMADomains },
		"OEM table ID":        func(p *Platform) { p.OEMTableID = "TOOLONGID" },
		"RSDP unaligned":      func(p *Platform) { p.RSDPAddr = 0xe0008 },
		"RSDP in tables":      func(p *Platform) { p.RSDPAddr = testBase + 0x100 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			p := testPlatform(4, 2, true)
			mutate(&p)
			_, err := Build(p, testBase)
			assert.Error(t, err)
		})
	}
	_, err := Build(testPlatform(1, 1, false), testBase+8)
	assert.Error(t, err, "unaligned base")
}

func TestBuildAcceptsVariations(t *testing.T) {
	p := testPlatform(2, 2, false)
	p.Distances = [][]uint8{{10, 21}, {21, 10}}
	p.OEMTableID = "VM0001"
	p.PCI.INTxGSI = func(slot, pin int) uint32 { return 20 + uint32(pin) }
	p.Legacy.COM1 = false
	ts, err := Build(p, testBase)
	require.NoError(t, err)
	checkTables(t, p, ts)
	slit, ok := ts.Find("SLIT")
	require.True(t, ok)
	assert.Equal(t, []byte{2, 0, 0, 0, 0, 0, 0, 0, 10, 21, 21, 10}, slit.Data[HeaderLen:])
	assert.Equal(t, "VM0001  ", string(slit.Data[16:24]))
}

func TestDefaultINTxGSI(t *testing.T) {
	assert.EqualValues(t, 16, DefaultINTxGSI(0, 0))
	assert.EqualValues(t, 17, DefaultINTxGSI(0, 1))
	assert.EqualValues(t, 16, DefaultINTxGSI(7, 1))
	assert.EqualValues(t, 23, DefaultINTxGSI(31, 0))
}

// TestMADTAndSRATEntries decodes the per-CPU and memory entries of the 300
// vCPU, 2-node platform: APIC IDs up to 254 in type 0 entries, 255 and up
// in x2APIC entries, UIDs and proximity domains as given.
func TestMADTAndSRATEntries(t *testing.T) {
	p := testPlatform(300, 2, true)
	ts, err := Build(p, testBase)
	require.NoError(t, err)
	apic, _ := ts.Find("APIC")
	seen := map[uint32]uint32{} // APIC ID -> UID
	for off := HeaderLen + 8; off < len(apic.Data); off += int(apic.Data[off+1]) {
		e := apic.Data[off:]
		switch e[0] {
		case 0:
			require.EqualValues(t, 8, e[1])
			assert.Less(t, e[3], byte(255))
			assert.EqualValues(t, 1, le32(e[4:]), "enabled")
			seen[uint32(e[3])] = uint32(e[2])
		case 9:
			require.EqualValues(t, 16, e[1])
			assert.GreaterOrEqual(t, le32(e[4:]), uint32(255))
			assert.EqualValues(t, 1, le32(e[8:]), "enabled")
			seen[le32(e[4:])] = le32(e[12:])
		case 1:
			assert.EqualValues(t, 0xfec00000, le32(e[4:]))
		case 2:
			assert.Equal(t, []byte{2, 10, 0, 0, 2, 0, 0, 0, 0, 0}, []byte(e[:10]))
		}
	}
	require.Len(t, seen, 300)
	for id, uid := range seen {
		assert.Equal(t, id, uid)
	}

	srat, _ := ts.Find("SRAT")
	nodes := map[uint32]uint32{}
	var mem [][3]uint64
	for off := HeaderLen + 12; off < len(srat.Data); off += int(srat.Data[off+1]) {
		e := srat.Data[off:]
		switch e[0] {
		case 0:
			nodes[uint32(e[3])] = uint32(e[2]) | uint32(e[9])<<8 | uint32(e[10])<<16 | uint32(e[11])<<24
		case 2:
			nodes[le32(e[8:])] = le32(e[4:])
		case 1:
			mem = append(mem, [3]uint64{uint64(le32(e[2:])), le64(e[8:]), le64(e[16:])})
			assert.EqualValues(t, 1, le32(e[28:]), "enabled")
		}
	}
	for _, c := range p.CPUs {
		assert.Equal(t, c.Node, nodes[c.APICID], "APIC ID %d", c.APICID)
	}
	require.Len(t, mem, len(p.Memory))
	for i, m := range p.Memory {
		assert.Equal(t, [3]uint64{uint64(m.Node), m.Base, m.Size}, mem[i])
	}
}

// smtCPUs numbers n CPUs as a mirrored two-thread topology does: every
// core's first thread (APIC IDs 0, 2, 4, ...) before the second threads
// (1, 3, 5, ...), as Linux numbers a host's CPUs.
func smtCPUs(n int) []CPU {
	cpus := make([]CPU, n)
	for i := range cpus {
		if i < n/2 {
			cpus[i].APICID = uint32(2 * i)
		} else {
			cpus[i].APICID = uint32(2*(i-n/2) + 1)
		}
	}
	return cpus
}

// madtCPUs decodes the per-CPU MADT entries: entry type, APIC ID and UID
// of each, in table order.
func madtCPUs(t *testing.T, ts Tables) (types []byte, ids, uids []uint32, nmiTypes []byte) {
	apic, ok := ts.Find("APIC")
	require.True(t, ok)
	for off := HeaderLen + 8; off < len(apic.Data); off += int(apic.Data[off+1]) {
		e := apic.Data[off:]
		require.NotZero(t, e[1])
		switch e[0] {
		case 0:
			types, ids, uids = append(types, 0), append(ids, uint32(e[3])), append(uids, uint32(e[2]))
		case 9:
			types, ids, uids = append(types, 9), append(ids, le32(e[4:])), append(uids, le32(e[12:]))
		case 4, 10:
			nmiTypes = append(nmiTypes, e[0])
		}
	}
	return types, ids, uids, nmiTypes
}

// TestMADTBeyond254CPUs builds the tables of 255, 256, 288 and 1024 vCPUs,
// flat (APIC ID = index) and SMT-mirrored (first threads, then second
// threads): every CPU is in the MADT and SRAT exactly once with UID = its
// index; xAPIC-range IDs get Local APIC entries while their UIDs fit 8
// bits, and once one would not (SMT order past 255 CPUs), every CPU is an
// x2APIC entry, with the x2APIC NMI entry only.
func TestMADTBeyond254CPUs(t *testing.T) {
	for _, n := range []int{255, 256, 288, 1024} {
		for _, layout := range []string{"flat", "smt"} {
			t.Run(fmt.Sprintf("%d-%s", n, layout), func(t *testing.T) {
				p := testPlatform(n, 1, true)
				if layout == "smt" {
					p.CPUs = smtCPUs(n)
				}
				ts, err := Build(p, testBase)
				require.NoError(t, err)
				types, ids, uids, nmi := madtCPUs(t, ts)
				require.Len(t, ids, n)
				onlyX2 := allX2APIC(p.CPUs)
				assert.Equal(t, layout == "smt" && n > 256, onlyX2, "all-x2APIC only when a UID would overflow")
				for i := range ids {
					assert.Equal(t, p.CPUs[i].APICID, ids[i], "entry %d", i)
					assert.EqualValues(t, i, uids[i], "UID = index")
					want := byte(9)
					if ids[i] <= MaxXAPICID && !onlyX2 {
						want = 0
					}
					assert.Equal(t, want, types[i], "entry type of APIC ID %d", ids[i])
				}
				var wantNMI []byte
				if !onlyX2 {
					wantNMI = append(wantNMI, 4)
				}
				if slices.Contains(types, 9) {
					wantNMI = append(wantNMI, 10)
				}
				assert.Equal(t, wantNMI, nmi)

				srat, _ := ts.Find("SRAT")
				sratIDs := map[uint32]byte{}
				for off := HeaderLen + 12; off < len(srat.Data); off += int(srat.Data[off+1]) {
					e := srat.Data[off:]
					switch e[0] {
					case 0:
						sratIDs[uint32(e[3])] = 0
					case 2:
						sratIDs[le32(e[8:])] = 9
					}
				}
				require.Len(t, sratIDs, n)
				for i, id := range ids {
					assert.Equal(t, types[i], sratIDs[id], "SRAT entry type of APIC ID %d follows the MADT's", id)
				}
			})
		}
	}
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
func le64(b []byte) uint64 { return uint64(le32(b)) | uint64(le32(b[4:]))<<32 }
