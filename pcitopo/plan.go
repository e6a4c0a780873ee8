// Package pcitopo plans the guest's PCIe tree for passed-through devices:
// with --topology host it mirrors the host's locality as NCCL sees it
// (devices behind one host PCIe switch sit behind one emulated switch, the
// others each behind their own root port, every port reporting the link
// of the host port it stands for), with --topology flat it keeps every
// device on bus 0. The plan is pure data: it gives each device its guest
// bus/device number, numbers buses the way pci.Root.AssignBuses does (and
// the way firmware does, so Linux keeps them), prints as a tree for the
// log and `hpcvmm check`, and writes NCCL's XML topology (NCCL_TOPO_FILE).
// The VM builds pci.Bridge ports from it; preflight predicts BAR placement
// from it with addrspace.PlanHierarchy (Plan.Bridges).
package pcitopo

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/host"
)

// Mode is the --topology choice for PCI devices.
type Mode uint8

// Topology modes.
const (
	// Host mirrors the host's switches and ports.
	Host Mode = iota
	// Flat puts every device on bus 0 (hpcvmm's layout before ports).
	Flat
)

// ParseMode parses "host" or "flat".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "host":
		return Host, nil
	case "flat":
		return Flat, nil
	}
	return 0, fmt.Errorf("topology %q: want host or flat", s)
}

func (m Mode) String() string {
	if m == Flat {
		return "flat"
	}
	return "host"
}

// Device is one passed-through function and what the host says about its
// place in the PCI tree.
type Device struct {
	// Name labels the device in the printed tree ("gpu", "vf").
	Name string
	// BDF is the host function.
	BDF host.BDF
	// Path is its sysfs realpath (host.Host.PCIPath).
	Path host.PCIPath
	// Link is its own link (host.Host.PCILink).
	Link host.PCILink
	// Class, Vendor and DeviceID are its identity, for NCCL's topology file.
	Class            uint32
	Vendor, DeviceID uint16
}

// Kind is a node's role in the guest tree.
type Kind uint8

// Node kinds.
const (
	RootPort Kind = iota
	UpstreamPort
	DownstreamPort
	Endpoint
)

func (k Kind) String() string {
	return [...]string{"root port", "switch upstream port", "switch downstream port", "endpoint"}[k]
}

// DefaultLink is what a port reports when the host tells nothing about
// the link it mirrors (no link attributes on the host port or the device):
// 16 GT/s x16, a rate NCCL takes as a full PCIe Gen4 slot.
var DefaultLink = host.PCILink{MaxSpeed: 4, MaxWidth: 16, CurSpeed: 4, CurWidth: 16}

// Node is a guest function: a port (with the bus range below it) or a
// passed-through endpoint.
type Node struct {
	Kind Kind
	// Bus and Slot are the guest bus and device number (function 0).
	Bus, Slot uint8
	// Secondary and Subordinate are a port's bus range.
	Secondary, Subordinate uint8
	// Link is what a port reports in its link registers: the link of the
	// host function it mirrors (Mirrors), or of the device below when the
	// host has none (a device on the host's root bus), or DefaultLink.
	Link host.PCILink
	// Mirrors is the host bridge a port stands for; HasMirror is false
	// when there is none (a root port made for a root-bus device).
	Mirrors   host.BDF
	HasMirror bool
	// Device indexes Plan.Devices for an endpoint; -1 for ports.
	Device int
	// Children are the functions on a port's secondary bus, in slot order.
	Children []*Node
}

// GuestBDF returns the node's guest address (domain 0, function 0).
func (n *Node) GuestBDF() host.BDF { return host.BDF{Bus: n.Bus, Device: n.Slot} }

// Plan is the guest's PCI tree for the passthrough devices.
type Plan struct {
	Mode    Mode
	Devices []Device
	// Top are the nodes on bus 0, in slot order.
	Top []*Node
	// HostLinks are the links of the host bridges the plan read (by BDF),
	// kept for the NCCL file.
	hostLinks map[host.BDF]host.PCILink
}

// trie is the host's switch structure above the devices, as NCCL's nodes.
type trie struct {
	key      host.BDF // the switch upstream port, or the device
	device   int      // -1 for a switch
	above    host.BDF // the host function directly above key (its port)
	hasAbove bool
	minDev   int
	children []*trie
}

// New plans the tree for devs. slots are the bus-0 device numbers the plan
// may use, in order (hpcvmm's passthrough slots): one per device in flat
// mode, one per root port in host mode. hostLinks holds the links of the
// host bridges above the devices (PCILink of each function in their
// Path.Chain; missing entries fall back to the device's link).
func New(mode Mode, devs []Device, hostLinks map[host.BDF]host.PCILink, slots []int) (*Plan, error) {
	p := &Plan{Mode: mode, Devices: devs, hostLinks: hostLinks}
	seen := map[host.BDF]bool{}
	for i, d := range devs {
		if len(d.Path.Chain) == 0 || d.Path.Device() != d.BDF {
			return nil, fmt.Errorf("pcitopo: device %d (%s): PCI path %q does not end at the device", i, d.BDF, d.Path)
		}
		if seen[d.BDF] {
			return nil, fmt.Errorf("pcitopo: device %s given twice", d.BDF)
		}
		seen[d.BDF] = true
	}
	for i, s := range slots {
		if s < 1 || s > 31 {
			return nil, fmt.Errorf("pcitopo: bus-0 slot %d outside 1-31", s)
		}
		// Ascending, so the plan numbers buses in the slot order
		// pci.Root.AssignBuses walks.
		if i > 0 && s <= slots[i-1] {
			return nil, fmt.Errorf("pcitopo: bus-0 slots %v: want strictly ascending", slots)
		}
	}
	nextSlot := 0
	takeSlot := func(what string) (uint8, error) {
		if nextSlot >= len(slots) {
			return 0, fmt.Errorf("pcitopo: no bus-0 slot left for %s: %d slots for %d devices", what, len(slots), len(devs))
		}
		nextSlot++
		return uint8(slots[nextSlot-1]), nil
	}
	if mode == Flat {
		for i, d := range devs {
			s, err := takeSlot(d.BDF.String())
			if err != nil {
				return nil, err
			}
			p.Top = append(p.Top, &Node{Kind: Endpoint, Slot: s, Device: i})
		}
		return p, nil
	}

	// Group the devices by the host switches above them (NCCL's nodes).
	root := &trie{device: -1}
	for i, d := range devs {
		sw := d.Path.Switches()
		t := root
		for j := len(sw) - 1; j >= 0; j-- {
			var next *trie
			for _, c := range t.children {
				if c.device < 0 && c.key == sw[j] {
					next = c
				}
			}
			if next == nil {
				next = &trie{key: sw[j], device: -1, minDev: i}
				next.above, next.hasAbove = chainAbove(d.Path, sw[j])
				t.children = append(t.children, next)
			}
			t = next
		}
		leaf := &trie{key: d.BDF, device: i, minDev: i}
		leaf.above, leaf.hasAbove = d.Path.Port()
		t.children = append(t.children, leaf)
	}
	// Root ports in the order the devices were given (the first --gpu gets
	// the first slot); ports below a switch in host BDF order, as on the host.
	slices.SortStableFunc(root.children, func(a, b *trie) int { return cmp.Compare(a.minDev, b.minDev) })
	nextBus := 1
	for _, t := range root.children {
		s, err := takeSlot(t.key.String())
		if err != nil {
			return nil, err
		}
		rp := &Node{Kind: RootPort, Slot: s, Device: -1}
		p.mirror(rp, t)
		if err := p.below(rp, t, &nextBus); err != nil {
			return nil, err
		}
		p.Top = append(p.Top, rp)
	}
	return p, nil
}

// chainAbove returns the function directly above b in path.
func chainAbove(path host.PCIPath, b host.BDF) (host.BDF, bool) {
	for i, c := range path.Chain {
		if c == b && i > 0 {
			return path.Chain[i-1], true
		}
	}
	return host.BDF{}, false
}

// mirror sets a port's link to that of the host function above t (the
// host port t's link starts at), falling back to the first device's link.
func (p *Plan) mirror(port *Node, t *trie) {
	port.Link = DefaultLink
	if t.hasAbove {
		port.Mirrors, port.HasMirror = t.above, true
		if l, ok := p.hostLinks[t.above]; ok && l.Known() {
			port.Link = withCurrent(l)
			return
		}
	}
	if l := p.Devices[t.minDev].Link; l.Known() {
		port.Link = withCurrent(l)
	}
}

// withCurrent fills an unknown current link with the maximum.
func withCurrent(l host.PCILink) host.PCILink {
	if l.CurSpeed == 0 || l.CurWidth == 0 {
		l.CurSpeed, l.CurWidth = l.MaxSpeed, l.MaxWidth
	}
	return l
}

// below fills port (a root or downstream port) with what t is: the device,
// or an upstream port with a downstream port per child. Buses are numbered
// depth-first as pci.Root.AssignBuses numbers them.
func (p *Plan) below(port *Node, t *trie, nextBus *int) error {
	if *nextBus > 0xff {
		return fmt.Errorf("pcitopo: more than 255 buses")
	}
	port.Secondary = uint8(*nextBus)
	*nextBus++
	defer func() { port.Subordinate = uint8(*nextBus - 1) }()
	if t.device >= 0 {
		port.Children = []*Node{{Kind: Endpoint, Bus: port.Secondary, Device: t.device}}
		return nil
	}
	usp := &Node{Kind: UpstreamPort, Bus: port.Secondary, Device: -1, Mirrors: t.key, HasMirror: true, Link: DefaultLink}
	if l, ok := p.hostLinks[t.key]; ok && l.Known() {
		usp.Link = withCurrent(l)
	} else if l := p.Devices[t.minDev].Link; l.Known() {
		usp.Link = withCurrent(l)
	}
	port.Children = []*Node{usp}
	if len(t.children) > 32 {
		return fmt.Errorf("pcitopo: host switch %s has %d devices below it: a guest switch has at most 32 downstream ports", t.key, len(t.children))
	}
	slices.SortStableFunc(t.children, func(a, b *trie) int {
		if a.key.Less(b.key) {
			return -1
		}
		if b.key.Less(a.key) {
			return 1
		}
		return cmp.Compare(a.device, b.device)
	})
	usp.Secondary = uint8(*nextBus)
	*nextBus++
	for i, c := range t.children {
		dsp := &Node{Kind: DownstreamPort, Bus: usp.Secondary, Slot: uint8(i), Device: -1}
		p.mirror(dsp, c)
		if err := p.below(dsp, c, nextBus); err != nil {
			return err
		}
		usp.Children = append(usp.Children, dsp)
	}
	usp.Subordinate = uint8(*nextBus - 1)
	return nil
}

// Walk calls fn for every node, parents before children, with the node's
// parent (nil on bus 0), in the order pci.Root.AssignBuses visits them.
func (p *Plan) Walk(fn func(n, parent *Node)) {
	var walk func(ns []*Node, parent *Node)
	walk = func(ns []*Node, parent *Node) {
		for _, n := range ns {
			fn(n, parent)
			walk(n.Children, n)
		}
	}
	walk(p.Top, nil)
}

// Endpoint returns the node of device i.
func (p *Plan) Endpoint(i int) *Node {
	var out *Node
	p.Walk(func(n, _ *Node) {
		if n.Kind == Endpoint && n.Device == i {
			out = n
		}
	})
	return out
}

// String prints the tree for the log and `hpcvmm check`, in the manner of
// `lspci -tv`: guest addresses, bus ranges, port links and what each node
// stands for on the host.
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "[0000:00] host bridge (--topology %s)\n", p.Mode)
	var walk func(ns []*Node, indent string)
	walk = func(ns []*Node, indent string) {
		for i, n := range ns {
			last := i == len(ns)-1
			branch, next := "+-", "| "
			if last {
				branch, next = "\\-", "  "
			}
			fmt.Fprintf(&b, "%s%s%02x:%02x.0 %s\n", indent, branch, n.Bus, n.Slot, p.describe(n))
			walk(n.Children, indent+next)
		}
	}
	walk(p.Top, " ")
	return b.String()
}

func (p *Plan) describe(n *Node) string {
	if n.Kind == Endpoint {
		d := p.Devices[n.Device]
		name := d.Name
		if name == "" {
			name = "device"
		}
		return fmt.Sprintf("%s host %s [%04x:%04x] class %06x%s", name, d.BDF, d.Vendor, d.DeviceID, d.Class, linkText(d.Link))
	}
	bus := fmt.Sprintf("[%02x]", n.Secondary)
	if n.Subordinate != n.Secondary {
		bus = fmt.Sprintf("[%02x-%02x]", n.Secondary, n.Subordinate)
	}
	host := ""
	if n.HasMirror {
		host = " mirrors host " + n.Mirrors.String()
	}
	return fmt.Sprintf("%s %s%s%s", n.Kind, bus, linkText(n.Link), host)
}

func linkText(l host.PCILink) string {
	if !l.Known() {
		return ""
	}
	return fmt.Sprintf(" %s x%d", l.MaxSpeed, l.MaxWidth)
}

// Placement describes the plan to addrspace.PlanHierarchy, so preflight
// predicts the BAR layout the VM's pci.Root.AssignBARs will produce: the
// ports as addrspace bridges in the order the Root lists them (depth-first
// in slot order), the bridge each device sits behind (indexed like
// Devices; nil on bus 0) and the device indexes in that same walk order,
// the order in which the Root lists their BARs.
func (p *Plan) Placement() (bridges []*addrspace.Bridge, behind []*addrspace.Bridge, order []int) {
	behind = make([]*addrspace.Bridge, len(p.Devices))
	of := map[*Node]*addrspace.Bridge{}
	p.Walk(func(n, parent *Node) {
		if n.Kind == Endpoint {
			behind[n.Device] = of[parent]
			order = append(order, n.Device)
			return
		}
		b := &addrspace.Bridge{Name: fmt.Sprintf("%02x:%02x.0 %s", n.Bus, n.Slot, n.Kind), Parent: of[parent]}
		of[n] = b
		bridges = append(bridges, b)
	})
	return bridges, behind, order
}
