package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
)

// Spec is one --gpu or --vf argument.
type Spec struct {
	BDF host.BDF
	// VF: the device must be an SR-IOV virtual function (--vf).
	VF bool
	// Clique is the NVIDIA GPUDirect P2P clique (0-15), -1 for none.
	Clique int
	// IB is an InfiniBand VF's identity to set on its PF (--vf only):
	// node-guid=, port-guid=, guid=auto, link=.
	IB ibvf.Settings
}

// ParseSpec parses "BDF" or "BDF,clique=N" (clique only for --gpu), and
// for a VF "BDF,node-guid=G,port-guid=G[,link=auto|enable|disable]" or
// "BDF,guid=auto".
func ParseSpec(s string, vf bool) (Spec, error) {
	flag := "--gpu"
	if vf {
		flag = "--vf"
	}
	parts := strings.Split(s, ",")
	b, err := host.ParseBDF(parts[0])
	if err != nil {
		return Spec{}, fmt.Errorf("%s %q: %w", flag, s, err)
	}
	sp := Spec{BDF: b, VF: vf, Clique: -1}
	for _, opt := range parts[1:] {
		k, v, _ := strings.Cut(opt, "=")
		switch k {
		case "clique":
			if vf {
				return Spec{}, fmt.Errorf("%s %q: clique applies to NVIDIA GPUs given with --gpu", flag, s)
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > 15 {
				return Spec{}, fmt.Errorf("%s %q: clique=%q must be a number 0-15 (GPUs with the same clique can do peer-to-peer)", flag, s, v)
			}
			sp.Clique = n
		default:
			if vf {
				if ok, err := sp.IB.Set(k, v); ok {
					if err != nil {
						return Spec{}, fmt.Errorf("%s %q: %w", flag, s, err)
					}
					continue
				}
				return Spec{}, fmt.Errorf("%s %q: unknown option %q (known: node-guid=GUID, port-guid=GUID, guid=auto, link=auto|enable|disable)", flag, s, opt)
			}
			for _, ib := range ibvf.Keys {
				if k == ib {
					return Spec{}, fmt.Errorf("%s %q: %s applies to InfiniBand VFs given with --vf", flag, s, k)
				}
			}
			return Spec{}, fmt.Errorf("%s %q: unknown option %q (known: clique=N)", flag, s, opt)
		}
	}
	return sp, nil
}

// bridgeClass reports PCI-to-PCI bridges (class 0x0604, 0x0609), which the
// kernel tolerates in a VFIO group whatever their driver (pcieport).
func bridgeClass(d *host.Device) bool {
	sc := d.SubClass()
	return sc == 0x0604 || sc == 0x0609
}

// groupMemberOK mirrors the kernel's viability rule: a group is usable when
// every member is on a VFIO driver, on pci-stub, on no driver, or is a
// bridge.
func groupMemberOK(d *host.Device) bool {
	return d.Driver == "" || host.IsVFIODriver(d.Driver) || d.Driver == "pci-stub" || bridgeClass(d)
}

// CheckGroupViable checks every device in bdf's IOMMU group and names the
// ones that keep the group from being usable.
func CheckGroupViable(h *host.Host, dev *host.Device) error {
	members, err := h.IOMMUGroupMembers(dev.IOMMUGroup)
	if err != nil {
		return fmt.Errorf("vfio: %s: %w", dev.BDF, err)
	}
	var bad, used []string
	for _, m := range members {
		if m == dev.BDF {
			continue
		}
		md, err := h.Device(m)
		if err != nil {
			return fmt.Errorf("vfio: %s: IOMMU group %d member: %w", dev.BDF, dev.IOMMUGroup, err)
		}
		if groupMemberOK(md) {
			continue
		}
		if err := CheckHostUse(h, m); err != nil {
			used = append(used, fmt.Sprintf("%s (driver %s: %v)", m, md.Driver, err))
			continue
		}
		bad = append(bad, fmt.Sprintf("%s (driver %s)", m, md.Driver))
	}
	if len(used) > 0 {
		// The group goes to the VM as a whole: a member the host uses
		// cannot follow, so neither can this device.
		return fmt.Errorf("vfio: %s: IOMMU group %d is not viable and cannot be made so: %s", dev.BDF, dev.IOMMUGroup, strings.Join(used, "; "))
	}
	if len(bad) > 0 {
		return fmt.Errorf("vfio: %s: IOMMU group %d is not viable: %s share(s) the group and are bound to host drivers; pass them through too, or bind them to vfio-pci (hpcvmm bind %s), or unbind them",
			dev.BDF, dev.IOMMUGroup, strings.Join(bad, ", "), strings.Join(firstWords(bad), " "))
	}
	return nil
}

func firstWords(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i], _, _ = strings.Cut(s, " ")
	}
	return out
}

// CheckDevice runs the host-side checks for one --gpu/--vf device and
// returns its host description: the device exists, the host IOMMU is on, its
// group is viable, it is bound to vfio-pci (bound is false and err nil when
// allowBind is set and it is not: the caller binds it), and for --vf it is an
// SR-IOV VF (the PF is in the returned device's PhysFn).
func CheckDevice(h *host.Host, sp Spec, allowBind bool) (dev *host.Device, bound bool, err error) {
	// The messages name the device by kind (the Go API's words); the CLI
	// puts its own flag in front.
	flag := "GPU"
	if sp.VF {
		flag = "VF"
	}
	dev, err = h.Device(sp.BDF)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("%s %s: no such PCI device on this host; list candidates with hpcvmm devices or lspci -D", flag, sp.BDF)
	}
	if err != nil {
		return nil, false, fmt.Errorf("%s %s: %w", flag, sp.BDF, err)
	}
	if sp.VF && dev.PhysFn == nil {
		return nil, false, fmt.Errorf("VF %s: %04x:%04x is not an SR-IOV virtual function (no physfn link); pass a VF (create them with echo N > /sys/bus/pci/devices/<PF>/sriov_numvfs) or pass it as a whole device (a GPU)",
			sp.BDF, dev.Vendor, dev.DeviceID)
	}
	if sp.Clique >= 0 && (dev.Vendor != nvidiaVendor || dev.BaseClass() != host.ClassDisplay) {
		return nil, false, fmt.Errorf("GPU %s,clique=%d: the P2P clique capability is for NVIDIA GPUs, this is %04x:%04x class %06x", sp.BDF, sp.Clique, dev.Vendor, dev.DeviceID, dev.Class)
	}
	if n, err := h.IOMMUGroups(); err != nil {
		return nil, false, fmt.Errorf("%s %s: %w", flag, sp.BDF, err)
	} else if n == 0 || dev.IOMMUGroup < 0 {
		return nil, false, fmt.Errorf("%s %s: the host IOMMU is disabled (no IOMMU groups): enable VT-d/AMD-Vi in the firmware and boot with intel_iommu=on (Intel) or amd_iommu=on iommu=pt", flag, sp.BDF)
	}
	if err := CheckGroupViable(h, dev); err != nil {
		return nil, false, err
	}
	if !host.IsVFIODriver(dev.Driver) {
		if err := CheckHostUse(h, dev.BDF); err != nil {
			return nil, false, fmt.Errorf("%s %s: %w", flag, sp.BDF, err)
		}
		if dev.Driver != "" && !allowBind {
			return nil, false, fmt.Errorf("%s %s: in use by the host driver %s; let hpcvmm rebind it to vfio-pci for this VM and back afterwards (Passthrough.Bind; hpcvmm run --bind-devices), or run hpcvmm bind %s", flag, sp.BDF, dev.Driver, sp.BDF)
		}
		if !allowBind {
			return nil, false, fmt.Errorf("%s %s: not bound to vfio-pci; let hpcvmm bind it (Passthrough.Bind; hpcvmm run --bind-devices), or run hpcvmm bind %s", flag, sp.BDF, sp.BDF)
		}
		return dev, false, nil
	}
	return dev, true, nil
}

// CheckHostUse refuses a function the host itself uses (host.DeviceUse):
// a network interface that is up, routes or carries an address, a block
// device that is mounted, stacked on or swapped to. Taking it from its
// driver would cut the node off its network or pull its disk out from
// under the running system (issue 23), so it is refused with what the
// host uses, before anything changes.
func CheckHostUse(h *host.Host, b host.BDF) error {
	u, err := h.DeviceUse(b)
	if err != nil {
		return fmt.Errorf("cannot tell whether the host uses it: %w", err)
	}
	if u.Busy() {
		return fmt.Errorf("the host uses it: %s; taking it from its driver would take that from the host: pass another device (hpcvmm devices), or end that use on the host first", u)
	}
	return nil
}

// nvidiaVendor is NVIDIA's PCI vendor ID.
const nvidiaVendor = 0x10de
