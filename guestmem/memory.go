package guestmem

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// Options configures New.
type Options struct {
	// Size is the total guest RAM in bytes, a non-zero multiple of PageSize.
	Size uint64
	// PageSize is the backing page size; the zero value means Page4K.
	PageSize PageSize
	// Node is the host NUMA node the pages must come from, bound with
	// mbind(MPOL_BIND) before any page is touched; -1 means no binding
	// (the kernel's default first-touch policy).
	Node int
	// PrefaultCPUs are the host CPUs the prefault workers are pinned to,
	// one worker per CPU (capped at Workers when Workers > 0). Pinning the
	// workers to CPUs of Node keeps the page clearing node-local. Empty
	// means unpinned workers.
	PrefaultCPUs []int
	// Workers is the number of prefault workers; 0 means len(PrefaultCPUs)
	// or, with no CPUs given, runtime.NumCPU().
	Workers int
	// Progress, when non-nil, receives a progress line about once a second
	// while prefaulting takes longer than a second.
	Progress io.Writer
}

// Memory is guest RAM: one memfd mapped once, carved into the regions of
// Layout. Its methods other than Close may be called concurrently; Close
// must not run while the memory is still in use.
type Memory struct {
	fd       int
	data     []byte // the whole mapping; regions are sub-slices
	regions  [2]Region
	nregions int
	size     uint64
	pageSize PageSize

	prefaultTime    time.Duration
	prefaultWorkers int

	closeOnce sync.Once
	closeErr  error
}

// New allocates, binds and prefaults guest RAM as described by opts. On any
// error everything acquired so far is released, so a failed New never leaves
// hugepages reserved on the host.
func New(opts Options) (*Memory, error) {
	ps := opts.PageSize
	if ps == 0 {
		ps = Page4K
	}
	if !ps.valid() {
		return nil, fmt.Errorf("guestmem: page size %d: want 1G, 2M or 4K", uint64(ps))
	}
	if opts.Size == 0 || opts.Size%uint64(ps) != 0 {
		return nil, fmt.Errorf("guestmem: memory size %d bytes is not a non-zero multiple of the %s page size: round it to a multiple of %d bytes", opts.Size, ps, uint64(ps))
	}
	if opts.Size > addrspace.MaxRAM {
		return nil, fmt.Errorf("guestmem: memory size %d bytes exceeds the maximum %d", opts.Size, uint64(addrspace.MaxRAM))
	}
	if uint64(int(opts.Size)) != opts.Size || int(opts.Size) < 0 {
		return nil, fmt.Errorf("guestmem: memory size %d bytes does not fit this host's address space", opts.Size)
	}
	if opts.Node < -1 {
		return nil, fmt.Errorf("guestmem: NUMA node %d: want a node number or -1 for no binding", opts.Node)
	}
	if opts.Workers < 0 {
		return nil, fmt.Errorf("guestmem: prefault workers %d: want 0 (automatic) or more", opts.Workers)
	}
	for _, cpu := range opts.PrefaultCPUs {
		if cpu < 0 || cpu >= cpuSetSize {
			return nil, fmt.Errorf("guestmem: prefault CPU %d: want 0..%d", cpu, cpuSetSize-1)
		}
	}

	m := &Memory{fd: -1, size: opts.Size, pageSize: ps}
	ok := false
	defer func() {
		if !ok {
			m.release()
		}
	}()

	flags := unix.MFD_CLOEXEC
	switch ps {
	case Page1G:
		flags |= unix.MFD_HUGETLB | unix.MFD_HUGE_1GB
	case Page2M:
		flags |= unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	}
	fd, err := unix.MemfdCreate("hpcvmm-guest-ram", flags)
	if err != nil {
		if ps.hugetlb() {
			return nil, fmt.Errorf("guestmem: memfd_create for %s hugepages: %w (is hugetlbfs support for %s pages in the host kernel? see /sys/kernel/mm/hugepages/%s)", ps, err, ps, ps.sysfsName())
		}
		return nil, fmt.Errorf("guestmem: memfd_create: %w", err)
	}
	m.fd = fd
	if err := unix.Ftruncate(fd, int64(opts.Size)); err != nil {
		return nil, fmt.Errorf("guestmem: ftruncate guest RAM memfd to %d bytes: %w", opts.Size, err)
	}

	// One MAP_SHARED mapping without MAP_NORESERVE: for hugetlb the kernel
	// reserves every page of the mapping here, so a short pool fails now
	// with ENOMEM instead of with SIGBUS when the guest first touches a
	// page hours into a job.
	data, err := unix.Mmap(fd, 0, int(opts.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		if ps.hugetlb() && errors.Is(err, unix.ENOMEM) {
			return nil, fmt.Errorf("guestmem: mmap %d bytes of guest RAM: %w: %s", opts.Size, err, shortPoolHint(ps, opts.Size))
		}
		return nil, fmt.Errorf("guestmem: mmap %d bytes of %s-page guest RAM: %w", opts.Size, ps, err)
	}
	m.data = data

	// The policy must be in place before the first touch: a page's node is
	// chosen when it is faulted in, and faulted pages never move.
	if opts.Node >= 0 {
		if err := uapi.Mbind(data, uapi.MPolBind, []int{opts.Node}, uapi.MPolMFStrict); err != nil {
			return nil, fmt.Errorf("guestmem: bind guest RAM to NUMA node %d: %w (does the node exist and have memory? see /sys/devices/system/node)", opts.Node, err)
		}
	}

	lay := addrspace.RAM(opts.Size)
	var off uint64
	for i, r := range lay {
		m.regions[i] = Region{GPA: r.GPA, Data: data[off : off+r.Size : off+r.Size]}
		off += r.Size
	}
	m.nregions = len(lay)

	start := time.Now()
	workers, err := prefault(data, uint64(ps), opts)
	if err != nil {
		return nil, prefaultError(err, ps, opts)
	}
	m.prefaultTime = time.Since(start)
	m.prefaultWorkers = workers
	ok = true
	return m, nil
}

// Regions returns the RAM regions in address order. The Data slices alias
// the guest memory; the returned slice itself is a copy.
func (m *Memory) Regions() []Region {
	return append([]Region(nil), m.regions[:m.nregions]...)
}

// Size returns the total guest RAM in bytes.
func (m *Memory) Size() uint64 { return m.size }

// End returns the highest guest-physical RAM address plus one; the 64-bit
// MMIO window starts at or above it.
func (m *Memory) End() uint64 {
	if m.nregions == 0 {
		return 0
	}
	return m.regions[m.nregions-1].End()
}

// PageSize returns the backing page size.
func (m *Memory) PageSize() PageSize { return m.pageSize }

// FD returns the memfd backing all of guest RAM (mapping offset 0 is GPA 0,
// the high region follows the low one), for sharing with vhost backends. It
// is -1 after Close. The fd stays owned by Memory.
func (m *Memory) FD() int { return m.fd }

// PrefaultStats reports how long the prefault took and with how many
// workers.
func (m *Memory) PrefaultStats() (d time.Duration, workers int) {
	return m.prefaultTime, m.prefaultWorkers
}

// Close unmaps guest RAM and closes the memfd, which returns the hugepages
// to the host pool (once no vhost backend holds the fd either). It is
// idempotent. After Close, Regions is empty and Slice fails.
func (m *Memory) Close() error {
	m.closeOnce.Do(func() { m.closeErr = m.release() })
	return m.closeErr
}

// release drops the mapping and the fd, whichever exist.
func (m *Memory) release() error {
	var errs []error
	m.regions = [2]Region{}
	m.nregions = 0
	if m.data != nil {
		if err := unix.Munmap(m.data); err != nil {
			errs = append(errs, fmt.Errorf("guestmem: munmap guest RAM: %w", err))
		}
		m.data = nil
	}
	if m.fd >= 0 {
		if err := unix.Close(m.fd); err != nil {
			errs = append(errs, fmt.Errorf("guestmem: close guest RAM memfd: %w", err))
		}
		m.fd = -1
	}
	return errors.Join(errs...)
}

// sysfsRoot is where hugepage pool counters are read for error messages;
// a variable so tests can point it at a fixture.
var sysfsRoot = "/sys"

// poolAvailable returns the pages of size ps that are free and not yet
// promised to another mapping, globally (node < 0) or on one node.
func poolAvailable(ps PageSize, node int) (int64, error) {
	dir := filepath.Join(sysfsRoot, "kernel/mm/hugepages", ps.sysfsName())
	if node >= 0 {
		dir = filepath.Join(sysfsRoot, "devices/system/node", "node"+strconv.Itoa(node), "hugepages", ps.sysfsName())
	}
	free, err := readCounter(filepath.Join(dir, "free_hugepages"))
	if err != nil {
		return 0, err
	}
	if node >= 0 {
		// Reservations are only accounted globally.
		return free, nil
	}
	resv, err := readCounter(filepath.Join(dir, "resv_hugepages"))
	if err != nil {
		return 0, err
	}
	return free - resv, nil
}

func readCounter(path string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse %s: %w", path, err)
	}
	return v, nil
}

// shortPoolHint explains a failed hugetlb reservation: how many pages are
// needed, how many the pool has, and which knob to turn.
func shortPoolHint(ps PageSize, size uint64) string {
	need := size / uint64(ps)
	have := "an unknown number"
	if n, err := poolAvailable(ps, -1); err == nil {
		have = strconv.FormatInt(n, 10)
	}
	return fmt.Sprintf("need %d free %s hugepages, have %s: raise /sys/kernel/mm/hugepages/%s/nr_hugepages (or the per-node file /sys/devices/system/node/nodeN/hugepages/%s/nr_hugepages)",
		need, ps, have, ps.sysfsName(), ps.sysfsName())
}

// prefaultError adds the likely cause to a failed prefault. With a node
// binding the global reservation can succeed while the node itself is short
// of pages, which surfaces only when the pages are faulted in.
func prefaultError(err error, ps PageSize, opts Options) error {
	if ps.hugetlb() && opts.Node >= 0 {
		have := "an unknown number"
		if n, perr := poolAvailable(ps, opts.Node); perr == nil {
			have = strconv.FormatInt(n, 10)
		}
		return fmt.Errorf("guestmem: prefault %d bytes of %s-page guest RAM on NUMA node %d: %w (the node may be short of hugepages: need %d, node %d has %s free: raise /sys/devices/system/node/node%d/hugepages/%s/nr_hugepages)",
			opts.Size, ps, opts.Node, err, opts.Size/uint64(ps), opts.Node, have, opts.Node, ps.sysfsName())
	}
	return fmt.Errorf("guestmem: prefault %d bytes of %s-page guest RAM: %w", opts.Size, ps, err)
}
