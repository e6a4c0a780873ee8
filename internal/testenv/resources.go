package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Resources is what this process holds on the host that a VM's
// create/run/destroy cycle could leak, as the kernel shows it.
type Resources struct {
	// FDs lists /proc/self/fd by target (KVM VM and vCPU fds, eventfds,
	// the guest RAM memfd, TAP queues, VFIO container, group and device
	// files), sorted.
	FDs []string
	// VFIOFDs counts the fds on /dev/vfio/* (containers and groups): zero
	// once every VM's container is closed, and with it the IOMMU's DMA
	// mappings, which the kernel tears down when the container goes.
	VFIOFDs int
	// Maps is the number of lines of /proc/self/maps.
	Maps int
	// FileMaps lists the mappings backed by a file or an anon_inode (guest
	// RAM's memfd, each vCPU's kvm_run, mmapped BARs), sorted. Unnamed
	// anonymous mappings are in Maps only: the Go heap grows and shrinks
	// through them on its own schedule.
	FileMaps []string
	// HugePagesFree is free_hugepages of each pool in
	// /sys/kernel/mm/hugepages, by pool ("hugepages-2048kB").
	HugePagesFree map[string]uint64
	// Links lists the network interfaces of the calling thread's network
	// namespace (TAPs a VM created are among them while it lives).
	Links []string
	// Drivers maps each watched PCI device to its driver ("" for none).
	Drivers map[string]string
	// Journals lists the files (not the directories) in the host-state
	// journal directory.
	Journals []string
	// HeapAlloc and HeapInuse are the Go heap after a forced collection.
	HeapAlloc, HeapInuse uint64
	// Goroutines and Threads are the goroutine and OS thread counts.
	Goroutines, Threads int
}

// Watch says which host state Snapshot reads beyond the process's own.
type Watch struct {
	// BDFs are PCI devices whose driver binding is recorded.
	BDFs []string
	// JournalDir is the host-state journal directory ("" for none).
	JournalDir string
}

// Snapshot reads the process's resources and the watched host state. Call
// it on the thread (runtime.LockOSThread) whose network namespace the VMs
// use: Links is that namespace's.
func Snapshot(w Watch) (Resources, error) {
	runtime.GC()
	runtime.GC() // the first run's finalizers (os.File) free more on the second
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r := Resources{HeapAlloc: ms.HeapAlloc, HeapInuse: ms.HeapInuse, Goroutines: runtime.NumGoroutine(),
		HugePagesFree: map[string]uint64{}, Drivers: map[string]string{}}

	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return r, err
	}
	for _, e := range ents {
		target, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the ReadDir's own fd, closed meanwhile
		}
		r.FDs = append(r.FDs, target)
		if strings.HasPrefix(target, "/dev/vfio/") {
			r.VFIOFDs++
		}
	}
	slices.Sort(r.FDs)

	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return r, err
	}
	for _, line := range strings.Split(strings.TrimSpace(string(maps)), "\n") {
		r.Maps++
		if f := strings.Fields(line); len(f) >= 6 && !strings.HasPrefix(f[5], "[") {
			r.FileMaps = append(r.FileMaps, strings.Join(f[5:], " "))
		}
	}
	slices.Sort(r.FileMaps)

	pools, _ := filepath.Glob("/sys/kernel/mm/hugepages/hugepages-*")
	for _, p := range pools {
		b, err := os.ReadFile(filepath.Join(p, "free_hugepages"))
		if err != nil {
			return r, err
		}
		n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil {
			return r, fmt.Errorf("testenv: %s/free_hugepages: %w", p, err)
		}
		r.HugePagesFree[filepath.Base(p)] = n
	}

	dev, err := os.ReadFile("/proc/thread-self/net/dev")
	if err != nil {
		return r, err
	}
	for _, line := range strings.Split(string(dev), "\n") {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.Contains(name, "|") {
			r.Links = append(r.Links, name)
		}
	}
	slices.Sort(r.Links)

	for _, bdf := range w.BDFs {
		l, err := os.Readlink("/sys/bus/pci/devices/" + bdf + "/driver")
		if err != nil && !os.IsNotExist(err) {
			return r, err
		}
		if err == nil {
			l = filepath.Base(l)
		}
		r.Drivers[bdf] = l
	}
	if w.JournalDir != "" {
		ents, err := os.ReadDir(w.JournalDir)
		if err != nil && !os.IsNotExist(err) {
			return r, err
		}
		for _, e := range ents {
			// Directories are not journals: the run directory also holds
			// the CPU claims (cpus/, package cpuclaim), whose locks the
			// kernel drops when a VM's process ends.
			if e.IsDir() {
				continue
			}
			r.Journals = append(r.Journals, e.Name())
		}
	}

	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return r, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			r.Threads, _ = strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return r, nil
}

// Bounds are how far after may differ from before in Leaks: the Go heap
// and the runtime's own anonymous mappings move on their own schedule;
// everything else must be exactly as before.
type Bounds struct {
	// Heap is how many bytes HeapAlloc may grow.
	Heap uint64
	// Maps is how many lines /proc/self/maps may grow (anonymous mappings
	// only: FileMaps must be equal).
	Maps int
}

// Leaks lists every difference between before and after beyond b, one
// line each; empty means nothing leaked.
func Leaks(before, after Resources, b Bounds) []string {
	var out []string
	diff := func(what string, x, y []string) {
		if !slices.Equal(x, y) {
			out = append(out, fmt.Sprintf("%s: gone %v, new %v", what, minus(x, y), minus(y, x)))
		}
	}
	diff("open fds", before.FDs, after.FDs)
	diff("file and anon_inode mappings", before.FileMaps, after.FileMaps)
	diff("network interfaces", before.Links, after.Links)
	diff("host-state journals", before.Journals, after.Journals)
	if before.VFIOFDs != after.VFIOFDs {
		out = append(out, fmt.Sprintf("fds on /dev/vfio: %d before, %d after", before.VFIOFDs, after.VFIOFDs))
	}
	for k, v := range before.HugePagesFree {
		if after.HugePagesFree[k] != v {
			out = append(out, fmt.Sprintf("%s free: %d before, %d after", k, v, after.HugePagesFree[k]))
		}
	}
	for k, v := range before.Drivers {
		if after.Drivers[k] != v {
			out = append(out, fmt.Sprintf("driver of %s: %q before, %q after", k, v, after.Drivers[k]))
		}
	}
	if after.Maps > before.Maps+b.Maps {
		out = append(out, fmt.Sprintf("/proc/self/maps lines: %d before, %d after (bound +%d)", before.Maps, after.Maps, b.Maps))
	}
	if after.HeapAlloc > before.HeapAlloc+b.Heap {
		out = append(out, fmt.Sprintf("Go heap: %d bytes before, %d after (bound +%d)", before.HeapAlloc, after.HeapAlloc, b.Heap))
	}
	if after.Goroutines > before.Goroutines {
		out = append(out, fmt.Sprintf("goroutines: %d before, %d after", before.Goroutines, after.Goroutines))
	}
	return out
}

// minus is the multiset difference x - y of sorted lists.
func minus(x, y []string) []string {
	var out []string
	i, j := 0, 0
	for i < len(x) {
		switch {
		case j >= len(y) || x[i] < y[j]:
			out = append(out, x[i])
			i++
		case x[i] > y[j]:
			j++
		default:
			i++
			j++
		}
	}
	return out
}

// String is a one-line summary for logs and records.
func (r Resources) String() string {
	return fmt.Sprintf("fds=%d vfio_fds=%d maps=%d file_maps=%d hugepages_free=%v links=%d drivers=%v journals=%d heap_alloc=%d heap_inuse=%d goroutines=%d threads=%d",
		len(r.FDs), r.VFIOFDs, r.Maps, len(r.FileMaps), r.HugePagesFree, len(r.Links), r.Drivers, len(r.Journals),
		r.HeapAlloc, r.HeapInuse, r.Goroutines, r.Threads)
}
