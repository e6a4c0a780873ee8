package preflight

// The request: the VM to check for, and the checks on its own values.

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/ibvf"
)

// Request describes the VM to check for.
type Request struct {
	// GPUs are whole functions to pass through (any class, e.g. QEMU's edu
	// device in tests), as BDFs.
	GPUs []string `json:"gpus"`
	// VFs are SR-IOV virtual functions to pass through.
	VFs []string `json:"vfs"`
	// Memory is guest RAM in bytes; 0 skips the memory checks.
	Memory uint64 `json:"memory"`
	// PageSize backs guest RAM: Page1G, Page2M or Page4K (no hugepages).
	// Zero means Page1G, hpcvmm's default.
	PageSize uint64 `json:"page_size"`
	// CPUs is the vCPU count; 0 skips the CPU check.
	CPUs int `json:"cpus"`
	// NUMANode is the node to run on, or -1 to choose (see ChooseNode).
	NUMANode int `json:"numa_node"`
	// FlatTopology says the guest puts the devices on its root bus
	// (--topology flat, --acpi=off); otherwise they sit behind emulated
	// PCIe ports (pcitopo), whose windows the BAR check takes into account.
	FlatTopology bool `json:"flat_topology"`
	// PortSlots are the guest's bus-0 slots for the devices' root ports
	// (vmm.PassthroughSlots); empty skips the check behind ports.
	PortSlots []int `json:"port_slots,omitempty"`
	// AllowBind says hpcvmm will rebind devices held by a host driver to
	// vfio-pci itself (hpcvmm run --bind): such a device is a warning, not
	// a failure.
	AllowBind bool `json:"allow_bind"`
	// KVMCheck, if set, is called when the KVM device exists, with its
	// path, to check the capabilities hpcvmm needs. Opening /dev/kvm is the
	// uapi package's job, so the CLI plugs the probe in here.
	KVMCheck func(devPath string) []Result `json:"-"`
	// VFIdentity, if set, reads an InfiniBand VF's GUIDs and link state
	// from its PF's netdev (ibvf.System.Identity), so a VF whose zero port
	// GUID would keep its link down is reported. Left nil, only sysfs is
	// read.
	VFIdentity func(netdev string, vf int) (ibvf.Identity, error) `json:"-"`
	// GroupOpen, if set, opens /dev/vfio/<group> read-write and closes it,
	// as VFIO will later (vmm.ProbeVFIOGroup), for each device already on
	// a VFIO driver: a device cgroup (Slurm's ConstrainDevices), file
	// modes or another VMM holding the group then fail here, before guest
	// RAM is reserved and prefaulted, not minutes later. An fs.ErrNotExist
	// answer (no group file here) is not reported.
	GroupOpen func(group int) error `json:"-"`
}

func (r Request) pageSize() uint64 {
	if r.PageSize == 0 {
		return Page1G
	}
	return r.PageSize
}

func (r Request) devices() int { return len(r.GPUs) + len(r.VFs) }

func (c *checker) request() {
	switch c.req.pageSize() {
	case Page1G, Page2M, Page4K:
	default:
		c.add("request", "vm", Fail, "use --hugepages 1G, 2M or none", "page size %d is not 1G, 2M or 4K", c.req.PageSize)
	}
	if ps := c.req.pageSize(); c.req.Memory%ps != 0 && (ps == Page1G || ps == Page2M) {
		c.add("request", "vm", Fail, fmt.Sprintf("use --memory %s", guestmem.FormatSize(addrspace.AlignUp(c.req.Memory, ps))),
			"memory %s is not a multiple of the %s page size", guestmem.FormatSize(c.req.Memory), guestmem.FormatSize(ps))
	}
	if c.req.CPUs < 0 {
		c.add("request", "vm", Fail, "use --cpus 1 or more", "cpus %d is negative", c.req.CPUs)
	}
}
