package host

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// HugePool is one hugepage pool: the pages of one size on one node (or the
// whole host when the kernel has no NUMA information).
type HugePool struct {
	// PageSize is the page size in bytes (2 MiB, 1 GiB).
	PageSize uint64 `json:"page_size"`
	// Total is nr_hugepages: the pool's size in pages (set aside from the
	// rest of memory, whether in use or not).
	Total uint64 `json:"total"`
	// Free is free_hugepages: pages of the pool not yet faulted into any
	// mapping. It includes Resv.
	Free uint64 `json:"free"`
	// Resv is resv_hugepages: free pages already promised to mappings
	// that have not faulted them in yet, so not available to a new one
	// (Free - Resv is). Only the global pools in /sys/kernel/mm/hugepages
	// report it; zero for a node's pool.
	Resv uint64 `json:"resv"`
}

// Available is the pages a new mapping can still get: free, not promised.
func (p HugePool) Available() uint64 {
	if p.Resv > p.Free {
		return 0
	}
	return p.Free - p.Resv
}

// Node is one NUMA node as the kernel reports it.
type Node struct {
	// ID is the node number.
	ID int `json:"id"`
	// CPUs are the node's CPUs.
	CPUs []int `json:"cpus"`
	// Hugepages are the node's pools, ordered by page size.
	Hugepages []HugePool `json:"hugepages"`
	// MemTotal and MemFree are in bytes; zero when unknown.
	MemTotal uint64 `json:"mem_total"`
	MemFree  uint64 `json:"mem_free"`
	// PerNode is false for the single pseudo-node of a host without
	// /sys/devices/system/node, whose pools are the global ones in
	// /sys/kernel/mm/hugepages. Fix commands must then name the global pool.
	PerNode bool `json:"per_node"`
}

// Pool returns the node's pool of the given page size.
func (n Node) Pool(pageSize uint64) (HugePool, bool) {
	for _, p := range n.Hugepages {
		if p.PageSize == pageSize {
			return p, true
		}
	}
	return HugePool{}, false
}

// HugepageDirName is the sysfs directory name of a pool of pageSize bytes,
// e.g. "hugepages-1048576kB".
func HugepageDirName(pageSize uint64) string {
	return fmt.Sprintf("hugepages-%dkB", pageSize>>10)
}

// NrHugepagesPath is the canonical live-host sysfs file that sizes the pool
// of pageSize on node (or the global pool when perNode is false). Fix
// commands use it; it is not rooted at the host tree on purpose.
func NrHugepagesPath(node int, pageSize uint64, perNode bool) string {
	if !perNode {
		return "/sys/kernel/mm/hugepages/" + HugepageDirName(pageSize) + "/nr_hugepages"
	}
	return fmt.Sprintf("/sys/devices/system/node/node%d/hugepages/%s/nr_hugepages", node, HugepageDirName(pageSize))
}

// Nodes returns the host's online NUMA nodes ordered by ID. A kernel without
// NUMA support (no node directory) is reported as one node 0 holding every
// online CPU and the global hugepage pools, with PerNode false.
func (h *Host) Nodes() ([]Node, error) {
	l := h.Layout
	if l.Nodes == "" || !exists(l.Nodes) {
		return h.pseudoNode()
	}
	ids, err := h.nodeIDs()
	if err != nil {
		return nil, err
	}
	nodes := make([]Node, 0, len(ids))
	for _, id := range ids {
		n, err := h.readNode(id, len(ids) == 1)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// Node returns node id, or an error wrapping fs.ErrNotExist if it is not
// online.
func (h *Host) Node(id int) (Node, error) {
	nodes, err := h.Nodes()
	if err != nil {
		return Node{}, err
	}
	for _, n := range nodes {
		if n.ID == id {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("host: NUMA node %d is not online (online: %s): %w", id, nodeList(nodes), fs.ErrNotExist)
}

func nodeList(nodes []Node) string {
	ids := make([]int, len(nodes))
	for i, n := range nodes {
		ids[i] = n.ID
	}
	return FormatCPUList(ids)
}

func (h *Host) pseudoNode() ([]Node, error) {
	n := Node{ID: 0}
	s, err := readString(h.Layout.CPUOnline)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("host: read online CPUs: %w", err)
	}
	if n.CPUs, err = ParseCPUList(s); err != nil {
		return nil, err
	}
	if n.Hugepages, err = readPools(h.Layout.Hugepages); err != nil {
		return nil, err
	}
	return []Node{n}, nil
}

// nodeIDs reads the online node list, or, in a capture without one, the
// node numbers found in the directory.
func (h *Host) nodeIDs() ([]int, error) {
	s, err := readString(filepath.Join(h.Layout.Nodes, "online"))
	if err == nil {
		return ParseCPUList(s)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("host: read online nodes: %w", err)
	}
	ents, err := os.ReadDir(h.Layout.Nodes)
	if err != nil {
		return nil, fmt.Errorf("host: list NUMA nodes: %w", err)
	}
	seen := map[int]bool{}
	for _, e := range ents {
		name := strings.TrimSuffix(e.Name(), ".cpulist")
		if !strings.HasPrefix(name, "node") {
			continue
		}
		if id, err := strconv.Atoi(name[len("node"):]); err == nil && id >= 0 {
			seen[id] = true
		}
	}
	ids := make([]int, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids, nil
}

// nodeFile returns nodeN/name, or the capture's flattened nodeN.name.
func (h *Host) nodeFile(id int, name string) string {
	p := filepath.Join(h.Layout.Nodes, fmt.Sprintf("node%d", id), name)
	if exists(p) {
		return p
	}
	return filepath.Join(h.Layout.Nodes, fmt.Sprintf("node%d.%s", id, name))
}

func (h *Host) readNode(id int, only bool) (Node, error) {
	n := Node{ID: id, PerNode: true}
	s, err := readString(h.nodeFile(id, "cpulist"))
	if err != nil {
		return n, fmt.Errorf("host: read CPUs of NUMA node %d: %w", id, err)
	}
	if n.CPUs, err = ParseCPUList(s); err != nil {
		return n, fmt.Errorf("host: NUMA node %d: %w", id, err)
	}
	mi, err := readNodeMeminfo(h.nodeFile(id, "meminfo"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return n, fmt.Errorf("host: NUMA node %d: %w", id, err)
	}
	n.MemTotal, n.MemFree = mi["MemTotal"], mi["MemFree"]

	hp := filepath.Join(h.Layout.Nodes, fmt.Sprintf("node%d", id), "hugepages")
	switch {
	case exists(hp):
		n.Hugepages, err = readPools(hp)
	case exists(filepath.Join(h.Layout.Nodes, "hugepage-sizes")):
		n.Hugepages, err = h.capturePools(mi)
	case only:
		// One node without per-node pools (old kernel): the global pools
		// are this node's.
		n.Hugepages, err = readPools(h.Layout.Hugepages)
		n.PerNode = false
	}
	if err != nil {
		return n, fmt.Errorf("host: hugepages of NUMA node %d: %w", id, err)
	}
	return n, nil
}

// defaultHugepageSize is the kernel's default hstate on x86-64 (2 MiB unless
// default_hugepagesz= says otherwise). Node meminfo's HugePages_Total/Free
// count only that pool.
const defaultHugepageSize = 2 << 20

// capturePools builds a capture node's pools: the sizes listed in
// node/hugepage-sizes, with the counts meminfo gives for the default size.
// A capture records no counts for other sizes, so they read as empty, which
// is the conservative answer for a "are there enough free pages" check.
func (h *Host) capturePools(mi map[string]uint64) ([]HugePool, error) {
	s, err := readString(filepath.Join(h.Layout.Nodes, "hugepage-sizes"))
	if err != nil {
		return nil, err
	}
	var pools []HugePool
	for _, name := range strings.Fields(s) {
		size, ok := parsePoolDir(name)
		if !ok {
			return nil, fmt.Errorf("hugepage-sizes: bad entry %q (want hugepages-<N>kB)", name)
		}
		p := HugePool{PageSize: size}
		if size == defaultHugepageSize {
			p.Total, p.Free = mi["HugePages_Total"], mi["HugePages_Free"]
		}
		pools = append(pools, p)
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].PageSize < pools[j].PageSize })
	return pools, nil
}

func parsePoolDir(name string) (uint64, bool) {
	if !strings.HasPrefix(name, "hugepages-") || !strings.HasSuffix(name, "kB") {
		return 0, false
	}
	kb, err := strconv.ParseUint(name[len("hugepages-"):len(name)-2], 10, 44)
	if err != nil || kb == 0 {
		return 0, false
	}
	return kb << 10, true
}

// readPools reads dir/hugepages-<N>kB/{nr,free,resv}_hugepages.
func readPools(dir string) ([]HugePool, error) {
	if dir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pools []HugePool
	for _, e := range ents {
		size, ok := parsePoolDir(e.Name())
		if !ok {
			continue
		}
		p := HugePool{PageSize: size}
		if p.Total, err = readUint(filepath.Join(dir, e.Name(), "nr_hugepages"), 64); err != nil {
			return nil, err
		}
		if p.Free, err = readUint(filepath.Join(dir, e.Name(), "free_hugepages"), 64); err != nil {
			return nil, err
		}
		// Present in the global pools only.
		if v, err := readUint(filepath.Join(dir, e.Name(), "resv_hugepages"), 64); err == nil {
			p.Resv = v
		}
		pools = append(pools, p)
	}
	sort.Slice(pools, func(i, j int) bool { return pools[i].PageSize < pools[j].PageSize })
	return pools, nil
}

// readNodeMeminfo parses "Node 0 MemFree:  3300144 kB" lines into bytes
// (kB values) or counts (HugePages_*), keyed by field name.
func readNodeMeminfo(p string) (map[string]uint64, error) {
	f, err := os.Open(p)
	if err != nil {
		return map[string]uint64{}, err
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// "Node", "0", "MemFree:", "3300144", "kB"
		if len(fields) < 4 || fields[0] != "Node" {
			continue
		}
		key := strings.TrimSuffix(fields[2], ":")
		v, err := strconv.ParseUint(fields[3], 10, 64)
		if err != nil {
			return out, fmt.Errorf("parse %s: field %s: %w", p, key, err)
		}
		if len(fields) >= 5 && fields[4] == "kB" {
			v <<= 10
		}
		out[key] = v
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read %s: %w", p, err)
	}
	return out, nil
}
