package preflight

// The host-wide checks: KVM, the IOMMU and interrupt remapping, RLIMIT_MEMLOCK.

import (
	"fmt"
	"math"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
)

// CheckKVM runs only Run's KVM checks: the device, its backend (kvm_pvm
// runs no stock kernel) and req.KVMCheck's capabilities. vmm.New runs it
// before the kernel step, so a host whose KVM cannot run the guest refuses
// before seconds of decompression and a kernel-cache write.
func CheckKVM(h *host.Host, req Request) Report {
	c := &checker{h: h, req: req, rep: Report{Node: -1}}
	c.kvm()
	return c.rep
}

func (c *checker) kvm() {
	p := c.h.Layout.KVM
	if !c.h.KVMPresent() {
		mod := "kvm_intel (Intel) or kvm_amd (AMD)"
		switch c.h.CPUVendor() {
		case "GenuineIntel":
			mod = "kvm_intel"
		case "AuthenticAMD":
			mod = "kvm_amd"
		}
		c.add("kvm", "host", Fail, fmt.Sprintf("modprobe %s (and enable virtualization, VT-x/AMD-V, in the firmware setup)", mod),
			"%s does not exist: KVM is not available", p)
		return
	}
	c.add("kvm", "host", Pass, "", "%s present", p)
	if c.h.KVMBackend() == "kvm_pvm" {
		c.add("kvm", "backend", Fail, "use a host with VT-x/AMD-V and kvm_intel or kvm_amd",
			"KVM is provided by kvm_pvm (pagetable-based virtualization), which runs only guest kernels built for PVM: a stock kernel hangs")
	}
	if c.req.KVMCheck != nil {
		c.rep.Results = append(c.rep.Results, c.req.KVMCheck(p)...)
	}
}

// iommuFix is the kernel command line change that turns the IOMMU on.
func (c *checker) iommuFix() string {
	arg := "intel_iommu=on iommu=pt (Intel) or amd_iommu=on iommu=pt (AMD)"
	fw := "VT-d/AMD-Vi"
	switch c.h.CPUVendor() {
	case "GenuineIntel":
		arg, fw = "intel_iommu=on iommu=pt", "VT-d"
	case "AuthenticAMD":
		arg, fw = "amd_iommu=on iommu=pt", "AMD-Vi (IOMMU)"
	}
	return fmt.Sprintf("enable %s in the firmware setup, add %s to GRUB_CMDLINE_LINUX in /etc/default/grub, run update-grub and reboot", fw, arg)
}

func (c *checker) iommu() {
	// Without passthrough devices a missing IOMMU does not stop the VM, so
	// it is only a warning.
	sev := Fail
	if c.req.devices() == 0 {
		sev = Warn
	}
	n, err := c.h.IOMMUGroups()
	switch {
	case err != nil:
		c.add("iommu", "host", sev, "", "cannot read IOMMU groups: %v", err)
	case n == 0:
		c.add("iommu", "host", sev, c.iommuFix(), "no IOMMU groups: the kernel is not using an IOMMU, so VFIO cannot pass devices through")
	default:
		c.add("iommu", "host", Pass, "", "IOMMU enabled (%d groups)", n)
	}

	ir, why, err := c.h.InterruptRemapping()
	const unsafe = "/sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts"
	switch {
	case err != nil:
		c.add("irq-remap", "host", Warn, "", "cannot determine interrupt remapping: %v", err)
	case ir == host.IREnabled:
		c.add("irq-remap", "host", Pass, "", "interrupt remapping enabled: %s", why)
	case ir == host.IRDisabled && c.h.UnsafeInterruptsAllowed():
		c.add("irq-remap", "host", Warn, "enable interrupt remapping (x2APIC and VT-d/AMD-Vi IR in firmware, no intremap=off) and echo 0 > "+unsafe,
			"interrupt remapping disabled: %s; VFIO allows passthrough only because allow_unsafe_interrupts=Y, so a device can forge interrupts", why)
	case ir == host.IRDisabled:
		c.add("irq-remap", "host", sev, "enable interrupt remapping (x2APIC and VT-d/AMD-Vi IR in firmware, no intremap=off on the kernel command line), or, accepting that a device can forge interrupts: echo 1 > "+unsafe,
			"interrupt remapping disabled: %s; VFIO refuses to attach devices", why)
	default:
		c.add("irq-remap", "host", Warn, "dmesg | grep -i -e 'remapping' -e DMAR-IR -e AMD-Vi",
			"interrupt remapping unknown: %s", why)
	}
}

func (c *checker) memlock() {
	if len(c.devs) == 0 || c.req.Memory == 0 {
		return
	}
	limit, exempt, ok, err := c.h.MemlockLimit()
	const fix = "ulimit -l unlimited (or memlock in /etc/security/limits.conf, LimitMEMLOCK=infinity in a systemd unit)"
	switch {
	case err != nil:
		c.add("memlock", "process", Warn, fix, "cannot read RLIMIT_MEMLOCK: %v", err)
	case !ok:
		c.add("memlock", "process", Warn, "run hpcvmm check on the host itself", "RLIMIT_MEMLOCK unknown: this host tree is not the live host")
	case exempt:
		c.add("memlock", "process", Pass, "", "running as root (CAP_IPC_LOCK): VFIO may pin all guest RAM")
	case limit == math.MaxUint64 || limit >= c.req.Memory:
		c.add("memlock", "process", Pass, "", "RLIMIT_MEMLOCK %s covers %s of guest RAM", memlockString(limit), guestmem.FormatSize(c.req.Memory))
	default:
		c.add("memlock", "process", Warn, fix, "RLIMIT_MEMLOCK is %s but VFIO pins all %s of guest RAM: DMA mapping will fail unless hpcvmm gains CAP_IPC_LOCK",
			memlockString(limit), guestmem.FormatSize(c.req.Memory))
	}
}

func memlockString(v uint64) string {
	if v == math.MaxUint64 {
		return "unlimited"
	}
	return guestmem.FormatSize(v)
}
