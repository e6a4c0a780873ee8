package iommu

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// Backend is the DMA-mapping interface of a container. *uapi.VFIOContainer
// implements it; tests use fakes, and an iommufd IOAS would be another.
type Backend interface {
	IOMMUInfo() (uapi.VFIOIOMMUInfo, error)
	MapDMA(iova uint64, mem []byte, flags uint32) error
	UnmapDMA(iova, size uint64) (uint64, error)
	Close() error
}

// Kind says what a mapping holds.
type Kind uint8

// Mapping kinds.
const (
	GuestRAM Kind = iota
	BAR
)

func (k Kind) String() string {
	if k == BAR {
		return "BAR"
	}
	return "guest RAM"
}

// Mapping is one DMA mapping the container holds.
type Mapping struct {
	IOVA uint64
	Size uint64
	Kind Kind
	Name string
	// Took is how long its VFIO_IOMMU_MAP_DMA call took: the kernel pins
	// or looks up every page there, so this is the mapping's launch cost.
	Took time.Duration
}

// End is the first IOVA after the mapping.
func (m Mapping) End() uint64 { return m.IOVA + m.Size }

// Options configures Open.
type Options struct {
	// ContainerPath is the container device; "" means /dev/vfio/vfio.
	ContainerPath string
	// GroupDir holds the group nodes; "" means /dev/vfio.
	GroupDir string
}

// Container is the VM's one VFIO container. Its methods are safe for
// concurrent use.
type Container struct {
	mu       sync.Mutex
	vc       *uapi.VFIOContainer // nil when built on a test Backend
	be       Backend
	groupDir string
	groups   map[int]*uapi.VFIOGroup
	order    []int // attach order, detached in reverse
	iommuSet bool
	info     uapi.VFIOIOMMUInfo
	maps     []Mapping
	mapCalls uint64
	closed   bool
}

// Open opens the VFIO container and checks that it speaks the VFIO API and
// offers the type1v2 IOMMU. The IOMMU model itself is chosen when the first
// group is added (the kernel needs a group attached first).
func Open(opts Options) (*Container, error) {
	path := opts.ContainerPath
	if path == "" {
		path = uapi.DevVFIOContainer
	}
	vc, err := uapi.OpenVFIOContainerPath(path)
	if err != nil {
		return nil, fmt.Errorf("iommu: %w", err)
	}
	fail := func(err error) (*Container, error) {
		vc.Close()
		return nil, fmt.Errorf("iommu: container %s: %w", path, err)
	}
	v, err := vc.APIVersion()
	if err != nil {
		return fail(err)
	}
	if v != uapi.VFIOAPIVersion {
		return fail(fmt.Errorf("VFIO API version %d, want %d", v, uapi.VFIOAPIVersion))
	}
	ok, err := vc.CheckExtension(uapi.VFIOType1v2IOMMU)
	if err != nil {
		return fail(err)
	}
	if !ok {
		return fail(errors.New("the kernel does not offer the type1v2 IOMMU (load vfio_iommu_type1; is the host IOMMU enabled, intel_iommu=on or amd_iommu=on?)"))
	}
	dir := opts.GroupDir
	if dir == "" {
		dir = uapi.DevVFIODir
	}
	return &Container{vc: vc, be: vc, groupDir: dir, groups: map[int]*uapi.VFIOGroup{}}, nil
}

// NewWithBackend returns a container over an already configured backend
// (its IOMMU set), for tests and alternative backends. AddGroup is not
// available on it.
func NewWithBackend(be Backend) (*Container, error) {
	info, err := be.IOMMUInfo()
	if err != nil {
		return nil, fmt.Errorf("iommu: %w", err)
	}
	return &Container{be: be, iommuSet: true, info: info, groups: map[int]*uapi.VFIOGroup{}}, nil
}

// AddGroup attaches IOMMU group n to the container (opening /dev/vfio/n
// and checking it is viable) and, for the first group, selects the type1v2
// IOMMU and reads its capabilities. Adding a group twice returns the same
// handle. The container owns the group: Close detaches and closes it.
func (c *Container) AddGroup(n int) (*uapi.VFIOGroup, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.vc == nil || c.closed {
		return nil, fmt.Errorf("iommu: add group %d: container is closed or has no VFIO backend", n)
	}
	if g, ok := c.groups[n]; ok {
		return g, nil
	}
	g, err := uapi.OpenVFIOGroupPath(filepath.Join(c.groupDir, strconv.Itoa(n)), n)
	if err != nil {
		return nil, fmt.Errorf("iommu: add group %d: %w", n, err)
	}
	viable, set, err := g.Status()
	if err == nil && !viable {
		err = fmt.Errorf("IOMMU group %d is not viable: some device in /sys/kernel/iommu_groups/%d/devices is bound to a host driver; bind every device of the group to vfio-pci (or unbind it)", n, n)
	}
	if err == nil && set {
		err = fmt.Errorf("IOMMU group %d is already attached to another container", n)
	}
	if err == nil {
		err = g.SetContainer(c.vc)
	}
	if err != nil {
		g.Close()
		return nil, fmt.Errorf("iommu: add group %d: %w", n, err)
	}
	if !c.iommuSet {
		if err := c.vc.SetIOMMU(uapi.VFIOType1v2IOMMU); err != nil {
			g.UnsetContainer()
			g.Close()
			return nil, fmt.Errorf("iommu: add group %d: %w", n, err)
		}
		c.iommuSet = true
	}
	// Every group can narrow the IOVA ranges (its devices' reserved
	// regions), so re-read the info after each attach.
	info, err := c.vc.IOMMUInfo()
	if err != nil {
		g.UnsetContainer()
		g.Close()
		return nil, fmt.Errorf("iommu: add group %d: %w", n, err)
	}
	c.info = info
	c.groups[n] = g
	c.order = append(c.order, n)
	return g, nil
}

// Info returns the container's IOMMU information as of the last AddGroup.
func (c *Container) Info() uapi.VFIOIOMMUInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.info
}

// PageSize returns the mapping granularity: the smallest IOMMU page size,
// 4 KiB when the kernel reports none.
func (c *Container) PageSize() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return minPage(c.info)
}

func minPage(info uapi.VFIOIOMMUInfo) uint64 {
	if info.PageSizes == 0 {
		return 4096
	}
	return 1 << bits.TrailingZeros64(info.PageSizes)
}

func formatRanges(rs []uapi.VFIOIOVARange) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("[%#x, %#x]", r.Start, r.End)
	}
	return strings.Join(parts, ", ")
}

// check validates one mapping request against the IOMMU's granularity and
// IOVA ranges and against existing mappings.
func (c *Container) check(iova uint64, mem []byte, what string) error {
	size := uint64(len(mem))
	if size == 0 {
		return fmt.Errorf("iommu: map %s at IOVA %#x: empty range", what, iova)
	}
	if iova+size < iova {
		return fmt.Errorf("iommu: map %s at IOVA %#x size %#x: range wraps the address space", what, iova, size)
	}
	// The host address must be aligned too; guest RAM and BAR mmaps are
	// page aligned by construction and the kernel rejects anything else.
	pg := minPage(c.info)
	if iova%pg != 0 || size%pg != 0 {
		return fmt.Errorf("iommu: map %s [%#x, %#x): not aligned to the IOMMU page size %#x (page sizes bitmap %#x)",
			what, iova, iova+size, pg, c.info.PageSizes)
	}
	if len(c.info.IOVARanges) > 0 {
		last := iova + size - 1
		inside := false
		for _, r := range c.info.IOVARanges {
			if iova >= r.Start && last <= r.End {
				inside = true
				break
			}
		}
		if !inside {
			hint := ""
			top := c.info.IOVARanges[len(c.info.IOVARanges)-1].End
			if last > top {
				hint = fmt.Sprintf("; the host IOMMU addresses only up to %#x (%d bits): use less guest memory or place BARs lower, or raise the IOMMU address width (e.g. intel-iommu aw-bits=48 in a nested host)", top, bits.Len64(top))
			}
			return fmt.Errorf("iommu: map %s [%#x, %#x]: outside the container's usable IOVA ranges %s%s",
				what, iova, last, formatRanges(c.info.IOVARanges), hint)
		}
	}
	for _, m := range c.maps {
		if iova < m.End() && m.IOVA < iova+size {
			return fmt.Errorf("iommu: map %s [%#x, %#x): overlaps existing %s mapping %q [%#x, %#x)", what, iova, iova+size, m.Kind, m.Name, m.IOVA, m.End())
		}
	}
	return nil
}

// MapGuestRAM DMA-maps every guest RAM region at IOVA = guest physical
// address, read-write, one VFIO_IOMMU_MAP_DMA per region. All regions are
// checked before any is mapped, and a failure unmaps what this call mapped,
// so an error leaves the container as it was.
func (c *Container) MapGuestRAM(regions []guestmem.Region) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("iommu: map guest RAM: container closed")
	}
	if c.info.HasDMAAvail && uint64(len(regions)) > uint64(c.info.DMAAvail) {
		return fmt.Errorf("iommu: map guest RAM: %d regions but the container accepts only %d more mappings (vfio_iommu_type1 dma_entry_limit)", len(regions), c.info.DMAAvail)
	}
	for i, r := range regions {
		if err := c.check(r.GPA, r.Data, fmt.Sprintf("guest RAM region %d", i)); err != nil {
			return err
		}
		for _, o := range regions[:i] {
			if r.GPA < o.End() && o.GPA < r.End() {
				return fmt.Errorf("iommu: map guest RAM: regions [%#x, %#x) and [%#x, %#x) overlap", o.GPA, o.End(), r.GPA, r.End())
			}
		}
	}
	var done []Mapping
	for i, r := range regions {
		c.mapCalls++
		start := time.Now()
		if err := c.be.MapDMA(r.GPA, r.Data, uapi.VFIODMAMapFlagRead|uapi.VFIODMAMapFlagWrite); err != nil {
			for _, m := range done {
				c.be.UnmapDMA(m.IOVA, m.Size)
			}
			return fmt.Errorf("iommu: map guest RAM region %d [%#x, %#x) after %v: %w", i, r.GPA, r.End(), time.Since(start).Round(time.Millisecond), err)
		}
		done = append(done, Mapping{IOVA: r.GPA, Size: r.Size(), Kind: GuestRAM, Name: fmt.Sprintf("ram%d", i), Took: time.Since(start)})
	}
	c.maps = append(c.maps, done...)
	return nil
}

// MapBAR DMA-maps a passed-through BAR's host mapping mem at IOVA iova (the
// guest address of the BAR), so other devices in the container can reach
// it (peer-to-peer). name labels the mapping in errors and Mappings.
func (c *Container) MapBAR(iova uint64, mem []byte, name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("iommu: map %s: container closed", name)
	}
	if err := c.check(iova, mem, name); err != nil {
		return err
	}
	c.mapCalls++
	start := time.Now()
	if err := c.be.MapDMA(iova, mem, uapi.VFIODMAMapFlagRead|uapi.VFIODMAMapFlagWrite); err != nil {
		return fmt.Errorf("iommu: map %s at IOVA %#x after %v: %w", name, iova, time.Since(start).Round(time.Millisecond), err)
	}
	c.maps = append(c.maps, Mapping{IOVA: iova, Size: uint64(len(mem)), Kind: BAR, Name: name, Took: time.Since(start)})
	return nil
}

// Mapping returns the mapping that starts at iova.
func (c *Container) Mapping(iova uint64) (Mapping, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.maps, func(m Mapping) bool { return m.IOVA == iova })
	if i < 0 {
		return Mapping{}, false
	}
	return c.maps[i], true
}

// Unmap removes the mapping that starts at iova.
func (c *Container) Unmap(iova uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.IndexFunc(c.maps, func(m Mapping) bool { return m.IOVA == iova })
	if i < 0 {
		return fmt.Errorf("iommu: unmap IOVA %#x: no mapping starts there", iova)
	}
	m := c.maps[i]
	if _, err := c.be.UnmapDMA(m.IOVA, m.Size); err != nil {
		return fmt.Errorf("iommu: unmap %s %q: %w", m.Kind, m.Name, err)
	}
	c.maps = slices.Delete(c.maps, i, i+1)
	return nil
}

// MapCalls returns how many VFIO_IOMMU_MAP_DMA calls the container made.
func (c *Container) MapCalls() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mapCalls
}

// Mappings returns the current mappings in the order they were made.
func (c *Container) Mappings() []Mapping {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.maps)
}

// UnmapAll removes every mapping, newest first, and reports every failure.
func (c *Container) UnmapAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unmapAll()
}

func (c *Container) unmapAll() error {
	var errs []error
	for i := len(c.maps) - 1; i >= 0; i-- {
		m := c.maps[i]
		if _, err := c.be.UnmapDMA(m.IOVA, m.Size); err != nil {
			errs = append(errs, fmt.Errorf("iommu: unmap %s %q: %w", m.Kind, m.Name, err))
		}
	}
	c.maps = nil
	return errors.Join(errs...)
}

// Close unmaps everything, detaches and closes the groups and closes the
// container. Devices opened from the groups must be closed first (the
// kernel keeps a group busy while a device fd is open). Closing twice is a
// no-op.
func (c *Container) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	errs := []error{c.unmapAll()}
	for i := len(c.order) - 1; i >= 0; i-- {
		g := c.groups[c.order[i]]
		if err := g.UnsetContainer(); err != nil {
			errs = append(errs, fmt.Errorf("iommu: %w", err))
		}
		if err := g.Close(); err != nil {
			errs = append(errs, fmt.Errorf("iommu: %w", err))
		}
	}
	c.groups, c.order = nil, nil
	if err := c.be.Close(); err != nil {
		errs = append(errs, fmt.Errorf("iommu: %w", err))
	}
	return errors.Join(errs...)
}

// Available reports whether this host can open a VFIO container at all, with
// the reason when not (for tests and preflight messages).
func Available() (bool, string) {
	if _, err := os.Stat(uapi.DevVFIOContainer); err != nil {
		return false, fmt.Sprintf("%s: %v (modprobe vfio-pci; the host needs an enabled IOMMU)", uapi.DevVFIOContainer, err)
	}
	return true, ""
}
