package preflight

// The request: the VM to check for, and the checks on its own values.

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
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
	// PMEMSize is the read-only image mapped between RAM and the 64-bit
	// BAR window (vmm.Config.PMEM), in bytes; 0 for none. It moves the
	// window up (addrspace.NewWindowsPMEM).
	PMEMSize uint64 `json:"pmem_size,omitempty"`
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
	// vfio-pci itself (hpcvmm run --bind-devices): such a device is a warning, not
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
	// CPUMode is the requested CPU mode: "dedicated", "shared", or empty
	// for hpcvmm's choice (cpumode.go). RunDir, if set, is the run
	// directory whose CPU claims (package cpuclaim) count as taken.
	CPUMode string `json:"cpu_mode,omitempty"`
	RunDir  string `json:"run_dir,omitempty"`
	// GPUDriver asks for the checks of the host NVIDIA driver behind each
	// NVIDIA GPU among GPUs (gpudriver.go): "gpu-driver", the libraries
	// and programs of the loaded module's version that jobs' guests get,
	// and "gpu-firmware", the GSP firmware the guest kernel's nvidia
	// module names. hpcvmm check sets it; a VM's own preflight does not: a
	// plain VM needs neither, and a job checks both before it boots.
	GPUDriver bool `json:"gpu_driver,omitempty"`
	// DriverRoot is the host root those checks read beneath ("" means
	// "/"; tests: gpudriver/testdata/host), DriverCache the loader cache's
	// entries (nil: DriverRoot's /etc/ld.so.cache), GuestRelease the
	// guest kernel's release ("": DriverRoot's running kernel,
	// /proc/sys/kernel/osrelease, which a job boots unless given
	// --kernel).
	DriverRoot   string                 `json:"driver_root,omitempty"`
	DriverCache  []gpudriver.CacheEntry `json:"-"`
	GuestRelease string                 `json:"guest_release,omitempty"`
}

func (r Request) pageSize() uint64 {
	if r.PageSize == 0 {
		return Page1G
	}
	return r.PageSize
}

func (r Request) devices() int { return len(r.GPUs) + len(r.VFs) }

// MinMemory is the least guest RAM a Linux x86-64 guest with an initramfs
// gets to userspace in.
const MinMemory = 64 << 20

// InputError is a request no host state could satisfy: a value out of
// range, or a size that can never fit this host whatever is freed or
// reserved. Callers report it as bad input (hpcvmm exits 2), not as a host
// problem with a fix. Field names the Request field at fault; the message
// names no flag, so the CLI and the Go API each name it their own way.
type InputError struct {
	Field string // Request field: Memory, PageSize or NUMANode
	Err   error
}

func (e *InputError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *InputError) Unwrap() error { return e.Err }

func inputErr(field, format string, args ...any) error {
	return &InputError{Field: field, Err: fmt.Errorf(format, args...)}
}

// CheckInput is the one validation of a request's sizes that `hpcvmm
// check` and `hpcvmm run` (vmm.Config.Validate, then vmm.New with the
// host) share, so both accept and refuse the same input with the same
// words. With h nil it checks the values alone (page size, memory at least
// MinMemory and a multiple of the page size); with a
// host also that the node exists and that guest RAM is no larger than the
// RAM of the node it would run on (the requested node, else the largest):
// a hugepage pool can never be given more than its node's memory, and 4 KiB
// guest RAM is bound to the node too. Free hugepages and free memory are
// host state an admin can change, so they are Run's checks (exit 1 with a
// fix), not input errors. The errors are *InputError, joined.
func CheckInput(h *host.Host, req Request) error {
	var errs []error
	ps := req.pageSize()
	switch ps {
	case Page1G, Page2M, Page4K:
	default:
		errs = append(errs, inputErr("PageSize", "page size %d is not 1G, 2M or 4K (none)", req.PageSize))
		ps = Page4K // the memory checks below, against any page size
	}
	switch {
	case req.Memory == 0:
		errs = append(errs, inputErr("Memory", "no guest memory: give a size, e.g. 2G"))
	case req.Memory < MinMemory:
		errs = append(errs, inputErr("Memory", "%s is too small: a Linux guest needs at least %s",
			guestmem.FormatSize(req.Memory), guestmem.FormatSize(MinMemory)))
	case req.Memory%ps != 0:
		errs = append(errs, inputErr("Memory", "%s is not a multiple of the %s page size: use %s, or a smaller page size",
			guestmem.FormatSize(req.Memory), guestmem.FormatSize(ps), guestmem.FormatSize(addrspace.AlignUp(req.Memory, ps))))
	}
	if h != nil {
		errs = append(errs, checkInputOnHost(h, req)...)
	}
	return errors.Join(errs...)
}

// checkInputOnHost is CheckInput's part that reads the host: the node and
// the largest guest RAM it could ever hold.
func checkInputOnHost(h *host.Host, req Request) []error {
	nodes, err := h.Nodes()
	if err != nil || len(nodes) == 0 {
		return nil // Run reports an unreadable host, with the error
	}
	ids := make([]int, len(nodes))
	var node *host.Node
	for i := range nodes {
		ids[i] = nodes[i].ID
		if req.NUMANode >= 0 && nodes[i].ID == req.NUMANode {
			node = &nodes[i]
		}
	}
	if req.NUMANode >= 0 && node == nil {
		return []error{inputErr("NUMANode", "node %d is not online; pick one of %s", req.NUMANode, host.FormatCPUList(ids))}
	}
	requested := node != nil
	if !requested {
		for i := range nodes {
			if node == nil || nodes[i].MemTotal > node.MemTotal {
				node = &nodes[i]
			}
		}
	}
	if node.MemTotal == 0 || req.Memory <= node.MemTotal {
		return nil
	}
	size := guestmem.FormatSizeApprox(node.MemTotal)
	where := fmt.Sprintf("the RAM of any NUMA node (the largest, node %d, has %s)", node.ID, size)
	switch {
	case requested:
		where = fmt.Sprintf("node %d's RAM (%s)", node.ID, size)
	case len(nodes) == 1:
		where = fmt.Sprintf("this host's RAM (%s)", size)
	}
	why := "guest RAM is bound to one node"
	if ps := req.pageSize(); ps != Page4K {
		why = fmt.Sprintf("no %s hugepage pool there can ever hold it", guestmem.FormatSize(ps))
	}
	return []error{inputErr("Memory", "%s is more than %s: %s", guestmem.FormatSizeApprox(req.Memory), where, why)}
}

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
