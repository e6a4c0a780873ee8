//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The passthrough scenarios run in one L1 boot (harness.ProfilePassthrough:
// an emulated IOMMU, edu, an NVMe VF and a 64 GiB ivshmem BAR). Each one
// puts the devices it uses on the drivers it needs first and leaves them
// on no driver, so they pass in any order.

// ptBaseCmdline is the L2 command line of every passthrough scenario.
const ptBaseCmdline = "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=pt"

// eduDMABuf is the guest-physical DMA buffer of the edu scenario: hidden
// from the L2 kernel with memmap= so /dev/mem may use it, and below edu's
// 28-bit DMA address mask.
const eduDMABuf = 0x8000000

// eduDMABufHigh is the DMA buffer of the two-device scenario: in guest RAM
// above 4 GiB (a 4 GiB guest has RAM at [4 GiB, 5 GiB)), which edu reaches
// because the profile widens its DMA mask.
const eduDMABufHigh = 0x120000000

// TestPassthroughLargeBAR passes ivshmem-plain with its 64 GiB BAR2 through
// with --p2p=false. Peer-to-peer mapping of that BAR works on L1's 6.1
// kernel but costs CI time: measured in L1, its VFIO_IOMMU_MAP_DMA took
// 48.9 s and 65.1 s (vfio type1 before Linux 6.15 looks up a BAR's pfns
// one 4 KiB page at a time; under TCG every page is emulated) and its
// unmap 7.0 s; TestPassthroughTwoDevices covers BAR peer-to-peer mapping
// with small BARs. Inside L2 the whole BAR is visible and a pattern
// written near its end reads back; on L1 no BAR access exited to hpcvmm
// and, by a kprobe, no MAP_DMA touched the BAR; outside L1 the pattern is
// in the BAR's backing file at that offset.
//
// This scenario is the one that exposed L1 freezing with one-shot LAPIC
// timers (see ProfilePassthrough's nohz=off highres=off).
func TestPassthroughLargeBAR(t *testing.T) {
	harness.RunOuter(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.IvshmemBDF, "vfio-pci")
		t.Cleanup(func() { setDriver(t, harness.IvshmemBDF, "") })

		off := uint64(harness.IvshmemBARSize - 4096 + 0x7c0) // in the last page
		pattern := rand.Uint32() | 1                         // never 0, the sparse file's content
		trace := startMapDMATrace(t)
		start := time.Now()
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s hpcvmm.pt=ivshmem hpcvmm.bar_off=%#x hpcvmm.bar_pattern=%#08x", ptBaseCmdline, off, pattern),
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--gpu", harness.IvshmemBDF, "--p2p=false",
		)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		for i, c := range trace.calls(t) {
			env.Record(t, fmt.Sprintf("trace_map_dma_%d", i), c.String())
			if !c.Unmap {
				assert.LessOrEqual(t, c.IOVA+c.Size, uint64(1<<30), "with --p2p=false only guest RAM ([0, 1 GiB)) is DMA-mapped, not %s", c)
			}
		}
		assert.Nil(t, logRecordWhere(vm.Log(), "DMA mapping", "kind", "BAR"), "a BAR DMA-mapped with --p2p=false")
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")

		assert.Equal(t, strconv.FormatUint(harness.IvshmemBARSize, 10), g["ivshmem_bar2_size"], "BAR2 size the guest sees (resource)")
		assert.Equal(t, fmt.Sprintf("%#08x", pattern), g["ivshmem_readback"], "pattern read back through the BAR")
		assert.Equal(t, "none", g["pt_failed"])
		for _, k := range []string{"ivshmem_bar2", "ivshmem_bar2_size", "ivshmem_bar2_flags", "ivshmem_first_access_seconds"} {
			env.Record(t, k, g[k])
		}
		log := vm.Log()
		bar2 := logRecordWhere(log, "passthrough BAR", "device", harness.IvshmemBDF, "bar", "2")
		require.NotNil(t, bar2, "no 'passthrough BAR' log line for BAR2")
		assert.Equal(t, strconv.FormatUint(harness.IvshmemBARSize, 10), bar2["direct_bytes"], "BAR2 bytes installed as memslots")
		assert.Equal(t, "false", bar2["trapped"], "BAR2 has no trapped part")
		assertNoBARExits(t, env, log, harness.IvshmemBDF, false)
		recordExits(t, env, log)
		dm := logRecord(log, "guest RAM DMA-mapped")
		require.NotNil(t, dm)
		env.Record(t, "map_dma_calls", dm["map_dma_calls"])
		env.Record(t, "bar_off", strconv.FormatUint(off, 10))
		env.Record(t, "bar_pattern", strconv.FormatUint(uint64(pattern), 10))
	}, func(t *testing.T, o harness.Outer) {
		assertBARFileHolds(t, o)
	})
}

// TestPassthroughDMA passes edu (the GPU stand-in) through with --gpu and
// checks, inside L2: the device is found and its id register reads
// 0x010000ed through the BAR (a memslot), its liveness and factorial
// registers work, a DMA round trip guest RAM -> device -> guest RAM
// through L1's IOMMU returns the bytes written, INTx interrupts arrive
// (uio_pci_generic) and MSI interrupts arrive (the edu_msi test module);
// on the L1 side: one container, guest RAM DMA-mapped with one MAP_DMA per
// RAM region, and no BAR access exited to hpcvmm (edu has no MSI-X, so
// nothing of its BAR is trapped).
func TestPassthroughDMA(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.EduBDF, "vfio-pci")
		t.Cleanup(func() { setDriver(t, harness.EduBDF, "") })

		start := time.Now()
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s hpcvmm.pt=edu,edu_intx,edu_msi hpcvmm.dma_buf=%#x memmap=1M$%#x", ptBaseCmdline, eduDMABuf, eduDMABuf),
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--gpu", harness.EduBDF,
		)
		l1IRQs := watchL1Interrupts(vm)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		l1 := recordL1IRQs(t, env, l1IRQs())
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")

		// Inside L2.
		assert.NotEqual(t, "missing", g["edu"], "edu (1234:11e8) not found on the guest's PCI bus")
		assert.Equal(t, "0x010000ed", g["edu_id"], "edu id register read through BAR0")
		assert.Equal(t, "0xedcba987", g["edu_liveness"], "edu liveness register (reads back inverted)")
		assert.Equal(t, "3628800", g["edu_factorial_10"], "edu factorial of 10")
		assert.Equal(t, "1", g["dma_done"], "both DMA transfers completed (command bit 0 cleared)")
		assert.Equal(t, "16", g["dma_words_matching"], "words of the DMA round trip equal to what was written (first word %s, expected %s)", g["dma_first_word"], g["dma_expected_first"])
		assert.Equal(t, "uio_pci_generic", g["intx_driver"])
		assert.Equal(t, "5", g["intx_received"], "INTx interrupts received through /dev/uio0 of 5 raised")
		assert.Equal(t, "5", g["intx_uio_count"], "uio's interrupt count")
		assert.Equal(t, "edu_msi", g["msi_driver"], "edu_msi module bound (msi_error=%q)", g["msi_error"])
		assert.Equal(t, "1", g["msi_enabled"], "MSI enabled on edu in the guest")
		assert.Equal(t, "8", g["msi_counted"], "MSIs received of %s raised (%s timed out)", g["msi_raised"], g["msi_timeouts"])
		assert.Equal(t, "msi", g["msi_irq_mode"], "interrupt mode in the guest's sysfs msi_irqs")
		assert.Equal(t, "none", g["pt_failed"], "guest passthrough parts that failed")
		for _, k := range []string{"edu", "edu_bar0", "edu_bar0_size", "edu_id", "dma_words_matching", "dma_seconds",
			"intx_received", "intx_proc_interrupts", "msi_counted", "msi_proc_interrupts"} {
			env.Record(t, k, g[k])
		}

		// L1 side.
		log := vm.Log()
		assertOneContainerAndMapPerRegion(t, env, log, 1)
		assertNoBARExits(t, env, log, harness.EduBDF, false)
		recordExits(t, env, log)
		assert.GreaterOrEqual(t, l1["vfio-intx("+harness.EduBDF+")"], uint64(5), "edu INTx interrupts L1's vfio-pci received")
		assert.GreaterOrEqual(t, l1["vfio-msi[0]("+harness.EduBDF+")"], uint64(8), "edu MSIs L1's vfio-pci received")
		assert.Equal(t, "vfio-pci", pciDriver(harness.EduBDF), "edu's driver after the VM (no --bind-devices: left on vfio-pci)")
	})
}

// Where the NVMe scenarios write in the namespace: each at its own offset,
// since they share one disk image and the outer checks run after all of
// them.
const (
	nvmeKiB           = 512
	nvmeOffKiBVF      = 2048
	nvmeOffKiBTwoDevs = 4096
)

// TestPassthroughVF passes the NVMe VF through with --vf: inside L2 the
// stock nvme driver binds, its namespace appears, data written reads back
// after dropping the page cache, and the queues' interrupts are MSI-X and
// counted in /proc/interrupts; on L1 hpcvmm named the VF's PF and only
// MSI-X table/PBA accesses exited; outside L1 the data is in the disk
// image behind the VF.
func TestPassthroughVF(t *testing.T) {
	harness.RunOuter(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.NVMeVFBDF, "vfio-pci")
		t.Cleanup(func() { setDriver(t, harness.NVMeVFBDF, "") })

		start := time.Now()
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s hpcvmm.pt=nvme hpcvmm.nvme_off_kib=%d hpcvmm.nvme_kib=%d", ptBaseCmdline, nvmeOffKiBVF, nvmeKiB),
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--vf", harness.NVMeVFBDF,
		)
		l1IRQs := watchL1Interrupts(vm)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		l1 := recordL1IRQs(t, env, l1IRQs())
		var msix uint64
		for name, n := range l1 {
			if strings.HasPrefix(name, "vfio-msix[") && strings.HasSuffix(name, "("+harness.NVMeVFBDF+")") {
				msix += n
			}
		}
		assert.Positive(t, msix, "MSI-X interrupts of the VF that L1's vfio-pci received")
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
		assertNVMeGuest(t, env, g)
		// Through MCFG/ECAM the guest sees the VF's whole 4 KiB config
		// space, extended capabilities included, as L1 does.
		assert.Equal(t, "4096", g["nvme_config_bytes"], "the VF's config file in the guest")
		assert.Equal(t, l1ConfigDword(t, harness.NVMeVFBDF, 0x100), g["nvme_config_0x100"], "dword 0x100 of the VF's config space: guest vs L1")
		env.Record(t, "nvme_config_0x100", g["nvme_config_0x100"])

		log := vm.Log()
		vf := logRecord(log, "SR-IOV virtual function")
		require.NotNil(t, vf, "hpcvmm did not log the VF and its PF")
		assert.Equal(t, harness.NVMeVFBDF, vf["vf"])
		assert.Equal(t, harness.NVMePFBDF, vf["pf"], "the VF's physical function")
		assertOneContainerAndMapPerRegion(t, env, log, 1)
		assertNoBARExits(t, env, log, harness.NVMeVFBDF, true)
		recordExits(t, env, log)
		env.Record(t, "nvme_sha256", g["nvme_written_sha256"])
	}, func(t *testing.T, o harness.Outer) {
		assertDiskHolds(t, o, nvmeOffKiBVF)
	})
}

// TestPassthroughTwoDevices passes edu (--gpu, already on vfio-pci) and the
// NVMe VF (--vf, on the host's nvme driver, taken with --bind-devices) through to
// one guest with 4 GiB of RAM, so guest RAM is two regions: [0, 3 GiB) and
// [4 GiB, 5 GiB). Both devices work inside L2, and edu's DMA round trip
// goes through a buffer above 4 GiB. On L1 one container holds both groups
// and guest RAM was DMA-mapped exactly once per region (not once per
// device): by hpcvmm's log and, independently, by a kprobe on L1's
// VFIO_IOMMU_MAP_DMA handler, which also sees the devices' BARs mapped for
// peer-to-peer (--p2p is on by default). After the VM ended the VF is back
// on nvme and the journal is gone.
func TestPassthroughTwoDevices(t *testing.T) {
	harness.RunOuter(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.EduBDF, "vfio-pci")
		setDriver(t, harness.NVMeVFBDF, "nvme")
		t.Cleanup(func() {
			setDriver(t, harness.EduBDF, "")
			setDriver(t, harness.NVMeVFBDF, "")
		})
		journalsBefore := journals(t)
		trace := startMapDMATrace(t)

		start := time.Now()
		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", fmt.Sprintf("%s hpcvmm.pt=edu,nvme hpcvmm.dma_buf=%#x memmap=1M$%#x hpcvmm.nvme_off_kib=%d hpcvmm.nvme_kib=%d",
				ptBaseCmdline, eduDMABufHigh, eduDMABufHigh, nvmeOffKiBTwoDevs, nvmeKiB),
			"--cpus", "1", "--memory", "4G", "--hugepages", "1G",
			"--gpu", harness.EduBDF, "--vf", harness.NVMeVFBDF, "--bind-devices",
		)
		require.Equal(t, 0, vm.Wait(), "hpcvmm exit status")
		env.Record(t, "wall_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
		traced := trace.calls(t)
		var calls, unmaps []mapDMACall
		for _, c := range traced {
			if c.Unmap {
				unmaps = append(unmaps, c)
			} else {
				calls = append(calls, c)
			}
		}
		g := vm.GuestResults()
		require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
		assert.Equal(t, "0x010000ed", g["edu_id"], "edu id register in the guest")
		assert.Equal(t, "1", g["dma_done"], "both edu DMA transfers completed (command bit 0 cleared)")
		assert.Equal(t, "16", g["dma_words_matching"], "words of the DMA round trip through guest RAM at %#x (above 4 GiB) equal to what was written (first word %s, expected %s)",
			eduDMABufHigh, g["dma_first_word"], g["dma_expected_first"])
		env.Record(t, "dma_buf", fmt.Sprintf("%#x", eduDMABufHigh))
		env.Record(t, "dma_words_matching", g["dma_words_matching"])
		assertNVMeGuest(t, env, g)

		log := vm.Log()
		ctr := assertOneContainerAndMapPerRegion(t, env, log, 2)
		assert.Equal(t, "2", ctr["devices"], "devices in the container")
		recordExits(t, env, log)
		ram := [][2]uint64{{0, 3 << 30}, {4 << 30, 1 << 30}} // [iova, size]: below the 32-bit hole, from 4 GiB
		assert.Equal(t, strconv.Itoa(len(ram)), logRecord(log, "guest RAM DMA-mapped")["regions"], "guest RAM regions of a 4 GiB guest")
		var logged [][2]uint64
		for _, r := range logRecords(log, "DMA mapping") {
			if r["kind"] == "guest RAM" {
				iova, err1 := strconv.ParseUint(r["iova"], 0, 64)
				size, err2 := strconv.ParseUint(r["size"], 10, 64)
				require.NoError(t, errors.Join(err1, err2), "DMA mapping line %v", r)
				logged = append(logged, [2]uint64{iova, size})
				env.Record(t, "ram_map_"+r["name"], fmt.Sprintf("iova=%s size=%s took=%s", r["iova"], r["size"], r["took"]))
			}
		}
		assert.Equal(t, ram, logged, "guest RAM mappings in hpcvmm's log")
		// --p2p is on by default: each device's BAR0 is DMA-mapped too (the
		// VF's minus its MSI-X pages).
		for _, bdf := range []string{harness.EduBDF, harness.NVMeVFBDF} {
			assert.NotNil(t, logRecordWhere(log, "DMA mapping", "kind", "BAR", "name", bdf+" BAR0"), "no peer-to-peer DMA mapping of %s BAR0", bdf)
		}
		var bars [][2]uint64
		for _, r := range logRecords(log, "DMA mapping") {
			if r["kind"] == "BAR" {
				iova, err1 := strconv.ParseUint(r["iova"], 0, 64)
				size, err2 := strconv.ParseUint(r["size"], 10, 64)
				require.NoError(t, errors.Join(err1, err2), "DMA mapping line %v", r)
				bars = append(bars, [2]uint64{iova, size})
			}
		}
		barLines := len(bars)

		// Independently: what L1's kernel received.
		for _, b := range bars {
			n := 0
			for _, c := range calls {
				if c.IOVA == b[0] && c.Size == b[1] {
					n++
				}
			}
			assert.Equal(t, 1, n, "MAP_DMA calls L1's kernel saw for the BAR mapping [%#x, +%#x) hpcvmm logged", b[0], b[1])
		}
		for _, r := range ram {
			n := 0
			for _, c := range calls {
				if c.IOVA == r[0] && c.Size == r[1] {
					n++
					assert.Zero(t, c.Ret, "MAP_DMA of [%#x, +%#x) returned %d", c.IOVA, c.Size, c.Ret)
				}
			}
			assert.Equal(t, 1, n, "MAP_DMA calls L1's kernel saw for guest RAM [%#x, %#x)", r[0], r[0]+r[1])
		}
		inRAM := 0
		for _, c := range calls {
			for _, r := range ram {
				if c.IOVA < r[0]+r[1] && r[0] < c.IOVA+c.Size {
					inRAM++
				}
			}
		}
		assert.Equal(t, len(ram), inRAM, "MAP_DMA calls touching guest RAM, by the kprobe")
		assert.Len(t, calls, len(ram)+barLines, "MAP_DMA calls by the kprobe vs hpcvmm's DMA mapping lines (guest RAM + BARs)")
		env.Record(t, "trace_map_dma_calls", strconv.Itoa(len(calls)))
		env.Record(t, "trace_map_dma_ram_calls", strconv.Itoa(inRAM))
		for _, r := range ram {
			n := 0
			for _, c := range unmaps {
				if c.IOVA == r[0] && c.Size == r[1] {
					n++
				}
			}
			assert.Equal(t, 1, n, "UNMAP_DMA calls L1's kernel saw for guest RAM [%#x, %#x) when the VM ended", r[0], r[0]+r[1])
		}
		for i, c := range traced {
			env.Record(t, fmt.Sprintf("trace_map_dma_%d", i), c.String())
		}

		rb := logRecord(log, "rebound to vfio-pci for this VM")
		require.NotNil(t, rb, "hpcvmm did not log rebinding the VF")
		assert.Equal(t, harness.NVMeVFBDF, rb["device"])
		assert.Equal(t, "nvme", rb["was"], "driver the VF was taken from")
		assert.Equal(t, "nvme", pciDriver(harness.NVMeVFBDF), "the VF's driver after the VM ended (--bind-devices gives it back)")
		assert.Equal(t, "vfio-pci", pciDriver(harness.EduBDF), "edu was on vfio-pci before and is left there")
		assert.Equal(t, journalsBefore, journals(t), "host-state journals after the VM ended")
		env.Record(t, "vf_driver_after", pciDriver(harness.NVMeVFBDF))
		env.Record(t, "nvme_sha256", g["nvme_written_sha256"])
	}, func(t *testing.T, o harness.Outer) {
		assertDiskHolds(t, o, nvmeOffKiBTwoDevs)
	})
}

// TestPassthroughBindKill takes the VF from the host's nvme driver with
// --bind-devices, kills hpcvmm with SIGKILL while the guest boots, and checks that
// the VF stays on vfio-pci with the journal left behind, and that
// `hpcvmm unbind` then gives it back to nvme and removes the journal.
func TestPassthroughBindKill(t *testing.T) {
	harness.Run(t, harness.ProfilePassthrough, func(t *testing.T, env *harness.Env) {
		setDriver(t, harness.NVMeVFBDF, "nvme")
		t.Cleanup(func() { setDriver(t, harness.NVMeVFBDF, "") })
		journalsBefore := journals(t)

		vm := env.StartVM(t, "run",
			"--kernel", env.L2Kernel(t), "--initrd", env.L2Initrd(t),
			"--cmdline", ptBaseCmdline+" hpcvmm.pt=nvme hpcvmm.hold=600",
			"--cpus", "1", "--memory", "1G", "--hugepages", "1G",
			"--vf", harness.NVMeVFBDF, "--bind-devices",
		)
		// Mid-boot: once the guest kernel prints, the VF is bound and the
		// VM runs.
		_, ok := vm.WaitForLine("Linux version", 3*time.Minute)
		require.True(t, ok, "the guest kernel never started")
		require.Equal(t, "vfio-pci", pciDriver(harness.NVMeVFBDF), "the VF's driver while the VM runs")
		require.NoError(t, syscall.Kill(vm.PID(), syscall.SIGKILL))
		assert.Equal(t, -1, vm.Wait(), "hpcvmm killed by a signal")

		assert.Equal(t, "vfio-pci", pciDriver(harness.NVMeVFBDF), "after SIGKILL nothing restored the VF")
		left := journals(t)
		assert.Greater(t, len(left), len(journalsBefore), "a journal in %s records the rebinding", journalDir)
		env.Record(t, "journals_after_kill", strings.Join(left, ","))

		out, err := exec.Command(env.HPCVMM(t), "unbind", harness.NVMeVFBDF).CombinedOutput()
		require.NoError(t, err, "hpcvmm unbind %s:\n%s", harness.NVMeVFBDF, out)
		t.Logf("hpcvmm unbind:\n%s", out)
		assert.Contains(t, string(out), "restored:")
		assert.Contains(t, string(out), harness.NVMeVFBDF)
		assert.Equal(t, "nvme", pciDriver(harness.NVMeVFBDF), "the VF's driver after hpcvmm unbind")
		assert.Equal(t, journalsBefore, journals(t), "journals after hpcvmm unbind")
		env.Record(t, "vf_driver_after_unbind", pciDriver(harness.NVMeVFBDF))

		out, err = exec.Command(env.HPCVMM(t), "unbind", harness.NVMeVFBDF).CombinedOutput()
		require.NoError(t, err, "a second hpcvmm unbind:\n%s", out)
		assert.Contains(t, string(out), "nothing to restore")
	})
}

// assertNVMeGuest checks the guest side of the NVMe VF: the stock driver
// bound, I/O read back equal, MSI-X interrupts counted.
func assertNVMeGuest(t *testing.T, env *harness.Env, g map[string]string) {
	t.Helper()
	assert.NotEqual(t, "missing", g["nvme"], "the NVMe VF (1b36:0010) not found in the guest")
	assert.Equal(t, "nvme", g["nvme_driver"], "the guest's driver on the VF")
	assert.NotEqual(t, "none", g["nvme_block"], "no NVMe namespace block device in the guest")
	assert.Equal(t, strconv.Itoa(harness.NVMeDiskSize), g["nvme_bytes"], "namespace size in the guest")
	assert.Len(t, g["nvme_written_sha256"], 64)
	assert.Equal(t, g["nvme_written_sha256"], g["nvme_read_sha256"], "data read back from the namespace")
	assert.Equal(t, "msix,", g["nvme_irq_mode"], "the VF's interrupt mode in the guest")
	n, _ := strconv.Atoi(g["nvme_irqs"])
	assert.Greater(t, n, 0, "nvme interrupts counted in the guest's /proc/interrupts")
	assert.Empty(t, g["nvme_write_error"]+g["nvme_read_error"], "dd errors on the namespace")
	for _, k := range []string{"nvme", "nvme_block", "nvme_bytes", "nvme_irq_mode", "nvme_irqs", "nvme_irq_lines", "nvme_io_seconds"} {
		env.Record(t, k, g[k])
	}
}

// assertDiskHolds checks, outside L1, that the NVMe disk image holds the
// data the guest wrote through the VF.
func assertDiskHolds(t *testing.T, o harness.Outer, offKiB int64) {
	t.Helper()
	f, err := os.Open(filepath.Join(o.RunDir, harness.PassthroughDiskFile))
	require.NoError(t, err)
	defer f.Close()
	h := sha256.New()
	_, err = io.Copy(h, io.NewSectionReader(f, offKiB<<10, nvmeKiB<<10))
	require.NoError(t, err)
	assert.Equal(t, o.Records["nvme_sha256"], hex.EncodeToString(h.Sum(nil)),
		"SHA-256 of the disk image outside L1 at %d KiB (%d KiB) vs what the L2 guest wrote", offKiB, nvmeKiB)
}

// assertOneContainerAndMapPerRegion checks hpcvmm's log: one VFIO container
// for devices devices, and exactly one VFIO_IOMMU_MAP_DMA per guest RAM
// region. It returns the container line's fields.
func assertOneContainerAndMapPerRegion(t *testing.T, env *harness.Env, log string, devices int) map[string]string {
	t.Helper()
	ctrs := logRecords(log, "VFIO container shared by all passed-through devices")
	require.Len(t, ctrs, 1, "container log lines")
	assert.Equal(t, "1", ctrs[0]["containers"])
	assert.Equal(t, strconv.Itoa(devices), ctrs[0]["devices"])
	dm := logRecords(log, "guest RAM DMA-mapped")
	require.Len(t, dm, 1, "guest RAM DMA-mapped log lines")
	assert.NotEmpty(t, dm[0]["regions"])
	assert.Equal(t, dm[0]["regions"], dm[0]["map_dma_calls"], "VFIO_IOMMU_MAP_DMA calls for guest RAM vs RAM regions")
	env.Record(t, "map_dma_calls", dm[0]["map_dma_calls"])
	env.Record(t, "ram_regions", dm[0]["regions"])
	return ctrs[0]
}

// assertNoBARExits checks that no access to bdf's BARs exited to hpcvmm
// except MSI-X table/PBA accesses (allowed only when msix is set).
func assertNoBARExits(t *testing.T, env *harness.Env, log, bdf string, msix bool) {
	t.Helper()
	recs := logRecords(log, "passthrough BAR accesses that exited to hpcvmm")
	seen := 0
	for _, r := range recs {
		if r["device"] != bdf {
			continue
		}
		seen++
		assert.Equal(t, "0", r["other"], "%s BAR%s: accesses outside the MSI-X pages that exited to hpcvmm", bdf, r["bar"])
		if !msix {
			assert.Equal(t, "0", r["msix"], "%s BAR%s: MSI-X accesses on a device without MSI-X", bdf, r["bar"])
		}
		env.Record(t, fmt.Sprintf("bar%s_exits_msix", r["bar"]), r["msix"])
		env.Record(t, fmt.Sprintf("bar%s_exits_other", r["bar"]), r["other"])
	}
	assert.Positive(t, seen, "no BAR access counts logged for %s", bdf)
}

// recordExits records hpcvmm's userspace exit counts by reason and its
// time from start to the first KVM_RUN (the launch cost, DMA mapping included).
func recordExits(t *testing.T, env *harness.Env, log string) {
	t.Helper()
	if r := logRecord(log, "first KVM_RUN"); r != nil {
		env.Record(t, "first_kvm_run_since_start", r["since_start"])
	}
	if r := logRecord(log, "guest RAM ready"); r != nil {
		env.Record(t, "guest_ram_prefault", r["prefault"])
	}
	recordTimeline(t, env, log)
	ex := logRecord(log, "userspace exits by reason")
	require.NotNil(t, ex, "no 'userspace exits by reason' log line")
	for k, v := range ex {
		if k != "time" && k != "level" && k != "msg" {
			env.Record(t, "exits_"+k, v)
		}
	}
}

// timelineMsgs are the hpcvmm log lines whose time recordTimeline records.
var timelineMsgs = []string{"guest RAM ready", "guest RAM DMA-mapped", "DMA mapping", "first KVM_RUN",
	"userspace exits by reason", "DMA unmapping", "VFIO container closed"}

// recordTimeline records when each timelineMsgs line was logged, in
// milliseconds after hpcvmm's first log line: where a launch or a teardown
// spends its time.
func recordTimeline(t *testing.T, env *harness.Env, log string) {
	t.Helper()
	var first time.Time
	n := 0
	for _, line := range strings.Split(log, "\n") {
		fields, err := harness.ParseFields(line)
		if err != nil {
			continue
		}
		m := map[string]string{}
		for _, f := range fields {
			m[f.Key] = f.Value
		}
		ts, err := time.Parse(time.RFC3339Nano, m["time"])
		if err != nil {
			continue
		}
		if first.IsZero() {
			first = ts
		}
		for _, msg := range timelineMsgs {
			if m["msg"] == msg {
				env.Record(t, fmt.Sprintf("timeline_%02d", n), fmt.Sprintf("%dms %s %s %s", ts.Sub(first).Milliseconds(), msg, m["name"], m["took"]))
				n++
			}
		}
	}
}

// logRecords returns the fields of every hpcvmm log line (slog text
// format) whose msg is msg.
func logRecords(log, msg string) []map[string]string {
	var out []map[string]string
	for _, line := range strings.Split(log, "\n") {
		fields, err := harness.ParseFields(line)
		if err != nil {
			continue
		}
		m := map[string]string{}
		for _, f := range fields {
			m[f.Key] = f.Value
		}
		if m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// logRecord returns the first log line with msg, or nil.
func logRecord(log, msg string) map[string]string {
	if r := logRecords(log, msg); len(r) > 0 {
		return r[0]
	}
	return nil
}

// logRecordWhere returns the first log line with msg whose fields have the
// given key/value pairs, or nil.
func logRecordWhere(log, msg string, kv ...string) map[string]string {
next:
	for _, r := range logRecords(log, msg) {
		for i := 0; i+1 < len(kv); i += 2 {
			if r[kv[i]] != kv[i+1] {
				continue next
			}
		}
		return r
	}
	return nil
}

// pciDriver returns the driver bound to bdf ("" for none).
func pciDriver(bdf string) string {
	l, err := os.Readlink("/sys/bus/pci/devices/" + bdf + "/driver")
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// setDriver binds bdf to drv ("" leaves it without a driver) through
// driver_override, as an admin would, independently of hpcvmm's own
// binding code.
func setDriver(t *testing.T, bdf, drv string) {
	t.Helper()
	dev := "/sys/bus/pci/devices/" + bdf
	if cur := pciDriver(bdf); cur == drv {
		return
	} else if cur != "" {
		writeSysfs(t, dev+"/driver/unbind", bdf)
	}
	// A newline clears driver_override.
	writeSysfs(t, dev+"/driver_override", drv+"\n")
	if drv == "" {
		return
	}
	writeSysfs(t, "/sys/bus/pci/drivers_probe", bdf)
	require.Equal(t, drv, pciDriver(bdf), "driver of %s after binding it to %s", bdf, drv)
}

func writeSysfs(t *testing.T, path, value string) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(value), 0o200), "echo %q > %s", value, path)
}

// mapDMATrace watches VFIO_IOMMU_MAP_DMA in L1's kernel, independently of
// hpcvmm's own count: a kprobe on vfio_iommu_type1_ioctl filtered to that
// command records each call's IOVA and size (read from the caller's struct
// vfio_iommu_type1_dma_map), a kretprobe its return value and time. It
// sees VFIO_IOMMU_UNMAP_DMA too (same layout up to size).
type mapDMATrace struct{ dir string }

// mapDMACall is one VFIO_IOMMU_MAP_DMA or VFIO_IOMMU_UNMAP_DMA the kprobe
// saw.
type mapDMACall struct {
	Unmap      bool
	TID        int
	IOVA, Size uint64
	Start, End float64 // trace clock, seconds
	Ret        int64
}

func (c mapDMACall) ms() float64 { return (c.End - c.Start) * 1000 }

func (c mapDMACall) String() string {
	op := "map"
	if c.Unmap {
		op = "unmap"
	}
	return fmt.Sprintf("%s iova=%#x size=%#x ms=%.3f ret=%d", op, c.IOVA, c.Size, c.ms(), c.Ret)
}

// Kprobe events of mapDMATrace, in their own group so removing them
// touches nothing else.
const (
	ptTraceGroup = "hpcvmm_pt"
	// vfioIOMMUMapDMA and vfioIOMMUUnmapDMA are VFIO_IOMMU_MAP_DMA and
	// VFIO_IOMMU_UNMAP_DMA, _IO(';', 100 + 13) and _IO(';', 100 + 14),
	// from linux/vfio.h.
	vfioIOMMUMapDMA   = 0x3b71
	vfioIOMMUUnmapDMA = 0x3b72
)

// startMapDMATrace mounts tracefs if needed, installs the probes, clears
// the trace buffer and enables the probes until t ends.
func startMapDMATrace(t *testing.T) *mapDMATrace {
	t.Helper()
	dir := "/sys/kernel/tracing"
	if _, err := os.Stat(dir + "/kprobe_events"); err != nil {
		require.NoError(t, syscall.Mount("tracefs", dir, "tracefs", 0, ""), "mount tracefs on %s", dir)
	}
	tr := &mapDMATrace{dir: dir}
	// On x86-64 vfio_iommu_type1_ioctl(iommu_data, cmd, arg) has cmd in
	// %si and the user pointer arg in %dx; struct vfio_iommu_type1_dma_map
	// is {u32 argsz, flags; u64 vaddr, iova, size} and struct
	// vfio_iommu_type1_dma_unmap {u32 argsz, flags; u64 iova, size}, so
	// the probe reads the three u64 after the header and calls sorts
	// them out by command.
	defs := []string{
		"p:" + ptTraceGroup + "/map_dma vfio_iommu_type1_ioctl cmd=%si:u32 a8=+u8(%dx):x64 a16=+u16(%dx):x64 a24=+u24(%dx):x64",
		"r:" + ptTraceGroup + "/map_dma_ret vfio_iommu_type1_ioctl ret=$retval:s64",
	}
	for _, d := range defs {
		appendSysfs(t, dir+"/kprobe_events", d)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(dir+"/events/"+ptTraceGroup+"/enable", []byte("0"), 0o200)
		for _, ev := range []string{"map_dma", "map_dma_ret"} {
			f, err := os.OpenFile(dir+"/kprobe_events", os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				_, _ = f.WriteString("-:" + ptTraceGroup + "/" + ev + "\n")
				f.Close()
			}
		}
	})
	writeSysfs(t, dir+"/events/"+ptTraceGroup+"/map_dma/filter", fmt.Sprintf("cmd == %d || cmd == %d", vfioIOMMUMapDMA, vfioIOMMUUnmapDMA))
	writeSysfs(t, dir+"/trace", "")
	writeSysfs(t, dir+"/events/"+ptTraceGroup+"/enable", "1")
	writeSysfs(t, dir+"/tracing_on", "1")
	return tr
}

// ptTraceLine matches an ftrace text line: "COMM-TID [CPU] FLAGS TIME: EVENT: ARGS".
var ptTraceLine = regexp.MustCompile(`^\s*.*?-(\d+)\s+(?:\(\s*[\d-]+\)\s+)?\[\d+\]\s+(?:\S+\s+)?(\d+\.\d+):\s+(map_dma(?:_ret)?):\s*(.*)$`)

// calls returns the MAP_DMA and UNMAP_DMA calls traced so far, each paired with the next
// return on its thread (the entry probe is filtered to MAP_DMA, the return
// probe is not, so returns without an open entry belong to other
// commands). An entry without a return fails the test.
func (tr *mapDMATrace) calls(t *testing.T) []mapDMACall {
	t.Helper()
	b, err := os.ReadFile(tr.dir + "/trace")
	require.NoError(t, err)
	var out []mapDMACall
	open := map[int]int{}
	for _, line := range strings.Split(string(b), "\n") {
		m := ptTraceLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		tid, _ := strconv.Atoi(m[1])
		ts, _ := strconv.ParseFloat(m[2], 64)
		args := map[string]string{}
		for _, f := range strings.Fields(m[4]) {
			if k, v, ok := strings.Cut(f, "="); ok {
				args[k] = v
			}
		}
		if m[3] == "map_dma" {
			cmd, err0 := strconv.ParseUint(args["cmd"], 0, 32)
			a8, err1 := strconv.ParseUint(args["a8"], 0, 64)
			a16, err2 := strconv.ParseUint(args["a16"], 0, 64)
			a24, err3 := strconv.ParseUint(args["a24"], 0, 64)
			require.NoError(t, errors.Join(err0, err1, err2, err3), "trace line %q", line)
			c := mapDMACall{TID: tid, IOVA: a16, Size: a24, Start: ts}
			if cmd == vfioIOMMUUnmapDMA {
				c = mapDMACall{Unmap: true, TID: tid, IOVA: a8, Size: a16, Start: ts}
			}
			open[tid] = len(out)
			out = append(out, c)
			continue
		}
		if i, ok := open[tid]; ok {
			delete(open, tid)
			out[i].End = ts
			out[i].Ret, _ = strconv.ParseInt(args["ret"], 0, 64)
		}
	}
	for _, i := range open {
		t.Errorf("traced MAP_DMA/UNMAP_DMA of [%#x, +%#x) on thread %d never returned", out[i].IOVA, out[i].Size, out[i].TID)
	}
	return out
}

// appendSysfs appends a line to a tracefs control file (kprobe_events
// keeps existing definitions only when opened for appending).
func appendSysfs(t *testing.T, path, value string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(value + "\n")
	require.NoError(t, errors.Join(err, f.Close()), "echo %q >> %s", value, path)
}

// journalDir is where hpcvmm keeps its host-state journals.
const journalDir = "/run/hpcvmm"

// journals lists hpcvmm's host-state journals (not the harness's files).
func journals(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(journalDir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatalf("reading %s: %v", journalDir, err)
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() { // cpus/: the CPU claims, not a journal
			out = append(out, e.Name())
		}
	}
	return out
}

// watchL1Interrupts samples L1's /proc/interrupts while vm runs and
// returns a function giving, per VFIO interrupt line of L1 (vfio-intx,
// vfio-msi, vfio-msix: the device's interrupts as L1 received them), the
// highest count seen, summed over CPUs.
func watchL1Interrupts(vm *harness.VMProcess) func() map[string]uint64 {
	seen := map[string]uint64{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !vm.Exited() {
			b, err := os.ReadFile("/proc/interrupts")
			if err == nil {
				for _, line := range strings.Split(string(b), "\n") {
					f := strings.Fields(line)
					if len(f) < 3 || !strings.HasPrefix(f[len(f)-1], "vfio") {
						continue
					}
					var n uint64
					for _, x := range f[1:] {
						v, err := strconv.ParseUint(x, 10, 64)
						if err != nil {
							break
						}
						n += v
					}
					name := f[len(f)-1]
					seen[name] = max(seen[name], n)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return func() map[string]uint64 {
		<-done
		return seen
	}
}

// recordL1IRQs records what watchL1Interrupts saw and returns it.
func recordL1IRQs(t *testing.T, env *harness.Env, seen map[string]uint64) map[string]uint64 {
	t.Helper()
	for name, n := range seen {
		env.Record(t, "l1_irq_"+name, strconv.FormatUint(n, 10))
	}
	return seen
}

// l1ConfigDword reads a dword of a device's config space as L1 sees it,
// formatted like the guest's hexdump ("%08x").
func l1ConfigDword(t *testing.T, bdf string, off int64) string {
	t.Helper()
	f, err := os.Open("/sys/bus/pci/devices/" + bdf + "/config")
	require.NoError(t, err)
	defer f.Close()
	var b [4]byte
	_, err = f.ReadAt(b[:], off)
	require.NoError(t, err, "read %s config at %#x (needs root for the extended space)", bdf, off)
	return fmt.Sprintf("%08x", binary.LittleEndian.Uint32(b[:]))
}

// assertBARFileHolds checks, outside L1 after it powered off, that the
// ivshmem BAR's backing file holds the pattern the L2 guest wrote at the
// offset the scenario recorded (bar_off, bar_pattern).
func assertBARFileHolds(t *testing.T, o harness.Outer) {
	t.Helper()
	off, err1 := strconv.ParseInt(o.Records["bar_off"], 10, 64)
	pattern, err2 := strconv.ParseUint(o.Records["bar_pattern"], 10, 32)
	require.NoError(t, errors.Join(err1, err2), "records bar_off=%q bar_pattern=%q", o.Records["bar_off"], o.Records["bar_pattern"])
	f, err := os.Open(filepath.Join(o.RunDir, harness.PassthroughBARFile))
	require.NoError(t, err)
	defer f.Close()
	var b [4]byte
	_, err = f.ReadAt(b[:], off)
	require.NoError(t, err)
	assert.Equal(t, uint32(pattern), binary.LittleEndian.Uint32(b[:]),
		"the BAR's backing file outside L1 at offset %#x holds what the L2 guest wrote there", off)
	t.Logf("outside L1: %s at %#x holds %#08x", harness.PassthroughBARFile, off, binary.LittleEndian.Uint32(b[:]))
}
