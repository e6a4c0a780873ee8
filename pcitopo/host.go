package pcitopo

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
)

// FromHost reads what New needs about the devices bdfs (labelled names,
// same length or nil) from h: each one's sysfs path, link and identity,
// and the links of every host bridge above them.
func FromHost(h *host.Host, names []string, bdfs []host.BDF) ([]Device, map[host.BDF]host.PCILink, error) {
	if names != nil && len(names) != len(bdfs) {
		return nil, nil, fmt.Errorf("pcitopo: %d names for %d devices", len(names), len(bdfs))
	}
	links := map[host.BDF]host.PCILink{}
	devs := make([]Device, 0, len(bdfs))
	for i, b := range bdfs {
		path, err := h.PCIPath(b)
		if err != nil {
			return nil, nil, err
		}
		d, err := h.Device(b)
		if err != nil {
			return nil, nil, err
		}
		l, err := h.PCILink(b)
		if err != nil {
			return nil, nil, err
		}
		dev := Device{BDF: b, Path: path, Link: l, Class: d.Class, Vendor: d.Vendor, DeviceID: d.DeviceID}
		if names != nil {
			dev.Name = names[i]
		}
		devs = append(devs, dev)
		for _, a := range path.Chain[:len(path.Chain)-1] {
			if _, ok := links[a]; ok {
				continue
			}
			// A bridge the tree does not show (a capture records only the
			// devices) is simply unknown: the ports fall back to the device.
			if l, err := h.PCILink(a); err == nil {
				links[a] = l
			}
		}
	}
	return devs, links, nil
}
