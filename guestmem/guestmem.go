// Package guestmem owns guest RAM: how it is backed on the host
// (one memfd, hugetlb with 1 GiB or 2 MiB pages or plain 4 KiB shmem), which
// NUMA node its pages come from (mbind before the first touch), and that every
// page exists before the guest runs (reservation at mmap time, then a parallel
// prefault by CPU-pinned workers). Where RAM sits in the guest-physical
// address space (around the 32-bit PCI hole) is package addrspace's to say.
//
// Guest-physical accesses from device models go through Slice, which is
// bounds-checked, overflow-safe and allocation-free so it can be used on the
// vCPU exit path and in virtqueue processing.
package guestmem

import (
	"errors"
	"fmt"
	"strings"
)

// PageSize is the host page size backing guest RAM.
type PageSize uint64

// The supported backing page sizes. Page4K means "no hugepages": ordinary
// shmem pages, which need no host preparation but cost TLB reach.
const (
	Page4K PageSize = 4 << 10
	Page2M PageSize = 2 << 20
	Page1G PageSize = 1 << 30
)

// ParsePageSize parses a page size as given on the command line or in a
// config file: "1G"/"1GiB", "2M"/"2MiB", or "4K"/"none" for no hugepages.
// Matching ignores case and surrounding space.
func ParsePageSize(s string) (PageSize, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "1g", "1gib", "1gb":
		return Page1G, nil
	case "2m", "2mib", "2mb":
		return Page2M, nil
	case "4k", "4kib", "4kb", "none":
		return Page4K, nil
	}
	return 0, fmt.Errorf("page size %q: want 1G, 2M or none (4 KiB pages)", s)
}

// String returns the short form accepted by ParsePageSize ("1G", "2M", "4K").
func (p PageSize) String() string {
	switch p {
	case Page1G:
		return "1G"
	case Page2M:
		return "2M"
	case Page4K:
		return "4K"
	}
	return fmt.Sprintf("PageSize(%d)", uint64(p))
}

// valid reports whether p is one of the supported sizes.
func (p PageSize) valid() bool { return p == Page4K || p == Page2M || p == Page1G }

// hugetlb reports whether p needs the hugetlb pool.
func (p PageSize) hugetlb() bool { return p == Page2M || p == Page1G }

// sysfsName is the kernel's directory name for the pool of p, e.g.
// "hugepages-1048576kB".
func (p PageSize) sysfsName() string { return fmt.Sprintf("hugepages-%dkB", uint64(p)>>10) }

// Region is one contiguous piece of guest RAM and its host mapping.
type Region struct {
	GPA  uint64
	Data []byte // host mapping of [GPA, GPA+len(Data))
}

// Size returns the region's length in bytes.
func (r Region) Size() uint64 { return uint64(len(r.Data)) }

// End returns the first guest-physical address after the region.
func (r Region) End() uint64 { return r.GPA + uint64(len(r.Data)) }

// ErrOutOfRange is wrapped by Slice errors: the access is not wholly inside
// one RAM region (it touches the PCI hole, runs past the end of RAM, or wraps
// the address space).
var ErrOutOfRange = errors.New("guest-physical range not in RAM")

// Slice returns the host bytes backing guest-physical [gpa, gpa+n). The
// range must lie within one region; an access straddling the PCI hole or the
// end of RAM is an error, as is one whose end wraps past 2^64. Slice never
// panics and does not allocate on success, so device models call it on
// every guest-supplied address. The returned slice's capacity is n, so an
// append cannot spill into neighbouring guest memory.
func (m *Memory) Slice(gpa, n uint64) ([]byte, error) {
	for i := 0; i < m.nregions; i++ {
		r := &m.regions[i]
		if gpa < r.GPA {
			continue
		}
		off := gpa - r.GPA
		size := uint64(len(r.Data))
		// Written as subtractions so no sum can wrap: off may be any
		// value, n may be any value.
		if off > size || n > size-off {
			continue
		}
		return r.Data[off : off+n : off+n], nil
	}
	return nil, fmt.Errorf("guestmem: access %#x+%#x: %w", gpa, n, ErrOutOfRange)
}
