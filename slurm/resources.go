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

// maxMiB bounds a job's memory size (an exbibyte), so that its bytes and
// the headroom's arithmetic stay within 64 bits whatever a variable or
// squeue says.
const maxMiB = 1 << 40

// GuestMemory returns the guest RAM for a job: SLURM_MEM_PER_NODE MiB, or
// SLURM_MEM_PER_CPU MiB times cpus (the job's CPUs on this node), less
// Headroom, rounded down to pageSize. A step that a bare srun allocated has
// neither variable (srun does not export them, sbatch and salloc do), so
// then the job's memory_per_node or memory_per_cpu comes from `squeue
// --json` (see JobMemory), the latter times the job's CPUs on this node
// (SLURM_CPUS_ON_NODE, else cpus). ok is false when the job has no memory size at all (none was
// requested and the cluster has no default), so the caller keeps its own
// default; source names where the size came from.
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
		source = fmt.Sprintf("SLURM_MEM_PER_CPU=%s x %d CPUs", v, cpus)
		if cpus < 1 || per > maxMiB/uint64(cpus) {
			return 0, "", false, fmt.Errorf("slurm: %s is not a memory size: give --memory", source)
		}
		mib = per * uint64(cpus)
	} else if e.InSlurm() {
		job := e.getenv("SLURM_JOB_ID")
		out, err := e.squeue(job)
		if err != nil {
			return 0, "", false, fmt.Errorf("slurm: neither SLURM_MEM_PER_NODE nor SLURM_MEM_PER_CPU is set and `squeue --json --jobs %s` failed (%w): give --memory", job, err)
		}
		m, err := JobMemory(out, job)
		if err != nil {
			return 0, "", false, fmt.Errorf("slurm: `squeue --json --jobs %s`: %w: give --memory", job, err)
		}
		if m.MiB == 0 {
			return 0, "", false, nil
		}
		mib = m.MiB
		source = fmt.Sprintf("squeue --json --jobs %s: %s", job, m)
		if m.PerCPU {
			if c := e.getenv("SLURM_CPUS_ON_NODE"); c != "" {
				if n, err := strconv.Atoi(c); err == nil && n > 0 {
					cpus = n
				}
			}
			if cpus < 1 || mib > maxMiB/uint64(cpus) {
				return 0, "", false, fmt.Errorf("slurm: %s x %d CPUs is not a memory size: give --memory", source, cpus)
			}
			mib *= uint64(cpus)
			source += fmt.Sprintf(" x %d CPUs", cpus)
		}
	} else {
		return 0, "", false, nil
	}
	if mib > maxMiB {
		return 0, source, false, fmt.Errorf("slurm: %s MiB is more than an exbibyte, not a memory size: give --memory", source)
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

// JobMem is a job's memory request: pn_min_memory, per node or per CPU.
type JobMem struct {
	// MiB is the size; 0 when the job has none (none was requested and
	// the cluster has no default).
	MiB uint64
	// PerCPU is true for a request per CPU (--mem-per-cpu), false for
	// one per node (--mem).
	PerCPU bool
}

// String names the squeue field the size came from, such as
// "memory_per_node=2048" (MiB, as Slurm's JSON gives it).
func (m JobMem) String() string {
	if m.PerCPU {
		return fmt.Sprintf("memory_per_cpu=%d", m.MiB)
	}
	return fmt.Sprintf("memory_per_node=%d", m.MiB)
}

// JobMemory finds job's memory request in `squeue --json` output: its
// memory_per_node or memory_per_cpu (MiB), which `scontrol show job`
// prints as MinMemoryNode and MinMemoryCPU. It reads the JSON record
// because scontrol's text carries the job's name and comment verbatim,
// where "\n   MinMemoryNode=999G" reads as the real field (issue 23; see
// findJob). A record with both set is an error: Slurm sets one.
func JobMemory(out []byte, job string) (JobMem, error) {
	j, err := findJob(out, job)
	if err != nil {
		return JobMem{}, err
	}
	node, cpu := j.MemoryPerNode, j.MemoryPerCPU
	switch {
	case node.Set && cpu.Set && node.N != 0 && cpu.N != 0:
		return JobMem{}, fmt.Errorf("job %d has both memory_per_node=%d and memory_per_cpu=%d", j.JobID, node.N, cpu.N)
	case cpu.Set && cpu.N != 0:
		return JobMem{MiB: cpu.N, PerCPU: true}, nil
	case node.Set:
		return JobMem{MiB: node.N}, nil
	}
	return JobMem{}, nil
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
