package slurm

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

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
// Headroom, rounded down to pageSize. A step that a bare srun allocated has
// neither variable (srun does not export them, sbatch and salloc do), so
// then the job's MinMemoryNode or MinMemoryCPU comes from `scontrol show
// job`. ok is false when the job has no memory size at all (none was
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
		mib = per * uint64(cpus)
		source = fmt.Sprintf("SLURM_MEM_PER_CPU=%s x %d CPUs", v, cpus)
	} else if e.InSlurm() {
		job := e.getenv("SLURM_JOB_ID")
		out, err := e.scontrol(job)
		if err != nil {
			return 0, "", false, fmt.Errorf("slurm: neither SLURM_MEM_PER_NODE nor SLURM_MEM_PER_CPU is set and `scontrol show job -d %s` failed (%w): give --memory", job, err)
		}
		key, per, found, err := JobMemory(out)
		if err != nil {
			return 0, "", false, fmt.Errorf("slurm: `scontrol show job -d %s`: %w: give --memory", job, err)
		}
		if !found {
			return 0, "", false, nil
		}
		mib = per
		source = fmt.Sprintf("scontrol show job %s: %s", job, key)
		if strings.HasPrefix(key, "MinMemoryCPU=") {
			if c := e.getenv("SLURM_CPUS_ON_NODE"); c != "" {
				if n, err := strconv.Atoi(c); err == nil && n > 0 {
					cpus = n
				}
			}
			mib = per * uint64(cpus)
			source += fmt.Sprintf(" x %d CPUs", cpus)
		}
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

// JobMemory finds the job's memory request in `scontrol show job` output:
// "MinMemoryNode=2G" (per node) or "MinMemoryCPU=700M" (per CPU), sizes as
// Slurm prints them (a number, possibly with two decimals, and a K/M/G/T
// suffix of binary units; "1.50G" is 1536 MiB). It returns the field as
// printed and its size in MiB; found is false when the job has none or 0.
func JobMemory(out string) (field string, mib uint64, found bool, err error) {
	for _, f := range strings.Fields(out) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || (k != "MinMemoryNode" && k != "MinMemoryCPU") {
			continue
		}
		mib, err := parseSlurmSize(v)
		if err != nil {
			return f, 0, false, fmt.Errorf("%s: %w", f, err)
		}
		if mib == 0 {
			return f, 0, false, nil
		}
		return f, mib, true, nil
	}
	return "", 0, false, nil
}

// parseSlurmSize parses a size as Slurm prints it (convert_num_unit: MiB
// by default, K/M/G/T/P suffixes of 1024), in whole MiB rounded down.
func parseSlurmSize(v string) (uint64, error) {
	bad := fmt.Errorf("%q: want a size such as 2048, 700M or 1.50G", v)
	num, mult := v, 1.0
	if n := len(v); n > 0 && (v[n-1] < '0' || v[n-1] > '9') {
		i := strings.IndexByte("KMGTP", v[n-1])
		if i < 0 {
			return 0, bad
		}
		mult = math.Pow(1024, float64(i-1))
		num = v[:n-1]
	}
	for _, c := range num {
		if (c < '0' || c > '9') && c != '.' {
			return 0, bad
		}
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*mult >= 1<<53 {
		return 0, bad
	}
	return uint64(f * mult), nil
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
