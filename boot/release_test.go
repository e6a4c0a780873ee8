package boot_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/vmlinux"
	"github.com/stretchr/testify/require"
)

func TestReleaseOfVmlinuxSynthetic(t *testing.T) {
	img := []byte("\x7fELF....%s Linux version %s (%s)\x00....Linux version 6.1.0-56-amd64 (debian-kernel@lists.debian.org) (gcc-12) #1 SMP\x00")
	require.Equal(t, "6.1.0-56-amd64", boot.ReleaseOfVmlinux(img))
	require.Empty(t, boot.ReleaseOfVmlinux([]byte("no banner here")))
	require.Empty(t, boot.ReleaseOfVmlinux([]byte("Linux version ")))
}

// TestReleaseOfVmlinuxHostKernel decompresses the host's Debian bzImage
// and finds the same release in its vmlinux as in the bzImage's header.
func TestReleaseOfVmlinuxHostKernel(t *testing.T) {
	paths, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(paths) == 0 {
		t.Skip("no /boot/vmlinuz-* on this machine: install linux-image-amd64 to test against a real kernel")
	}
	image, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	k, err := boot.ParseBzImage(image)
	require.NoError(t, err)
	elf, _, err := vmlinux.Decompress(k)
	require.NoError(t, err)
	require.Equal(t, k.Release(), boot.ReleaseOfVmlinux(elf))
	require.Equal(t, strings.TrimPrefix(filepath.Base(paths[0]), "vmlinuz-"), boot.ReleaseOfVmlinux(elf))
}
