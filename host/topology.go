package host

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
)

// PCIPath is a device's place in the host's PCI tree, read from its sysfs
// realpath (/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:08.0/0000:04:00.0):
// the root complex it hangs from and every function on the way down.
type PCIPath struct {
	// RootComplex is the host bridge's sysfs name, e.g. "pci0000:00".
	RootComplex string `json:"root_complex"`
	// Chain runs from the function on the root bus (a root port, or the
	// device itself when it is on the root bus) down to the device, last.
	Chain []BDF `json:"chain"`
}

// ParsePCIPath parses a PCI device's sysfs realpath. Anything before the
// "pciDDDD:BB" component (the sysfs mount point, a test root) is ignored.
func ParsePCIPath(realpath string) (PCIPath, error) {
	parts := strings.Split(filepath.ToSlash(filepath.Clean(realpath)), "/")
	for i, p := range parts {
		if !strings.HasPrefix(p, "pci") || !strings.Contains(p, ":") {
			continue
		}
		path := PCIPath{RootComplex: p}
		for _, c := range parts[i+1:] {
			b, err := ParseBDF(c)
			if err != nil || len(c) != len("0000:00:00.0") {
				return PCIPath{}, fmt.Errorf("host: PCI path %s: component %q is not a PCI function", realpath, c)
			}
			path.Chain = append(path.Chain, b)
		}
		if len(path.Chain) == 0 {
			return PCIPath{}, fmt.Errorf("host: PCI path %s: no PCI function below %s", realpath, p)
		}
		return path, nil
	}
	return PCIPath{}, fmt.Errorf("host: PCI path %s: no pciDDDD:BB root complex component", realpath)
}

// Device returns the function the path leads to.
func (p PCIPath) Device() BDF { return p.Chain[len(p.Chain)-1] }

// Port returns the bridge directly above the device (its root or
// downstream port); ok is false for a device on the root bus.
func (p PCIPath) Port() (BDF, bool) {
	if len(p.Chain) < 2 {
		return BDF{}, false
	}
	return p.Chain[len(p.Chain)-2], true
}

// Switches returns the PCIe switches above the device as NCCL sees them,
// nearest first: every second ancestor going up from the device (the
// device's port is skipped, the one above it is the switch's upstream
// port, and so on), stopping at the root complex, so root ports never
// appear. Devices sharing a switch share its upstream port here.
func (p PCIPath) Switches() []BDF {
	var out []BDF
	for i := len(p.Chain) - 3; i >= 0; i -= 2 {
		out = append(out, p.Chain[i])
	}
	return out
}

// String formats the path as sysfs does below /sys/devices.
func (p PCIPath) String() string {
	var b strings.Builder
	b.WriteString(p.RootComplex)
	for _, c := range p.Chain {
		b.WriteByte('/')
		b.WriteString(c.String())
	}
	return b.String()
}

// PCIPath reads device b's position in the PCI tree: on a live tree the
// resolved bus/pci/devices symlink, in a capture the recorded "realpath" file.
func (h *Host) PCIPath(b BDF) (PCIPath, error) {
	dir := h.devDir(b)
	if s, err := readString(filepath.Join(dir, "realpath")); err == nil {
		return ParsePCIPath(s)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return PCIPath{}, fmt.Errorf("host: PCI device %s: read realpath: %w", b, err)
	}
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return PCIPath{}, fmt.Errorf("host: PCI device %s: resolve %s: %w", b, dir, err)
	}
	return ParsePCIPath(real)
}

// LinkSpeed is a PCIe link speed as its generation (1 = 2.5 GT/s ... 6 =
// 64 GT/s); 0 is unknown.
type LinkSpeed uint8

// ParseLinkSpeed parses a sysfs link speed: "16.0 GT/s PCIe" (Linux 5.6+),
// "16 GT/s" and "2.5 GT/s" (older kernels). "Unknown" (a link that never
// trained, or a function without a link) is speed 0 with no error.
func ParseLinkSpeed(s string) (LinkSpeed, error) {
	s = strings.TrimSpace(s)
	if s == "" || strings.HasPrefix(s, "Unknown") {
		return 0, nil
	}
	num, _, ok := strings.Cut(s, " GT/s")
	if !ok {
		return 0, fmt.Errorf("host: link speed %q: want \"N GT/s\"", s)
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("host: link speed %q: %w", s, err)
	}
	for gen, gt := range []float64{2.5, 5, 8, 16, 32, 64} {
		if f == gt {
			return LinkSpeed(gen + 1), nil
		}
	}
	return 0, fmt.Errorf("host: link speed %q: not a PCIe rate (2.5, 5, 8, 16, 32 or 64 GT/s)", s)
}

// String formats the speed as current kernels write it ("16.0 GT/s PCIe").
func (s LinkSpeed) String() string {
	switch s {
	case 1:
		return "2.5 GT/s PCIe"
	case 2, 3, 4, 5, 6:
		return fmt.Sprintf("%d.0 GT/s PCIe", []int{0, 0, 5, 8, 16, 32, 64}[s])
	}
	return "Unknown"
}

// PCILink is a function's PCIe link as sysfs reports it. Zero fields are
// unknown (the attribute is absent, as on conventional PCI functions and
// root complex integrated endpoints, or reads "Unknown").
type PCILink struct {
	MaxSpeed LinkSpeed `json:"max_speed"`
	MaxWidth int       `json:"max_width"`
	CurSpeed LinkSpeed `json:"current_speed"`
	CurWidth int       `json:"current_width"`
}

// Known reports whether the maximum speed and width are both known.
func (l PCILink) Known() bool { return l.MaxSpeed != 0 && l.MaxWidth != 0 }

// PCILink reads max_link_speed/max_link_width and current_link_speed/
// current_link_width of function b: what NCCL reads of a device and of its
// parent port to rate their link.
func (h *Host) PCILink(b BDF) (PCILink, error) {
	dir := h.devDir(b)
	var l PCILink
	for _, f := range []struct {
		name  string
		speed *LinkSpeed
		width *int
	}{{"max_link_speed", &l.MaxSpeed, nil}, {"current_link_speed", &l.CurSpeed, nil}, {"max_link_width", nil, &l.MaxWidth}, {"current_link_width", nil, &l.CurWidth}} {
		s, err := readString(filepath.Join(dir, f.name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return PCILink{}, fmt.Errorf("host: PCI device %s: read %s: %w", b, f.name, err)
		}
		if f.speed != nil {
			if *f.speed, err = ParseLinkSpeed(s); err != nil {
				return PCILink{}, fmt.Errorf("host: PCI device %s: %s: %w", b, f.name, err)
			}
			continue
		}
		w, err := strconv.Atoi(s)
		if err != nil || w < 0 || w > 32 {
			return PCILink{}, fmt.Errorf("host: PCI device %s: %s %q: want a lane count 0-32", b, f.name, s)
		}
		*f.width = w
	}
	return l, nil
}
