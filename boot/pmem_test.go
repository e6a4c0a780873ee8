package boot

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLoadPMEMEntry: a read-only image's range is in the zero page's e820
// table as type 12 (E820_TYPE_PRAM), sorted after RAM and the reserved
// ECAM window, and Load writes nothing there.
func TestLoadPMEMEntry(t *testing.T) {
	ram := []RAMRange{{0, testRAM}, {4 << 30, 1 << 30}}
	pmem := RAMRange{GPA: 6 << 30, Size: 102 << 20}
	ecam := E820Entry{Addr: 0xe0000000, Size: 0x10000000}
	mem, _ := loadSynth(t, Params{RAM: ram, Reserved: []E820Entry{ecam}, PMEM: []RAMRange{pmem}})
	n := int(mem.u8(0x7000 + 0x1e8))
	var got []E820Entry
	for i := range n {
		e := uint64(0x7000 + 0x2d0 + i*20)
		got = append(got, E820Entry{Addr: mem.u64(e), Size: mem.u64(e + 8), Type: mem.u32(e + 16)})
	}
	assert.Equal(t, []E820Entry{
		{Addr: 0, Size: 0x9fc00, Type: E820RAM},
		{Addr: 0x9fc00, Size: 0x60400, Type: E820Reserved},
		{Addr: 0x100000, Size: testRAM - 0x100000, Type: E820RAM},
		{Addr: 0xe0000000, Size: 0x10000000, Type: E820Reserved},
		{Addr: 4 << 30, Size: 1 << 30, Type: E820RAM},
		{Addr: 6 << 30, Size: 102 << 20, Type: 12},
	}, got)
}

func TestValidatePMEM(t *testing.T) {
	ram := []RAMRange{{0, 3 << 30}, {4 << 30, 2 << 30}}
	ecam := []E820Entry{{Addr: 0xe0000000, Size: 0x10000000}}
	require.NoError(t, validatePMEM([]RAMRange{{6 << 30, 2 << 20}}, ram, ecam))
	require.NoError(t, validatePMEM(nil, ram, ecam))
	for _, tc := range []struct {
		name string
		pmem []RAMRange
		want string
	}{
		{"empty", []RAMRange{{6 << 30, 0}}, "is empty"},
		{"base not 2 MiB-aligned", []RAMRange{{6<<30 + 4096, 2 << 20}}, "2 MiB-aligned"},
		{"size not 2 MiB-aligned", []RAMRange{{6 << 30, 3 << 20}}, "2 MiB-aligned"},
		{"over RAM", []RAMRange{{5 << 30, 2 << 30}}, "overlaps"},
		{"over ECAM", []RAMRange{{0xe0000000, 2 << 20}}, "overlaps"},
		{"two overlapping", []RAMRange{{6 << 30, 4 << 20}, {6<<30 + 2<<20, 2 << 20}}, "overlaps"},
		{"wraps", []RAMRange{{1<<64 - 2<<20, 4 << 20}}, "wraps"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorContains(t, validatePMEM(tc.pmem, ram, ecam), tc.want)
		})
	}
}

func TestCheckRefusesMisplacedPMEM(t *testing.T) {
	k := synthKernel(t, nil)
	ram := []RAMRange{{0, testRAM}}
	err := Check(Params{Kernel: k, RAM: ram, CPUs: 1, PMEM: []RAMRange{{0, 2 << 20}}}, 0)
	var ce *CheckError
	require.True(t, errors.As(err, &ce), "%v", err)
	assert.Equal(t, InputPMEM, ce.Input)
	assert.Equal(t, "persistent memory", ce.Input.String())
	assert.NoError(t, Check(Params{Kernel: k, RAM: ram, CPUs: 1, PMEM: []RAMRange{{4 << 30, 2 << 20}}}, 0))
}
