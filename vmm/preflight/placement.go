package preflight

// Placement: the NUMA node, its CPUs, memory and hugepages, and the devices'
// nodes relative to it.

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
)

// ChooseNode picks the NUMA node for the VM: the requested node if
// req.NUMANode >= 0 (an error if it is not online); else the node of the
// first device (GPUs, then VFs) that reports one; else the node with the
// most free hugepages of the requested size (most free memory for 4K
// pages), lowest ID on a tie. It returns the node and why it was chosen.
func ChooseNode(h *host.Host, req Request) (int, string, error) {
	nodes, err := h.Nodes()
	if err != nil {
		return -1, "", fmt.Errorf("preflight: choose NUMA node: %w", err)
	}
	if len(nodes) == 0 {
		return -1, "", errors.New("preflight: choose NUMA node: the host reports no online NUMA nodes")
	}
	online := map[int]bool{}
	ids := make([]int, len(nodes))
	for i, n := range nodes {
		online[n.ID] = true
		ids[i] = n.ID
	}
	if req.NUMANode >= 0 {
		if !online[req.NUMANode] {
			return -1, "", fmt.Errorf("--numa-node %d: node is not online; pick one of %s", req.NUMANode, host.FormatCPUList(ids))
		}
		return req.NUMANode, "requested with --numa-node", nil
	}
	for _, s := range append(append([]string(nil), req.GPUs...), req.VFs...) {
		b, err := host.ParseBDF(s)
		if err != nil {
			continue
		}
		d, err := h.Device(b)
		if err != nil || d.NUMANode < 0 || !online[d.NUMANode] {
			continue
		}
		return d.NUMANode, "node of " + b.String(), nil
	}
	if len(nodes) == 1 {
		return nodes[0].ID, "the only node", nil
	}
	ps := req.pageSize()
	best, bestFree := nodes[0].ID, uint64(0)
	for i, n := range nodes {
		var free uint64
		if ps == Page4K {
			free = n.MemFree
		} else if p, ok := n.Pool(ps); ok {
			free = p.Free
		}
		if i == 0 || free > bestFree {
			best, bestFree = n.ID, free
		}
	}
	if ps == Page4K {
		return best, fmt.Sprintf("most free memory (%s)", guestmem.FormatSize(bestFree)), nil
	}
	return best, fmt.Sprintf("most free %s hugepages (%d)", guestmem.FormatSize(ps), bestFree), nil
}

func (c *checker) node() {
	id, why, err := ChooseNode(c.h, c.req)
	if err != nil {
		c.add("numa-node", "vm", Fail, "", "%v", err)
		return
	}
	n, err := c.h.Node(id)
	if err != nil {
		c.add("numa-node", "vm", Fail, "", "%v", err)
		return
	}
	c.chosen, c.rep.Node, c.rep.NodeReason = &n, id, why
	subj := fmt.Sprintf("node %d", id)
	c.add("numa-node", subj, Pass, "", "chosen: %s; CPUs %s", why, host.FormatCPUList(n.CPUs))

	if c.req.CPUs > 0 {
		if len(n.CPUs) >= c.req.CPUs {
			c.add("cpus", subj, Pass, "", "%s for %s", count(len(n.CPUs), "CPU"), count(c.req.CPUs, "vCPU"))
		} else {
			fix := fmt.Sprintf("use --cpus %d", len(n.CPUs))
			if alt := c.nodeWithCPUs(c.req.CPUs); alt >= 0 {
				fix += fmt.Sprintf(" or --numa-node %d", alt)
			}
			c.add("cpus", subj, Warn, fix, "%s for %s: vCPUs will share host CPUs", count(len(n.CPUs), "CPU"), count(c.req.CPUs, "vCPU"))
		}
	}
	if c.req.Memory > 0 {
		c.memory(n)
	}
}

func (c *checker) nodeWithCPUs(want int) int {
	nodes, err := c.h.Nodes()
	if err != nil {
		return -1
	}
	for _, n := range nodes {
		if len(n.CPUs) >= want {
			return n.ID
		}
	}
	return -1
}

func (c *checker) memory(n host.Node) {
	subj := fmt.Sprintf("node %d", n.ID)
	ps := c.req.pageSize()
	if ps == Page4K {
		switch {
		case n.MemFree == 0:
			c.add("memory", subj, Pass, "", "free memory unknown; no hugepages requested")
		case n.MemFree >= c.req.Memory:
			c.add("memory", subj, Pass, "", "%s free for %s (4K pages)", guestmem.FormatSizeApprox(n.MemFree), guestmem.FormatSizeApprox(c.req.Memory))
		default:
			c.add("memory", subj, Warn, "use hugepages (--hugepages 1G) reserved on this node, or free memory",
				"%s free of the node's %s for %s of guest RAM: the kernel must reclaim memory (page cache) or the guest will not get it all",
				guestmem.FormatSizeApprox(n.MemFree), guestmem.FormatSizeApprox(n.MemTotal), guestmem.FormatSizeApprox(c.req.Memory))
		}
		return
	}
	need := (c.req.Memory + ps - 1) / ps
	p, ok := n.Pool(ps)
	path := host.NrHugepagesPath(n.ID, ps, n.PerNode)
	if !ok {
		fix := fmt.Sprintf("add hugepagesz=%s hugepages=%d to the kernel command line and reboot, or use --hugepages 2M", guestmem.FormatSize(ps), need)
		if ps == Page2M {
			fix = fmt.Sprintf("add hugepagesz=2M hugepages=%d to the kernel command line and reboot, or use --hugepages none", need)
		}
		c.add("hugepages", subj, Fail, fix, "the kernel has no %s hugepage pool", guestmem.FormatSize(ps))
		return
	}
	// The words follow sysfs: the pool is nr_hugepages pages, of which
	// free_hugepages are not in use, of which resv_hugepages are promised
	// to mappings already.
	pool := fmt.Sprintf("%d of the pool's %d %s hugepages free", p.Free, p.Total, guestmem.FormatSize(ps))
	if p.Resv > 0 {
		pool += fmt.Sprintf(" (%d of them promised to other mappings)", p.Resv)
	}
	if avail := p.Available(); avail >= need {
		c.add("hugepages", subj, Pass, "", "%s; the VM needs %d (%s)", pool, need, guestmem.FormatSizeApprox(need*ps))
		return
	}
	c.add("hugepages", subj, Fail, fmt.Sprintf("echo %d > %s", p.Total+(need-p.Available()), path),
		"%s; the VM needs %d (%s)", pool, need, guestmem.FormatSizeApprox(need*ps))
}

func (c *checker) placement() {
	if c.chosen == nil {
		return
	}
	for _, rd := range c.devs {
		subj := rd.d.BDF.String()
		switch dn := rd.d.NUMANode; {
		case dn < 0:
			c.add("placement", subj, Pass, "", "no NUMA information: cannot be misplaced relative to node %d", c.chosen.ID)
		case dn == c.chosen.ID:
			c.add("placement", subj, Pass, "", "on the VM's node %d", dn)
		default:
			c.add("placement", subj, Warn, fmt.Sprintf("use --numa-node %d", dn),
				"on node %d, VM on node %d: DMA and interrupts cross the socket interconnect", dn, c.chosen.ID)
		}
	}
}
