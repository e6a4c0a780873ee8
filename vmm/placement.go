package vmm

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/cpuclaim"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// Automatic NUMA balancing: mainline Linux has no per-process switch (a
// PR_SET_NUMA_BALANCING prctl was proposed but not merged), so hpcvmm does
// not try one. It does not need it: balancing skips hugetlb mappings, guest
// RAM is bound to one node with MPOL_BIND (nothing to migrate to), and
// vCPU threads are pinned. Only --hugepages none leaves guest RAM exposed
// to balancing's hinting faults; New warns about that.

// placement is where on the host the VM lives: one NUMA node for its RAM,
// and one host CPU per vCPU.
type placement struct {
	node     int   // node guest RAM is bound to
	vcpuCPUs []int // host CPU of vCPU i
	nodeCPUs []int // CPUs of the node, for the prefault workers
	why      string
	// claim holds the vCPUs' host CPUs against other hpcvmm VMs
	// (cpuclaim) in claimDir; nil when the VM claims none. sharedWhy says
	// why a VM without a CPU list could not have CPUs of its own, and
	// claimNote why no claims were tried and claimErr why taking them
	// failed (logged by New).
	claim     *cpuclaim.Claim
	claimDir  string
	sharedWhy string
	claimNote string
	claimErr  error
}

// choosePlacement applies the NUMA rules: an explicit --numa-node wins;
// otherwise a --cpu-list decides; otherwise the node of the first
// passthrough device (deviceNode, -1 when none or unknown), else the node
// with the most free hugepages. A CPU
// list spanning nodes is refused unless AllowCrossNUMA, because a vCPU on
// a remote node pays the interconnect on every guest memory access.
func choosePlacement(cfg *Config, h *host.Host, deviceNode int) (placement, error) {
	nodes, err := h.Nodes()
	if err != nil {
		return placement{}, fmt.Errorf("read host NUMA topology: %w", err)
	}
	nodeOf := map[int]int{}
	for _, n := range nodes {
		for _, c := range n.CPUs {
			nodeOf[c] = n.ID
		}
	}
	var p placement
	if len(cfg.CPUList) > 0 {
		spanned := map[int]bool{}
		for _, c := range cfg.CPUList {
			n, ok := nodeOf[c]
			if !ok {
				return p, fieldErr("CPUList", "host CPU %d is not online (online CPUs: %s)", c, host.FormatCPUList(sortedKeys(cpuSet(nodeOf))))
			}
			spanned[n] = true
		}
		if len(spanned) > 1 && !cfg.AllowCrossNUMA {
			return p, fieldErr("CPUList", "CPUs %s span NUMA nodes %v: pick CPUs of one node, or allow cross-NUMA placement to accept remote memory accesses", host.FormatCPUList(cfg.CPUList), sortedKeys(spanned))
		}
	}
	switch {
	case cfg.NUMANode != NUMANodeAuto:
		p.node = cfg.NUMANode
		p.why = "requested"
	case len(cfg.CPUList) > 0:
		p.node = nodeOf[cfg.CPUList[0]]
		p.why = "node of the first CPU in the CPU list"
	case deviceNode >= 0:
		p.node = deviceNode
		p.why = "node of the first passthrough device"
	default:
		n, why, err := preflight.ChooseNode(h, preflight.Request{
			Memory: cfg.Memory, PageSize: uint64(cfg.pageSize()), CPUs: cfg.CPUs, NUMANode: -1,
		})
		if err != nil {
			return p, fieldErr("NUMANode", "%v", err)
		}
		p.node, p.why = n, why
	}
	node, err := h.Node(p.node)
	if err != nil {
		ids := make([]int, 0, len(nodes))
		for _, n := range nodes {
			ids = append(ids, n.ID)
		}
		return p, fieldErr("NUMANode", "node %d does not exist on this host (nodes: %v)", p.node, ids)
	}
	p.nodeCPUs = node.CPUs
	cpus := cfg.CPUList
	if len(cpus) == 0 {
		cpus = node.CPUs
		claim, claimed, sharedWhy, skipped, err := claimCPUs(cfg, p.node, node.CPUs)
		switch {
		case err != nil:
			p.claimErr = err
		case skipped != "":
			p.claimNote = "CPUs not claimed: " + skipped
		case claim != nil:
			p.claim, p.claimDir, cpus = claim, cfg.runDir(), claimed
		default:
			p.sharedWhy = sharedWhy
		}
	}
	if len(cpus) == 0 {
		return p, fieldErr("NUMANode", "node %d has no online CPUs to run vCPUs on: pick another node or give a CPU list", p.node)
	}
	p.vcpuCPUs = make([]int, cfg.CPUs)
	for i := range p.vcpuCPUs {
		p.vcpuCPUs[i] = cpus[i%len(cpus)]
	}
	return p, nil
}

func sortedKeys(m map[int]bool) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func cpuSet(nodeOf map[int]int) map[int]bool {
	out := make(map[int]bool, len(nodeOf))
	for c := range nodeOf {
		out[c] = true
	}
	return out
}

// affinity returns the CPUs this process may run on (its cpuset under
// Slurm or systemd); a variable so tests can narrow it.
var affinity = func() (unix.CPUSet, error) {
	var set unix.CPUSet
	err := unix.SchedGetaffinity(0, &set)
	return set, err
}

// prefaultPlan picks the prefault workers' CPUs and count: the CPUs of the
// guest's node this process may run on (a job's cpuset may hold only some
// of them, and pinning to a CPU outside it fails), one worker per CPU, or
// the requested number of them. Prefault ends before the first vCPU runs,
// so no CPU of the node is taken by a vCPU yet. A process allowed none of
// the node's CPUs still binds the memory to the node and runs unpinned
// workers, one per CPU it may use: the pages come from the node either way,
// only the clearing crosses the interconnect.
func prefaultPlan(p placement, requested int, allowedFn func() (unix.CPUSet, error)) (cpus []int, workers int, err error) {
	allowed, err := allowedFn()
	if err != nil {
		return nil, 0, fmt.Errorf("prefault workers: sched_getaffinity: %w", err)
	}
	for _, c := range p.nodeCPUs {
		if c >= 0 && c < 1024 && allowed.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	avail := len(cpus)
	what := fmt.Sprintf("the %d CPUs of node %d this process may use (%s)", avail, p.node, host.FormatCPUList(cpus))
	if avail == 0 {
		avail = max(allowed.Count(), 1)
		what = fmt.Sprintf("this process may use none of node %d's CPUs, and %d others", p.node, avail)
		cpus = nil
	}
	if requested > avail {
		return nil, 0, fieldErr("PrefaultWorkers", "%d workers: more than %s; each worker needs a CPU of its own (sharing one measured no faster): pass at most %d, or 0 for all of them", requested, what, avail)
	}
	if requested == 0 {
		requested = avail
	}
	return cpus, requested, nil
}
