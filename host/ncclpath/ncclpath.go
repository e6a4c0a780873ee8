// Package ncclpath classifies the PCI path between two devices from sysfs
// the way NCCL does, so tests (on the host, and in a guest checking what
// hpcvmm's emulated ports show) can assert what NCCL will decide: GPUDirect
// RDMA and GPU peer-to-peer are on by default only up to PXB.
//
// The model follows NCCL's src/graph/xml.cc (ncclTopoGetXmlFromSys) and
// paths.cc (ncclTopoSetPaths): starting from a device's sysfs realpath, go
// up two directories at a time; a directory that is not a PCI function
// ("pci0000:00") is the CPU (keyed by the NUMA node of the topmost
// function), otherwise the function two levels up is a PCI switch node
// (the switch's upstream port; the device's own port, and so root ports,
// are skipped). Two devices below the same switch node with no
// switch-to-switch link between are PIX, with one or more such links PXB,
// with only the CPU in common PHB, on different CPUs SYS. An InfiniBand
// NIC's path is first rewritten as NCCL's IB transport does
// (src/transport/net_ib: function to 0, and with NCCL_IB_MERGE_VFS=1, the
// default, the device number to 00 as well), then resolved again.
//
// It reads sysfs directly (like package host, whose leaf it is) because it
// must run inside a guest with nothing else of hpcvmm.
package ncclpath

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Type is an NCCL path type, in NCCL's order (closer first).
type Type int

// The path types a PCI-only topology can produce.
const (
	LOC Type = iota // the same device
	PIX             // through one PCIe switch
	PXB             // through several PCIe switches, not the host bridge
	PHB             // through the host bridge (CPU) only
	SYS             // across CPUs / NUMA nodes
)

func (t Type) String() string {
	switch t {
	case LOC:
		return "LOC"
	case PIX:
		return "PIX"
	case PXB:
		return "PXB"
	case PHB:
		return "PHB"
	case SYS:
		return "SYS"
	}
	return fmt.Sprintf("Type(%d)", int(t))
}

// Device names a PCI function and how NCCL finds it.
type Device struct {
	// BDF is the function's address, "0000:04:00.0".
	BDF string
	// NIC marks an InfiniBand/RoCE device, whose path NCCL's IB transport
	// rewrites (function to 0; device to 00 with MergeVFs).
	NIC bool
}

// Options are the NCCL settings that change classification.
type Options struct {
	// MergeVFs is NCCL_IB_MERGE_VFS (NCCL's default: true).
	MergeVFs bool
}

// DefaultOptions are NCCL's defaults.
func DefaultOptions() Options { return Options{MergeVFs: true} }

// Node is where a device hangs in NCCL's tree: its own (possibly
// rewritten) bus ID, the switch nodes above it (nearest first) and its
// CPU (the NUMA node as sysfs writes it, "-1" without NUMA information).
type Node struct {
	BusID    string
	Switches []string
	CPU      string
}

func isBDF(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		if i == 4 || i == 7 || i == 10 {
			continue
		}
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// rewrite applies NCCL's IB path rewrite to a bus ID.
func rewrite(busID string, opt Options) string {
	b := []byte(busID)
	b[len(b)-1] = '0'
	if opt.MergeVFs {
		b[len(b)-3], b[len(b)-4] = '0', '0'
	}
	return string(b)
}

// Locate builds d's node from the sysfs tree at sysRoot ("/sys").
func Locate(sysRoot string, d Device, opt Options) (Node, error) {
	if !isBDF(d.BDF) {
		return Node{}, fmt.Errorf("ncclpath: %q is not a PCI bus ID like 0000:04:00.0", d.BDF)
	}
	busID := strings.ToLower(d.BDF)
	if d.NIC {
		busID = rewrite(busID, opt)
	}
	n := Node{BusID: busID}
	path, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "bus/pci/devices", busID))
	if err != nil {
		// NCCL finds no sysfs path (a rewritten ID naming no function) and
		// attaches the device to an unknown CPU.
		if _, serr := os.Stat(filepath.Join(sysRoot, "bus/pci/devices", strings.ToLower(d.BDF))); serr != nil {
			return Node{}, fmt.Errorf("ncclpath: %s: %w", d.BDF, err)
		}
		n.CPU = "-1"
		return n, nil
	}
	for {
		numa := "-1"
		if b, err := os.ReadFile(filepath.Join(path, "numa_node")); err == nil {
			numa = strings.TrimSpace(string(b))
		}
		parent := filepath.Dir(path)
		if !isBDF(filepath.Base(parent)) {
			n.CPU = numa
			return n, nil
		}
		grand := filepath.Dir(parent)
		if !isBDF(filepath.Base(grand)) {
			n.CPU = numa
			return n, nil
		}
		n.Switches = append(n.Switches, strings.ToLower(filepath.Base(grand)))
		path = grand
	}
}

// Classify returns the NCCL path type between a and b in the sysfs tree
// at sysRoot.
func Classify(sysRoot string, a, b Device, opt Options) (Type, error) {
	na, err := Locate(sysRoot, a, opt)
	if err != nil {
		return 0, err
	}
	nb, err := Locate(sysRoot, b, opt)
	if err != nil {
		return 0, err
	}
	return Between(na, nb), nil
}

// Between classifies the path between two located nodes.
func Between(a, b Node) Type {
	if a.BusID == b.BusID {
		return LOC
	}
	for i, s := range a.Switches {
		for j, t := range b.Switches {
			if s == t {
				// i + j switch-to-switch links on the way (NCCL's PXB rule:
				// a PCI node linked to a PCI node).
				if i+j == 0 {
					return PIX
				}
				return PXB
			}
		}
	}
	if a.CPU == b.CPU {
		return PHB
	}
	return SYS
}
