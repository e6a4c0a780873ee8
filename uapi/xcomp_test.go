package uapi

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequestGuestXCompPerm asks for AMX tile data on a CPU that has it and
// reads the permission back: the bit of XFeatureXTileData must be set.
func TestRequestGuestXCompPerm(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	require.NoError(t, err)
	if !strings.Contains(string(info), " amx_tile") {
		t.Skip("this CPU reports no amx_tile in /proc/cpuinfo: no dynamic XSAVE feature to ask for")
	}
	require.NoError(t, RequestGuestXCompPerm(XFeatureXTileData))
	mask, err := GuestXCompPerm()
	require.NoError(t, err)
	require.NotZero(t, mask&(1<<XFeatureXTileData), "guest permission %#x lacks XTILEDATA", mask)
	t.Logf("guest XSAVE permission %#x", mask)
	// Asking again is allowed and changes nothing.
	require.NoError(t, RequestGuestXCompPerm(XFeatureXTileData))
}
