package uapi

import (
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIoctlNamesMatchHeaders: every name IoctlRequest answers is the C
// macro of that name, compiled against the kernel and libc headers, so the
// seccomp allow-list built from these names allows exactly those requests.
func TestIoctlNamesMatchHeaders(t *testing.T) {
	names := make([]string, 0, len(ioctlNames))
	for n := range ioctlNames {
		names = append(names, n)
	}
	sort.Strings(names)
	items := make([]abiItem, 0, len(names))
	for _, n := range names {
		items = append(items, val(n, uint64(ioctlNames[n])))
	}
	got := checkABI(t, []string{"linux/kvm.h", "linux/vfio.h", "linux/vhost.h", "linux/if_tun.h", "asm-generic/ioctls.h"}, items)
	t.Logf("checked %d ioctl request names against the headers", got)

	req, ok := IoctlRequest("KVM_RUN")
	require.True(t, ok)
	assert.Equal(t, uintptr(kvmRun), req)
	_, ok = IoctlRequest("TIOCSTI")
	assert.False(t, ok, "hpcvmm never issues TIOCSTI")
}
