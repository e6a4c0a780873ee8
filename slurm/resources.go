package slurm

import (
	"fmt"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
)

// Headroom is what hpcvmm leaves of the job's memory for itself when the
// guest's RAM comes from Slurm: 5% of it plus 256 MiB, for the VMM's own
// pages (Go heap, page tables of the guest mapping, VFIO and vhost
// bookkeeping) and the step's other processes, which Slurm's memory cgroup
// counts with the guest. Guest RAM on hugepages is not charged to the
// memory cgroup on every kernel, so the headroom errs on the safe side.
const (
	HeadroomPercent = 5
	HeadroomFixed   = 256 << 20
)

// GuestMemory returns the guest RAM for a job: SLURM_MEM_PER_NODE MiB, or
// SLURM_MEM_PER_CPU MiB times cpus (the job's CPUs on this node), less
// Headroom, rounded down to pageSize. ok is false when Slurm set neither
// variable (no memory was requested and the cluster has no default), so the
// caller keeps its own default; source names the variable used.
func (e *Env) GuestMemory(cpus int, pageSize uint64) (bytes uint64, source string, ok bool, err error) {
	var mib uint64
	if v, set := e.lookup("SLURM_MEM_PER_NODE"); set {
		if mib, err = strconv.ParseUint(v, 10, 64); err != nil {
			return 0, "", false, fmt.Errorf("slurm: SLURM_MEM_PER_NODE=%q: want a number of MiB", v)
		}
		source = "SLURM_MEM_PER_NODE=" + v
	} else if v, set := e.lookup("SLURM_MEM_PER_CPU"); set {
		per, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, "", false, fmt.Errorf("slurm: SLURM_MEM_PER_CPU=%q: want a number of MiB", v)
		}
		if c := e.getenv("SLURM_CPUS_ON_NODE"); c != "" {
			n, err := strconv.Atoi(c)
			if err != nil || n < 1 {
				return 0, "", false, fmt.Errorf("slurm: SLURM_CPUS_ON_NODE=%q: want a number of CPUs", c)
			}
			cpus = n
		}
		mib = per * uint64(cpus)
		source = fmt.Sprintf("SLURM_MEM_PER_CPU=%s x %d CPUs", v, cpus)
	} else {
		return 0, "", false, nil
	}
	total := mib << 20
	head := total*HeadroomPercent/100 + HeadroomFixed
	if pageSize == 0 {
		pageSize = 4096
	}
	if total <= head || (total-head)/pageSize == 0 {
		return 0, source, false, fmt.Errorf("slurm: %s MiB leaves nothing for the guest after hpcvmm's headroom (%d%% + %d MiB): request more with --mem, or give --memory", source, HeadroomPercent, HeadroomFixed>>20)
	}
	return (total - head) / pageSize * pageSize, source, true, nil
}

// AllowedCPUs returns the CPUs this process may run on
// (sched_getaffinity): under Slurm, the step's CPUs.
func AllowedCPUs() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("slurm: sched_getaffinity: %w", err)
	}
	var out []int
	for c := 0; c < len(set)*64; c++ {
		if set.IsSet(c) {
			out = append(out, c)
		}
	}
	return out, nil
}

// NodeCPUs returns the allowed CPUs that are on NUMA node, in order. With
// node < 0 it picks the node holding most of them (the lowest on a tie) and
// returns it. An allowed set with none on node is an error that says what
// Slurm gave and what to do.
func NodeCPUs(allowed []int, h *host.Host, node int) (cpus []int, chosen int, err error) {
	nodes, err := h.Nodes()
	if err != nil {
		return nil, -1, err
	}
	per := map[int][]int{}
	var ids []int
	for _, n := range nodes {
		ids = append(ids, n.ID)
		for _, c := range n.CPUs {
			if slices.Contains(allowed, c) {
				per[n.ID] = append(per[n.ID], c)
			}
		}
	}
	if node < 0 {
		node = -1
		for _, id := range ids {
			if node < 0 || len(per[id]) > len(per[node]) {
				node = id
			}
		}
	}
	if len(per[node]) == 0 {
		return nil, node, fmt.Errorf("slurm: the step may run on CPUs %s (sched_getaffinity), none of them on NUMA node %d where the VM's devices are: ask Slurm for CPUs near the devices (gres.conf Cores=, srun --gres-flags=enforce-binding), or give --cpu-list and --allow-cross-numa", host.FormatCPUList(allowed), node)
	}
	return per[node], node, nil
}
