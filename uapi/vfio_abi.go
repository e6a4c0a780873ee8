package uapi

import "unsafe"

// This file mirrors the C structures of linux/vfio.h that hpcvmm uses, field
// for field; vfio_abi_test.go checks every size, offset, ioctl number and
// constant against the header.

// vfioInfoCapHeader is struct vfio_info_cap_header: the link of every VFIO
// capability chain (region info, device info, IOMMU info). Next is the
// offset of the next header from the start of the enclosing info struct.
type vfioInfoCapHeader struct {
	ID      uint16
	Version uint16
	Next    uint32
}

// vfioGroupStatus is struct vfio_group_status.
type vfioGroupStatus struct {
	Argsz uint32
	Flags uint32
}

// vfioDeviceInfo is struct vfio_device_info.
type vfioDeviceInfo struct {
	Argsz      uint32
	Flags      uint32
	NumRegions uint32
	NumIRQs    uint32
	CapOffset  uint32
}

// vfioRegionInfo is struct vfio_region_info.
type vfioRegionInfo struct {
	Argsz     uint32
	Flags     uint32
	Index     uint32
	CapOffset uint32
	Size      uint64
	Offset    uint64
}

// vfioRegionSparseMmapArea is struct vfio_region_sparse_mmap_area.
type vfioRegionSparseMmapArea struct {
	Offset uint64
	Size   uint64
}

// vfioRegionInfoCapSparseMmap is the fixed part of struct
// vfio_region_info_cap_sparse_mmap; the areas follow.
type vfioRegionInfoCapSparseMmap struct {
	Header   vfioInfoCapHeader
	NrAreas  uint32
	Reserved uint32
}

// vfioRegionInfoCapType is struct vfio_region_info_cap_type.
type vfioRegionInfoCapType struct {
	Header  vfioInfoCapHeader
	Type    uint32
	Subtype uint32
}

// vfioIRQInfo is struct vfio_irq_info.
type vfioIRQInfo struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Count uint32
}

// vfioIRQSet is the fixed part of struct vfio_irq_set; the data follow.
type vfioIRQSet struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Start uint32
	Count uint32
}

// vfioIOMMUType1Info is struct vfio_iommu_type1_info (24 bytes: the
// trailing u32 is padded to the u64 alignment).
type vfioIOMMUType1Info struct {
	Argsz       uint32
	Flags       uint32
	IOVAPgsizes uint64
	CapOffset   uint32
	pad         uint32
}

// vfioIOVARange is struct vfio_iova_range (inclusive end).
type vfioIOVARange struct {
	Start uint64
	End   uint64
}

// vfioIOMMUType1InfoCapIOVARange is the fixed part of struct
// vfio_iommu_type1_info_cap_iova_range; the ranges follow.
type vfioIOMMUType1InfoCapIOVARange struct {
	Header   vfioInfoCapHeader
	NrIOVAs  uint32
	Reserved uint32
}

// vfioIOMMUType1InfoDMAAvail is struct vfio_iommu_type1_info_dma_avail.
type vfioIOMMUType1InfoDMAAvail struct {
	Header vfioInfoCapHeader
	Avail  uint32
}

// vfioIOMMUType1DMAMap is struct vfio_iommu_type1_dma_map.
type vfioIOMMUType1DMAMap struct {
	Argsz uint32
	Flags uint32
	Vaddr uint64
	IOVA  uint64
	Size  uint64
}

// vfioIOMMUType1DMAUnmap is the fixed part of struct
// vfio_iommu_type1_dma_unmap (no dirty bitmap data is ever passed).
type vfioIOMMUType1DMAUnmap struct {
	Argsz uint32
	Flags uint32
	IOVA  uint64
	Size  uint64
}

// VFIO ioctl encoding: every VFIO ioctl is _IO(VFIO_TYPE, VFIO_BASE + n);
// the argument sizes travel in the structs' argsz fields instead.
const (
	vfioType = ';'
	vfioBase = 100

	ioVFIO uintptr = iocNone<<iocDirShift | vfioType<<iocTypeShift
)

// VFIO ioctl numbers (container, group, device, type1 IOMMU).
const (
	vfioGetAPIVersion       = ioVFIO | (vfioBase + 0)
	vfioCheckExtension      = ioVFIO | (vfioBase + 1)
	vfioSetIOMMU            = ioVFIO | (vfioBase + 2)
	vfioGroupGetStatus      = ioVFIO | (vfioBase + 3)
	vfioGroupSetContainer   = ioVFIO | (vfioBase + 4)
	vfioGroupUnsetContainer = ioVFIO | (vfioBase + 5)
	vfioGroupGetDeviceFD    = ioVFIO | (vfioBase + 6)
	vfioDeviceGetInfo       = ioVFIO | (vfioBase + 7)
	vfioDeviceGetRegion     = ioVFIO | (vfioBase + 8)
	vfioDeviceGetIRQInfo    = ioVFIO | (vfioBase + 9)
	vfioDeviceSetIRQs       = ioVFIO | (vfioBase + 10)
	vfioDeviceReset         = ioVFIO | (vfioBase + 11)
	vfioIOMMUGetInfo        = ioVFIO | (vfioBase + 12)
	vfioIOMMUMapDMA         = ioVFIO | (vfioBase + 13)
	vfioIOMMUUnmapDMA       = ioVFIO | (vfioBase + 14)
)

// Sizes of the fixed structs, as the kernel expects them in argsz.
const (
	sizeofVFIOGroupStatus  = uint32(unsafe.Sizeof(vfioGroupStatus{}))
	sizeofVFIODeviceInfo   = uint32(unsafe.Sizeof(vfioDeviceInfo{}))
	sizeofVFIORegionInfo   = uint32(unsafe.Sizeof(vfioRegionInfo{}))
	sizeofVFIOIRQInfo      = uint32(unsafe.Sizeof(vfioIRQInfo{}))
	sizeofVFIOIRQSet       = uint32(unsafe.Sizeof(vfioIRQSet{}))
	sizeofVFIOIOMMUInfo    = uint32(unsafe.Sizeof(vfioIOMMUType1Info{}))
	sizeofVFIODMAMap       = uint32(unsafe.Sizeof(vfioIOMMUType1DMAMap{}))
	sizeofVFIODMAUnmap     = uint32(unsafe.Sizeof(vfioIOMMUType1DMAUnmap{}))
	sizeofVFIOCapHeader    = int(unsafe.Sizeof(vfioInfoCapHeader{}))
	sizeofVFIOSparseCap    = int(unsafe.Sizeof(vfioRegionInfoCapSparseMmap{}))
	sizeofVFIOSparseArea   = int(unsafe.Sizeof(vfioRegionSparseMmapArea{}))
	sizeofVFIOIOVARangeCap = int(unsafe.Sizeof(vfioIOMMUType1InfoCapIOVARange{}))
	sizeofVFIOIOVARange    = int(unsafe.Sizeof(vfioIOVARange{}))
	sizeofVFIODMAAvailCap  = int(unsafe.Sizeof(vfioIOMMUType1InfoDMAAvail{}))
	sizeofVFIOCapType      = int(unsafe.Sizeof(vfioRegionInfoCapType{}))
)

// Constants from linux/vfio.h.
const (
	// VFIOAPIVersion is VFIO_API_VERSION, the only container API version.
	VFIOAPIVersion = 0

	// VFIOType1IOMMU and VFIOType1v2IOMMU are container extensions and
	// SetIOMMU types; v2 is the one hpcvmm uses (it allows unmapping any
	// sub-range and has sane semantics for mapping MMIO).
	VFIOType1IOMMU   = 1
	VFIOType1v2IOMMU = 3
	// VFIOUnmapAll is the VFIO_UNMAP_ALL extension.
	VFIOUnmapAll = 9

	// VFIOGroupFlagsViable: every device in the group is bound to a VFIO
	// driver or to nothing. VFIOGroupFlagsContainerSet: the group is
	// attached to a container.
	VFIOGroupFlagsViable       = 1 << 0
	VFIOGroupFlagsContainerSet = 1 << 1

	// Device info flags.
	VFIODeviceFlagsReset = 1 << 0
	VFIODeviceFlagsPCI   = 1 << 1
	VFIODeviceFlagsCaps  = 1 << 7

	// Region info flags.
	VFIORegionInfoFlagRead  = 1 << 0
	VFIORegionInfoFlagWrite = 1 << 1
	VFIORegionInfoFlagMmap  = 1 << 2
	VFIORegionInfoFlagCaps  = 1 << 3

	// Region info capability IDs.
	VFIORegionInfoCapSparseMmap   = 1
	VFIORegionInfoCapType         = 2
	VFIORegionInfoCapMSIXMappable = 3

	// IRQ info flags.
	VFIOIRQInfoEventFD    = 1 << 0
	VFIOIRQInfoMaskable   = 1 << 1
	VFIOIRQInfoAutomasked = 1 << 2
	VFIOIRQInfoNoResize   = 1 << 3

	// SetIRQs flags: one data type and one action.
	VFIOIRQSetDataNone      = 1 << 0
	VFIOIRQSetDataBool      = 1 << 1
	VFIOIRQSetDataEventFD   = 1 << 2
	VFIOIRQSetActionMask    = 1 << 3
	VFIOIRQSetActionUnmask  = 1 << 4
	VFIOIRQSetActionTrigger = 1 << 5

	// vfio-pci's fixed region indexes.
	VFIOPCIBAR0RegionIndex   = 0
	VFIOPCIROMRegionIndex    = 6
	VFIOPCIConfigRegionIndex = 7
	VFIOPCIVGARegionIndex    = 8
	VFIOPCINumRegions        = 9

	// vfio-pci's fixed IRQ indexes.
	VFIOPCIINTxIRQIndex = 0
	VFIOPCIMSIIRQIndex  = 1
	VFIOPCIMSIXIRQIndex = 2
	VFIOPCIErrIRQIndex  = 3
	VFIOPCIReqIRQIndex  = 4

	// Type1 IOMMU info flags and capability IDs.
	VFIOIOMMUInfoPgsizes         = 1 << 0
	VFIOIOMMUInfoCaps            = 1 << 1
	VFIOIOMMUType1InfoCapIOVA    = 1
	VFIOIOMMUType1InfoCapMigrate = 2
	VFIOIOMMUType1InfoDMAAvail   = 3

	// DMA map flags: the device may read / write the mapping.
	VFIODMAMapFlagRead  = 1 << 0
	VFIODMAMapFlagWrite = 1 << 1
)
