package preflight_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"math"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

const (
	mib = uint64(1) << 20
	gib = uint64(1) << 30
)

const fixture = "../../testdata/gpu-host-sysfs"

const (
	gpu   = "0000:41:00.0"
	audio = "0000:41:00.1"
	pf    = "0000:82:00.0"
	vf    = "0000:82:00.1"
)

// msixConfig is a 256-byte config space with one MSI-X capability at 0x40.
func msixConfig(vendor, device uint16, vectors int, bir uint8, tableOff, pbaOff uint32) []byte {
	c := make([]byte, 256)
	binary.LittleEndian.PutUint16(c[0:], vendor)
	binary.LittleEndian.PutUint16(c[2:], device)
	binary.LittleEndian.PutUint16(c[6:], 0x10) // capability list present
	c[0x34] = 0x40
	c[0x40], c[0x41] = host.CapMSIX, 0
	binary.LittleEndian.PutUint16(c[0x42:], uint16(vectors-1))
	binary.LittleEndian.PutUint32(c[0x44:], tableOff|uint32(bir))
	binary.LittleEndian.PutUint32(c[0x48:], pbaOff|uint32(bir))
	return c
}

// goodHost is a two-node host where a GPU on node 1 and an InfiniBand VF on
// node 0 are ready for passthrough: IOMMU and interrupt remapping on, GPU
// and VF on vfio-pci, 1G hugepages reserved, running as root.
func goodHost(t testing.TB) (*hosttest.Tree, *host.Host) {
	tr := hosttest.New(t)
	tr.Node(0, "0-7", 32*gib, hosttest.Pool{Size: gib, Total: 8, Free: 8}, hosttest.Pool{Size: 2 * mib})
	tr.Node(1, "8-15", 32*gib, hosttest.Pool{Size: gib, Total: 16, Free: 16}, hosttest.Pool{Size: 2 * mib, Total: 1024, Free: 512})
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.KVM()
	tr.AddDevice(hosttest.Device{BDF: gpu, Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "vfio-pci", NUMANode: 1, IOMMUGroup: 40, ResetMethod: "flr",
		Resource: hosttest.Resource(map[int]string{
			0: hosttest.ResourceLine(0xa000_0000, 16*mib, false, false),
			2: hosttest.ResourceLine(0x1000_0000_0000, 128*gib, true, true),
			4: hosttest.ResourceLine(0x1020_0000_0000, 32*mib, true, true),
		}),
		Config: msixConfig(0x10de, 0x2330, 9, 0, 0xb90000, 0xba0000)})
	tr.AddDevice(hosttest.Device{BDF: pf, Vendor: 0x15b3, DeviceID: 0x101d, Class: 0x020700, Driver: "mlx5_core", NUMANode: 0, IOMMUGroup: 30, ResetMethod: "flr",
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x3800_0000_0000, 32*mib, true, true), 7: hosttest.ResourceLine(0x3800_0200_0000, 16*mib, true, true)})})
	tr.AddDevice(hosttest.Device{BDF: vf, Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020700, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 31, ResetMethod: "flr",
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x3800_0200_0000, 1*mib, true, true)}),
		Config:   msixConfig(0x15b3, 0x101e, 64, 0, 0x2000, 0x3000)})
	tr.LinkVF(pf, vf, 0)
	h := tr.Host()
	asRoot(h)
	return tr, h
}

func asRoot(h *host.Host) {
	h.Memlock = func() (uint64, error) { return 8 * mib, nil }
	h.Euid = func() int { return 0 }
}

func goodRequest() preflight.Request {
	return preflight.Request{GPUs: []string{gpu}, VFs: []string{vf}, Memory: 8 * gib, PageSize: preflight.Page1G, CPUs: 8, NUMANode: -1}
}

// find returns the single result for check name on subject.
func find(t *testing.T, r preflight.Report, name, subject string) preflight.Result {
	t.Helper()
	var got []preflight.Result
	for _, x := range r.Results {
		if x.Name == name && x.Subject == subject {
			got = append(got, x)
		}
	}
	require.Len(t, got, 1, "results for %s/%s in %+v", name, subject, r.Results)
	return got[0]
}

func has(r preflight.Report, name string) bool {
	for _, x := range r.Results {
		if x.Name == name {
			return true
		}
	}
	return false
}

func TestAllPass(t *testing.T) {
	_, h := goodHost(t)
	r := preflight.Run(h, goodRequest())
	require.True(t, r.OK(), "%+v", r.Failures())
	assert.Equal(t, 1, r.Node)
	assert.Equal(t, "node of "+gpu, r.NodeReason)
	for _, x := range r.Results {
		if x.Name == "placement" && x.Subject == vf {
			assert.Equal(t, preflight.Warn, x.Status, "VF on node 0, VM on node 1")
			assert.Equal(t, "use --numa-node 0", x.Fix)
			continue
		}
		assert.Equal(t, preflight.Pass, x.Status, "%+v", x)
		assert.Empty(t, x.Fix, "%+v", x)
	}
	assert.Contains(t, find(t, r, "sr-iov", vf).Detail, "VF of PF "+pf+" (driver mlx5_core")
	assert.Contains(t, find(t, r, "iommu-group", gpu).Detail, "group 40, alone")
	assert.Contains(t, find(t, r, "interrupts", gpu).Detail, "table BAR0+0xb90000")
	assert.Contains(t, find(t, r, "hugepages", "node 1").Detail, "16 of the pool's 16 1G hugepages free; the VM needs 8 (8G)")
	assert.Contains(t, find(t, r, "irq-remap", "host").Detail, "IR-")
	// 16M (32-bit) is not in the 64-bit window; 128G+32M (GPU) + 1M (VF) is.
	assert.Contains(t, find(t, r, "bar-space", "vm").Detail, "3 64-bit BARs")
	assert.Equal(t, preflight.Pass, find(t, r, "memlock", "process").Status)
}

func TestKVM(t *testing.T) {
	tr, h := goodHost(t)
	req := goodRequest()
	var probed string
	req.KVMCheck = func(p string) []preflight.Result {
		probed = p
		return []preflight.Result{{Name: "kvm-cap", Subject: "host", Status: preflight.Fail, Detail: "KVM_CAP_X missing", Fix: "upgrade"}}
	}
	r := preflight.Run(h, req)
	assert.Equal(t, h.Layout.KVM, probed, "hook receives the device path")
	assert.Equal(t, preflight.Fail, find(t, r, "kvm-cap", "host").Status)
	assert.False(t, r.OK())

	tr.Remove("dev/kvm")
	probed = ""
	r = preflight.Run(h, req)
	k := find(t, r, "kvm", "host")
	assert.Equal(t, preflight.Fail, k.Status)
	assert.Equal(t, "modprobe kvm_amd (and enable virtualization, VT-x/AMD-V, in the firmware setup)", k.Fix)
	assert.Empty(t, probed, "no probe without the device")
	assert.False(t, has(r, "kvm-cap"))
}

func TestKVMBackendPVMFails(t *testing.T) {
	tr, h := goodHost(t)
	for _, x := range preflight.Run(h, goodRequest()).Results {
		assert.False(t, x.Name == "kvm" && x.Subject == "backend", "no backend row for a hardware KVM: %+v", x)
	}
	tr.Write("sys/module/kvm_pvm/parameters/nested_pvm", "Y")
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "kvm", "backend")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "kvm_pvm")
	assert.Contains(t, x.Fix, "kvm_intel or kvm_amd")
	assert.False(t, r.OK())
}

func TestIOMMUOff(t *testing.T) {
	tr, h := goodHost(t)
	tr.Remove("sys/kernel/iommu_groups")
	tr.Remove("sys/bus/pci/devices/" + gpu + "/iommu_group")
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "iommu", "host")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Fix, "amd_iommu=on iommu=pt")
	g := find(t, r, "iommu-group", gpu)
	assert.Equal(t, preflight.Fail, g.Status)
	assert.Contains(t, g.Detail, "not in an IOMMU group")
	assert.False(t, r.OK())

	// Without passthrough devices the VM can still start.
	r = preflight.Run(h, preflight.Request{Memory: 2 * gib, NUMANode: -1})
	assert.Equal(t, preflight.Warn, find(t, r, "iommu", "host").Status)
	assert.True(t, r.OK(), "%+v", r.Failures())
	assert.False(t, has(r, "memlock"), "memlock only matters with VFIO")
	assert.False(t, has(r, "bar-space"))
}

func TestInterruptRemapping(t *testing.T) {
	tr, h := goodHost(t)
	tr.Interrupts(false)
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "irq-remap", "host")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Fix, "echo 1 > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts")

	tr.Write("sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts", "Y\n")
	r = preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Warn, find(t, r, "irq-remap", "host").Status)
	assert.True(t, r.OK())

	tr.Remove("proc/interrupts")
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "irq-remap", "host")
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "unknown")
}

func TestDriver(t *testing.T) {
	tr, h := goodHost(t)
	tr.Symlink("sys/bus/pci/devices/"+gpu+"/driver", "../../../bus/pci/drivers/nvidia")
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "driver", gpu)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "bound to nvidia")
	assert.Equal(t, "hpcvmm bind 0000:41:00.0 (or hpcvmm run --bind-devices), or by hand: "+
		"modprobe vfio-pci && echo vfio-pci > /sys/bus/pci/devices/0000:41:00.0/driver_override && "+
		"echo 0000:41:00.0 > /sys/bus/pci/devices/0000:41:00.0/driver/unbind && echo 0000:41:00.0 > /sys/bus/pci/drivers_probe", x.Fix)
	assert.False(t, r.OK())

	// With --bind-devices hpcvmm rebinds the device itself: a warning, not a failure.
	req := goodRequest()
	req.AllowBind = true
	r = preflight.Run(h, req)
	x = find(t, r, "driver", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "--bind-devices rebinds it")

	tr.Remove("sys/bus/pci/devices/" + gpu + "/driver")
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "driver", gpu)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "no driver")
	assert.NotContains(t, x.Fix, "unbind")

	tr.Symlink("sys/bus/pci/devices/"+gpu+"/driver", "../../../bus/pci/drivers/nvgrace_gpu_vfio_pci")
	r = preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Pass, find(t, r, "driver", gpu).Status, "vfio-pci variant drivers are VFIO drivers")
}

func TestIOMMUGroupViability(t *testing.T) {
	tr, h := goodHost(t)
	tr.AddDevice(hosttest.Device{BDF: audio, Vendor: 0x10de, DeviceID: 0x1aef, Class: 0x040300, Driver: "snd_hda_intel", NUMANode: 1, IOMMUGroup: 40})
	tr.AddDevice(hosttest.Device{BDF: "0000:40:01.0", Vendor: 0x1022, DeviceID: 0x1483, Class: 0x060400, Driver: "pcieport", NUMANode: 1, IOMMUGroup: 40})
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "iommu-group", gpu)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "0000:41:00.1 (snd_hda_intel)")
	assert.NotContains(t, x.Detail, "0000:40:01.0 (pcieport) must", "bridges on pcieport are allowed")
	assert.Equal(t, preflight.BindFix(host.BDF{Bus: 0x41, Function: 1}, "snd_hda_intel"), x.Fix)

	tr.Symlink("sys/bus/pci/devices/"+audio+"/driver", "../../../bus/pci/drivers/vfio-pci")
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "iommu-group", gpu)
	assert.Equal(t, preflight.Pass, x.Status, x.Detail)
	assert.Contains(t, x.Detail, "0000:41:00.1 (vfio-pci)")
	assert.Contains(t, x.Detail, "0000:40:01.0 (pcieport)")
}

func TestResetAndInterrupts(t *testing.T) {
	tr, h := goodHost(t)
	tr.Remove("sys/bus/pci/devices/" + gpu + "/reset_method")
	// MSI-X table beyond the 16 MiB BAR0.
	tr.Write("sys/bus/pci/devices/"+gpu+"/config", string(msixConfig(0x10de, 0x2330, 9, 0, 0x1000000, 0xba0000)))
	r := preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Warn, find(t, r, "reset", gpu).Status)
	x := find(t, r, "interrupts", gpu)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "outside its BAR")

	// MSI-X table in an unpopulated BAR.
	tr.Write("sys/bus/pci/devices/"+gpu+"/config", string(msixConfig(0x10de, 0x2330, 9, 5, 0, 0x1000)))
	r = preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Fail, find(t, r, "interrupts", gpu).Status)

	// No MSI at all: INTx only is a warning.
	tr.Write("sys/bus/pci/devices/"+gpu+"/config", string(make([]byte, 256)))
	r = preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Warn, find(t, r, "interrupts", gpu).Status)

	// Unprivileged read: 64 bytes... and fewer.
	tr.Write("sys/bus/pci/devices/"+gpu+"/config", string(make([]byte, 32)))
	r = preflight.Run(h, goodRequest())
	assert.Contains(t, find(t, r, "interrupts", gpu).Fix, "root")
}

func TestBARSpace(t *testing.T) {
	tr, h := goodHost(t)
	tr.CPUInfo(39) // 512 GiB of guest physical address space
	req := goodRequest()
	req.Memory = 300 * gib
	req.PageSize = preflight.Page4K
	r := preflight.Run(h, req)
	// RAM ends at 301G; the 128G BAR lands at [384G, 512G): just fits.
	x := find(t, r, "bar-space", "vm")
	assert.Equal(t, preflight.Pass, x.Status, x.Detail)
	assert.Contains(t, x.Detail, "need 39 of the host's 39")

	req.Memory = 400 * gib
	r = preflight.Run(h, req)
	x = find(t, r, "bar-space", "vm")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "needs 40 physical address bits, the host has 39")
	// The largest RAM that keeps the 128G BAR at 384G with room below it
	// for the 32M and 1M BARs: RAM end <= 383G.
	assert.Contains(t, x.Fix, "--memory 382G or less")

	tr.CPUInfo(36) // 64 GiB: a 128 GiB BAR can never fit
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "bar-space", "vm")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "needs 38 physical address bits, the host has 36")
	assert.Contains(t, x.Fix, "pass fewer devices")

	// 32-bit BARs overflowing the hole below 4 GiB.
	tr.CPUInfo(46)
	tr.Write("sys/bus/pci/devices/"+gpu+"/resource", hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x8000_0000, 1*gib, false, false)}))
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "bar-space-32bit", "vm")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "1 32-bit BARs need 1G of the 32-bit MMIO window, which has 512M")
	assert.Equal(t, preflight.Pass, find(t, r, "bar-space", "vm").Status, "the VF's 64-bit BAR still fits")
}

func TestVF(t *testing.T) {
	tr, h := goodHost(t)
	req := goodRequest()
	req.VFs = []string{pf} // a PF is not a VF
	r := preflight.Run(h, req)
	x := find(t, r, "sr-iov", pf)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "not an SR-IOV virtual function")
	assert.Contains(t, x.Fix, "sriov_numvfs")

	tr.Remove("sys/bus/pci/devices/" + pf + "/driver")
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "sr-iov", vf)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "PF "+pf+", which has no driver")
}

func TestHugepages(t *testing.T) {
	tr, h := goodHost(t)
	req := goodRequest()
	req.Memory = 20 * gib
	tr.Write("sys/devices/system/node/node1/hugepages/hugepages-1048576kB/free_hugepages", "10\n")
	r := preflight.Run(h, req)
	x := find(t, r, "hugepages", "node 1")
	assert.Equal(t, preflight.Fail, x.Status)
	// The words of sysfs: nr_hugepages is the pool, free_hugepages what
	// of it is not in use.
	assert.Equal(t, "10 of the pool's 16 1G hugepages free; the VM needs 20 (20G)", x.Detail)
	// A pool of 16, 6 of them in use: 26 leaves 20 free.
	assert.Equal(t, "echo 26 > /sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages", x.Fix)
	assert.False(t, r.OK())

	req.Memory = 1 * gib
	req.PageSize = preflight.Page2M
	r = preflight.Run(h, req)
	x = find(t, r, "hugepages", "node 1")
	assert.Equal(t, preflight.Pass, x.Status, x.Detail)
	assert.Contains(t, x.Detail, "the VM needs 512 (1G)")

	tr.Remove("sys/devices/system/node/node1/hugepages/hugepages-2048kB")
	r = preflight.Run(h, req)
	x = find(t, r, "hugepages", "node 1")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "no 2M hugepage pool")

	req.Memory = 3*gib + 2*mib
	req.PageSize = preflight.Page1G
	r = preflight.Run(h, req)
	x = find(t, r, "request", "vm")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Equal(t, "use --memory 4G", x.Fix)

	req.Memory = 64 * gib
	req.PageSize = preflight.Page4K
	r = preflight.Run(h, req)
	x = find(t, r, "memory", "node 1")
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Equal(t, "32G free of the node's 64G for 64G of guest RAM: the kernel must reclaim memory (page cache) or the guest will not get it all", x.Detail)
}

// TestHugepagesPromised: free_hugepages counts pages promised to mappings
// that have not faulted them in (resv_hugepages, global pools only); those
// are not the VM's to take.
func TestHugepagesPromised(t *testing.T) {
	tr := hosttest.New(t)
	tr.KVM()
	tr.Write("sys/devices/system/cpu/online", "0-3\n")
	pool := "sys/kernel/mm/hugepages/hugepages-2048kB/"
	tr.Write(pool+"nr_hugepages", "512\n")
	tr.Write(pool+"free_hugepages", "512\n")
	tr.Write(pool+"resv_hugepages", "100\n")
	h := tr.Host()
	asRoot(h)
	req := preflight.Request{Memory: gib, PageSize: preflight.Page2M, CPUs: 1, NUMANode: -1}
	r := preflight.Run(h, req)
	x := find(t, r, "hugepages", "node 0")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Equal(t, "512 of the pool's 512 2M hugepages free (100 of them promised to other mappings); the VM needs 512 (1G)", x.Detail)
	assert.Equal(t, "echo 612 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", x.Fix)

	tr.Write(pool+"resv_hugepages", "0\n")
	x = find(t, preflight.Run(h, req), "hugepages", "node 0")
	assert.Equal(t, preflight.Pass, x.Status, x.Detail)
}

// TestCheckInput: the one validation hpcvmm check and hpcvmm run share.
// Sizes that can never fit the node are input errors naming the Request
// field, in GiB; what only today's pool lacks is not.
func TestCheckInput(t *testing.T) {
	_, h := goodHost(t) // two nodes of 64 GiB each (32 free)
	fields := func(err error) []string {
		var out []string
		list := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			list = j.Unwrap()
		}
		for _, e := range list {
			var ie *preflight.InputError
			require.ErrorAs(t, e, &ie)
			out = append(out, ie.Field)
		}
		return out
	}
	ok := preflight.Request{Memory: 60 * gib, PageSize: preflight.Page1G, CPUs: 1, NUMANode: -1}
	require.NoError(t, preflight.CheckInput(h, ok), "fits a node's RAM, though not today's pool of 16")
	require.NoError(t, preflight.CheckInput(nil, ok))

	for _, tc := range []struct {
		name   string
		mutate func(*preflight.Request)
		field  string
		msg    string
	}{
		{"100T on 2M pages", func(r *preflight.Request) { r.Memory, r.PageSize = 100<<40, preflight.Page2M }, "Memory",
			"100T is more than the RAM of any NUMA node (the largest, node 0, has 64G): no 2M hugepage pool there can ever hold it"},
		{"100T on 4K pages", func(r *preflight.Request) { r.Memory, r.PageSize = 100<<40, preflight.Page4K }, "Memory",
			"100T is more than the RAM of any NUMA node (the largest, node 0, has 64G): guest RAM is bound to one node"},
		{"a node's worth too much", func(r *preflight.Request) { r.Memory, r.NUMANode = 65*gib, 1 }, "Memory",
			"65G is more than node 1's RAM (64G): no 1G hugepage pool there can ever hold it"},
		{"no such node", func(r *preflight.Request) { r.NUMANode = 3 }, "NUMANode", "node 3 is not online; pick one of 0-1"},
		{"zero", func(r *preflight.Request) { r.Memory = 0 }, "Memory", "no guest memory: give a size, e.g. 2G"},
		{"tiny", func(r *preflight.Request) { r.Memory, r.PageSize = mib, preflight.Page4K }, "Memory", "1M is too small: a Linux guest needs at least 64M"},
		{"not a multiple", func(r *preflight.Request) { r.Memory = 3*gib + 2*mib }, "Memory", "3074M is not a multiple of the 1G page size: use 4G, or a smaller page size"},
		{"odd page", func(r *preflight.Request) { r.PageSize = 12345 }, "PageSize", "page size 12345 is not 1G, 2M or 4K (none)"},
	} {
		req := ok
		tc.mutate(&req)
		err := preflight.CheckInput(h, req)
		require.Error(t, err, tc.name)
		assert.Equal(t, []string{tc.field}, fields(err), tc.name)
		assert.Equal(t, tc.field+": "+tc.msg, err.Error(), tc.name)
		assert.NotContains(t, err.Error(), "--", "%s: the Go API's words name no flag", tc.name)
	}
}

func TestCPUs(t *testing.T) {
	tr, h := goodHost(t)
	tr.Node(2, "16-31", 4*gib)
	req := goodRequest()
	req.CPUs = 12
	r := preflight.Run(h, req)
	x := find(t, r, "cpus", "node 1")
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Equal(t, "use --cpus 8 or --numa-node 2", x.Fix)
	assert.True(t, r.OK(), "too few CPUs is a warning")
}

func TestMemlock(t *testing.T) {
	_, h := goodHost(t)
	h.Euid = func() int { return 1000 }
	r := preflight.Run(h, goodRequest())
	x := find(t, r, "memlock", "process")
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "RLIMIT_MEMLOCK is 8M but VFIO pins all 8G")
	assert.Contains(t, x.Fix, "ulimit -l unlimited")

	h.Memlock = func() (uint64, error) { return math.MaxUint64, nil }
	r = preflight.Run(h, goodRequest())
	x = find(t, r, "memlock", "process")
	assert.Equal(t, preflight.Pass, x.Status)
	assert.Contains(t, x.Detail, "unlimited")

	h.Memlock = nil
	r = preflight.Run(h, goodRequest())
	assert.Equal(t, preflight.Warn, find(t, r, "memlock", "process").Status)
}

func TestDeviceInput(t *testing.T) {
	_, h := goodHost(t)
	req := goodRequest()
	req.GPUs = []string{"82:00", "0000:99:00.0", gpu, "41:00.0"}
	r := preflight.Run(h, req)
	x := find(t, r, "device", "82:00")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "--gpu")
	assert.Contains(t, x.Detail, "DDDD:BB:DD.F")
	x = find(t, r, "device", "0000:99:00.0")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "no PCI device")
	var dup []preflight.Result
	for _, y := range r.Results {
		if y.Name == "device" && y.Subject == gpu {
			dup = append(dup, y)
		}
	}
	require.Len(t, dup, 2)
	assert.Equal(t, preflight.Fail, dup[1].Status, "the short form of the same address is a duplicate")

	tr2, h2 := goodHost(t)
	tr2.AddDevice(hosttest.Device{BDF: "0000:40:01.0", Vendor: 0x1022, DeviceID: 0x1483, Class: 0x060400, Driver: "vfio-pci", NUMANode: 1, IOMMUGroup: 41})
	r = preflight.Run(h2, preflight.Request{GPUs: []string{"40:01.0"}, NUMANode: -1})
	assert.Equal(t, preflight.Fail, find(t, r, "device", "0000:40:01.0").Status, "bridges cannot be assigned")
}

func TestChooseNode(t *testing.T) {
	tr, h := goodHost(t)
	n, why, err := preflight.ChooseNode(h, preflight.Request{NUMANode: 0, GPUs: []string{gpu}})
	require.NoError(t, err)
	assert.Equal(t, 0, n)
	assert.Contains(t, why, "--numa-node")

	_, _, err = preflight.ChooseNode(h, preflight.Request{NUMANode: 7})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--numa-node 7")
	assert.Contains(t, err.Error(), "0-1")

	n, why, err = preflight.ChooseNode(h, preflight.Request{NUMANode: -1, VFs: []string{vf}, GPUs: []string{gpu}})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "GPUs first")
	assert.Equal(t, "node of "+gpu, why)

	// No devices: most free hugepages of the size.
	n, why, err = preflight.ChooseNode(h, preflight.Request{NUMANode: -1, PageSize: preflight.Page2M})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, "most free 2M hugepages (512)", why)

	tr.Write("sys/devices/system/node/node0/hugepages/hugepages-1048576kB/free_hugepages", "16\n")
	n, _, err = preflight.ChooseNode(h, preflight.Request{NUMANode: -1, PageSize: preflight.Page1G})
	require.NoError(t, err)
	assert.Equal(t, 0, n, "a tie goes to the lowest node")
	tr.Write("sys/devices/system/node/node0/hugepages/hugepages-1048576kB/free_hugepages", "2\n")
	n, _, err = preflight.ChooseNode(h, preflight.Request{NUMANode: -1})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "default page size is 1G")

	// Devices without NUMA information fall through to the hugepage rule.
	tr.Write("sys/bus/pci/devices/"+gpu+"/numa_node", "-1\n")
	n, why, err = preflight.ChooseNode(h, preflight.Request{NUMANode: -1, GPUs: []string{gpu}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Contains(t, why, "most free 1G hugepages")

	r := preflight.Run(h, preflight.Request{NUMANode: 5, Memory: gib})
	assert.Equal(t, preflight.Fail, find(t, r, "numa-node", "vm").Status)
	assert.Equal(t, -1, r.Node)
}

func TestPlacement(t *testing.T) {
	_, h := goodHost(t)
	req := goodRequest()
	req.NUMANode = 0
	r := preflight.Run(h, req)
	x := find(t, r, "placement", gpu)
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Equal(t, "use --numa-node 1", x.Fix)
	assert.Equal(t, preflight.Pass, find(t, r, "placement", vf).Status)
}

// The real H100 capture: the GPU is on nvidia, no IOMMU groups, no NUMA
// information, FLR, MSI-X at 0xb0, BARs fit the 46-bit address space, and no
// hugepages reserved.
func TestFixture(t *testing.T) {
	if _, err := os.Stat(fixture); err != nil {
		t.Fatalf("real-host capture missing at %s (it is part of the module): %v", fixture, err)
	}
	h := host.New(fixture, "/nonexistent-proc")
	r := preflight.Run(h, preflight.Request{GPUs: []string{"00:06.0"}, Memory: 16 * gib, CPUs: 16, NUMANode: -1})
	assert.False(t, r.OK())
	const g = "0000:00:06.0"
	x := find(t, r, "iommu", "host")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Fix, "intel_iommu=on", "the capture's CPU is GenuineIntel")
	assert.Equal(t, preflight.Warn, find(t, r, "irq-remap", "host").Status)
	assert.Equal(t, preflight.Fail, find(t, r, "kvm", "host").Status)
	assert.Equal(t, "10de:2330 3D controller (class 0x030200)", find(t, r, "device", g).Detail)
	x = find(t, r, "driver", g)
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Contains(t, x.Detail, "nvidia")
	assert.Contains(t, x.Fix, "echo vfio-pci > /sys/bus/pci/devices/0000:00:06.0/driver_override")
	assert.Equal(t, preflight.Fail, find(t, r, "iommu-group", g).Status)
	assert.Equal(t, "no NUMA information (numa_node -1)", find(t, r, "numa", g).Detail)
	assert.Equal(t, "reset methods: flr", find(t, r, "reset", g).Detail)
	assert.Equal(t, "MSI-X at 0xb0: 9 vectors, table BAR0+0xb90000, PBA BAR0+0xba0000", find(t, r, "interrupts", g).Detail)
	x = find(t, r, "bar-space", "vm")
	assert.Equal(t, preflight.Pass, x.Status)
	// 16G of RAM ends at 17G; BAR1's 128G lands at [128G, 256G), the 32M
	// and 16M BARs in the gap below it: 38 bits of the host's 46.
	assert.Contains(t, x.Detail, "3 64-bit BARs (128.0G) fit in [0x440000000, 0x4000000000)")
	assert.Contains(t, x.Detail, "need 38 of the host's 46")
	x = find(t, r, "hugepages", "node 0")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.Equal(t, "echo 16 > /sys/devices/system/node/node0/hugepages/hugepages-1048576kB/nr_hugepages", x.Fix)
	assert.Equal(t, preflight.Pass, find(t, r, "cpus", "node 0").Status)
	assert.Equal(t, preflight.Pass, find(t, r, "placement", g).Status)
	assert.Equal(t, preflight.Warn, find(t, r, "memlock", "process").Status)
}

func TestReportOutput(t *testing.T) {
	_, h := goodHost(t)
	req := goodRequest()
	req.Memory = 20 * gib
	r := preflight.Run(h, req)
	var b bytes.Buffer
	require.NoError(t, r.WriteTable(&b))
	out := b.String()
	lines := strings.Split(out, "\n")
	require.True(t, strings.HasPrefix(lines[0], "      CHECK"), lines[0])
	col := strings.Index(lines[0], "DETAIL")
	var sawFix bool
	for i, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "FAIL") || strings.HasPrefix(l, "PASS") || strings.HasPrefix(l, "WARN"):
			assert.NotEqual(t, ' ', l[col-1+1], "detail column aligned: %q", l)
		case strings.Contains(l, "fix: "):
			sawFix = true
			assert.Equal(t, col, strings.Index(l, "fix: "), "fix line under the detail column")
			assert.True(t, strings.HasPrefix(lines[i], "FAIL") || strings.HasPrefix(lines[i], "WARN"), "fix follows its problem")
		}
	}
	assert.True(t, sawFix)
	assert.Contains(t, out, "failed: the VM cannot start")
	assert.Contains(t, out, "fix: echo 20 > /sys/devices/system/node/node1/hugepages/hugepages-1048576kB/nr_hugepages")

	b.Reset()
	require.NoError(t, r.WriteJSON(&b))
	assert.Contains(t, b.String(), `"status": "fail"`)
	assert.Contains(t, b.String(), "echo 20 > /sys", "no HTML escaping of fix commands")
	var got struct {
		OK      bool
		Node    int
		Results []preflight.Result
	}
	require.NoError(t, json.Unmarshal(b.Bytes(), &got))
	assert.False(t, got.OK)
	assert.Equal(t, 1, got.Node)
	assert.Equal(t, r.Results, got.Results)

	ok := preflight.Run(h, goodRequest())
	b.Reset()
	require.NoError(t, ok.WriteTable(&b))
	assert.Contains(t, b.String(), "0 failed: the VM can start")
}

func TestStatusText(t *testing.T) {
	for _, s := range []preflight.Status{preflight.Pass, preflight.Warn, preflight.Fail} {
		b, err := s.MarshalText()
		require.NoError(t, err)
		var back preflight.Status
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, s, back)
	}
	var s preflight.Status
	assert.Error(t, s.UnmarshalText([]byte("maybe")))
}

// TestBARSpaceBehindPorts: two devices on the host's root bus each get an
// emulated root port with --topology host. On the root bus a 512 MiB
// non-prefetchable 64-bit BAR goes in the 64-bit window and a 4 KiB 32-bit
// BAR in the 32-bit one: both fit. Behind a port a non-prefetchable BAR
// needs the port's 32-bit window, so the two ports need 512 MiB + 1 MiB of
// the 512 MiB window: the VM (pci.Root.AssignBARs, PlanHierarchy) refuses
// that layout, so preflight must too; with --topology flat it passes.
func TestBARSpaceBehindPorts(t *testing.T) {
	tr := hosttest.New(t)
	tr.Node(0, "0-7", 32*gib, hosttest.Pool{Size: gib, Total: 8, Free: 8})
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.KVM()
	a, b := "0000:00:04.0", "0000:00:05.0"
	tr.AddDeviceUnder(hosttest.Device{BDF: a, Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 4,
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0x10_0000_0000, 512*mib, true, false)})})
	tr.AddDeviceUnder(hosttest.Device{BDF: b, Vendor: 0x1234, DeviceID: 0x11e8, Class: 0x00ff00, Driver: "vfio-pci", NUMANode: 0, IOMMUGroup: 5,
		Resource: hosttest.Resource(map[int]string{0: hosttest.ResourceLine(0xe000_0000, 4096, false, false)})})
	h := tr.Host()
	asRoot(h)
	req := preflight.Request{GPUs: []string{a, b}, Memory: 2 * gib, PageSize: preflight.Page1G, CPUs: 1, NUMANode: -1,
		PortSlots: []int{10, 11, 12, 13}}
	r := preflight.Run(h, req)
	assert.Equal(t, preflight.Pass, find(t, r, "bar-space-32bit", "vm").Status, "on the root bus they fit")
	assert.Equal(t, preflight.Pass, find(t, r, "bar-space", "vm").Status)
	x := find(t, r, "bar-space-ports", "vm")
	assert.Equal(t, preflight.Fail, x.Status, x.Detail)
	assert.Contains(t, x.Detail, "behind the emulated PCIe ports of --topology host (2)")
	assert.Contains(t, x.Fix, "--topology flat")

	req.FlatTopology = true
	r = preflight.Run(h, req)
	assert.False(t, has(r, "bar-space-ports"), "no ports with --topology flat")
}

// TestGroupOpen: a group the process may not open fails before the VM is
// built, each errno with its own fix; no group file is not reported.
func TestGroupOpen(t *testing.T) {
	_, h := goodHost(t)
	for _, tc := range []struct {
		err        error
		fail       bool
		detail     string
		fixContain string
	}{
		{nil, false, "", ""},
		{fmt.Errorf("vfio: open /dev/vfio/31: %w", fs.ErrNotExist), false, "", ""},
		{fmt.Errorf("vfio: open /dev/vfio/31: %w", syscall.EPERM), true, "/dev/vfio/31: this process's device cgroup does not let it open the group (EPERM)", "--gres=nic:N"},
		{syscall.EACCES, true, "/dev/vfio/31 is not accessible to this user (EACCES)", "chown $USER /dev/vfio/31"},
		{syscall.EBUSY, true, "/dev/vfio/31 is open in another process (EBUSY)", "stop the VM or job"},
	} {
		req := goodRequest()
		var asked []int
		req.GroupOpen = func(g int) error {
			asked = append(asked, g)
			if g == 31 { // the VF's group
				return tc.err
			}
			return nil
		}
		r := preflight.Run(h, req)
		assert.ElementsMatch(t, []int{40, 31}, asked, "both devices are on vfio-pci")
		if !tc.fail {
			assert.False(t, has(r, "vfio-open"), "%v: %+v", tc.err, r.Results)
			continue
		}
		x := find(t, r, "vfio-open", vf)
		assert.Equal(t, preflight.Fail, x.Status)
		assert.Equal(t, tc.detail, x.Detail)
		assert.Contains(t, x.Fix, tc.fixContain)
		assert.False(t, r.OK())
	}
}

// TestOneVCPUIsSingular: "1 vCPUs" (issue 35) reads "1 vCPU".
func TestOneVCPUIsSingular(t *testing.T) {
	tr := hosttest.New(t)
	tr.Node(0, "0-1", 8<<30)
	rep := preflight.Run(tr.Host(), preflight.Request{CPUs: 1, Memory: 256 << 20, PageSize: preflight.Page4K, NUMANode: -1})
	n := 0
	for _, r := range rep.Results {
		if r.Name == "cpus" || r.Name == "cpu-mode" {
			n++
			assert.Contains(t, r.Detail, "1 vCPU", r.Name)
			assert.NotContains(t, r.Detail, "1 vCPUs", r.Name)
		}
	}
	assert.Equal(t, 2, n, "the cpus and cpu-mode rows")
}
