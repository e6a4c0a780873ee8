package ibvf

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
)

// Target is where a VF's identity is set: its PF's IPoIB netdev and the
// VF's number on that PF.
type Target struct {
	VF, PF host.BDF
	// Netdev is the PF's IPoIB interface ("ib0").
	Netdev string
	// Index is the VF's number on the PF (virtfnN).
	Index int
	// RDMADevice and LinkLayer are the PF's RDMA device and port 1's link
	// layer, "" when it has none (for hpcvmm check).
	RDMADevice, LinkLayer string
}

// Locate finds vf's PF, netdev and VF number and checks that the PF is
// InfiniBand, so GUID options are refused, with what to do, before
// anything on the host changes: a device that is not a VF, a PF without a
// netdev (ib_ipoib not loaded), an Ethernet PF.
func Locate(h *host.Host, vf host.BDF) (Target, error) {
	t := Target{VF: vf}
	d, err := h.Device(vf)
	if err != nil {
		return t, err
	}
	if d.PhysFn == nil {
		return t, fmt.Errorf("%s is not an SR-IOV virtual function (no physfn): node-guid, port-guid, guid and link apply to InfiniBand VFs", vf)
	}
	t.PF = *d.PhysFn
	if t.Index, err = h.VFIndex(t.PF, vf); err != nil {
		return t, err
	}
	if t.RDMADevice, t.LinkLayer, _, err = h.RDMALinkLayer(t.PF); err != nil {
		return t, err
	}
	ifs, err := h.NetInterfaces(t.PF)
	if err != nil {
		return t, err
	}
	if len(ifs) == 0 {
		return t, fmt.Errorf("PF %s of VF %s has no network interface, and the kernel sets VF GUIDs through the PF's IPoIB netdev: load it with modprobe ib_ipoib (then ls /sys/bus/pci/devices/%s/net)", t.PF, vf, t.PF)
	}
	var types []string
	for _, name := range ifs {
		typ, err := h.NetInterfaceType(t.PF, name)
		if err != nil {
			return t, err
		}
		if typ == host.ARPHRDInfiniBand {
			t.Netdev = name
			return t, nil
		}
		types = append(types, fmt.Sprintf("%s type %d", name, typ))
	}
	layer := ""
	if t.LinkLayer != "" {
		layer = fmt.Sprintf(", link layer %s", t.LinkLayer)
	}
	return t, fmt.Errorf("PF %s of VF %s is not InfiniBand (netdev %v, not type %d%s): node-guid, port-guid, guid and link apply to InfiniBand VFs; pass an Ethernet VF without them", t.PF, vf, types, host.ARPHRDInfiniBand, layer)
}
