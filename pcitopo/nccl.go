package pcitopo

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"strings"

	"github.com/hpcvmm/hpcvmm/host"
)

// CPU describes the guest's CPU node for NCCL's topology file: the
// attributes NCCL's ncclTopoAddCpu reads (src/graph/topo.cc).
type CPU struct {
	// NUMAID is the guest NUMA node the devices hang from (hpcvmm guests
	// have one, node 0).
	NUMAID int
	// Affinity is the node's CPU mask in sysfs cpumap form (AffinityMask).
	Affinity string
	// Arch is "x86_64".
	Arch string
	// Vendor is the CPUID vendor string ("GenuineIntel", "AuthenticAMD").
	Vendor string
	// FamilyID and ModelID are the CPUID family and model (NCCL picks its
	// Intel bandwidth model from them).
	FamilyID, ModelID int
}

// AffinityMask formats CPUs 0..n-1 as a sysfs cpumap ("ffffffff,0000000f"
// style: 32-bit hex words, most significant first), the form NCCL parses.
func AffinityMask(n int) string {
	if n <= 0 {
		return "00000000"
	}
	words := make([]string, (n+31)/32)
	for i := range words {
		bits := min(32, n-32*i)
		w := uint32(1<<bits - 1)
		if bits == 32 {
			w = 0xffffffff
		}
		words[len(words)-1-i] = fmt.Sprintf("%08x", w)
	}
	return strings.Join(words, ",")
}

// minLink is NCCL's rate for a PCI node: the lower of the function's own
// maximum and its parent port's (ncclTopoGetXmlFromSys reads max_link_* of
// the function and of ".."). Unknown values lose to known ones.
func minLink(own, port host.PCILink) host.PCILink {
	out := own
	if port.MaxSpeed != 0 && (out.MaxSpeed == 0 || port.MaxSpeed < out.MaxSpeed) {
		out.MaxSpeed = port.MaxSpeed
	}
	if port.MaxWidth != 0 && (out.MaxWidth == 0 || port.MaxWidth < out.MaxWidth) {
		out.MaxWidth = port.MaxWidth
	}
	return out
}

// WriteNCCLTopology writes the guest tree as an NCCL topology file
// (NCCL_TOPO_FILE), for guests whose sysfs NCCL cannot read: one <cpu>,
// under it a <pci> per switch upstream port (NCCL's switch node, keyed by
// its bus ID; root and downstream ports are not nodes, as in NCCL's sysfs
// walk) holding a <pci> per device, and devices on root ports or bus 0
// directly under the <cpu>. Bus IDs are the guest's; link_speed and
// link_width are what NCCL would compute from the guest's sysfs.
func (p *Plan) WriteNCCLTopology(w io.Writer, cpu CPU) error {
	var b bytes.Buffer
	attr := func(name, v string) {
		b.WriteString(" " + name + `="`)
		_ = xml.EscapeText(&b, []byte(v))
		b.WriteString(`"`)
	}
	b.WriteString("<system version=\"1\">\n  <cpu")
	attr("numaid", fmt.Sprint(cpu.NUMAID))
	if cpu.Affinity != "" {
		attr("affinity", cpu.Affinity)
	}
	attr("arch", cpu.Arch)
	attr("vendor", cpu.Vendor)
	attr("familyid", fmt.Sprint(cpu.FamilyID))
	attr("modelid", fmt.Sprint(cpu.ModelID))
	b.WriteString(">\n")
	pciNode := func(depth int, n *Node, class uint32, vendor, device uint16, link host.PCILink, open bool) {
		b.WriteString(strings.Repeat("  ", depth) + "<pci")
		attr("busid", strings.ToLower(n.GuestBDF().String()))
		attr("class", fmt.Sprintf("0x%06x", class))
		attr("vendor", fmt.Sprintf("0x%04x", vendor))
		attr("device", fmt.Sprintf("0x%04x", device))
		if link.MaxSpeed != 0 {
			attr("link_speed", link.MaxSpeed.String())
		} else {
			attr("link_speed", "")
		}
		attr("link_width", fmt.Sprint(link.MaxWidth))
		if open {
			b.WriteString(">\n")
		} else {
			b.WriteString("/>\n")
		}
	}
	// emit writes what hangs below port (nil: bus 0) at the given depth.
	var emit func(n *Node, port *Node, depth int)
	emit = func(n *Node, port *Node, depth int) {
		var portLink host.PCILink
		if port != nil {
			portLink = port.Link
		}
		switch n.Kind {
		case Endpoint:
			d := p.Devices[n.Device]
			pciNode(depth, n, d.Class, d.Vendor, d.DeviceID, minLink(d.Link, portLink), false)
		case UpstreamPort:
			vendor, device := uint16(0x104c), uint16(0x8232)
			pciNode(depth, n, 0x060400, vendor, device, minLink(n.Link, portLink), true)
			for _, dsp := range n.Children {
				for _, c := range dsp.Children {
					emit(c, dsp, depth+1)
				}
			}
			b.WriteString(strings.Repeat("  ", depth) + "</pci>\n")
		default: // a root or downstream port is not an NCCL node
			for _, c := range n.Children {
				emit(c, n, depth)
			}
		}
	}
	for _, n := range p.Top {
		emit(n, nil, 2)
	}
	b.WriteString("  </cpu>\n</system>\n")
	_, err := w.Write(b.Bytes())
	return err
}
