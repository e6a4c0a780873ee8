package vmm

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pcitopo"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// ptTopology is where the passed-through devices sit in the guest's PCI
// tree: the plan, and once the ports exist, each device's parent port
// (nil on bus 0) and the bus-0 slot its INTx routes through (its root
// port's, or its own: Linux swizzles INTx up to bus 0, where _PRT and the
// MP table describe it).
type ptTopology struct {
	plan     *pcitopo.Plan
	parents  []*pci.Bridge
	rootSlot []int
}

// PassthroughSlots are the bus-0 slots the passthrough devices (flat) or
// their root ports (host topology) take.
func PassthroughSlots() []int {
	var s []int
	for i := firstPassthroughSlot; i < pci.NumSlots; i++ {
		s = append(s, i)
	}
	return s
}

// planPCITopology plans the guest tree of the checked passthrough devices
// (vm.pt.devs): --topology host mirrors the host's PCIe switches and port
// links, flat (and --acpi=off, whose guests get the flat layout
// throughout) keeps every device on bus 0. A host whose sysfs does not
// show where a device sits gets the flat layout, with a warning.
func (vm *VM) planPCITopology(h *host.Host) error {
	pt := vm.dev.pt
	bdfs := make([]host.BDF, len(pt.devs))
	names := make([]string, len(pt.devs))
	for i, d := range pt.devs {
		bdfs[i] = d.BDF
		names[i] = "gpu"
		if pt.specs[i].VF {
			names[i] = "vf"
		}
	}
	mode := pcitopo.Host
	if vm.cfg.Topology == TopologyFlat || vm.cfg.NoACPI {
		mode = pcitopo.Flat
	}
	var plan *pcitopo.Plan
	devs, links, err := pcitopo.FromHost(h, names, bdfs)
	if err == nil {
		plan, err = pcitopo.New(mode, devs, links, PassthroughSlots())
	} else {
		vm.log.Warn("host PCI topology unreadable: passthrough devices go flat on bus 0", "err", err)
		mode = pcitopo.Flat
		plan, err = flatPlan(pt.devs, names)
	}
	if err != nil {
		return fieldErr("Passthrough", "%v", err)
	}
	pt.topo = ptTopology{plan: plan, rootSlot: rootSlots(plan)}
	vm.log.Info("guest PCI topology of the passthrough devices", "topology", mode.String(), "tree", plan.String())
	return nil
}

// flatPlan puts devs on bus 0 in order, knowing nothing of the host tree.
func flatPlan(devs []*host.Device, names []string) (*pcitopo.Plan, error) {
	pd := make([]pcitopo.Device, len(devs))
	for i, d := range devs {
		pd[i] = pcitopo.Device{Name: names[i], BDF: d.BDF, Path: host.PCIPath{RootComplex: "?", Chain: []host.BDF{d.BDF}},
			Class: d.Class, Vendor: d.Vendor, DeviceID: d.DeviceID}
	}
	return pcitopo.New(pcitopo.Flat, pd, nil, PassthroughSlots())
}

// rootSlots returns, for each device of plan, the bus-0 slot above it.
func rootSlots(plan *pcitopo.Plan) []int {
	out := make([]int, len(plan.Devices))
	for _, top := range plan.Top {
		var mark func(n *pcitopo.Node)
		mark = func(n *pcitopo.Node) {
			if n.Kind == pcitopo.Endpoint {
				out[n.Device] = int(top.Slot)
			}
			for _, c := range n.Children {
				mark(c)
			}
		}
		mark(top)
	}
	return out
}

// portLink converts a plan link to the port's, falling back to the default
// for a host value no PCIe port can report.
func portLink(l host.PCILink) (max, cur pci.Link) {
	max = pci.Link{Speed: pci.LinkSpeed(l.MaxSpeed), Width: uint8(l.MaxWidth)}
	cur = pci.Link{Speed: pci.LinkSpeed(l.CurSpeed), Width: uint8(l.CurWidth)}
	if max.Validate() != nil {
		d := pcitopo.DefaultLink
		max = pci.Link{Speed: pci.LinkSpeed(d.MaxSpeed), Width: uint8(d.MaxWidth)}
	}
	if cur.Validate() != nil || cur.Speed > max.Speed || cur.Width > max.Width {
		cur = max
	}
	return max, cur
}

// buildPorts adds the plan's ports to root and returns each device's
// parent port (nil for a device on bus 0).
func buildPorts(root *pci.Root, plan *pcitopo.Plan) ([]*pci.Bridge, error) {
	parents := make([]*pci.Bridge, len(plan.Devices))
	ports := map[*pcitopo.Node]*pci.Bridge{}
	types := map[pcitopo.Kind]pci.PortType{pcitopo.RootPort: pci.RootPort, pcitopo.UpstreamPort: pci.UpstreamPort, pcitopo.DownstreamPort: pci.DownstreamPort}
	physSlot := uint16(0)
	var err error
	plan.Walk(func(n, parent *pcitopo.Node) {
		if err != nil {
			return
		}
		if n.Kind == pcitopo.Endpoint {
			parents[n.Device] = ports[parent]
			return
		}
		max, cur := portLink(n.Link)
		cfg := pci.BridgeConfig{Type: types[n.Kind], Link: max, Current: cur, PortNumber: n.Slot}
		if n.Kind != pcitopo.UpstreamPort {
			physSlot++
			cfg.PhysicalSlot = physSlot
		}
		var b *pci.Bridge
		if b, err = pci.NewBridge(cfg); err != nil {
			return
		}
		name := n.Kind.String()
		if n.HasMirror {
			name += " for host " + n.Mirrors.String()
		}
		if parent == nil {
			err = root.AddDevice(int(n.Slot), name, b)
		} else {
			err = root.AddDeviceBelow(ports[parent], int(n.Slot), name, b)
		}
		ports[n] = b
	})
	return parents, err
}

// addPorts builds the planned ports on the VM's root complex.
func (vm *VM) addPorts() error {
	parents, err := buildPorts(vm.dev.pci, vm.dev.pt.topo.plan)
	if err != nil {
		return fmt.Errorf("PCIe ports: %w", err)
	}
	vm.dev.pt.topo.parents = parents
	return nil
}

// attachPassthrough puts passthrough device i where the plan says: below
// its port at device 0, or on bus 0 at its slot.
func (vm *VM) attachPassthrough(i int, name string, dev pci.Device) error {
	t := &vm.dev.pt.topo
	if p := t.parents[i]; p != nil {
		return vm.dev.pci.AddDeviceBelow(p, 0, name, dev)
	}
	return vm.dev.pci.AddDevice(t.rootSlot[i], name, dev)
}

// writeNCCLTopology writes --nccl-topo: the guest's tree in NCCL's XML
// format, one CPU node (the guest's single NUMA node) with the vCPUs'
// affinity and the host CPU's identity from CPUID leaves 0 and 1, which
// NCCL needs for Intel CPUs.
func (vm *VM) writeNCCLTopology(supported []uapi.CPUIDEntry) error {
	if vm.cfg.NCCLTopoFile == "" {
		return nil
	}
	cpu := pcitopo.CPU{NUMAID: 0, Affinity: pcitopo.AffinityMask(vm.cfg.CPUs), Arch: "x86_64"}
	for _, e := range supported {
		switch {
		case e.Function == 0 && e.Index == 0:
			var v [12]byte
			for i, r := range []uint32{e.EBX, e.EDX, e.ECX} {
				v[4*i], v[4*i+1], v[4*i+2], v[4*i+3] = byte(r), byte(r>>8), byte(r>>16), byte(r>>24)
			}
			cpu.Vendor = string(v[:])
		case e.Function == 1 && e.Index == 0:
			family := int(e.EAX>>8) & 0xf
			model := int(e.EAX>>4) & 0xf
			if family == 0xf {
				family += int(e.EAX>>20) & 0xff
			}
			if family == 6 || family >= 0xf {
				model |= int(e.EAX>>16) & 0xf << 4
			}
			cpu.FamilyID, cpu.ModelID = family, model
		}
	}
	plan := &pcitopo.Plan{Mode: pcitopo.Flat}
	if vm.dev.pt != nil {
		plan = vm.dev.pt.topo.plan
	}
	var b bytes.Buffer
	if err := plan.WriteNCCLTopology(&b, cpu); err != nil {
		return err
	}
	// Created, and renamed into place, with the rights of the user
	// hpcvmm acts for: the file and its directory are that user's.
	if err := asuser.Do(vm.cfg.ActingFor, func() error { return writeReplacing(vm.cfg.NCCLTopoFile, b.Bytes(), 0o644) }); err != nil {
		return fmt.Errorf("NCCL topology file %s: %w", vm.cfg.NCCLTopoFile, err)
	}
	vm.log.Info("NCCL topology written", "file", vm.cfg.NCCLTopoFile)
	return nil
}

// writeReplacing writes data to a new file beside path (created with
// O_EXCL, so never through a symlink or over an existing file) and renames
// it over path. os.WriteFile follows a symlink planted at the path: hpcvmm
// runs as root and the path is the user's, so it wrote whatever file the
// link named (issue 23). rename(2) replaces a symlink at path itself, and
// in a sticky directory (/tmp) refuses to replace another user's entry.
func writeReplacing(path string, data []byte, perm os.FileMode) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
