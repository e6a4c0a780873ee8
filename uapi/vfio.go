package uapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Paths of the VFIO character devices.
const (
	// DevVFIOContainer is the container device: one open is one container.
	DevVFIOContainer = "/dev/vfio/vfio"
	// DevVFIODir holds one node per IOMMU group, named by group number.
	DevVFIODir = "/dev/vfio"
)

// vfioOpen opens a VFIO node read-write and close-on-exec, with a hint for
// the usual causes.
func vfioOpen(path string) (int, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV):
			hint = " (is the vfio-pci module loaded and the device bound to it? modprobe vfio-pci)"
		case errors.Is(err, unix.EBUSY):
			hint = " (another process, e.g. a second VMM, holds this VFIO group)"
		case errors.Is(err, unix.EACCES):
			hint = " (run as root or give the user access to the node)"
		case errors.Is(err, unix.EPERM):
			// File modes give EACCES; EPERM on a device node is the
			// device cgroup, which denies root as well.
			hint = " (this process's device cgroup denies it: under Slurm with ConstrainDevices=yes the job was not given this device; request its GRES, e.g. --gres=nic:1)"
		}
		return -1, fmt.Errorf("vfio: open %s: %w%s", path, err, hint)
	}
	return fd, nil
}

func closeFD(fd *int, what string) error {
	if *fd < 0 {
		return nil
	}
	err := unix.Close(*fd)
	*fd = -1
	if err != nil {
		return fmt.Errorf("vfio: close %s: %w", what, err)
	}
	return nil
}

// walkVFIOCaps follows a VFIO capability chain inside raw (an info struct
// and its trailing capabilities) from offset first, calling fn with each
// capability's bytes from its header to the next capability or the end of
// raw. Offsets below minOff (inside the fixed struct), past raw, or seen
// before end the walk with an error.
func walkVFIOCaps(raw []byte, first uint32, minOff int, fn func(id, version uint16, c []byte) error) error {
	le := binary.LittleEndian
	seen := map[uint32]bool{}
	for off := first; off != 0; {
		if int64(off) < int64(minOff) || int64(off)+int64(sizeofVFIOCapHeader) > int64(len(raw)) {
			return fmt.Errorf("capability at offset %d outside [%d, %d)", off, minOff, len(raw))
		}
		if seen[off] {
			return fmt.Errorf("capability chain loops at offset %d", off)
		}
		seen[off] = true
		id, ver, next := le.Uint16(raw[off:]), le.Uint16(raw[off+2:]), le.Uint32(raw[off+4:])
		end := uint32(len(raw))
		if next > off && next < end {
			end = next
		}
		if err := fn(id, ver, raw[off:end]); err != nil {
			return err
		}
		off = next
	}
	return nil
}

// VFIODevice is an open VFIO device fd: regions, interrupts, reset.
type VFIODevice struct {
	fd   int
	Name string
}

// NewVFIODevice wraps an already open VFIO device fd (e.g. from a cdev
// open under iommufd); the VFIODevice owns it.
func NewVFIODevice(fd int, name string) *VFIODevice { return &VFIODevice{fd: fd, Name: name} }

// FD returns the device's file descriptor.
func (d *VFIODevice) FD() int { return d.fd }

// Close closes the device fd. Closing twice is a no-op.
func (d *VFIODevice) Close() error { return closeFD(&d.fd, "device "+d.Name) }

// VFIODeviceInfo is VFIO_DEVICE_GET_INFO's answer.
type VFIODeviceInfo struct {
	Flags      uint32 // VFIODeviceFlags*
	NumRegions uint32
	NumIRQs    uint32
}

// Info is VFIO_DEVICE_GET_INFO.
func (d *VFIODevice) Info() (VFIODeviceInfo, error) {
	k := vfioDeviceInfo{Argsz: sizeofVFIODeviceInfo}
	if _, err := ioctlPtr(d.fd, vfioDeviceGetInfo, unsafe.Pointer(&k)); err != nil {
		return VFIODeviceInfo{}, fmt.Errorf("vfio: VFIO_DEVICE_GET_INFO (%s): %w", d.Name, err)
	}
	return VFIODeviceInfo{Flags: k.Flags, NumRegions: k.NumRegions, NumIRQs: k.NumIRQs}, nil
}

// VFIOSparseArea is one mmappable area of a region (relative to the region).
type VFIOSparseArea struct {
	Offset, Size uint64
}

// VFIORegionInfo is VFIO_DEVICE_GET_REGION_INFO's answer with its
// capabilities parsed.
type VFIORegionInfo struct {
	Index uint32
	Flags uint32 // VFIORegionInfoFlag*
	// Size is the region's length; zero for an unimplemented region.
	Size uint64
	// Offset is where the region starts in the device fd (for pread,
	// pwrite and mmap).
	Offset uint64
	// Sparse is true when the region carries a sparse-mmap capability:
	// only Areas may be mmapped (possibly none).
	Sparse bool
	Areas  []VFIOSparseArea
	// MSIXMappable: the MSI-X table and PBA inside this BAR may be mmapped.
	MSIXMappable bool
	// Type and Subtype are the region type capability (device-specific
	// regions), zero when absent.
	Type, Subtype uint32
}

// Mmappable reports whether the region may be mmapped at all.
func (r VFIORegionInfo) Mmappable() bool { return r.Flags&VFIORegionInfoFlagMmap != 0 }

// MmapAreas returns the parts of the region that may be mmapped: the sparse
// areas when the region has them, else the whole region when it is
// mmappable, else nothing.
func (r VFIORegionInfo) MmapAreas() []VFIOSparseArea {
	switch {
	case !r.Mmappable() || r.Size == 0:
		return nil
	case r.Sparse:
		return r.Areas
	}
	return []VFIOSparseArea{{Offset: 0, Size: r.Size}}
}

// RegionInfo is VFIO_DEVICE_GET_REGION_INFO for region index, repeated
// with a larger buffer when the capabilities do not fit.
func (d *VFIODevice) RegionInfo(index uint32) (VFIORegionInfo, error) {
	argsz := sizeofVFIORegionInfo
	for tries := 0; tries < 4; tries++ {
		buf := make([]uint64, (argsz+7)/8)
		hdr := (*vfioRegionInfo)(unsafe.Pointer(&buf[0]))
		hdr.Argsz, hdr.Index = argsz, index
		if _, err := ioctlPtr(d.fd, vfioDeviceGetRegion, unsafe.Pointer(&buf[0])); err != nil {
			return VFIORegionInfo{}, fmt.Errorf("vfio: VFIO_DEVICE_GET_REGION_INFO (%s, region %d): %w", d.Name, index, err)
		}
		if hdr.Argsz > argsz {
			argsz = hdr.Argsz
			continue
		}
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*8)[:argsz]
		info, err := ParseVFIORegionInfo(raw)
		if err != nil {
			return info, fmt.Errorf("vfio: %s region %d: %w", d.Name, index, err)
		}
		return info, nil
	}
	return VFIORegionInfo{}, fmt.Errorf("vfio: VFIO_DEVICE_GET_REGION_INFO (%s, region %d): the kernel kept asking for a larger buffer", d.Name, index)
}

// ParseVFIORegionInfo decodes a struct vfio_region_info buffer and its
// capability chain (sparse mmap, MSI-X mappable, region type). It never
// panics on malformed input.
func ParseVFIORegionInfo(raw []byte) (VFIORegionInfo, error) {
	if len(raw) < int(sizeofVFIORegionInfo) {
		return VFIORegionInfo{}, fmt.Errorf("region info: %d bytes, want at least %d", len(raw), sizeofVFIORegionInfo)
	}
	le := binary.LittleEndian
	var z vfioRegionInfo
	info := VFIORegionInfo{
		Flags:  le.Uint32(raw[unsafe.Offsetof(z.Flags):]),
		Index:  le.Uint32(raw[unsafe.Offsetof(z.Index):]),
		Size:   le.Uint64(raw[unsafe.Offsetof(z.Size):]),
		Offset: le.Uint64(raw[unsafe.Offsetof(z.Offset):]),
	}
	if info.Flags&VFIORegionInfoFlagCaps == 0 {
		return info, nil
	}
	first := le.Uint32(raw[unsafe.Offsetof(z.CapOffset):])
	err := walkVFIOCaps(raw, first, int(sizeofVFIORegionInfo), func(id, _ uint16, c []byte) error {
		switch id {
		case VFIORegionInfoCapSparseMmap:
			if len(c) < sizeofVFIOSparseCap {
				return fmt.Errorf("sparse mmap capability truncated (%d bytes)", len(c))
			}
			n := int(le.Uint32(c[unsafe.Offsetof(vfioRegionInfoCapSparseMmap{}.NrAreas):]))
			body := c[sizeofVFIOSparseCap:]
			if n > len(body)/sizeofVFIOSparseArea {
				return fmt.Errorf("sparse mmap capability claims %d areas in %d bytes", n, len(body))
			}
			info.Sparse = true
			for i := 0; i < n; i++ {
				a := body[i*sizeofVFIOSparseArea:]
				area := VFIOSparseArea{Offset: le.Uint64(a), Size: le.Uint64(a[8:])}
				if area.Size == 0 {
					continue
				}
				if area.Offset > info.Size || area.Size > info.Size-area.Offset {
					return fmt.Errorf("sparse mmap area %#x+%#x outside the %#x-byte region", area.Offset, area.Size, info.Size)
				}
				info.Areas = append(info.Areas, area)
			}
		case VFIORegionInfoCapMSIXMappable:
			info.MSIXMappable = true
		case VFIORegionInfoCapType:
			if len(c) < sizeofVFIOCapType {
				return fmt.Errorf("region type capability truncated (%d bytes)", len(c))
			}
			info.Type = le.Uint32(c[unsafe.Offsetof(vfioRegionInfoCapType{}.Type):])
			info.Subtype = le.Uint32(c[unsafe.Offsetof(vfioRegionInfoCapType{}.Subtype):])
		}
		return nil
	})
	return info, err
}

// VFIOIRQInfo is VFIO_DEVICE_GET_IRQ_INFO's answer.
type VFIOIRQInfo struct {
	Index uint32
	Flags uint32 // VFIOIRQInfo*
	Count uint32 // vectors; 0 when the device lacks this interrupt type
}

// IRQInfo is VFIO_DEVICE_GET_IRQ_INFO for IRQ index (VFIOPCI*IRQIndex).
func (d *VFIODevice) IRQInfo(index uint32) (VFIOIRQInfo, error) {
	k := vfioIRQInfo{Argsz: sizeofVFIOIRQInfo, Index: index}
	if _, err := ioctlPtr(d.fd, vfioDeviceGetIRQInfo, unsafe.Pointer(&k)); err != nil {
		return VFIOIRQInfo{}, fmt.Errorf("vfio: VFIO_DEVICE_GET_IRQ_INFO (%s, index %d): %w", d.Name, index, err)
	}
	return VFIOIRQInfo{Index: k.Index, Flags: k.Flags, Count: k.Count}, nil
}

// SetIRQEventFDs is VFIO_DEVICE_SET_IRQS with eventfd data: for action
// (VFIOIRQSetActionTrigger or VFIOIRQSetActionUnmask), vectors start..start+
// len(fds)-1 of index signal (trigger) or are unmasked by (unmask) fds[i];
// -1 tears down that vector's eventfd.
func (d *VFIODevice) SetIRQEventFDs(index, start, action uint32, fds []int32) error {
	hdr, data, p := flexBuf[vfioIRQSet, int32](len(fds))
	hdr.Argsz = sizeofVFIOIRQSet + uint32(4*len(fds))
	hdr.Flags = VFIOIRQSetDataEventFD | action
	hdr.Index, hdr.Start, hdr.Count = index, start, uint32(len(fds))
	copy(data, fds)
	if _, err := ioctlPtr(d.fd, vfioDeviceSetIRQs, p); err != nil {
		return fmt.Errorf("vfio: VFIO_DEVICE_SET_IRQS (%s, index %d, start %d, %d eventfds, action %#x): %w", d.Name, index, start, len(fds), action, err)
	}
	return nil
}

// SetIRQs is VFIO_DEVICE_SET_IRQS without data: action (mask, unmask or
// trigger) on vectors start..start+count-1 of index. Trigger with count 0
// disables the interrupt index altogether.
func (d *VFIODevice) SetIRQs(index, start, count, action uint32) error {
	s := vfioIRQSet{Argsz: sizeofVFIOIRQSet, Flags: VFIOIRQSetDataNone | action, Index: index, Start: start, Count: count}
	if _, err := ioctlPtr(d.fd, vfioDeviceSetIRQs, unsafe.Pointer(&s)); err != nil {
		return fmt.Errorf("vfio: VFIO_DEVICE_SET_IRQS (%s, index %d, start %d, count %d, action %#x): %w", d.Name, index, start, count, action, err)
	}
	return nil
}

// DisableIRQs turns interrupt index off (SetIRQs trigger, count 0).
func (d *VFIODevice) DisableIRQs(index uint32) error {
	return d.SetIRQs(index, 0, 0, VFIOIRQSetActionTrigger)
}

// Reset is VFIO_DEVICE_RESET (function-level or other reset the kernel
// chose). EINVAL/ENOTTY mean the device has no usable reset method.
func (d *VFIODevice) Reset() error {
	if _, err := ioctl(d.fd, vfioDeviceReset, 0); err != nil {
		return fmt.Errorf("vfio: VFIO_DEVICE_RESET (%s): %w", d.Name, err)
	}
	return nil
}

// ReadAt reads len(p) bytes at fd offset off (a region's Offset plus the
// offset inside the region): pread on the device fd.
func (d *VFIODevice) ReadAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(d.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("vfio: pread %s (%d bytes at %#x): %w", d.Name, len(p), off, err)
		}
		return n, nil
	}
}

// WriteAt writes p at fd offset off: pwrite on the device fd.
func (d *VFIODevice) WriteAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pwrite(d.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("vfio: pwrite %s (%d bytes at %#x): %w", d.Name, len(p), off, err)
		}
		return n, nil
	}
}

// Mmap maps size bytes of the device fd at off (page aligned, inside an
// mmappable area) shared, with prot (unix.PROT_*). Unmap it with Munmap.
//
// The address agrees with off modulo mmapAlignment(size) (up to 1 GiB).
// A BAR's physical address is naturally aligned and VFIO region offsets
// are multiples of 2^40, so the mapping then lines up with the BAR's
// physical pages: vfio-pci can fault it in with 2 MiB and 1 GiB page-table
// entries (Linux 6.12 and later), KVM can back the memslot with large pages
// (the guest-physical address is aligned the same way), and vfio type1
// walks it in large steps when it is DMA-mapped for peer-to-peer (6.15 and
// later). An mmap(2) address of the kernel's choosing is only 4 KiB aligned.
func (d *VFIODevice) Mmap(off int64, size int, prot int) ([]byte, error) {
	m, err := mmapAligned(d.fd, off, size, prot, mmapAlignment(size))
	if err != nil {
		return nil, fmt.Errorf("vfio: mmap %s (%#x bytes at %#x): %w", d.Name, size, off, err)
	}
	return m, nil
}

// Munmap unmaps memory returned by Mmap.
func (d *VFIODevice) Munmap(mem []byte) error {
	if len(mem) == 0 {
		return nil
	}
	if err := unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem))); err != nil {
		return fmt.Errorf("vfio: munmap %s (%#x bytes): %w", d.Name, len(mem), err)
	}
	return nil
}

// maxMmapAlignment is the largest page-table entry size on x86-64.
const maxMmapAlignment = 1 << 30

// mmapAlignment is the alignment Mmap gives a mapping of size bytes: the
// largest power of two not above size, between 4 KiB and 1 GiB.
func mmapAlignment(size int) int {
	if size <= 4096 {
		return 4096
	}
	a := 1 << (bits.Len(uint(size)) - 1)
	return min(a, maxMmapAlignment)
}

// mmapAligned maps size bytes of fd at off shared at an address congruent
// to off modulo align: it reserves size+2*align bytes of address space with
// PROT_NONE, maps the file over the aligned part with MAP_FIXED, and gives
// the rest of the reservation back.
func mmapAligned(fd int, off int64, size, prot, align int) ([]byte, error) {
	if size <= 0 || off < 0 || align <= 0 || align&(align-1) != 0 {
		return nil, unix.EINVAL
	}
	reserve := uintptr(size) + 2*uintptr(align)
	base, err := unix.MmapPtr(-1, 0, nil, reserve, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserving %#x bytes of address space: %w", reserve, err)
	}
	lo := uintptr(base)
	a := uintptr(align)
	addr := (lo+a-1)&^(a-1) + uintptr(off)&(a-1)
	if addr-a >= lo {
		addr -= a
	}
	p, err := unix.MmapPtr(fd, off, unsafe.Add(base, addr-lo), uintptr(size), prot, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		_ = unix.MunmapPtr(base, reserve)
		return nil, err
	}
	// Give back the reservation around the mapping; failing to would only
	// leave PROT_NONE address space behind, so the errors are not fatal.
	if addr > lo {
		_ = unix.MunmapPtr(base, addr-lo)
	}
	if end := addr + uintptr(size); end < lo+reserve {
		_ = unix.MunmapPtr(unsafe.Add(base, end-lo), lo+reserve-end)
	}
	return unsafe.Slice((*byte)(p), size), nil
}
