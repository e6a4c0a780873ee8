package harness

import (
	"fmt"
	"os"
	"strings"
)

// The stand-ins of ProfileSwitch inside L1: behind QEMU's PCIe switch, so
// their bus numbers follow from the ports' (the root port at 00:07.0
// takes bus 1, the switch's upstream port 01:00.0 bus 2, its downstream
// ports 02:00.0, 02:01.0 and 02:02.0 buses 3, 4 and 5). The setup checks
// each one's sysfs path, so a QEMU that numbers differently fails there.
const (
	// SwitchRootPortBDF is the root port above the switch.
	SwitchRootPortBDF = "0000:00:07.0"
	// SwitchUpstreamBDF is the switch's upstream port (x3130-upstream):
	// the node NCCL sees the switch as.
	SwitchUpstreamBDF = "0000:01:00.0"
	// SwitchEduBDF is edu (the GPU stand-in) behind downstream port 02:00.0.
	SwitchEduBDF = "0000:03:00.0"
	// SwitchNVMePFBDF is the SR-IOV NVMe controller behind downstream
	// port 02:01.0. L1's setup creates the VF on nvme and then unbinds
	// the PF (see switchSetup).
	SwitchNVMePFBDF = "0000:04:00.0"
	// SwitchNVMeVFBDF is its VF (the InfiniBand VF stand-in), function 1
	// on the PF's bus.
	SwitchNVMeVFBDF = "0000:04:00.1"
	// SwitchIvshmemBDF is ivshmem-plain with the 64 GiB BAR2 behind
	// downstream port 02:02.0.
	SwitchIvshmemBDF = "0000:05:00.0"

	// SwitchHugePages1G is how many 1 GiB hugepages ProfileSwitch's L1
	// reserves: its scenarios run one 1 GiB guest at a time.
	SwitchHugePages1G = 2
)

// switchPorts is QEMU's PCIe switch of testbed.md with a third downstream
// port: a root port on the root bus, the switch's upstream port below it
// and three downstream ports (ids dn1, dn2, dn3) for the stand-ins.
var switchPorts = []string{
	"-device", "pcie-root-port,id=rp1,bus=pcie.0,chassis=1,addr=07.0",
	"-device", "x3130-upstream,id=up1,bus=rp1",
	"-device", "xio3130-downstream,id=dn1,bus=up1,chassis=2,slot=1",
	"-device", "xio3130-downstream,id=dn2,bus=up1,chassis=3,slot=2",
	"-device", "xio3130-downstream,id=dn3,bus=up1,chassis=4,slot=3",
}

// ProfileSwitch is ProfilePassthrough's stand-ins behind a PCIe switch,
// the way a GPU node puts its GPU and NIC under one switch: edu on the
// first downstream port, the SR-IOV NVMe controller (and so its VF) on the
// second, ivshmem's 64 GiB BAR on the third, with ProfilePassthrough's
// IOMMU, 64-bit hole and cmdline. NCCL classifies edu and the VF as PIX in
// L1; the topology scenarios check what hpcvmm's guest shows.
//
// Memory: 5G gets the two 1 GiB pages (see ProfileBasic); the scenarios
// run one 1 GiB guest at a time.
var ProfileSwitch = Profile{
	Name:    "switch",
	Machine: ProfilePassthrough.Machine,
	Memory:  "5G",
	CPUs:    1,
	Devices: append(append([]string{
		// intel-iommu must come before the PCI devices it translates.
		"-device", "intel-iommu,intremap=on,caching-mode=on,aw-bits=48",
		"-global", "q35-pcihost.pci-hole64-size=256G",
	}, switchPorts...),
		"-device", "edu,bus=dn1,dma_mask=0xffffffffffffffff",
	),
	// no_timer_check: measured once on the loaded 2-core machine, L1
	// panicked at boot with "timer doesn't work through Interrupt-remapped
	// IO-APIC": the kernel's check that the timer ticks within a few
	// emulated milliseconds failed under TCG; the check only guards
	// against broken timer wiring, which QEMU's q35 does not have.
	Cmdline: []string{"intel_iommu=on", "hugepagesz=1G", fmt.Sprintf("hugepages=%d", SwitchHugePages1G), "nohz=off", "highres=off", "no_timer_check"},
	Setup:   switchSetup,
	HostReady: func() error {
		b, err := os.ReadFile("/sys/bus/pci/devices/" + SwitchEduBDF + "/vendor")
		if err != nil || strings.TrimSpace(string(b)) != "0x1234" {
			return fmt.Errorf("no QEMU edu device at %s (the switch profile's stand-in devices exist only in its L1)", SwitchEduBDF)
		}
		return nil
	},
	Prepare: func(dir string) ([]string, error) {
		return prepareStandIns("switch", dir, "bus=dn2", "bus=dn3")
	},
}

// switchSetup checks that every stand-in sits behind the switch where the
// constants say (its sysfs realpath runs through the root port and the
// upstream port), logs the links L1 sees, does ProfilePassthrough's setup
// (the VF, IOMMU groups) and then leaves the PF without a driver.
//
// Why the PF is unbound: QEMU 7.2's xio3130 downstream ports have no ACS,
// so L1's kernel puts each port and everything below it in one IOMMU
// group (measured: PF, VF and their port in one), and VFIO takes a group
// only when none of its devices is on a host driver. The VF keeps its
// controller and namespace (nvme's remove leaves SR-IOV enabled).
var switchSetup = `for d in ` + SwitchEduBDF + ` ` + SwitchNVMePFBDF + ` ` + SwitchIvshmemBDF + `; do
	p=$(readlink -f /sys/bus/pci/devices/$d) || { echo "no $d behind the switch"; exit 1; }
	case "$p" in
	*/` + SwitchRootPortBDF + `/` + SwitchUpstreamBDF + `/*/$d) ;;
	*) echo "$d is at $p, not behind the switch ` + SwitchUpstreamBDF + `"; exit 1 ;;
	esac
	echo "L1 setup: $p link $(cat /sys/bus/pci/devices/$d/max_link_speed 2>/dev/null || echo none) x$(cat /sys/bus/pci/devices/$d/max_link_width 2>/dev/null || echo none), port $(cat $p/../max_link_speed) x$(cat $p/../max_link_width)"
done
` + standInsSetup(SwitchHugePages1G, SwitchNVMePFBDF, SwitchNVMeVFBDF, SwitchEduBDF, SwitchIvshmemBDF) + `
echo ` + SwitchNVMePFBDF + ` >/sys/bus/pci/devices/` + SwitchNVMePFBDF + `/driver/unbind
[ -e /sys/bus/pci/devices/` + SwitchNVMeVFBDF + `/physfn ] || { echo "VF ` + SwitchNVMeVFBDF + ` gone after unbinding its PF"; exit 1; }
echo "L1 setup: PF ` + SwitchNVMePFBDF + ` unbound (shares IOMMU group $(basename $(readlink /sys/bus/pci/devices/` + SwitchNVMePFBDF + `/iommu_group)) with its VF)"`

// ProfileCores is L1 with two cores of one thread (-smp 2,cores=2), for
// the CPU topology scenario: vCPUs pinned to L1's two CPUs are two cores.
// (There is no SMT counterpart: with -smp 2,threads=2 L1's kernel still
// sees two cores, see docs/testbed.md.) No devices, no
// hugepages: their guests are small. testbed.md measured an L2 hang once
// in five runs with L1 -smp 2 and a 2-vCPU L2, which is what these
// scenarios need; the harness's stall watch reports such a hang.
var ProfileCores = cpuProfile("cores", "cores=2")

func cpuProfile(name, smp string) Profile {
	return Profile{
		Name:        name,
		Machine:     "q35",
		Memory:      "2G",
		CPUs:        2,
		SMPTopology: smp,
		// See ProfileBasic.
		Cmdline: []string{"nohz=off", "highres=off"},
		// What L1's kernel made of QEMU's topology, for the console.
		Setup: `for c in /sys/devices/system/cpu/cpu[0-9]*; do
	echo "L1 setup: $(basename $c) package $(cat $c/topology/physical_package_id) core $(cat $c/topology/core_id) siblings $(cat $c/topology/thread_siblings_list)"
done`,
	}
}
