//go:build integration

package tests

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// meminfoHugePages returns HugePages_Free and HugePages_Rsvd for the
// default pool from /proc/meminfo, and the per-size free count from sysfs.
type hugeState struct {
	free1G, rsvd1G uint64
	free2M         uint64
}

func readUintFile(t *testing.T, path string) uint64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		t.Fatalf("parse %s: %v", path, err)
	}
	return v
}

func readHugeState(t *testing.T) hugeState {
	t.Helper()
	const g = "/sys/kernel/mm/hugepages/hugepages-1048576kB/"
	const m = "/sys/kernel/mm/hugepages/hugepages-2048kB/"
	var s hugeState
	if _, err := os.Stat(g); err == nil {
		s.free1G = readUintFile(t, g+"free_hugepages")
		s.rsvd1G = readUintFile(t, g+"resv_hugepages")
	}
	if _, err := os.Stat(m); err == nil {
		s.free2M = readUintFile(t, m+"free_hugepages")
	}
	return s
}

// vcpuThreads maps vCPU index to the thread id of hpcvmm's vCPU threads,
// which name themselves vcpuN.
func vcpuThreads(t *testing.T, pid int) map[int]int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int{}
	for _, task := range tasks {
		comm, err := os.ReadFile(filepath.Join(task, "comm"))
		if err != nil {
			continue
		}
		name := strings.TrimSpace(string(comm))
		if !strings.HasPrefix(name, "vcpu") {
			continue
		}
		idx, err1 := strconv.Atoi(strings.TrimPrefix(name, "vcpu"))
		tid, err2 := strconv.Atoi(filepath.Base(task))
		if err1 == nil && err2 == nil {
			out[idx] = tid
		}
	}
	return out
}

// affinity returns the CPUs a thread may run on.
func affinity(t *testing.T, tid int) []int {
	t.Helper()
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(tid, &set); err != nil {
		t.Fatalf("sched_getaffinity(%d): %v", tid, err)
	}
	var cpus []int
	for c := 0; c < 1024; c++ {
		if set.IsSet(c) {
			cpus = append(cpus, c)
		}
	}
	return cpus
}

// guestRAMMapping describes hpcvmm's guest RAM mapping as /proc/PID/smaps
// and numa_maps show it.
type guestRAMMapping struct {
	sizeKiB       uint64
	kernelPageKiB uint64
	numaPolicy    string // e.g. "bind:0"
	nodePages     map[string]uint64
}

var smapsHeader = regexp.MustCompile(`^([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$`)

// findGuestRAM finds the mapping of the guest RAM memfd in smaps and
// numa_maps of pid.
func findGuestRAM(t *testing.T, pid int) (guestRAMMapping, bool) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatalf("open smaps: %v", err)
	}
	defer f.Close()
	var m guestRAMMapping
	var start string
	found, in := false, false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if h := smapsHeader.FindStringSubmatch(line); h != nil {
			in = strings.Contains(h[3], "hpcvmm-guest-ram")
			if in {
				start, found = h[1], true
			}
			continue
		}
		if !in {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) >= 2 {
			v, _ := strconv.ParseUint(fields[1], 10, 64)
			switch fields[0] {
			case "Size:":
				m.sizeKiB = v
			case "KernelPageSize:":
				m.kernelPageKiB = v
			}
		}
	}
	if !found {
		return m, false
	}
	nm, err := os.ReadFile(fmt.Sprintf("/proc/%d/numa_maps", pid))
	if err != nil {
		t.Fatalf("read numa_maps: %v", err)
	}
	m.nodePages = map[string]uint64{}
	for _, line := range strings.Split(string(nm), "\n") {
		fields := strings.Fields(line)
		if len(fields) < 2 || strings.TrimLeft(fields[0], "0") != strings.TrimLeft(start, "0") {
			continue
		}
		m.numaPolicy = fields[1]
		for _, f := range fields[2:] {
			if k, v, ok := strings.Cut(f, "="); ok && len(k) > 1 && k[0] == 'N' {
				n, _ := strconv.ParseUint(v, 10, 64)
				m.nodePages[k] = n
			}
		}
	}
	return m, true
}
