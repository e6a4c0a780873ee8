package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/bits"
	"strings"
	"syscall"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/pcitopo"

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
	// CPUMode is the requested CPU mode: "dedicated", "shared", or empty
	// for hpcvmm's choice (cpumode.go). RunDir, if set, is the run
	// directory whose CPU claims (package cpuclaim) count as taken.
	CPUMode string `json:"cpu_mode,omitempty"`
	RunDir  string `json:"run_dir,omitempty"`
}

func (r Request) pageSize() uint64 {
	if r.PageSize == 0 {
		return Page1G
	}
	return r.PageSize
}

func (r Request) devices() int { return len(r.GPUs) + len(r.VFs) }

func alignUp(v, a uint64) uint64 {
	if v > math.MaxUint64-(a-1) {
		return math.MaxUint64
	}
	return (v + a - 1) &^ (a - 1)
}

// ChooseNode picks the NUMA node for the VM: the requested node if
// req.NUMANode >= 0 (an error if it is not online); else the node of the
// first device (GPUs, then VFs) that reports one; else the node with the
// most free hugepages of the requested size (most free memory for 4K
// pages), lowest ID on a tie. It returns the node and why it was chosen.
func ChooseNode(h *host.Host, req Request) (int, string, error) {
	nodes, err := h.Nodes()
	if err != nil {
		return -1, "", fmt.Errorf("preflight: choose NUMA node: %w", err)
	}
	if len(nodes) == 0 {
		return -1, "", errors.New("preflight: choose NUMA node: the host reports no online NUMA nodes")
	}
	online := map[int]bool{}
	ids := make([]int, len(nodes))
	for i, n := range nodes {
		online[n.ID] = true
		ids[i] = n.ID
	}
	if req.NUMANode >= 0 {
		if !online[req.NUMANode] {
			return -1, "", fmt.Errorf("--numa-node %d: node is not online; pick one of %s", req.NUMANode, host.FormatCPUList(ids))
		}
		return req.NUMANode, "requested with --numa-node", nil
	}
	for _, s := range append(append([]string(nil), req.GPUs...), req.VFs...) {
		b, err := host.ParseBDF(s)
		if err != nil {
			continue
		}
		d, err := h.Device(b)
		if err != nil || d.NUMANode < 0 || !online[d.NUMANode] {
			continue
		}
		return d.NUMANode, "node of " + b.String(), nil
	}
	if len(nodes) == 1 {
		return nodes[0].ID, "the only node", nil
	}
	ps := req.pageSize()
	best, bestFree := nodes[0].ID, uint64(0)
	for i, n := range nodes {
		var free uint64
		if ps == Page4K {
			free = n.MemFree
		} else if p, ok := n.Pool(ps); ok {
			free = p.Free
		}
		if i == 0 || free > bestFree {
			best, bestFree = n.ID, free
		}
	}
	if ps == Page4K {
		return best, fmt.Sprintf("most free memory (%s)", guestmem.FormatSize(bestFree)), nil
	}
	return best, fmt.Sprintf("most free %s hugepages (%d)", guestmem.FormatSize(ps), bestFree), nil
}

// Run performs every check for req against h. It never stops early: the
// admin gets every problem and its fix in one pass.
func Run(h *host.Host, req Request) Report {
	c := &checker{h: h, req: req, rep: Report{Node: -1}}
	c.request()
	c.kvm()
	c.iommu()
	c.devicesChecks()
	c.barSpace()
	c.node()
	c.cpuMode()
	c.memlock()
	c.placement()
	return c.rep
}

type checker struct {
	h   *host.Host
	req Request
	rep Report
	// devs are the requested devices that exist, in request order.
	devs   []reqDev
	chosen *host.Node
}

type reqDev struct {
	d    *host.Device
	isVF bool
}

func (c *checker) add(name, subject string, st Status, fix, format string, args ...any) {
	c.rep.Results = append(c.rep.Results, Result{Name: name, Subject: subject, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix})
}

func (c *checker) request() {
	switch c.req.pageSize() {
	case Page1G, Page2M, Page4K:
	default:
		c.add("request", "vm", Fail, "use --hugepages 1G, 2M or none", "page size %d is not 1G, 2M or 4K", c.req.PageSize)
	}
	if ps := c.req.pageSize(); c.req.Memory%ps != 0 && (ps == Page1G || ps == Page2M) {
		c.add("request", "vm", Fail, fmt.Sprintf("use --memory %s", guestmem.FormatSize(alignUp(c.req.Memory, ps))),
			"memory %s is not a multiple of the %s page size", guestmem.FormatSize(c.req.Memory), guestmem.FormatSize(ps))
	}
	if c.req.CPUs < 0 {
		c.add("request", "vm", Fail, "use --cpus 1 or more", "cpus %d is negative", c.req.CPUs)
	}
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

// BindFix returns the commands that hand device b, currently bound to
// driver ("" for none), to vfio-pci via driver_override.
func BindFix(b host.BDF, driver string) string {
	p := "/sys/bus/pci/devices/" + b.String()
	parts := []string{"modprobe vfio-pci", "echo vfio-pci > " + p + "/driver_override"}
	if driver != "" {
		parts = append(parts, fmt.Sprintf("echo %s > %s/driver/unbind", b, p))
	}
	parts = append(parts, fmt.Sprintf("echo %s > /sys/bus/pci/drivers_probe", b))
	return strings.Join(parts, " && ")
}

// groupSafeDriver reports whether a device bound to driver may share an
// IOMMU group with a VFIO device: VFIO drivers, no driver, or the drivers
// the kernel marks driver_managed_dma (pci-stub, pcieport for bridges).
func groupSafeDriver(driver string) bool {
	return driver == "" || host.IsVFIODriver(driver) || driver == "pci-stub" || driver == "pcieport"
}

func (c *checker) devicesChecks() {
	seen := map[host.BDF]bool{}
	check := func(s string, isVF bool) {
		flag := "--gpu"
		if isVF {
			flag = "--vf"
		}
		b, err := host.ParseBDF(s)
		if err != nil {
			c.add("device", s, Fail, "hpcvmm devices (lists the host's passthrough-capable devices)", "%s %v", flag, err)
			return
		}
		subj := b.String()
		if seen[b] {
			c.add("device", subj, Fail, "pass each device once", "%s %s is given more than once", flag, subj)
			return
		}
		seen[b] = true
		d, err := c.h.Device(b)
		if errors.Is(err, fs.ErrNotExist) {
			c.add("device", subj, Fail, "hpcvmm devices (or lspci -D) to find the right address", "no PCI device %s on this host", subj)
			return
		}
		if err != nil {
			c.add("device", subj, Fail, "", "cannot read device: %v", err)
			return
		}
		c.devs = append(c.devs, reqDev{d: d, isVF: isVF})
		c.device(d, isVF)
	}
	for _, s := range c.req.GPUs {
		check(s, false)
	}
	for _, s := range c.req.VFs {
		check(s, true)
	}
}

func (c *checker) device(d *host.Device, isVF bool) {
	subj := d.BDF.String()
	ids := fmt.Sprintf("%04x:%04x %s (class %#06x)", d.Vendor, d.DeviceID, d.ClassName(), d.Class)
	if d.BaseClass() == host.ClassBridge {
		c.add("device", subj, Fail, "pass the endpoint behind the bridge instead (hpcvmm devices)", "%s: a bridge cannot be passed through", ids)
	} else {
		c.add("device", subj, Pass, "", "%s", ids)
	}

	var use host.Use
	var useErr error
	if !host.IsVFIODriver(d.Driver) {
		use, useErr = c.h.DeviceUse(d.BDF)
	}
	drv := d.Driver
	if drv == "" {
		drv = "no driver"
	}
	switch {
	case host.IsVFIODriver(d.Driver):
		c.add("driver", subj, Pass, "", "bound to %s", d.Driver)
	case useErr != nil:
		c.add("driver", subj, Fail, "", "bound to %s; cannot tell whether the host uses it: %v", drv, useErr)
	case use.Busy():
		// Never a rebind for these: it would cut the node off its
		// network or pull a disk from under it (issue 23).
		c.add("driver", subj, Fail, "pass another device (hpcvmm devices lists them), or end that use on the host first",
			"bound to %s, and the host uses it: %s; it cannot be passed through while the host does", drv, use)
	case d.Driver == "" && c.req.AllowBind:
		c.add("driver", subj, Warn, "", "no driver bound; --bind binds it to vfio-pci for the VM")
	case d.Driver == "":
		c.add("driver", subj, Fail, "hpcvmm bind "+subj+" (or hpcvmm run --bind), or by hand: "+BindFix(d.BDF, ""), "no driver bound; VFIO needs vfio-pci")
	case c.req.AllowBind:
		c.add("driver", subj, Warn, "", "bound to %q; --bind rebinds it to vfio-pci for the VM and gives it back afterwards", d.Driver)
	default:
		c.add("driver", subj, Fail, "hpcvmm bind "+subj+" (or hpcvmm run --bind), or by hand: "+BindFix(d.BDF, d.Driver), "bound to %s (in use by the host); VFIO needs vfio-pci", d.Driver)
	}

	c.group(d)

	if d.NUMANode < 0 {
		c.add("numa", subj, Pass, "", "no NUMA information (numa_node -1)")
	} else {
		c.add("numa", subj, Pass, "", "on node %d", d.NUMANode)
	}

	switch {
	case len(d.ResetMethods) > 0:
		c.add("reset", subj, Pass, "", "reset methods: %s", strings.Join(d.ResetMethods, ", "))
	case d.ResetKnown:
		c.add("reset", subj, Warn, "none in software: prefer a device or slot that supports FLR or a bus reset",
			"no reset method: state may leak between VMs")
	default:
		c.add("reset", subj, Warn, "cat /sys/bus/pci/devices/"+subj+"/reset_method (Linux 5.15+ lists the methods; no file means no reset)",
			"no reset method reported: state may leak between VMs, or the kernel predates reset_method")
	}

	c.interrupts(d)

	if isVF {
		c.vf(d)
	}
}

func (c *checker) group(d *host.Device) {
	subj := d.BDF.String()
	if d.IOMMUGroup < 0 {
		c.add("iommu-group", subj, Fail, c.iommuFix(), "not in an IOMMU group: the IOMMU is off or does not cover this device")
		return
	}
	members, err := c.h.IOMMUGroupMembers(d.IOMMUGroup)
	if err != nil {
		c.add("iommu-group", subj, Fail, "", "group %d: %v", d.IOMMUGroup, err)
		return
	}
	var others, offenders, fixes []string
	hostUsed := false
	for _, m := range members {
		if m == d.BDF {
			continue
		}
		md, err := c.h.Device(m)
		if err != nil {
			offenders = append(offenders, fmt.Sprintf("%s (unreadable: %v)", m, err))
			continue
		}
		drv := md.Driver
		if drv == "" {
			drv = "no driver"
		}
		others = append(others, fmt.Sprintf("%s (%s)", m, drv))
		if groupSafeDriver(md.Driver) {
			continue
		}
		if u, err := c.h.DeviceUse(m); err != nil || u.Busy() {
			why := fmt.Sprintf("the host uses it: %s", u)
			if err != nil {
				why = fmt.Sprintf("cannot tell whether the host uses it: %v", err)
			}
			offenders = append(offenders, fmt.Sprintf("%s (%s; %s)", m, md.Driver, why))
			hostUsed = true
			continue
		}
		offenders = append(offenders, fmt.Sprintf("%s (%s)", m, md.Driver))
		fixes = append(fixes, BindFix(m, md.Driver))
	}
	switch {
	case hostUsed:
		c.add("iommu-group", subj, Fail, "pass another device (hpcvmm devices lists them): a group is assigned as a whole",
			"group %d is not viable and cannot be made so: %s", d.IOMMUGroup, strings.Join(offenders, ", "))
	case len(offenders) > 0:
		c.add("iommu-group", subj, Fail, strings.Join(fixes, " && "),
			"group %d is not viable: %s must be bound to vfio-pci or unbound (a group is assigned as a whole)", d.IOMMUGroup, strings.Join(offenders, ", "))
	case len(others) > 0:
		c.add("iommu-group", subj, Pass, "", "group %d, shared with %s", d.IOMMUGroup, strings.Join(others, ", "))
	default:
		c.add("iommu-group", subj, Pass, "", "group %d, alone", d.IOMMUGroup)
	}
	if c.req.GroupOpen != nil && host.IsVFIODriver(d.Driver) {
		c.groupOpen(subj, d.IOMMUGroup)
	}
}

// groupOpen reports whether this process may open the device's VFIO group.
func (c *checker) groupOpen(subj string, group int) {
	err := c.req.GroupOpen(group)
	path := fmt.Sprintf("/dev/vfio/%d", group)
	switch {
	case err == nil || errors.Is(err, fs.ErrNotExist):
		return
	case errors.Is(err, syscall.EPERM):
		c.add("vfio-open", subj, Fail, "under Slurm, request the device's GRES (--gres=gpu:N or --gres=nic:N); elsewhere, allow the device in this process's cgroup",
			"%s: this process's device cgroup does not let it open the group (EPERM)", path)
	case errors.Is(err, syscall.EACCES):
		c.add("vfio-open", subj, Fail, fmt.Sprintf("chown $USER %s (a Slurm Prolog does it for the job's user), or run as root", path),
			"%s is not accessible to this user (EACCES)", path)
	case errors.Is(err, syscall.EBUSY):
		c.add("vfio-open", subj, Fail, "stop the VM or job that uses the device, or pass another one",
			"%s is open in another process (EBUSY)", path)
	default:
		c.add("vfio-open", subj, Fail, "", "open %s: %v", path, err)
	}
}

func barByIndex(d *host.Device, i int) (host.BAR, bool) {
	for _, b := range d.BARs {
		if b.Index == i {
			return b, true
		}
	}
	return host.BAR{}, false
}

func (c *checker) interrupts(d *host.Device) {
	subj := d.BDF.String()
	cfg := d.Config
	switch {
	case cfg.Length < 0x40:
		c.add("interrupts", subj, Warn, "run hpcvmm check as root (config space beyond 64 bytes is root-only)", "configuration space not readable (%d bytes)", cfg.Length)
	case cfg.MSIX != nil:
		m := cfg.MSIX
		bar, ok := barByIndex(d, int(m.TableBIR))
		pbar, pok := barByIndex(d, int(m.PBABIR))
		switch {
		case !ok || bar.IO || !pok || pbar.IO:
			c.add("interrupts", subj, Fail, "", "MSI-X table in BAR%d / PBA in BAR%d, which is not a populated memory BAR", m.TableBIR, m.PBABIR)
		case uint64(m.TableOffset)+m.TableBytes() > bar.Size || uint64(m.PBAOffset)+m.PBABytes() > pbar.Size:
			c.add("interrupts", subj, Fail, "", "MSI-X table (BAR%d+%#x, %d vectors) or PBA (BAR%d+%#x) lies outside its BAR", m.TableBIR, m.TableOffset, m.TableSize, m.PBABIR, m.PBAOffset)
		default:
			c.add("interrupts", subj, Pass, "", "MSI-X at %#x: %d vectors, table BAR%d+%#x, PBA BAR%d+%#x", m.Offset, m.TableSize, m.TableBIR, m.TableOffset, m.PBABIR, m.PBAOffset)
		}
	case cfg.MSI != nil:
		c.add("interrupts", subj, Pass, "", "MSI at %#x: %d vectors (no MSI-X)", cfg.MSI.Offset, cfg.MSI.Vectors)
	default:
		c.add("interrupts", subj, Warn, "none: prefer a device with MSI or MSI-X", "no MSI or MSI-X capability: legacy INTx only (slower, shared line)")
	}
	if len(cfg.Problems) > 0 {
		c.add("config-space", subj, Warn, "", "malformed capability list: %s", strings.Join(cfg.Problems, "; "))
	}
}

func (c *checker) vf(d *host.Device) {
	subj := d.BDF.String()
	if d.PhysFn == nil {
		c.add("sr-iov", subj, Fail, "pass a whole function with --gpu, or create VFs on the PF: echo N > /sys/bus/pci/devices/<PF>/sriov_numvfs",
			"not an SR-IOV virtual function (no physfn link)")
		return
	}
	pf, err := c.h.Device(*d.PhysFn)
	if err != nil {
		c.add("sr-iov", subj, Fail, "", "VF of %s, which cannot be read: %v", d.PhysFn, err)
		return
	}
	if pf.Driver == "" {
		c.add("sr-iov", subj, Warn, fmt.Sprintf("echo %s > /sys/bus/pci/drivers_probe", pf.BDF),
			"VF of PF %s, which has no driver: the PF driver usually manages the VFs (link, MAC, firmware)", pf.BDF)
		return
	}
	c.add("sr-iov", subj, Pass, "", "VF of PF %s (driver %s, %d VFs enabled)", pf.BDF, pf.Driver, pf.NumVFs)
	c.ibVF(d, pf)
}

// ibVF reports what an InfiniBand VF's identity depends on: the PF's link
// layer, its netdev, and, when VFIdentity is set, whether the VF's GUIDs
// are still zero (a zero port GUID keeps the VF's link down in the guest).
// A PF with neither an RDMA device nor a netdev adds nothing.
func (c *checker) ibVF(d, pf *host.Device) {
	subj := d.BDF.String()
	rdma, layer, hasRDMA, err := c.h.RDMALinkLayer(pf.BDF)
	if err != nil {
		c.add("ib-vf", subj, Warn, "", "%v", err)
		return
	}
	ifs, err := c.h.NetInterfaces(pf.BDF)
	if err != nil {
		c.add("ib-vf", subj, Warn, "", "%v", err)
		return
	}
	if !hasRDMA && len(ifs) == 0 {
		return
	}
	netdev, typ := "", 0
	for _, name := range ifs {
		t, err := c.h.NetInterfaceType(pf.BDF, name)
		if err != nil {
			continue
		}
		if netdev == "" || t == host.ARPHRDInfiniBand {
			netdev, typ = name, t
		}
	}
	where := fmt.Sprintf("PF %s", pf.BDF)
	if hasRDMA {
		where += fmt.Sprintf(" RDMA device %s port 1 link layer %s", rdma, layer)
	}
	if (layer != "" && layer != "InfiniBand") || (netdev != "" && typ != host.ARPHRDInfiniBand) {
		c.add("ib-vf", subj, Pass, "", "%s, netdev %s (type %d): not InfiniBand, so no GUIDs to set", where, orNone(netdev), typ)
		return
	}
	if netdev == "" {
		c.add("ib-vf", subj, Warn, "modprobe ib_ipoib (the kernel sets VF GUIDs through the PF's IPoIB netdev)",
			"%s, no netdev: VF GUIDs cannot be set, and a VF with a zero port GUID stays down", where)
		return
	}
	idx, err := c.h.VFIndex(pf.BDF, d.BDF)
	if err != nil {
		c.add("ib-vf", subj, Warn, "", "%s, netdev %s: %v", where, netdev, err)
		return
	}
	if c.req.VFIdentity == nil {
		c.add("ib-vf", subj, Pass, "", "%s, IPoIB netdev %s, VF %d", where, netdev, idx)
		return
	}
	id, err := c.req.VFIdentity(netdev, idx)
	if err != nil {
		c.add("ib-vf", subj, Warn, "", "%s, IPoIB netdev %s, VF %d: cannot read its GUIDs: %v", where, netdev, idx, err)
		return
	}
	if id.PortGUID == 0 || id.NodeGUID == 0 {
		c.add("ib-vf", subj, Warn,
			fmt.Sprintf("hpcvmm run --vf %s,guid=auto (under Slurm) or --vf %s,node-guid=G,port-guid=G; by hand: ip link set %s vf %d node_guid G port_guid G", d.BDF, d.BDF, netdev, idx),
			"%s, IPoIB netdev %s, VF %d: node GUID %s, port GUID %s, link %s: a zero port GUID keeps the VF's link down in the guest",
			where, netdev, idx, id.NodeGUID, id.PortGUID, id.Link)
		return
	}
	c.add("ib-vf", subj, Pass, "", "%s, IPoIB netdev %s, VF %d: node GUID %s, port GUID %s, link %s", where, netdev, idx, id.NodeGUID, id.PortGUID, id.Link)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// barSpace checks that every requested device's BARs fit the guest's MMIO
// windows, placed by addrspace.Plan (on the root bus) and, with the host
// topology, by addrspace.PlanHierarchy behind the devices' PCIe ports: the
// calls the VM makes, so a layout passes here exactly when the VM accepts it. I/O BARs and SR-IOV VF BARs
// (lines 7-12, which belong to the VFs, not the PF's guest) are not placed.
// hpcvmm's own virtio devices add a few 16 KiB BARs, which the largest-first
// rule places last, in gaps the device BARs leave.
func (c *checker) barSpace() {
	c.barSpaceFlat()
	c.barSpaceBehindPorts()
}

// barSpaceBehindPorts checks the layout --topology host gives the devices:
// behind the emulated PCIe ports pcitopo plans for them, placed by
// addrspace.PlanHierarchy over Plan.Placement — what pci.Root.AssignBARs
// does in the VM — so a set that fits on the root bus but not in the
// ports' windows (each rounded to 1 MiB and aligned to its largest BAR, and
// non-prefetchable 64-bit BARs in the 32-bit window) fails here as in the VM.
// A host whose tree cannot be read gets the flat layout in the VM, which
// barSpaceFlat has checked.
func (c *checker) barSpaceBehindPorts() {
	if c.req.FlatTopology || len(c.req.PortSlots) == 0 || len(c.devs) == 0 {
		return
	}
	physBits, err := c.h.PhysAddrBits()
	if err != nil {
		return // barSpaceFlat warned
	}
	w, err := addrspace.NewWindows(c.req.Memory, uint(physBits))
	if err != nil {
		return // barSpaceFlat failed
	}
	names := make([]string, len(c.devs))
	bdfs := make([]host.BDF, len(c.devs))
	for i, rd := range c.devs {
		names[i], bdfs[i] = "gpu", rd.d.BDF
		if rd.isVF {
			names[i] = "vf"
		}
	}
	devs, links, err := pcitopo.FromHost(c.h, names, bdfs)
	if err != nil {
		return
	}
	plan, err := pcitopo.New(pcitopo.Host, devs, links, c.req.PortSlots)
	if err != nil {
		c.add("bar-space-ports", "vm", Fail, "use --topology flat", "guest PCIe topology: %v", err)
		return
	}
	bridges, behind, order := plan.Placement()
	if len(bridges) == 0 {
		return
	}
	var bars []addrspace.BAR
	for _, i := range order {
		d := c.devs[i].d
		for _, b := range d.BARs {
			if b.Index >= host.ROMIndex || b.Size == 0 {
				continue
			}
			bar := addrspace.BAR{Owner: d.BDF.String(), Index: b.Index, Kind: addrspace.Mem32, Size: powerOfTwo(b.Size),
				Prefetchable: b.Prefetchable, Behind: behind[i]}
			switch {
			case b.IO:
				bar.Kind = addrspace.IO
			case b.Mem64:
				bar.Kind = addrspace.Mem64
			}
			bars = append(bars, bar)
		}
	}
	if _, err := addrspace.PlanHierarchy(w, bridges, bars); err != nil {
		c.add("bar-space-ports", "vm", Fail, "use --topology flat, less --memory or fewer devices",
			"behind the emulated PCIe ports of --topology host (%d): %v", len(bridges), err)
		return
	}
	c.add("bar-space-ports", "vm", Pass, "", "%d BARs fit behind the emulated PCIe ports of --topology host (%d)", len(bars), len(bridges))
}

// barSpaceFlat checks the BARs on the guest's root bus.
func (c *checker) barSpaceFlat() {
	if len(c.devs) == 0 {
		return
	}
	var b64, b32 []addrspace.BAR
	var total64 uint64
	for _, rd := range c.devs {
		for _, b := range rd.d.BARs {
			if b.IO || b.Index >= host.ROMIndex || b.Size == 0 {
				continue
			}
			bar := addrspace.BAR{Owner: rd.d.BDF.String(), Index: b.Index, Kind: addrspace.Mem32, Size: powerOfTwo(b.Size)}
			if b.Mem64 {
				bar.Kind = addrspace.Mem64
				b64 = append(b64, bar)
				total64 += bar.Size
			} else {
				b32 = append(b32, bar)
			}
		}
	}
	if len(b32) > 0 {
		w := addrspace.Windows{Mem32: addrspace.Range{GPA: addrspace.Window32Base, Size: addrspace.Window32Size}}
		addrs, err := addrspace.Plan(w, b32)
		var pe *addrspace.PlanError
		switch {
		case errors.As(err, &pe):
			c.add("bar-space-32bit", "vm", Fail, "pass fewer devices with 32-bit BARs",
				"%d 32-bit BARs need %s of the 32-bit MMIO window, which has %s", len(b32), humanSize(pe.Need), humanSize(w.Mem32.Size))
		case err != nil:
			c.add("bar-space-32bit", "vm", Fail, "", "%v", err)
		default:
			c.add("bar-space-32bit", "vm", Pass, "", "%d 32-bit BARs fit in [%#x, %#x)", len(b32), w.Mem32.GPA, barsEnd(b32, addrs))
		}
	}
	physBits, err := c.h.PhysAddrBits()
	if err != nil {
		c.add("bar-space", "vm", Warn, "", "cannot check 64-bit BARs against the address width: %v", err)
		return
	}
	if len(b64) == 0 {
		c.add("bar-space", "vm", Pass, "", "no 64-bit BARs")
		return
	}
	w, err := addrspace.NewWindows(c.req.Memory, uint(physBits))
	if err != nil {
		c.add("bar-space", "vm", Fail, "use less --memory", "%v", err)
		return
	}
	addrs, err := addrspace.Plan(w, b64)
	if err == nil {
		end := barsEnd(b64, addrs)
		c.add("bar-space", "vm", Pass, "", "%d 64-bit BARs (%s) fit in [%#x, %#x): need %d of the host's %d physical address bits",
			len(b64), humanSize(total64), w.Mem64.GPA, end, bits.Len64(end-1), physBits)
		return
	}
	var pe *addrspace.PlanError
	if !errors.As(err, &pe) {
		c.add("bar-space", "vm", Fail, "", "%v", err)
		return
	}
	end := w.Mem64.GPA + pe.Need
	fix := "pass fewer devices: these BARs do not fit below 2^" + fmt.Sprint(physBits) + " even with no RAM above 4 GiB"
	if maxMem, ok := maxMemoryFitting(b64, uint(physBits)); ok {
		fix = fmt.Sprintf("use --memory %s or less, or pass fewer devices (the CPU's %d-bit physical address width is fixed)", guestmem.FormatSize(maxMem), physBits)
	}
	c.add("bar-space", "vm", Fail, fix, "%d 64-bit BARs (%s) from %#x end at %#x: the guest needs %d physical address bits, the host has %d",
		len(b64), humanSize(total64), w.Mem64.GPA, end, bits.Len64(end-1), physBits)
}

// powerOfTwo rounds a BAR size up to a power of two, as BAR sizing does.
func powerOfTwo(size uint64) uint64 {
	if size&(size-1) == 0 || bits.Len64(size) >= 64 {
		return size
	}
	return 1 << bits.Len64(size)
}

// barsEnd returns the end of the highest placed BAR.
func barsEnd(bars []addrspace.BAR, addrs []uint64) uint64 {
	var end uint64
	for i, b := range bars {
		end = max(end, addrs[i]+b.Size)
	}
	return end
}

// maxMemoryFitting returns the largest whole-GiB guest memory for which the
// 64-bit BARs still fit the 64-bit window.
func maxMemoryFitting(bars []addrspace.BAR, physBits uint) (uint64, bool) {
	fits := func(gib uint64) bool {
		w, err := addrspace.NewWindows(gib<<30, physBits)
		if err != nil {
			return false
		}
		_, err = addrspace.Plan(w, bars)
		return err == nil
	}
	if !fits(0) {
		return 0, false
	}
	lo, hi := uint64(0), uint64(1)<<(physBits-30) // fits(lo) holds; find the last fitting GiB count
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo << 30, true
}

func (c *checker) node() {
	id, why, err := ChooseNode(c.h, c.req)
	if err != nil {
		c.add("numa-node", "vm", Fail, "", "%v", err)
		return
	}
	n, err := c.h.Node(id)
	if err != nil {
		c.add("numa-node", "vm", Fail, "", "%v", err)
		return
	}
	c.chosen, c.rep.Node, c.rep.NodeReason = &n, id, why
	subj := fmt.Sprintf("node %d", id)
	c.add("numa-node", subj, Pass, "", "chosen: %s; CPUs %s", why, host.FormatCPUList(n.CPUs))

	if c.req.CPUs > 0 {
		if len(n.CPUs) >= c.req.CPUs {
			c.add("cpus", subj, Pass, "", "%d CPUs for %d vCPUs", len(n.CPUs), c.req.CPUs)
		} else {
			fix := fmt.Sprintf("use --cpus %d", len(n.CPUs))
			if alt := c.nodeWithCPUs(c.req.CPUs); alt >= 0 {
				fix += fmt.Sprintf(" or --numa-node %d", alt)
			}
			c.add("cpus", subj, Warn, fix, "%d CPUs for %d vCPUs: vCPUs will share host CPUs", len(n.CPUs), c.req.CPUs)
		}
	}
	if c.req.Memory > 0 {
		c.memory(n)
	}
}

func (c *checker) nodeWithCPUs(want int) int {
	nodes, err := c.h.Nodes()
	if err != nil {
		return -1
	}
	for _, n := range nodes {
		if len(n.CPUs) >= want {
			return n.ID
		}
	}
	return -1
}

func (c *checker) memory(n host.Node) {
	subj := fmt.Sprintf("node %d", n.ID)
	ps := c.req.pageSize()
	if ps == Page4K {
		switch {
		case n.MemFree == 0:
			c.add("memory", subj, Pass, "", "free memory unknown; no hugepages requested")
		case n.MemFree >= c.req.Memory:
			c.add("memory", subj, Pass, "", "%s free for %s (4K pages)", guestmem.FormatSize(n.MemFree), guestmem.FormatSize(c.req.Memory))
		default:
			c.add("memory", subj, Warn, "use hugepages (--hugepages 1G) reserved on this node, or free memory", "%s free for %s: guest RAM will spill to other nodes or swap", guestmem.FormatSize(n.MemFree), guestmem.FormatSize(c.req.Memory))
		}
		return
	}
	need := (c.req.Memory + ps - 1) / ps
	p, ok := n.Pool(ps)
	path := host.NrHugepagesPath(n.ID, ps, n.PerNode)
	if !ok {
		fix := fmt.Sprintf("add hugepagesz=%s hugepages=%d to the kernel command line and reboot, or use --hugepages 2M", guestmem.FormatSize(ps), need)
		if ps == Page2M {
			fix = fmt.Sprintf("add hugepagesz=2M hugepages=%d to the kernel command line and reboot, or use --hugepages none", need)
		}
		c.add("hugepages", subj, Fail, fix, "the kernel has no %s hugepage pool", guestmem.FormatSize(ps))
		return
	}
	if p.Free >= need {
		c.add("hugepages", subj, Pass, "", "%d of %d free %s hugepages, VM needs %d", p.Free, p.Total, guestmem.FormatSize(ps), need)
		return
	}
	c.add("hugepages", subj, Fail, fmt.Sprintf("echo %d > %s", p.Total+(need-p.Free), path),
		"%d free %s hugepages (%d reserved), VM needs %d", p.Free, guestmem.FormatSize(ps), p.Total, need)
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

// humanSize renders a byte count in its largest unit: exactly when the
// unit divides it ("128G"), else with one decimal ("128.0G").
func humanSize(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v >= 1<<u.shift {
			if v%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
			}
			return fmt.Sprintf("%.1f%s", float64(v)/float64(uint64(1)<<u.shift), u.suffix)
		}
	}
	return fmt.Sprintf("%d", v)
}

func memlockString(v uint64) string {
	if v == math.MaxUint64 {
		return "unlimited"
	}
	return guestmem.FormatSize(v)
}

func (c *checker) placement() {
	if c.chosen == nil {
		return
	}
	for _, rd := range c.devs {
		subj := rd.d.BDF.String()
		switch dn := rd.d.NUMANode; {
		case dn < 0:
			c.add("placement", subj, Pass, "", "no NUMA information: cannot be misplaced relative to node %d", c.chosen.ID)
		case dn == c.chosen.ID:
			c.add("placement", subj, Pass, "", "on the VM's node %d", dn)
		default:
			c.add("placement", subj, Warn, fmt.Sprintf("use --numa-node %d", dn),
				"on node %d, VM on node %d: DMA and interrupts cross the socket interconnect", dn, c.chosen.ID)
		}
	}
}
