package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// ARPHRDInfiniBand is the netdev type (/sys/class/net/<if>/type) of an
// IPoIB interface; Ethernet is 1.
const ARPHRDInfiniBand = 32

// NetInterfaces lists the network interfaces of PCI function b (the
// entries of its net/ directory), sorted; none when it has no netdev (a
// driver without one, or an InfiniBand PF without ib_ipoib loaded).
func (h *Host) NetInterfaces(b BDF) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(h.devDir(b), "net"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host: list network interfaces of %s: %w", b, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	sort.Strings(out)
	return out, nil
}

// NetInterfaceType returns the ARPHRD type of interface name of PCI
// function b (net/<name>/type): 32 for InfiniBand, 1 for Ethernet.
func (h *Host) NetInterfaceType(b BDF, name string) (int, error) {
	v, err := readUint(filepath.Join(h.devDir(b), "net", name, "type"), 16)
	if err != nil {
		return 0, fmt.Errorf("host: %s interface %s: read type: %w", b, name, err)
	}
	return int(v), nil
}

// RDMALinkLayer returns the RDMA device of PCI function b (its
// infiniband/ directory, e.g. mlx5_0) and port 1's link layer
// ("InfiniBand" or "Ethernet" for RoCE). ok is false when b has no RDMA
// device (no RDMA driver such as mlx5_ib loaded).
func (h *Host) RDMALinkLayer(b BDF) (dev, layer string, ok bool, err error) {
	ents, err := os.ReadDir(filepath.Join(h.devDir(b), "infiniband"))
	if errors.Is(err, fs.ErrNotExist) || (err == nil && len(ents) == 0) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, fmt.Errorf("host: list RDMA devices of %s: %w", b, err)
	}
	dev = ents[0].Name()
	layer, err = readString(filepath.Join(h.devDir(b), "infiniband", dev, "ports", "1", "link_layer"))
	if err != nil {
		return dev, "", false, fmt.Errorf("host: %s RDMA device %s: read port 1 link_layer: %w", b, dev, err)
	}
	return dev, layer, true, nil
}

// VFIndex returns n of the PF's virtfnN link that points at vf: the VF
// number the PF's driver and netlink's IFLA_VF_* attributes use.
func (h *Host) VFIndex(pf, vf BDF) (int, error) {
	dir := h.devDir(pf)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, fmt.Errorf("host: PF %s: %w", pf, err)
	}
	for _, e := range ents {
		name := e.Name()
		if len(name) <= len("virtfn") || name[:len("virtfn")] != "virtfn" {
			continue
		}
		n, err := strconv.Atoi(name[len("virtfn"):])
		if err != nil {
			continue
		}
		t, ok, err := readLink(dir, name)
		if err != nil || !ok {
			continue
		}
		if filepath.Base(t) == vf.String() {
			return n, nil
		}
	}
	return 0, fmt.Errorf("host: %s is not among the virtual functions of %s (no virtfnN link to it)", vf, pf)
}
