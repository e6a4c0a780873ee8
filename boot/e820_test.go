package boot

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestE820MapSingleRegionBelowHole(t *testing.T) {
	got := E820Map([]RAMRange{{GPA: 0, Size: 512 << 20}})
	assert.Equal(t, []E820Entry{
		{Addr: 0, Size: 0x9fc00, Type: E820RAM},
		{Addr: 0x9fc00, Size: 0x100000 - 0x9fc00, Type: E820Reserved},
		{Addr: 0x100000, Size: 512<<20 - 0x100000, Type: E820RAM},
	}, got)
}

func TestE820MapTwoRegionsAroundPCIHole(t *testing.T) {
	// 8 GiB guest: 3 GiB below the hole, 5 GiB from 4 GiB on.
	got := E820Map([]RAMRange{{GPA: 0, Size: 3 << 30}, {GPA: 4 << 30, Size: 5 << 30}})
	assert.Equal(t, []E820Entry{
		{Addr: 0, Size: 0x9fc00, Type: E820RAM},
		{Addr: 0x9fc00, Size: 0x60400, Type: E820Reserved},
		{Addr: 0x100000, Size: 3<<30 - 0x100000, Type: E820RAM},
		{Addr: 4 << 30, Size: 5 << 30, Type: E820RAM},
	}, got)
	// Nothing in the map touches the PCI hole [3 GiB, 4 GiB).
	for _, e := range got {
		assert.False(t, e.Addr < 4<<30 && e.End() > 3<<30, "entry %+v overlaps the PCI hole", e)
	}
}

func TestE820MapTinyLowRegion(t *testing.T) {
	// A low region ending inside the legacy hole yields no RAM above 1 MiB
	// and still reports the hole reserved.
	got := E820Map([]RAMRange{{GPA: 0, Size: 0xa0000}})
	assert.Equal(t, []E820Entry{
		{Addr: 0, Size: 0x9fc00, Type: E820RAM},
		{Addr: 0x9fc00, Size: 0x60400, Type: E820Reserved},
	}, got)
}

func TestE820MapSkipsEmptyRanges(t *testing.T) {
	got := E820Map([]RAMRange{{GPA: 0, Size: 0}, {GPA: 0, Size: 2 << 20}})
	require.Len(t, got, 3)
	assert.Equal(t, uint64(2<<20), got[2].End())
}

func TestValidateRAM(t *testing.T) {
	lowEnd, err := validateRAM([]RAMRange{{0, 3 << 30}, {4 << 30, 1 << 30}})
	require.NoError(t, err)
	assert.Equal(t, uint64(3<<30), lowEnd)

	bad := []struct {
		name string
		ram  []RAMRange
		want string
	}{
		{"empty", nil, "empty"},
		{"not at zero", []RAMRange{{1 << 20, 1 << 30}}, "must start at guest-physical 0"},
		{"empty range", []RAMRange{{0, 1 << 30}, {4 << 30, 0}}, "is empty"},
		{"overlap", []RAMRange{{0, 1 << 30}, {1 << 29, 1 << 30}}, "ascending and disjoint"},
		{"below 1 MiB", []RAMRange{{0, 0xa0000}}, "below 1 MiB"},
		{"low above 4 GiB", []RAMRange{{0, 5 << 30}}, "above 4 GiB"},
		{"wraps", []RAMRange{{0, 1 << 30}, {1 << 63, 1 << 63}}, "wraps"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validateRAM(tc.ram)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
