//go:build integration

package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/ncclpath"
	"github.com/hpcvmm/hpcvmm/pcitopo"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The PCI topology scenarios run in one L1 boot (harness.ProfileSwitch:
// edu, the SR-IOV NVMe controller with its VF and ivshmem's 64 GiB BAR
// each behind a downstream port of one QEMU PCIe switch). In L1, NCCL
// classifies edu and the VF as PIX; the scenarios check what the L2 guest
// shows with --topology host and flat, and that each device still works
// behind hpcvmm's emulated ports.

// nvmeOffKiBSwitch is where TestSwitchTopologyHost writes in the namespace.
const nvmeOffKiBSwitch = 6144

// TestSwitchTopologyHost passes edu (--gpu) and the NVMe VF (--vf) through
// with the default --topology host. In L1 both sit behind the switch's
// upstream port 01:00.0 (NCCL: PIX). Inside L2, NCCL's classification from
// the guest's sysfs (tests/guest/pcipath, host/ncclpath) is PIX too, and
// each device's max_link_speed/max_link_width and those of the port above
// it (the two NCCL takes the bandwidth from) equal L1's for the same
// device (where L1's port has a link; see assertGuestLinksMatchL1), and so
// do the links of the root port and the switch's upstream port on the way
// (assertGuestChainMatchesL1); edu's
// DMA round trip and nvme I/O on the VF work behind the ports. On L1: one
// VFIO container, guest RAM DMA-mapped once per region, the VF's MSI-X
// interrupts received by vfio-pci, no BAR access exiting but the VF's
// MSI-X table/PBA; outside L1 the written data is in the disk image.
func TestSwitchTopologyHost(t *testing.T) {
	harness.RunOuter(t, harness.ProfileSwitch, func(t *testing.T, env *harness.Env) {
		l1Path := l1NCCLPath(t, env)
		require.Equal(t, "PIX", l1Path, "NCCL's path between edu and the VF in L1 (the profile's switch)")
		g, log, l1IRQs := runSwitchGuest(t, env, "host", fmt.Sprintf("topo,edu,nvme hpcvmm.dma_buf=%#x memmap=1M$%#x hpcvmm.nvme_off_kib=%d hpcvmm.nvme_kib=%d",
			eduDMABuf, eduDMABuf, nvmeOffKiBSwitch, nvmeKiB))
		assert.Equal(t, "PIX", g["nccl_path"], "NCCL's path between edu (%s) and the VF (%s, bus ID %s) in the guest; switches above them: %s / %s",
			g["nccl_gpu"], g["nccl_nic"], g["nccl_nic_busid"], g["nccl_gpu_switches"], g["nccl_nic_switches"])
		assertGuestLinksMatchL1(t, env, g)
		assertGuestChainMatchesL1(t, env, g, "gpu", harness.SwitchEduBDF)
		assertGuestChainMatchesL1(t, env, g, "nic", harness.SwitchNVMeVFBDF)

		assert.Equal(t, "0x010000ed", g["edu_id"], "edu id register in the guest")
		assert.Equal(t, "1", g["dma_done"], "both edu DMA transfers completed")
		assert.Equal(t, "16", g["dma_words_matching"], "words of edu's DMA round trip equal to what was written (first word %s, expected %s)", g["dma_first_word"], g["dma_expected_first"])
		assertNVMeGuest(t, env, g)
		assert.Equal(t, "none", g["pt_failed"], "guest passthrough parts that failed")
		env.Record(t, "dma_words_matching", g["dma_words_matching"])
		env.Record(t, "dma_seconds", g["dma_seconds"])
		env.Record(t, "nvme_sha256", g["nvme_written_sha256"])
		// L1 side: one container for both devices, guest RAM DMA-mapped
		// once per region (edu's DMA went through L1's IOMMU), the VF's
		// MSI-X interrupts arrived at L1's vfio-pci, and only MSI-X
		// table/PBA accesses exited.
		assertOneContainerAndMapPerRegion(t, env, log, 2)
		var msix uint64
		for name, n := range l1IRQs {
			if strings.HasPrefix(name, "vfio-msix[") && strings.HasSuffix(name, "("+harness.SwitchNVMeVFBDF+")") {
				msix += n
			}
		}
		assert.Positive(t, msix, "MSI-X interrupts of the VF that L1's vfio-pci received")
		assertNoBARExits(t, env, log, harness.SwitchEduBDF, false)
		assertNoBARExits(t, env, log, harness.SwitchNVMeVFBDF, true)
	}, func(t *testing.T, o harness.Outer) {
		assertDiskHolds(t, o, nvmeOffKiBSwitch)
	})
}

// TestSwitchTopologyFlat is TestSwitchTopologyHost's devices with
// --topology flat: both on the guest's root bus, so NCCL finds only the
// host bridge in common (PHB), although L1 has them under one switch. edu
// still computes through its BAR.
func TestSwitchTopologyFlat(t *testing.T) {
	harness.Run(t, harness.ProfileSwitch, func(t *testing.T, env *harness.Env) {
		require.Equal(t, "PIX", l1NCCLPath(t, env), "NCCL's path between edu and the VF in L1")
		g, _, _ := runSwitchGuest(t, env, "flat", "topo,edu")
		assert.Equal(t, "PHB", g["nccl_path"], "NCCL's path between edu (%s) and the VF (%s) in the guest with --topology flat; switches above them: %s / %s",
			g["nccl_gpu"], g["nccl_nic"], g["nccl_gpu_switches"], g["nccl_nic_switches"])
		assert.Equal(t, "none", g["nccl_gpu_switches"], "switches above edu in the flat guest")
		assert.Equal(t, "3628800", g["edu_factorial_10"], "edu factorial of 10 through its BAR")
		assert.Equal(t, "none", g["pt_failed"], "guest passthrough parts that failed")
	})
}

// TestSwitchLargeBAR passes ivshmem-plain, behind L1's switch, through
// with --topology host and --p2p=false (TestPassthroughLargeBAR says why):
// the guest gets it behind an emulated switch, sees the whole 64 GiB BAR2
// in the switch's 64-bit prefetchable window without moving it, and a
// pattern written in the BAR's last page reads back; no BAR access exited
// to hpcvmm, and outside L1 the pattern is in the BAR's backing file.
func TestSwitchLargeBAR(t *testing.T) {
	harness.RunOuter(t, harness.ProfileSwitch, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.SwitchIvshmemBDF, "vfio-pci")
		t.Cleanup(func() { setDriver(t, harness.SwitchIvshmemBDF, "") })
		off := uint64(harness.IvshmemBARSize - 4096 + 0x7c4) // in the last page
		pattern := rand.Uint32() | 1                         // never 0, the sparse file's content
		start := time.Now()
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s hpcvmm.pt=ivshmem hpcvmm.bar_off=%#x hpcvmm.bar_pattern=%#08x", ptBaseCmdline, off, pattern),
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--gpu", harness.SwitchIvshmemBDF, "--p2p=false", "--topology", "host",
		)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
		log := vm.Log()
		tree := logRecord(log, "guest PCI topology of the passthrough devices")
		require.NotNil(t, tree, "no guest PCI topology log line")
		env.Record(t, "guest_tree", tree["tree"])
		assert.Contains(t, tree["tree"], "switch downstream port", "ivshmem behind an emulated switch")
		assert.Equal(t, strconv.FormatUint(harness.IvshmemBARSize, 10), g["ivshmem_bar2_size"], "BAR2 size the guest sees (resource)")
		assert.Equal(t, fmt.Sprintf("%#08x", pattern), g["ivshmem_readback"], "pattern read back through the BAR")
		assert.Equal(t, "none", g["pt_failed"])
		assertBARsKept(t, vm.Console(), g["ivshmem"])
		for _, k := range []string{"ivshmem", "ivshmem_bar2", "ivshmem_bar2_size", "ivshmem_first_access_seconds"} {
			env.Record(t, k, g[k])
		}
		assertNoBARExits(t, env, log, harness.SwitchIvshmemBDF, false)
		env.Record(t, "bar_off", strconv.FormatUint(off, 10))
		env.Record(t, "bar_pattern", strconv.FormatUint(uint64(pattern), 10))
	}, func(t *testing.T, o harness.Outer) {
		assertBARFileHolds(t, o)
	})
}

// barMoved matches the guest kernel's lines about a BAR it could not keep
// where firmware (hpcvmm) put it: both the 6.1 wording ("BAR 2: assigned")
// and the newer one Debian's 6.1 prints ("BAR 2 [mem ...]: assigned").
var barMoved = regexp.MustCompile(`BAR \d+\b.*(assigned|no space|can't assign|can't claim)`)

// assertBARsKept checks that the guest kernel kept every BAR of the guest
// functions bdfs where hpcvmm placed it (no pci=realloc needed).
func assertBARsKept(t *testing.T, console string, bdfs ...string) {
	t.Helper()
	for _, bdf := range bdfs {
		require.NotEmpty(t, bdf, "a guest device was not found")
		for _, l := range strings.Split(console, "\n") {
			if strings.Contains(l, "pci "+bdf) && barMoved.MatchString(l) {
				t.Errorf("the guest kernel moved or dropped a BAR of %s: %q", bdf, strings.TrimSpace(l))
			}
		}
	}
}

// l1NCCLPath classifies, with host/ncclpath on L1's own sysfs, the path
// between edu and the VF (as a NIC), and records it.
func l1NCCLPath(t *testing.T, env *harness.Env) string {
	t.Helper()
	p, err := ncclpath.Classify("/sys", ncclpath.Device{BDF: harness.SwitchEduBDF},
		ncclpath.Device{BDF: harness.SwitchNVMeVFBDF, NIC: true}, ncclpath.DefaultOptions())
	require.NoError(t, err)
	env.Record(t, "l1_nccl_path", p.String())
	return p.String()
}

// runSwitchGuest binds edu and the VF to vfio-pci, boots a guest with
// them and the given --topology running the passthrough parts pt (with
// their parameters), and returns the guest's results, hpcvmm's log and
// the VFIO interrupt counts L1 saw while it ran.
func runSwitchGuest(t *testing.T, env *harness.Env, topology, pt string) (map[string]string, string, map[string]uint64) {
	t.Helper()
	setDriver(t, harness.SwitchEduBDF, "vfio-pci")
	setDriver(t, harness.SwitchNVMeVFBDF, "vfio-pci")
	t.Cleanup(func() {
		setDriver(t, harness.SwitchEduBDF, "")
		setDriver(t, harness.SwitchNVMeVFBDF, "")
	})
	start := time.Now()
	vm := env.StartVM(t, "run",
		"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
		"--cmdline", ptBaseCmdline+" hpcvmm.pt="+pt,
		"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
		"--gpu", harness.SwitchEduBDF, "--vf", harness.SwitchNVMeVFBDF, "--topology", topology,
	)
	l1IRQs := watchL1Interrupts(vm)
	require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
	irqs := recordL1IRQs(t, env, l1IRQs())
	env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
	require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
	g := vm.GuestResults()
	require.Empty(t, g["pcipath_error"], "the guest's pcipath helper failed")
	assertBARsKept(t, vm.Console(), g["nccl_gpu"], g["nccl_nic"])
	log := vm.Log()
	if tree := logRecord(log, "guest PCI topology of the passthrough devices"); tree != nil {
		env.Record(t, "guest_tree", tree["tree"])
	}
	for _, l := range strings.Split(vm.Console(), "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "hpcvmm-guest-pci "); ok {
			t.Logf("guest PCI: %s", rest)
		}
	}
	for _, k := range []string{"nccl_path", "nccl_gpu", "nccl_nic", "nccl_nic_busid", "nccl_gpu_switches", "nccl_nic_switches", "gpu_sysfs", "nic_sysfs"} {
		env.Record(t, k, g[k])
	}
	return g, log, irqs
}

// assertGuestLinksMatchL1 checks the links NCCL reads for each device in
// the guest (the device's own max_link_speed/max_link_width and its
// port's): the device's equal L1's for the same device; its port's equal
// L1's port where L1 knows that link. Where L1's port reports none
// (measured: QEMU 7.2's xio3130 downstream ports say "Unknown" and x0)
// the guest port shows what pcitopo documents instead, the device's own
// link or else pcitopo.DefaultLink, never an unknown link (NCCL would
// rate it at nothing).
func assertGuestLinksMatchL1(t *testing.T, env *harness.Env, g map[string]string) {
	t.Helper()
	for _, d := range []struct{ role, bdf string }{{"gpu", harness.SwitchEduBDF}, {"nic", harness.SwitchNVMeVFBDF}} {
		dev, err := filepath.EvalSymlinks("/sys/bus/pci/devices/" + d.bdf)
		require.NoError(t, err)
		port := filepath.Dir(dev)
		l1 := map[string]string{}
		for _, a := range []struct{ key, dir, name string }{
			{"max_link_speed", dev, "max_link_speed"},
			{"max_link_width", dev, "max_link_width"},
			{"port_max_link_speed", port, "max_link_speed"},
			{"port_max_link_width", port, "max_link_width"},
		} {
			l1[a.key] = sysfsAttr(a.dir, a.name)
			env.Record(t, d.role+"_"+a.key, g[d.role+"_"+a.key])
			env.Record(t, "l1_"+d.role+"_"+a.key, l1[a.key])
		}
		for _, k := range []string{"max_link_speed", "max_link_width"} {
			assert.Equal(t, l1[k], g[d.role+"_"+k], "%s %s (%s): guest vs L1", d.role, k, d.bdf)
		}
		wantSpeed, wantWidth := l1["port_max_link_speed"], l1["port_max_link_width"]
		if !linkKnown(wantSpeed, wantWidth) {
			wantSpeed, wantWidth = l1["max_link_speed"], l1["max_link_width"]
			if !linkKnown(wantSpeed, wantWidth) {
				wantSpeed, wantWidth = pcitopo.DefaultLink.MaxSpeed.String(), strconv.Itoa(pcitopo.DefaultLink.MaxWidth)
			}
		}
		assert.Equal(t, wantSpeed+" x"+wantWidth, g[d.role+"_port_max_link_speed"]+" x"+g[d.role+"_port_max_link_width"],
			"%s's port in the guest (L1's port %s says %s x%s, the device %s x%s)", d.role, filepath.Base(port),
			l1["port_max_link_speed"], l1["port_max_link_width"], l1["max_link_speed"], l1["max_link_width"])
	}
}

// assertGuestChainMatchesL1 compares, function by function from the port
// below the host bridge down to the device, the links the guest shows on
// the device's path (tests/guest/pcipath's ROLE_chain) with L1's on the
// same device's path: the same depth (a root port, the switch's two
// ports, the device), and every link L1 knows equal; a port whose link
// L1 does not know must still show one in the guest.
func assertGuestChainMatchesL1(t *testing.T, env *harness.Env, g map[string]string, role, bdf string) {
	t.Helper()
	dev, err := filepath.EvalSymlinks("/sys/bus/pci/devices/" + bdf)
	require.NoError(t, err)
	var l1 []string
	for p := dev; strings.Count(filepath.Base(p), ":") == 2; p = filepath.Dir(p) {
		l1 = append([]string{sysfsAttr(p, "max_link_speed") + "/" + sysfsAttr(p, "max_link_width")}, l1...)
	}
	guest := strings.Split(g[role+"_chain"], ",")
	env.Record(t, role+"_chain", g[role+"_chain"])
	env.Record(t, "l1_"+role+"_chain", strings.Join(l1, ","))
	require.Len(t, guest, len(l1), "%s: functions on the path in the guest (%q) vs L1 (%q)", role, guest, l1)
	for i := range l1 {
		speed, width, _ := strings.Cut(l1[i], "/")
		gs, gw, _ := strings.Cut(guest[i], "/")
		if linkKnown(speed, width) || i == len(l1)-1 {
			assert.Equal(t, l1[i], guest[i], "%s: link of function %d of %d on the path, guest vs L1", role, i+1, len(l1))
		} else {
			assert.True(t, linkKnown(gs, gw), "%s: port %d of %d on the path shows no link in the guest (%s)", role, i+1, len(l1), guest[i])
		}
	}
}

// linkKnown reports whether sysfs link attributes name a link.
func linkKnown(speed, width string) bool {
	return speed != "none" && !strings.HasPrefix(speed, "Unknown") && width != "none" && width != "0"
}

// sysfsAttr reads a sysfs attribute the way tests/guest/pcipath prints
// it: trimmed, "none" when missing.
func sysfsAttr(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "none"
	}
	return strings.TrimSpace(string(b))
}
