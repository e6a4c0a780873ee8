package preflight

// The checks of each passthrough device: driver, IOMMU group, VFIO group
// access, interrupts, SR-IOV and InfiniBand VF identity.

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"syscall"

	"github.com/hpcvmm/hpcvmm/host"
)

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
		c.add("driver", subj, Warn, "", "no driver bound; --bind-devices binds it to vfio-pci for the VM")
	case d.Driver == "":
		c.add("driver", subj, Fail, "hpcvmm bind "+subj+" (or hpcvmm run --bind-devices), or by hand: "+BindFix(d.BDF, ""), "no driver bound; VFIO needs vfio-pci")
	case c.req.AllowBind:
		c.add("driver", subj, Warn, "", "bound to %q; --bind-devices rebinds it to vfio-pci for the VM and gives it back afterwards", d.Driver)
	default:
		c.add("driver", subj, Fail, "hpcvmm bind "+subj+" (or hpcvmm run --bind-devices), or by hand: "+BindFix(d.BDF, d.Driver), "bound to %s (in use by the host); VFIO needs vfio-pci", d.Driver)
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
