package host

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CPUTopology is where one host CPU sits: its package, its core within the
// package, and the last-level cache it shares with other CPUs.
type CPUTopology struct {
	CPU     int
	Package int // physical_package_id
	Core    int // core_id
	// LLC is the lowest CPU number sharing the CPU's highest-level cache
	// (cache/indexN with the largest level), so CPUs with the same LLC
	// share that cache; -1 when the host does not say.
	LLC int
}

// CPUTopologies returns the topology of each CPU in cpus, in order, from
// /sys/devices/system/cpu/cpuN/{topology,cache}; in a capture, from its
// lscpu.txt (see lscpuTopology).
func (h *Host) CPUTopologies(cpus []int) ([]CPUTopology, error) {
	if h.Layout.CPUs == "" {
		return h.lscpuTopology(cpus)
	}
	out := make([]CPUTopology, len(cpus))
	for i, c := range cpus {
		dir := filepath.Join(h.Layout.CPUs, fmt.Sprintf("cpu%d", c))
		pkg, err := readInt(filepath.Join(dir, "topology/physical_package_id"))
		if err != nil {
			return nil, fmt.Errorf("host: CPU %d topology: %w", c, err)
		}
		core, err := readInt(filepath.Join(dir, "topology/core_id"))
		if err != nil {
			return nil, fmt.Errorf("host: CPU %d topology: %w", c, err)
		}
		out[i] = CPUTopology{CPU: c, Package: pkg, Core: core, LLC: lastLevelCache(dir)}
	}
	return out, nil
}

// lastLevelCache returns the first CPU of the shared_cpu_list of the
// highest-level cache under dir/cache, or -1.
func lastLevelCache(dir string) int {
	entries, err := filepath.Glob(filepath.Join(dir, "cache/index*"))
	if err != nil {
		return -1
	}
	best, llc := -1, -1
	for _, e := range entries {
		level, err := readInt(filepath.Join(e, "level"))
		if err != nil || level <= best {
			continue
		}
		list, err := readString(filepath.Join(e, "shared_cpu_list"))
		if err != nil {
			continue
		}
		cpus, err := ParseCPUList(list)
		if err != nil || len(cpus) == 0 {
			continue
		}
		best, llc = level, cpus[0]
	}
	return llc
}

// lscpuTopology derives CPU topology from a capture's lscpu output: Socket(s),
// Core(s) per socket, Thread(s) per core and the number of L3 instances.
// lscpu does not say how Linux numbered SMT siblings; this takes the common
// numbering of a single-thread or a siblings-apart host (CPU c and c+cores
// are siblings), with cores split evenly over sockets and L3 instances.
func (h *Host) lscpuTopology(cpus []int) ([]CPUTopology, error) {
	f, err := os.Open(h.Layout.CPUInfo)
	if err != nil {
		return nil, fmt.Errorf("host: CPU topology: %w", err)
	}
	defer f.Close()
	vals := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			vals[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	num := func(key string) (int, error) {
		n, err := strconv.Atoi(strings.Fields(vals[key] + " x")[0])
		if err != nil || n < 1 {
			return 0, fmt.Errorf("host: %s: no usable %q line for the CPU topology", h.Layout.CPUInfo, key)
		}
		return n, nil
	}
	sockets, err := num("Socket(s)")
	if err != nil {
		return nil, err
	}
	coresPerSocket, err := num("Core(s) per socket")
	if err != nil {
		return nil, err
	}
	threads, err := num("Thread(s) per core")
	if err != nil {
		return nil, err
	}
	l3 := sockets // "L3 cache: 300 MiB (1 instance)"; default one per socket
	if v := vals["L3 cache"]; v != "" {
		if i := strings.LastIndex(v, "("); i >= 0 {
			if n, err := strconv.Atoi(strings.Fields(v[i+1:] + " x")[0]); err == nil && n >= sockets {
				l3 = n
			}
		}
	}
	cores := sockets * coresPerSocket
	coresPerL3 := max(1, cores/l3)
	out := make([]CPUTopology, len(cpus))
	for i, c := range cpus {
		if c < 0 || c >= cores*threads {
			return nil, fmt.Errorf("host: CPU %d is not among the %d CPUs %s describes", c, cores*threads, h.Layout.CPUInfo)
		}
		core := c % cores
		out[i] = CPUTopology{CPU: c, Package: core / coresPerSocket, Core: core % coresPerSocket, LLC: core / coresPerL3}
	}
	return out, nil
}

// readInt reads a sysfs attribute holding a decimal integer (which may be
// negative, like core_id on some platforms' offline CPUs).
func readInt(p string) (int, error) {
	s, err := readString(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("host: parse %s: %w", p, err)
	}
	return v, nil
}
