package harness

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseShowDepends(t *testing.T) {
	out := "insmod /lib/modules/6.1.0-56-amd64/kernel/virt/lib/irqbypass.ko \n" +
		"builtin crc32c\n" +
		"insmod /lib/modules/6.1.0-56-amd64/kernel/arch/x86/kvm/kvm.ko nx_huge_pages=1\n"
	assert.Equal(t, []string{
		"/lib/modules/6.1.0-56-amd64/kernel/virt/lib/irqbypass.ko",
		"/lib/modules/6.1.0-56-amd64/kernel/arch/x86/kvm/kvm.ko",
	}, parseShowDepends(out))
}

func TestParseLdd(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffc)\n" +
		"\tlibnvme.so.1 => /lib/x86_64-linux-gnu/libnvme.so.1 (0x00007fa6)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007fa6)\n" +
		"\tlibmissing.so => not found\n"
	assert.Equal(t, []string{"/lib/x86_64-linux-gnu/libnvme.so.1", "/lib64/ld-linux-x86-64.so.2"}, parseLdd(out))
}

func TestVersionLess(t *testing.T) {
	assert.True(t, versionLess("6.1.0-9-amd64", "6.1.0-10-amd64"))
	assert.True(t, versionLess("6.1.0-56-amd64", "6.12.0-1-amd64"))
	assert.False(t, versionLess("6.12.0-1-amd64", "6.1.0-56-amd64"))
	assert.False(t, versionLess("6.1", "6.1"))
}

// TestPickKernelPrefersGeneric: with Debian's cloud kernel installed beside
// the generic one (the cloud flavour sorts later by name), the generic one
// is chosen and the reason names the other.
func TestPickKernelPrefersGeneric(t *testing.T) {
	generic := Kernel{Version: "6.1.0-56-amd64"}
	cloud := Kernel{Version: "6.1.0-56-cloud-amd64"}
	newerCloud := Kernel{Version: "6.1.0-60-cloud-amd64"}
	assert.True(t, generic.Generic())
	assert.False(t, cloud.Generic())
	assert.False(t, Kernel{Version: "6.1.0-56-rt-amd64"}.Generic())

	k := pickKernel([]Kernel{generic, cloud, newerCloud})
	assert.Equal(t, generic.Version, k.Version)
	assert.Contains(t, k.Reason, "generic")
	assert.Contains(t, k.Reason, "6.1.0-60-cloud-amd64")

	k = pickKernel([]Kernel{{Version: "6.1.0-9-amd64"}, {Version: "6.1.0-10-amd64"}, cloud})
	assert.Equal(t, "6.1.0-10-amd64", k.Version)

	k = pickKernel([]Kernel{cloud, newerCloud})
	assert.Equal(t, newerCloud.Version, k.Version)
	assert.Contains(t, k.Reason, "no generic-flavour kernel")
}

// TestModuleDepsOfInstalledKernel checks the dependency collection against
// the real Debian kernel when one is installed.
func TestModuleDepsOfInstalledKernel(t *testing.T) {
	k, err := FindKernel()
	if err != nil {
		t.Skipf("no Debian kernel installed: %v", err)
	}
	if _, err := modprobeTool(); err != nil {
		t.Skip(err)
	}
	deps, err := ModuleDeps(k, []string{"kvm_amd", "vfio-pci"})
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, d := range deps {
		assert.False(t, seen[d], "duplicate %s", d)
		seen[d] = true
		_, err := os.Stat(d)
		assert.NoError(t, err)
	}
	require.NotEmpty(t, deps)
	// Load order: kvm before kvm-amd.
	idx := func(suffix string) int {
		for i, d := range deps {
			if len(d) >= len(suffix) && d[len(d)-len(suffix):] == suffix {
				return i
			}
		}
		return -1
	}
	if idx("/kvm.ko") >= 0 { // kvm may be built in on other kernels
		assert.Less(t, idx("/kvm.ko"), idx("/kvm-amd.ko"))
	}
	_, err = ModuleDeps(k, []string{"no_such_module_hpcvmm"})
	assert.ErrorContains(t, err, "no_such_module_hpcvmm")
}
