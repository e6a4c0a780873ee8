package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// The passthrough stand-ins of ProfilePassthrough inside L1 (see
// docs/testbed.md): their addresses are fixed by the profile's QEMU
// arguments.
const (
	// EduBDF is QEMU's edu device (1234:11e8), the GPU stand-in: BAR0
	// registers, DMA, INTx and one MSI vector.
	EduBDF = "0000:00:04.0"
	// NVMePFBDF is the SR-IOV capable NVMe controller (1b36:0010); L1
	// keeps it on the nvme driver to manage its VF.
	NVMePFBDF = "0000:00:05.0"
	// NVMeVFBDF is the NVMe virtual function L1's setup creates, the
	// InfiniBand VF stand-in (MSI-X, its own IOMMU group, a physfn link).
	NVMeVFBDF = "0000:00:05.1"
	// IvshmemBDF is ivshmem-plain (1af4:1110) with a 64 GiB BAR2 backed by
	// a sparse file outside L1, the large-BAR stand-in.
	IvshmemBDF = "0000:00:06.0"

	// IvshmemBARSize is the size of ivshmem's BAR2 (its memory backend).
	IvshmemBARSize = 64 << 30
	// NVMeDiskSize is the size of the NVMe namespace's disk image.
	NVMeDiskSize = 64 << 20

	// PassthroughHugePages1G is how many 1 GiB hugepages L1 reserves for
	// guest RAM: enough for a guest with RAM above 4 GiB (4 GiB: 3 below
	// the 32-bit hole, 1 above).
	PassthroughHugePages1G = 4

	// PassthroughBARFile and PassthroughDiskFile are the backing files
	// ProfilePassthrough.Prepare creates in the L1 run directory.
	PassthroughBARFile  = "ivshmem-bar2.mem"
	PassthroughDiskFile = "nvme-disk.img"
)

// ProfilePassthrough is L1 with an IOMMU and the three passthrough
// stand-ins of testbed.md: edu at 04.0, an NVMe controller with SR-IOV at
// 05.0 whose VF 05.1 the setup creates, and ivshmem-plain with a 64 GiB
// BAR2 at 06.0; plus four 1 GiB hugepages for guest RAM, so one scenario
// can give its guest RAM on both sides of the 32-bit PCI hole (3 GiB
// below it, 1 GiB from 4 GiB). Every device stays
// on its default driver (edu, the VF and ivshmem on none, the PF on nvme):
// each scenario binds what it needs, so the scenarios do not depend on one
// another's order.
//
// The IOMMU is the recipe of the kernel's VFIO selftests (split irqchip,
// interrupt remapping, caching mode); aw-bits=48 because the 64 GiB BAR is
// placed high, and the 64-bit PCI hole is widened from QEMU's 32 GiB
// default so the BAR fits at all. edu's DMA mask is widened from its 28-bit
// default so it can reach guest RAM above 4 GiB.
//
// Memory: 7G is 2 GiB below QEMU's 32-bit hole and 5 GiB above it, of which
// the kernel finds four aligned free GiB (see ProfileBasic: 5G gives two);
// QEMU allocates L1 RAM lazily, so only what the guests touch costs host
// memory.
var ProfilePassthrough = Profile{
	Name:    "passthrough",
	Machine: "q35,kernel-irqchip=split",
	Memory:  "7G",
	CPUs:    1,
	Devices: []string{
		// intel-iommu must come before the PCI devices it translates.
		"-device", "intel-iommu,intremap=on,caching-mode=on,aw-bits=48",
		"-global", "q35-pcihost.pci-hole64-size=256G",
		"-device", "edu,addr=04.0,dma_mask=0xffffffffffffffff",
	},
	// nohz=off highres=off: a periodic LAPIC tick instead of one-shot
	// timers. Measured: this L1 (one vCPU, TCG, nested SVM) froze in about
	// half the runs of the large-BAR scenario with the one-shot timer's
	// vector pending in IRR, never delivered, and the vCPU halted with
	// interrupts enabled: a wakeup QEMU lost. A periodic timer raises the
	// interrupt again on every tick, so a lost wakeup costs one tick.
	Cmdline: []string{"intel_iommu=on", "hugepagesz=1G", "hugepages=" + strconv.Itoa(PassthroughHugePages1G), "nohz=off", "highres=off"},
	Setup:   passthroughSetup,
	HostReady: func() error {
		// The stand-ins exist only under QEMU; a real host has real
		// devices and other BDFs.
		b, err := os.ReadFile("/sys/bus/pci/devices/" + EduBDF + "/vendor")
		if err != nil || strings.TrimSpace(string(b)) != "0x1234" {
			return fmt.Errorf("no QEMU edu device at %s (the passthrough profile's stand-in devices exist only in its L1)", EduBDF)
		}
		return nil
	},
	Prepare: preparePassthrough,
}

// preparePassthrough creates the NVMe disk image and ivshmem's sparse
// 64 GiB BAR backing file in the run directory and returns the devices
// that use them, at ProfilePassthrough's addresses on the root bus.
func preparePassthrough(dir string) ([]string, error) {
	return prepareStandIns("passthrough", dir, "addr=05.0", "addr=06.0")
}

// prepareStandIns creates the NVMe disk image and ivshmem's sparse 64 GiB
// BAR backing file in dir and returns the QEMU arguments of the SR-IOV
// NVMe controller and ivshmem-plain, placed by nvmeAt and ivshmemAt (QEMU
// device options such as "addr=05.0" or "bus=dn2"). profile names the
// caller in errors.
func prepareStandIns(profile, dir, nvmeAt, ivshmemAt string) ([]string, error) {
	if strings.ContainsAny(dir, ",:") {
		return nil, fmt.Errorf("profile %s: run directory %q must not contain ',' or ':' (QEMU option syntax); set HPCVMM_TEST_CACHE to a plainer directory", profile, dir)
	}
	disk := filepath.Join(dir, PassthroughDiskFile)
	bar := filepath.Join(dir, PassthroughBARFile)
	for _, f := range []struct {
		path string
		size int64
	}{{disk, NVMeDiskSize}, {bar, IvshmemBARSize}} {
		// Sparse: only the blocks the guests write take disk space.
		fh, err := os.Create(f.path)
		if err != nil {
			return nil, fmt.Errorf("profile %s: %w", profile, err)
		}
		err = fh.Truncate(f.size)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, fmt.Errorf("profile %s: sizing %s: %w", profile, f.path, err)
		}
	}
	return []string{
		"-device", "nvme-subsys,id=subsys0",
		// max_ioqpairs - sriov_vq_flexible must be at least 2 (QEMU).
		"-device", "nvme,serial=hpcvmm-sriov,subsys=subsys0,sriov_max_vfs=2,sriov_vq_flexible=8,sriov_vi_flexible=4,max_ioqpairs=12,msix_qsize=8," + nvmeAt,
		"-drive", "file=" + disk + ",if=none,id=nvm,format=raw",
		"-device", "nvme-ns,drive=nvm,nsid=1,shared=on,detached=on",
		"-object", fmt.Sprintf("memory-backend-file,id=bar,size=%d,mem-path=%s,share=on,prealloc=off", int64(IvshmemBARSize), bar),
		"-device", "ivshmem-plain,memdev=bar," + ivshmemAt,
	}, nil
}

// passthroughSetup is ProfilePassthrough's L1 setup (standInsSetup).
var passthroughSetup = standInsSetup(PassthroughHugePages1G, NVMePFBDF, NVMeVFBDF, EduBDF, IvshmemBDF)

// standInsSetup is the L1 setup of a profile with the passthrough
// stand-ins: it checks that L1 has hugepages1G 1 GiB pages and IOMMU
// groups, then creates the NVMe VF the way testbed.md measured it
// (flexible resources to secondary controller 1, one VF without driver
// autoprobe, so it binds only through driver_override, the secondary
// controller online, the namespace attached to it) and checks that vf
// appeared as the VF of pf and that vf and every one of others has an
// IOMMU group.
func standInsSetup(hugepages1G int, pf, vf string, others ...string) string {
	n := strconv.Itoa(hugepages1G)
	return `pf=/sys/bus/pci/devices/` + pf + `
n=$(cat /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)
[ "$n" -eq ` + n + ` ] || { echo "L1 has $n of ` + n + ` 1 GiB hugepages: raise the profile's Memory"; exit 1; }
[ -n "$(ls /sys/kernel/iommu_groups)" ] || { echo "no IOMMU groups: intel-iommu or intel_iommu=on missing"; exit 1; }
i=0
while [ ! -c /dev/nvme0 ]; do
	i=$((i + 1))
	[ $i -le 300 ] || { echo "no /dev/nvme0 after 30 s: the NVMe PF ` + pf + ` did not come up"; exit 1; }
	sleep 0.1
done
nvme virt-mgmt /dev/nvme0 -c 1 -r 0 -a 8 -n 2 >/dev/null
nvme virt-mgmt /dev/nvme0 -c 1 -r 1 -a 8 -n 1 >/dev/null
echo 0 >$pf/sriov_drivers_autoprobe
echo 1 >$pf/sriov_numvfs
nvme virt-mgmt /dev/nvme0 -c 1 -a 9 >/dev/null
nvme attach-ns /dev/nvme0 -n 1 -c 1 >/dev/null
vf=/sys/bus/pci/devices/` + vf + `
[ -e $vf/physfn ] || { echo "VF ` + vf + ` missing or without physfn"; exit 1; }
for d in ` + strings.Join(append([]string{vf}, others...), " ") + `; do
	g=$(readlink /sys/bus/pci/devices/$d/iommu_group) || { echo "$d has no IOMMU group"; exit 1; }
	echo "L1 setup: $d vendor $(cat /sys/bus/pci/devices/$d/vendor) device $(cat /sys/bus/pci/devices/$d/device) group ${g##*/}"
done`
}
