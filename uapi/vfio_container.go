package uapi

// The VFIO container: the IOMMU context, its IOVA ranges and DMA mappings.

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"unsafe"
)

// VFIOContainer is an open /dev/vfio/vfio: the IOMMU context shared by the
// groups attached to it (type1 IOMMU ioctls).
type VFIOContainer struct {
	fd int
}

// OpenVFIOContainer opens DevVFIOContainer.
func OpenVFIOContainer() (*VFIOContainer, error) { return OpenVFIOContainerPath(DevVFIOContainer) }

// OpenVFIOContainerPath opens a VFIO container device at path.
func OpenVFIOContainerPath(path string) (*VFIOContainer, error) {
	fd, err := vfioOpen(path)
	if err != nil {
		return nil, err
	}
	return &VFIOContainer{fd: fd}, nil
}

// FD returns the container's file descriptor.
func (c *VFIOContainer) FD() int { return c.fd }

// Close closes the container; the kernel drops its DMA mappings once no
// group is attached. Closing twice is a no-op.
func (c *VFIOContainer) Close() error { return closeFD(&c.fd, "container") }

// APIVersion is VFIO_GET_API_VERSION; it must be VFIOAPIVersion.
func (c *VFIOContainer) APIVersion() (int, error) {
	r, err := ioctl(c.fd, vfioGetAPIVersion, 0)
	if err != nil {
		return 0, fmt.Errorf("vfio: VFIO_GET_API_VERSION: %w", err)
	}
	return int(r), nil
}

// CheckExtension is VFIO_CHECK_EXTENSION: whether the container supports
// ext (e.g. VFIOType1v2IOMMU).
func (c *VFIOContainer) CheckExtension(ext int) (bool, error) {
	r, err := ioctl(c.fd, vfioCheckExtension, uintptr(ext))
	if err != nil {
		return false, fmt.Errorf("vfio: VFIO_CHECK_EXTENSION (%d): %w", ext, err)
	}
	return r > 0, nil
}

// SetIOMMU is VFIO_SET_IOMMU: choose the IOMMU model. At least one group
// must already be attached (VFIOGroup.SetContainer).
func (c *VFIOContainer) SetIOMMU(typ int) error {
	if _, err := ioctl(c.fd, vfioSetIOMMU, uintptr(typ)); err != nil {
		return fmt.Errorf("vfio: VFIO_SET_IOMMU (type %d): %w", typ, err)
	}
	return nil
}

// VFIOIOVARange is an IOVA range the container can map, End inclusive.
type VFIOIOVARange struct {
	Start, End uint64
}

// VFIOIOMMUInfo is what VFIO_IOMMU_GET_INFO reports about a type1 container.
type VFIOIOMMUInfo struct {
	// Flags are VFIOIOMMUInfo* bits.
	Flags uint32
	// PageSizes is the bitmap of IOMMU page sizes: the lowest set bit is
	// the mapping granularity (every IOVA, size and address aligned to it).
	PageSizes uint64
	// IOVARanges are the usable IOVA ranges, sorted; empty when the kernel
	// does not report them (before 5.4), meaning "not known".
	IOVARanges []VFIOIOVARange
	// DMAAvail is how many more DMA mappings the container accepts
	// (vfio_iommu_type1's dma_entry_limit minus mappings made), valid when
	// HasDMAAvail.
	DMAAvail    uint32
	HasDMAAvail bool
}

// IOMMUInfo is VFIO_IOMMU_GET_INFO with its capability chain parsed. The
// call is repeated with a larger buffer when the kernel asks for one.
func (c *VFIOContainer) IOMMUInfo() (VFIOIOMMUInfo, error) {
	argsz := sizeofVFIOIOMMUInfo
	for tries := 0; tries < 4; tries++ {
		buf := make([]uint64, (argsz+7)/8)
		hdr := (*vfioIOMMUType1Info)(unsafe.Pointer(&buf[0]))
		hdr.Argsz = argsz
		if _, err := ioctlPtr(c.fd, vfioIOMMUGetInfo, unsafe.Pointer(&buf[0])); err != nil {
			return VFIOIOMMUInfo{}, fmt.Errorf("vfio: VFIO_IOMMU_GET_INFO: %w", err)
		}
		if hdr.Argsz > argsz {
			argsz = hdr.Argsz
			continue
		}
		raw := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(buf)*8)[:argsz]
		return ParseVFIOIOMMUInfo(raw)
	}
	return VFIOIOMMUInfo{}, fmt.Errorf("vfio: VFIO_IOMMU_GET_INFO: the kernel kept asking for a larger buffer (%d bytes)", argsz)
}

// ParseVFIOIOMMUInfo decodes a struct vfio_iommu_type1_info buffer as the
// kernel filled it, including the IOVA-range and DMA-available
// capabilities. It never panics on malformed input.
func ParseVFIOIOMMUInfo(raw []byte) (VFIOIOMMUInfo, error) {
	if len(raw) < int(sizeofVFIOIOMMUInfo) {
		return VFIOIOMMUInfo{}, fmt.Errorf("vfio: IOMMU info: %d bytes, want at least %d", len(raw), sizeofVFIOIOMMUInfo)
	}
	le := binary.LittleEndian
	info := VFIOIOMMUInfo{
		Flags:     le.Uint32(raw[unsafe.Offsetof(vfioIOMMUType1Info{}.Flags):]),
		PageSizes: le.Uint64(raw[unsafe.Offsetof(vfioIOMMUType1Info{}.IOVAPgsizes):]),
	}
	if info.Flags&VFIOIOMMUInfoPgsizes == 0 {
		info.PageSizes = 0
	}
	if info.Flags&VFIOIOMMUInfoCaps == 0 {
		return info, nil
	}
	first := le.Uint32(raw[unsafe.Offsetof(vfioIOMMUType1Info{}.CapOffset):])
	err := walkVFIOCaps(raw, first, int(sizeofVFIOIOMMUInfo), func(id, _ uint16, c []byte) error {
		switch id {
		case VFIOIOMMUType1InfoCapIOVA:
			if len(c) < sizeofVFIOIOVARangeCap {
				return fmt.Errorf("IOVA range capability truncated (%d bytes)", len(c))
			}
			n := int(le.Uint32(c[unsafe.Offsetof(vfioIOMMUType1InfoCapIOVARange{}.NrIOVAs):]))
			body := c[sizeofVFIOIOVARangeCap:]
			if n > len(body)/sizeofVFIOIOVARange {
				return fmt.Errorf("IOVA range capability claims %d ranges in %d bytes", n, len(body))
			}
			for i := 0; i < n; i++ {
				r := body[i*sizeofVFIOIOVARange:]
				info.IOVARanges = append(info.IOVARanges, VFIOIOVARange{Start: le.Uint64(r), End: le.Uint64(r[8:])})
			}
		case VFIOIOMMUType1InfoDMAAvail:
			if len(c) < sizeofVFIODMAAvailCap {
				return fmt.Errorf("DMA-available capability truncated (%d bytes)", len(c))
			}
			info.DMAAvail = le.Uint32(c[unsafe.Offsetof(vfioIOMMUType1InfoDMAAvail{}.Avail):])
			info.HasDMAAvail = true
		}
		return nil
	})
	if err != nil {
		return info, fmt.Errorf("vfio: IOMMU info: %w", err)
	}
	return info, nil
}

// MapDMA is VFIO_IOMMU_MAP_DMA: make mem reachable by the container's
// devices at iova. flags are VFIODMAMapFlag* bits. The kernel pins the
// pages for as long as the mapping exists.
func (c *VFIOContainer) MapDMA(iova uint64, mem []byte, flags uint32) error {
	if len(mem) == 0 {
		return fmt.Errorf("vfio: VFIO_IOMMU_MAP_DMA (iova %#x): empty mapping", iova)
	}
	m := vfioIOMMUType1DMAMap{
		Argsz: sizeofVFIODMAMap, Flags: flags,
		Vaddr: uint64(uintptr(unsafe.Pointer(&mem[0]))), IOVA: iova, Size: uint64(len(mem)),
	}
	_, err := ioctlPtr(c.fd, vfioIOMMUMapDMA, unsafe.Pointer(&m))
	runtime.KeepAlive(mem)
	if err != nil {
		return fmt.Errorf("vfio: VFIO_IOMMU_MAP_DMA (iova %#x, size %#x, vaddr %#x, flags %#x): %w", iova, m.Size, m.Vaddr, flags, err)
	}
	return nil
}

// UnmapDMA is VFIO_IOMMU_UNMAP_DMA of [iova, iova+size); it returns how
// many bytes the kernel unmapped.
func (c *VFIOContainer) UnmapDMA(iova, size uint64) (uint64, error) {
	u := vfioIOMMUType1DMAUnmap{Argsz: sizeofVFIODMAUnmap, IOVA: iova, Size: size}
	if _, err := ioctlPtr(c.fd, vfioIOMMUUnmapDMA, unsafe.Pointer(&u)); err != nil {
		return 0, fmt.Errorf("vfio: VFIO_IOMMU_UNMAP_DMA (iova %#x, size %#x): %w", iova, size, err)
	}
	return u.Size, nil
}
