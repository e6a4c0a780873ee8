package boot

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// hostKernels returns the distribution kernels installed on this machine.
func hostKernels(t *testing.T) []string {
	t.Helper()
	paths, err := filepath.Glob("/boot/vmlinuz-*")
	require.NoError(t, err)
	if len(paths) == 0 {
		t.Skip("no /boot/vmlinuz-* on this machine: install linux-image-amd64 to test against a real bzImage")
	}
	return paths
}

func TestParseBzImageHostKernel(t *testing.T) {
	for _, path := range hostKernels(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			image, err := os.ReadFile(path)
			if os.IsPermission(err) {
				t.Skipf("cannot read %s: %v", path, err)
			}
			require.NoError(t, err)
			k, err := ParseBzImage(image)
			require.NoError(t, err)

			assert.GreaterOrEqual(t, k.Protocol, uint16(0x0206))
			assert.NotZero(t, k.XLoadFlags&xlfKernel64, "XLF_KERNEL_64")
			require.NotEmpty(t, k.Payload)
			assert.Equal(t, (k.SetupSects+1)*512+len(k.Payload), len(image))
			// The file name carries `uname -r`, which the version string
			// starts with (on Debian bookworm: 6.1.x).
			release := strings.TrimPrefix(filepath.Base(path), "vmlinuz-")
			assert.True(t, strings.HasPrefix(k.Version, release+" "), "version %q should start with %q", k.Version, release)
			assert.Equal(t, release, k.Release())
			if strings.HasPrefix(release, "6.1.") {
				assert.True(t, strings.HasPrefix(k.Version, "6.1"))
			}
			// The header copy runs from 0x1f1 to the jump target.
			assert.Equal(t, image[0x1f1:0x202+int(image[0x201])], k.Header)
			assert.Equal(t, binary.LittleEndian.Uint32(image[0x260:]), k.InitSize)
			assert.Equal(t, binary.LittleEndian.Uint64(image[0x258:]), k.PrefAddress)
			assert.Equal(t, binary.LittleEndian.Uint32(image[0x238:]), k.CmdlineSize)
			assert.Equal(t, binary.LittleEndian.Uint32(image[0x22c:]), k.InitrdAddrMax)
			assert.Equal(t, image[0x234] != 0, k.Relocatable)
			assert.Equal(t, binary.LittleEndian.Uint32(image[0x230:]), k.KernelAlignment)
			// A distribution kernel never decompresses below 1 MiB and
			// needs more memory than its compressed image.
			assert.GreaterOrEqual(t, k.PrefAddress, uint64(0x100000))
			assert.Greater(t, uint64(k.InitSize), uint64(len(k.Payload)))
		})
	}
}

func TestParseBzImageSynthetic(t *testing.T) {
	img := synthImage(nil)
	k, err := ParseBzImage(img)
	require.NoError(t, err)
	assert.Equal(t, uint16(0x020f), k.Protocol)
	assert.Equal(t, synthSetupSects, k.SetupSects)
	assert.Equal(t, img[5*512:], k.Payload)
	assert.Equal(t, img[0x1f1:0x26c], k.Header)
	assert.Equal(t, uint32(0x7fffffff), k.InitrdAddrMax)
	assert.Equal(t, uint32(0x7ff), k.CmdlineSize)
	assert.True(t, k.Relocatable)
	assert.Equal(t, uint32(0x200000), k.KernelAlignment)
	assert.Equal(t, uint64(synthPref), k.PrefAddress)
	assert.Equal(t, uint32(synthInitSize), k.InitSize)
	assert.Equal(t, uint16(3), k.XLoadFlags)
	assert.Equal(t, synthVersion, k.Version)

	// The header is a copy: changing the image afterwards must not change it.
	img[0x1f1] = 99
	assert.Equal(t, byte(synthSetupSects), k.Header[0])
}

func TestParseBzImageSetupSectsZeroMeansFour(t *testing.T) {
	k, err := ParseBzImage(synthImage(func(img []byte) { img[0x1f1] = 0 }))
	require.NoError(t, err)
	assert.Equal(t, 4, k.SetupSects)
	assert.Len(t, k.Payload, synthPayloadLen)
}

func TestParseBzImageVersionEdgeCases(t *testing.T) {
	// No version pointer.
	k, err := ParseBzImage(synthImage(func(img []byte) { binary.LittleEndian.PutUint16(img[0x20e:], 0) }))
	require.NoError(t, err)
	assert.Empty(t, k.Version)
	// A pointer past the setup sectors is ignored rather than read from
	// the payload.
	k, err = ParseBzImage(synthImage(func(img []byte) { binary.LittleEndian.PutUint16(img[0x20e:], 0x2000) }))
	require.NoError(t, err)
	assert.Empty(t, k.Version)
	// An unterminated string stops at the end of the setup area.
	k, err = ParseBzImage(synthImage(func(img []byte) {
		binary.LittleEndian.PutUint16(img[0x20e:], 5*512-0x200-3)
		copy(img[5*512-3:], "abc")
	}))
	require.NoError(t, err)
	assert.Equal(t, "abc", k.Version)
	assert.Equal(t, "abc", k.Release())
	assert.Equal(t, "6.1.0-56-amd64", (&Kernel{Version: "6.1.0-56-amd64 (debian-kernel@lists.debian.org) #1 SMP"}).Release())
	assert.Empty(t, (&Kernel{}).Release())
}

func TestParseBzImageRejects(t *testing.T) {
	le := binary.LittleEndian
	cases := []struct {
		name  string
		image []byte
		want  []string
	}{
		{"empty", nil, []string{"too short", "0 bytes"}},
		{"too short", synthImage(nil)[:0x200], []string{"too short", "512 bytes"}},
		{"no magic", synthImage(func(img []byte) { copy(img[0x202:], "XXXX") }), []string{"not a bzImage", "HdrS"}},
		{"ELF vmlinux", func() []byte {
			img := make([]byte, 4096)
			copy(img, "\x7fELF")
			return img
		}(), []string{"not a bzImage", "vmlinux"}},
		{"protocol 2.05", synthImage(func(img []byte) { le.PutUint16(img[0x206:], 0x0205) }), []string{"protocol 2.05 is too old: need >= 2.06"}},
		{"protocol 2.00", synthImage(func(img []byte) { le.PutUint16(img[0x206:], 0x0200) }), []string{"protocol 2.00 is too old"}},
		{"not loaded high", synthImage(func(img []byte) { img[0x211] = 0 }), []string{"not loadable high", "LOADED_HIGH"}},
		{"no XLF_KERNEL_64", synthImage(func(img []byte) { le.PutUint16(img[0x236:], 0x2) }), []string{"no 64-bit entry point", "XLF_KERNEL_64"}},
		{"protocol 2.11 has no xloadflags", synthImage(func(img []byte) { le.PutUint16(img[0x206:], 0x020b) }), []string{"no 64-bit entry point", "2.0b"}},
		{"header too short", synthImage(func(img []byte) { img[0x201] = 0x20 }), []string{"setup header claims to end at 0x222"}},
		{"header too long", synthImage(func(img []byte) { img[0x201] = 0xff }), []string{"setup header claims to end at 0x301"}},
		{"truncated payload", synthImage(nil)[:5*512], []string{"truncated", "4 setup sectors"}},
		{"bad alignment", synthImage(func(img []byte) { le.PutUint32(img[0x230:], 0x300000) }), []string{"kernel_alignment 0x300000", "power of two"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k, err := ParseBzImage(tc.image)
			require.Error(t, err)
			assert.Nil(t, k)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			assert.True(t, strings.HasPrefix(err.Error(), "boot: parse bzImage: "), err.Error())
		})
	}
}
