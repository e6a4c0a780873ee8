package host

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// BDF is a PCI function address: domain, bus, device, function.
type BDF struct {
	Domain   uint16
	Bus      uint8
	Device   uint8
	Function uint8
}

// ParseBDF parses "0000:82:00.0" or, with domain 0 implied, "82:00.0"
// (hexadecimal, as lspci prints them).
func ParseBDF(s string) (BDF, error) {
	bad := func(why string) (BDF, error) {
		return BDF{}, fmt.Errorf("PCI address %q: %s; want DDDD:BB:DD.F or BB:DD.F in hex, e.g. 0000:82:00.0 (see lspci -D)", s, why)
	}
	parts := strings.Split(s, ":")
	var dom, bus, devfn string
	switch len(parts) {
	case 3:
		dom, bus, devfn = parts[0], parts[1], parts[2]
	case 2:
		dom, bus, devfn = "0000", parts[0], parts[1]
	default:
		return bad("wrong number of ':' separators")
	}
	dev, fn, ok := strings.Cut(devfn, ".")
	if !ok {
		return bad("missing '.' before the function number")
	}
	d, err := parseHexField(dom, 4, 0xffff)
	if err != nil {
		return bad("domain " + err.Error())
	}
	b, err := parseHexField(bus, 2, 0xff)
	if err != nil {
		return bad("bus " + err.Error())
	}
	dv, err := parseHexField(dev, 2, 0x1f)
	if err != nil {
		return bad("device " + err.Error())
	}
	f, err := parseHexField(fn, 1, 7)
	if err != nil {
		return bad("function " + err.Error())
	}
	return BDF{Domain: uint16(d), Bus: uint8(b), Device: uint8(dv), Function: uint8(f)}, nil
}

func parseHexField(s string, maxDigits int, max uint64) (uint64, error) {
	if s == "" || len(s) > maxDigits {
		return 0, fmt.Errorf("%q must be 1 to %d hex digits", s, maxDigits)
	}
	v, err := strconv.ParseUint(s, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is not hexadecimal", s)
	}
	if v > max {
		return 0, fmt.Errorf("%q is above the maximum %#x", s, max)
	}
	return v, nil
}

// String formats the canonical sysfs name, e.g. "0000:82:00.0".
func (b BDF) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", b.Domain, b.Bus, b.Device, b.Function)
}

// MarshalText makes BDFs render as their sysfs name in JSON.
func (b BDF) MarshalText() ([]byte, error) { return []byte(b.String()), nil }

// Less orders BDFs as lspci does.
func (b BDF) Less(o BDF) bool {
	if b.Domain != o.Domain {
		return b.Domain < o.Domain
	}
	if b.Bus != o.Bus {
		return b.Bus < o.Bus
	}
	if b.Device != o.Device {
		return b.Device < o.Device
	}
	return b.Function < o.Function
}

// Linux resource flags (include/linux/ioport.h) as exported in the sysfs
// "resource" file.
const (
	resIO       = 0x00000100
	resMem      = 0x00000200
	resPrefetch = 0x00002000
	resMem64    = 0x00100000
)

// BAR is one populated region from a device's sysfs "resource" file.
type BAR struct {
	// Index is the BAR register number 0-5 (a 64-bit BAR takes two
	// registers, so an NVIDIA GPU's BAR0/BAR1/BAR3 are indexes 0, 2, 4),
	// 6 for the expansion ROM, 7-12 for SR-IOV VF BARs 0-5.
	Index int `json:"index"`
	// Start and End are the host physical range, inclusive.
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
	// Flags are the raw kernel resource flags.
	Flags uint64 `json:"flags"`
	// Size is End-Start+1.
	Size uint64 `json:"size"`
	// IO is true for an I/O-port BAR.
	IO bool `json:"io"`
	// Mem64 is true for a 64-bit memory BAR, which the guest may place
	// above 4 GiB.
	Mem64 bool `json:"mem64"`
	// Prefetchable is the BAR's prefetchable bit.
	Prefetchable bool `json:"prefetchable"`
}

// Resource indexes in the sysfs resource file.
const (
	// ROMIndex is the expansion ROM's line.
	ROMIndex = 6
	// VFBARIndex is the first SR-IOV VF BAR line (PCI_IOV_RESOURCES).
	VFBARIndex = 7
)

// ParseResource parses the contents of a sysfs "resource" file: one
// "start end flags" line per resource, hex. Unpopulated lines (all zero) are
// skipped.
func ParseResource(s string) ([]BAR, error) {
	var bars []BAR
	sc := bufio.NewScanner(strings.NewReader(s))
	for i := 0; sc.Scan(); i++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) != 3 {
			return nil, fmt.Errorf("resource line %d %q: want \"start end flags\"", i, sc.Text())
		}
		var v [3]uint64
		for j := range f {
			n, err := strconv.ParseUint(f[j], 0, 64)
			if err != nil {
				return nil, fmt.Errorf("resource line %d %q: %w", i, sc.Text(), err)
			}
			v[j] = n
		}
		if v[2] == 0 || v[1] < v[0] || (v[0] == 0 && v[1] == 0) {
			continue
		}
		bars = append(bars, BAR{
			Index: i, Start: v[0], End: v[1], Flags: v[2], Size: v[1] - v[0] + 1,
			IO:           v[2]&resIO != 0,
			Mem64:        v[2]&resMem64 != 0,
			Prefetchable: v[2]&resPrefetch != 0,
		})
	}
	return bars, sc.Err()
}

// Device is everything hpcvmm needs to know about one PCI function.
type Device struct {
	BDF BDF `json:"bdf"`
	// Vendor, DeviceID, SubVendor, SubDevice are the PCI IDs.
	Vendor    uint16 `json:"vendor"`
	DeviceID  uint16 `json:"device"`
	SubVendor uint16 `json:"subsystem_vendor"`
	SubDevice uint16 `json:"subsystem_device"`
	// Class is the 24-bit class code, e.g. 0x030200 (3D controller).
	Class uint32 `json:"class"`
	// Driver is the bound driver's name, "" for none.
	Driver string `json:"driver"`
	// IOMMUGroup is the group number, -1 when the device has none (IOMMU
	// off or the device is not translated).
	IOMMUGroup int `json:"iommu_group"`
	// NUMANode is the device's node, -1 when the firmware gives no NUMA
	// information.
	NUMANode int `json:"numa_node"`
	// ResetMethods are the kernel's reset methods in order ("flr", "pm",
	// "bus"); empty when the device cannot be reset.
	ResetMethods []string `json:"reset_methods"`
	// ResetKnown is false when the kernel exposes neither reset_method nor
	// reset, so reset capability cannot be determined.
	ResetKnown bool `json:"reset_known"`
	// BARs are the populated resources (see BAR.Index).
	BARs []BAR `json:"bars"`
	// PhysFn is the PF of an SR-IOV VF, nil otherwise.
	PhysFn *BDF `json:"physfn,omitempty"`
	// VirtFns are an SR-IOV PF's enabled VFs, ordered by VF number.
	VirtFns []BDF `json:"virtfns,omitempty"`
	// NumVFs and TotalVFs are sriov_numvfs / sriov_totalvfs (0 when the
	// device is not an SR-IOV PF).
	NumVFs   int `json:"sriov_numvfs"`
	TotalVFs int `json:"sriov_totalvfs"`
	// Config is the parsed configuration space (capability lists).
	Config Config `json:"config"`
}

// Class code prefixes used to pick passthrough candidates.
const (
	ClassNetwork    = 0x02   // base class: network controller
	ClassEthernet   = 0x0200 // network: Ethernet
	ClassInfiniBand = 0x0207 // network: InfiniBand
	ClassDisplay    = 0x03   // base class: display controller
	ClassVGA        = 0x0300 // display: VGA compatible
	ClassDisplay3D  = 0x0302 // display: 3D controller (compute GPUs)
	ClassAccel      = 0x12   // base class: processing accelerator
	ClassBridge     = 0x06   // base class: bridge
)

// BaseClass returns the class code's top byte.
func (d *Device) BaseClass() uint8 { return uint8(d.Class >> 16) }

// SubClass returns base class and subclass, e.g. 0x0302.
func (d *Device) SubClass() uint16 { return uint16(d.Class >> 8) }

// ClassName is a short human name for the class code.
func (d *Device) ClassName() string {
	switch d.SubClass() {
	case ClassVGA:
		return "VGA"
	case ClassDisplay3D:
		return "3D controller"
	case ClassEthernet:
		return "Ethernet"
	case ClassInfiniBand:
		return "InfiniBand"
	}
	switch d.BaseClass() {
	case ClassDisplay:
		return "display"
	case ClassNetwork:
		return "network"
	case ClassAccel:
		return "accelerator"
	case ClassBridge:
		return "bridge"
	case 0x01:
		return "storage"
	}
	return "other"
}

// IsVFIODriver reports whether a driver name is vfio-pci or a vfio-pci
// variant driver (e.g. mlx5_vfio_pci, nvgrace_gpu_vfio_pci).
func IsVFIODriver(name string) bool {
	return name == "vfio-pci" || strings.Contains(name, "vfio")
}

func (h *Host) devDir(b BDF) string {
	return filepath.Join(h.Layout.PCIDevices, b.String())
}

// Devices lists every PCI function of the host in BDF order.
func (h *Host) Devices() ([]BDF, error) {
	ents, err := os.ReadDir(h.Layout.PCIDevices)
	if err != nil {
		return nil, fmt.Errorf("host: list PCI devices in %s: %w", h.Layout.PCIDevices, err)
	}
	var out []BDF
	for _, e := range ents {
		if b, err := ParseBDF(e.Name()); err == nil {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out, nil
}

// Device reads one PCI function. A device that does not exist yields an
// error wrapping fs.ErrNotExist.
func (h *Host) Device(b BDF) (*Device, error) {
	dir := h.devDir(b)
	if _, err := os.Stat(dir); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("host: PCI device %s not found in %s: %w", b, h.Layout.PCIDevices, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("host: PCI device %s: %w", b, err)
	}
	d := &Device{BDF: b, IOMMUGroup: -1, NUMANode: -1}
	for _, f := range []struct {
		name string
		dst  *uint16
	}{{"vendor", &d.Vendor}, {"device", &d.DeviceID}, {"subsystem_vendor", &d.SubVendor}, {"subsystem_device", &d.SubDevice}} {
		v, err := readUint(filepath.Join(dir, f.name), 16)
		if err != nil && !(errors.Is(err, fs.ErrNotExist) && strings.HasPrefix(f.name, "subsystem")) {
			return nil, fmt.Errorf("host: PCI device %s: read %s: %w", b, f.name, err)
		}
		*f.dst = uint16(v)
	}
	c, err := readUint(filepath.Join(dir, "class"), 24)
	if err != nil {
		return nil, fmt.Errorf("host: PCI device %s: read class: %w", b, err)
	}
	d.Class = uint32(c)

	if t, ok, err := readLink(dir, "driver"); err != nil {
		return nil, err
	} else if ok {
		d.Driver = filepath.Base(t)
	}
	if t, ok, err := readLink(dir, "iommu_group"); err != nil {
		return nil, err
	} else if ok {
		g, err := strconv.Atoi(filepath.Base(t))
		if err != nil {
			return nil, fmt.Errorf("host: PCI device %s: iommu_group link %q: %w", b, t, err)
		}
		d.IOMMUGroup = g
	}
	if s, err := readString(filepath.Join(dir, "numa_node")); err == nil {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("host: PCI device %s: numa_node %q: %w", b, s, err)
		}
		if n >= 0 {
			d.NUMANode = n
		}
	}
	// reset_method (Linux 5.15+) lists the methods; it and "reset" are
	// hidden when the device has none, so on a kernel with reset_method
	// support an absent file means "cannot be reset". Without either we
	// cannot tell a resetless device from an old kernel.
	if s, err := readString(filepath.Join(dir, "reset_method")); err == nil {
		d.ResetMethods, d.ResetKnown = strings.Fields(s), true
	} else if exists(filepath.Join(dir, "reset")) {
		d.ResetMethods, d.ResetKnown = []string{"unspecified"}, true
	}
	if s, err := readString(filepath.Join(dir, "resource")); err == nil {
		if d.BARs, err = ParseResource(s); err != nil {
			return nil, fmt.Errorf("host: PCI device %s: %w", b, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("host: PCI device %s: read resource: %w", b, err)
	}
	if t, ok, err := readLink(dir, "physfn"); err != nil {
		return nil, err
	} else if ok {
		pf, err := ParseBDF(filepath.Base(t))
		if err != nil {
			return nil, fmt.Errorf("host: PCI device %s: physfn link %q: %w", b, t, err)
		}
		d.PhysFn = &pf
	}
	if d.VirtFns, err = readVirtFns(dir); err != nil {
		return nil, fmt.Errorf("host: PCI device %s: %w", b, err)
	}
	if v, err := readUint(filepath.Join(dir, "sriov_numvfs"), 16); err == nil {
		d.NumVFs = int(v)
	}
	if v, err := readUint(filepath.Join(dir, "sriov_totalvfs"), 16); err == nil {
		d.TotalVFs = int(v)
	}
	// Unprivileged readers get only the first 64 bytes of config space;
	// ParseConfig copes with whatever length it is given.
	if raw, err := os.ReadFile(filepath.Join(dir, "config")); err == nil {
		d.Config = ParseConfig(raw)
	}
	return d, nil
}

// readVirtFns collects virtfnN links (or virtfnN.link in a capture).
func readVirtFns(dir string) ([]BDF, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type vf struct {
		n int
		b BDF
	}
	var vfs []vf
	for _, e := range ents {
		name := strings.TrimSuffix(e.Name(), ".link")
		if !strings.HasPrefix(name, "virtfn") {
			continue
		}
		n, err := strconv.Atoi(name[len("virtfn"):])
		if err != nil {
			continue
		}
		t, ok, err := readLink(dir, name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		b, err := ParseBDF(filepath.Base(t))
		if err != nil {
			return nil, fmt.Errorf("%s link %q: %w", name, t, err)
		}
		vfs = append(vfs, vf{n, b})
	}
	sort.Slice(vfs, func(i, j int) bool { return vfs[i].n < vfs[j].n })
	out := make([]BDF, len(vfs))
	for i, v := range vfs {
		out[i] = v.b
	}
	return out, nil
}

// IOMMUGroupMembers lists the functions in IOMMU group g, in BDF order.
func (h *Host) IOMMUGroupMembers(g int) ([]BDF, error) {
	dir := filepath.Join(h.Layout.IOMMUGroups, strconv.Itoa(g), "devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("host: list IOMMU group %d: %w", g, err)
	}
	var out []BDF
	for _, e := range ents {
		if b, err := ParseBDF(e.Name()); err == nil {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out, nil
}

// IOMMUGroups returns the number of IOMMU groups. Zero groups means the
// kernel is not using an IOMMU (intel_iommu/amd_iommu off, or none present),
// so VFIO cannot work.
func (h *Host) IOMMUGroups() (int, error) {
	ents, err := os.ReadDir(h.Layout.IOMMUGroups)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("host: list IOMMU groups: %w", err)
	}
	n := 0
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			n++
		}
	}
	return n, nil
}

// PassthroughCandidate reports whether a device is one an admin would
// plausibly hand to a VM: a GPU (display class), a network or InfiniBand
// function, a processing accelerator, or anything already bound to a VFIO
// driver. SR-IOV VFs are listed under their PF, not on their own.
func PassthroughCandidate(d *Device) bool {
	if d.PhysFn != nil {
		return false
	}
	switch d.BaseClass() {
	case ClassDisplay, ClassNetwork, ClassAccel:
		return true
	}
	return IsVFIODriver(d.Driver)
}

// PassthroughDevices returns the host's passthrough candidates (see
// PassthroughCandidate) in BDF order; each PF's VFs are in its VirtFns.
func (h *Host) PassthroughDevices() ([]*Device, error) {
	bdfs, err := h.Devices()
	if err != nil {
		return nil, err
	}
	var out []*Device
	for _, b := range bdfs {
		d, err := h.Device(b)
		if err != nil {
			return nil, err
		}
		if PassthroughCandidate(d) {
			out = append(out, d)
		}
	}
	return out, nil
}
