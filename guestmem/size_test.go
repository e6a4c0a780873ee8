package guestmem

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]uint64{
		"4096": 4096, "512M": 512 << 20, "20G": 20 << 30, "1GiB": 1 << 30, "2t": 2 << 40, "64k": 64 << 10, "3GB": 3 << 30,
	} {
		got, err := ParseSize(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "G", "1.5G", "-1G", "12X", "99999999999999999999T", "16777216T"} {
		_, err := ParseSize(bad)
		assert.Error(t, err, bad)
		if err != nil {
			assert.Contains(t, err.Error(), "size", bad)
		}
	}
}

func TestFormatSize(t *testing.T) {
	assert.Equal(t, "2G", FormatSize(2<<30))
	assert.Equal(t, "1536M", FormatSize(1536<<20))
	assert.Equal(t, "4097", FormatSize(4097))
	assert.Equal(t, "0", FormatSize(0))
}

func TestFormatSizeApprox(t *testing.T) {
	assert.Equal(t, "128G", FormatSizeApprox(128<<30))
	assert.Equal(t, "3.5G", FormatSizeApprox(3661852<<10))
	assert.Equal(t, "100T", FormatSizeApprox(100<<40))
	assert.Equal(t, "1.5M", FormatSizeApprox(1536<<10))
	assert.Equal(t, "512", FormatSizeApprox(512))
}
