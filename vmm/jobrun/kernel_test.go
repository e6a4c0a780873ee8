package jobrun

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
)

// TestKernelReleaseIsOnePathElement is issue 30's defect 6 for kmodules: a
// bzImage whose version string holds "../" named the host's module
// directory outside /lib/modules. It is refused, naming --kernel.
func TestKernelReleaseIsOnePathElement(t *testing.T) {
	for _, version := range []string{"../../../home/u/mods (u@h) #1", "6.1\x1b]52;c;aGk=\a (u@h)"} {
		img := boottest.BzImage(nil, 0, 0)
		const at = 0x400 // in the setup sectors, where kernel_version points
		binary.LittleEndian.PutUint16(img[0x20e:], at-0x200)
		copy(img[at:], version+"\x00")
		k := filepath.Join(t.TempDir(), "bzImage")
		require.NoError(t, os.WriteFile(k, img, 0o644))
		_, err := kernelRelease(k, nil)
		require.Error(t, err, "%q", version)
		assert.Contains(t, err.Error(), "--kernel "+k+": kernel release")
		assert.NotContains(t, err.Error(), "\x1b", "the release is quoted, not printed raw")
	}
	// A distribution's release passes.
	img := boottest.BzImage(nil, 0, 0)
	binary.LittleEndian.PutUint16(img[0x20e:], 0x200)
	copy(img[0x400:], "6.1.0-18-amd64 (debian-kernel@lists.debian.org) #1 SMP\x00")
	k := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(k, img, 0o644))
	r, err := kernelRelease(k, nil)
	require.NoError(t, err)
	assert.Equal(t, "6.1.0-18-amd64", r)
}
