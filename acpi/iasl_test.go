package acpi

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIASLVectorsCurrent recompiles every testdata/*.asl and checks the
// committed .aml matches, so a vector edited without recompiling is caught.
// The header's checksum and compiler revision (bytes 9 and 32-35) may
// differ between iasl releases and are not compared.
func TestIASLVectorsCurrent(t *testing.T) {
	iasl := requireIASL(t)
	srcs, err := filepath.Glob(filepath.Join("testdata", "*.asl"))
	require.NoError(t, err)
	require.NotEmpty(t, srcs)
	dir := t.TempDir()
	for _, src := range srcs {
		fresh := compileASL(t, iasl, dir, src)
		committed, err := os.ReadFile(src[:len(src)-len(".asl")] + ".aml")
		require.NoError(t, err, "%s has no compiled .aml next to it", src)
		require.Equal(t, len(fresh), len(committed), "%s: committed .aml is stale; recompile with iasl -on", src)
		for _, b := range [][]byte{fresh, committed} {
			b[9] = 0
			copy(b[32:36], []byte{0, 0, 0, 0})
		}
		assert.Equal(t, fresh, committed, "%s: committed .aml is stale; recompile with iasl -on", src)
	}
}
