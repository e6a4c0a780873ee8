package uapi

import "unsafe"

// vfioABIItems lists every linux/vfio.h struct size, field offset, ioctl
// number and constant the VFIO mirrors use; abiItems appends them so
// TestABIConformance checks them against the header.
func vfioABIItems() []abiItem {
	const (
		capHdr = "struct vfio_info_cap_header"
		grp    = "struct vfio_group_status"
		dev    = "struct vfio_device_info"
		reg    = "struct vfio_region_info"
		area   = "struct vfio_region_sparse_mmap_area"
		sparse = "struct vfio_region_info_cap_sparse_mmap"
		rtype  = "struct vfio_region_info_cap_type"
		irq    = "struct vfio_irq_info"
		irqSet = "struct vfio_irq_set"
		info   = "struct vfio_iommu_type1_info"
		rng    = "struct vfio_iova_range"
		rngCap = "struct vfio_iommu_type1_info_cap_iova_range"
		avail  = "struct vfio_iommu_type1_info_dma_avail"
		dmaMap = "struct vfio_iommu_type1_dma_map"
		dmaUnm = "struct vfio_iommu_type1_dma_unmap"
	)
	var (
		h  vfioInfoCapHeader
		g  vfioGroupStatus
		d  vfioDeviceInfo
		r  vfioRegionInfo
		a  vfioRegionSparseMmapArea
		s  vfioRegionInfoCapSparseMmap
		t  vfioRegionInfoCapType
		q  vfioIRQInfo
		qs vfioIRQSet
		i  vfioIOMMUType1Info
		ir vfioIOVARange
		rc vfioIOMMUType1InfoCapIOVARange
		av vfioIOMMUType1InfoDMAAvail
		m  vfioIOMMUType1DMAMap
		u  vfioIOMMUType1DMAUnmap
	)
	return []abiItem{
		size(capHdr, unsafe.Sizeof(h)),
		off(capHdr, "id", unsafe.Offsetof(h.ID)), off(capHdr, "version", unsafe.Offsetof(h.Version)),
		off(capHdr, "next", unsafe.Offsetof(h.Next)),

		size(grp, unsafe.Sizeof(g)),
		off(grp, "argsz", unsafe.Offsetof(g.Argsz)), off(grp, "flags", unsafe.Offsetof(g.Flags)),

		size(dev, unsafe.Sizeof(d)),
		off(dev, "argsz", unsafe.Offsetof(d.Argsz)), off(dev, "flags", unsafe.Offsetof(d.Flags)),
		off(dev, "num_regions", unsafe.Offsetof(d.NumRegions)), off(dev, "num_irqs", unsafe.Offsetof(d.NumIRQs)),
		off(dev, "cap_offset", unsafe.Offsetof(d.CapOffset)),

		size(reg, unsafe.Sizeof(r)),
		off(reg, "argsz", unsafe.Offsetof(r.Argsz)), off(reg, "flags", unsafe.Offsetof(r.Flags)),
		off(reg, "index", unsafe.Offsetof(r.Index)), off(reg, "cap_offset", unsafe.Offsetof(r.CapOffset)),
		off(reg, "size", unsafe.Offsetof(r.Size)), off(reg, "offset", unsafe.Offsetof(r.Offset)),

		size(area, unsafe.Sizeof(a)),
		off(area, "offset", unsafe.Offsetof(a.Offset)), off(area, "size", unsafe.Offsetof(a.Size)),
		size(sparse, unsafe.Sizeof(s)),
		off(sparse, "header", unsafe.Offsetof(s.Header)), off(sparse, "nr_areas", unsafe.Offsetof(s.NrAreas)),
		off(sparse, "reserved", unsafe.Offsetof(s.Reserved)), off(sparse, "areas", unsafe.Sizeof(s)),
		size(rtype, unsafe.Sizeof(t)),
		off(rtype, "type", unsafe.Offsetof(t.Type)), off(rtype, "subtype", unsafe.Offsetof(t.Subtype)),

		size(irq, unsafe.Sizeof(q)),
		off(irq, "argsz", unsafe.Offsetof(q.Argsz)), off(irq, "flags", unsafe.Offsetof(q.Flags)),
		off(irq, "index", unsafe.Offsetof(q.Index)), off(irq, "count", unsafe.Offsetof(q.Count)),
		size(irqSet, unsafe.Sizeof(qs)),
		off(irqSet, "argsz", unsafe.Offsetof(qs.Argsz)), off(irqSet, "flags", unsafe.Offsetof(qs.Flags)),
		off(irqSet, "index", unsafe.Offsetof(qs.Index)), off(irqSet, "start", unsafe.Offsetof(qs.Start)),
		off(irqSet, "count", unsafe.Offsetof(qs.Count)), off(irqSet, "data", unsafe.Sizeof(qs)),

		size(info, unsafe.Sizeof(i)),
		off(info, "argsz", unsafe.Offsetof(i.Argsz)), off(info, "flags", unsafe.Offsetof(i.Flags)),
		off(info, "iova_pgsizes", unsafe.Offsetof(i.IOVAPgsizes)), off(info, "cap_offset", unsafe.Offsetof(i.CapOffset)),
		size(rng, unsafe.Sizeof(ir)),
		off(rng, "start", unsafe.Offsetof(ir.Start)), off(rng, "end", unsafe.Offsetof(ir.End)),
		size(rngCap, unsafe.Sizeof(rc)),
		off(rngCap, "header", unsafe.Offsetof(rc.Header)), off(rngCap, "nr_iovas", unsafe.Offsetof(rc.NrIOVAs)),
		off(rngCap, "reserved", unsafe.Offsetof(rc.Reserved)), off(rngCap, "iova_ranges", unsafe.Sizeof(rc)),
		size(avail, unsafe.Sizeof(av)),
		off(avail, "header", unsafe.Offsetof(av.Header)), off(avail, "avail", unsafe.Offsetof(av.Avail)),

		size(dmaMap, unsafe.Sizeof(m)),
		off(dmaMap, "argsz", unsafe.Offsetof(m.Argsz)), off(dmaMap, "flags", unsafe.Offsetof(m.Flags)),
		off(dmaMap, "vaddr", unsafe.Offsetof(m.Vaddr)), off(dmaMap, "iova", unsafe.Offsetof(m.IOVA)),
		off(dmaMap, "size", unsafe.Offsetof(m.Size)),
		size(dmaUnm, unsafe.Sizeof(u)),
		off(dmaUnm, "argsz", unsafe.Offsetof(u.Argsz)), off(dmaUnm, "flags", unsafe.Offsetof(u.Flags)),
		off(dmaUnm, "iova", unsafe.Offsetof(u.IOVA)), off(dmaUnm, "size", unsafe.Offsetof(u.Size)),
		off(dmaUnm, "data", unsafe.Sizeof(u)),

		// Ioctl numbers.
		val("VFIO_GET_API_VERSION", uint64(vfioGetAPIVersion)),
		val("VFIO_CHECK_EXTENSION", uint64(vfioCheckExtension)),
		val("VFIO_SET_IOMMU", uint64(vfioSetIOMMU)),
		val("VFIO_GROUP_GET_STATUS", uint64(vfioGroupGetStatus)),
		val("VFIO_GROUP_SET_CONTAINER", uint64(vfioGroupSetContainer)),
		val("VFIO_GROUP_UNSET_CONTAINER", uint64(vfioGroupUnsetContainer)),
		val("VFIO_GROUP_GET_DEVICE_FD", uint64(vfioGroupGetDeviceFD)),
		val("VFIO_DEVICE_GET_INFO", uint64(vfioDeviceGetInfo)),
		val("VFIO_DEVICE_GET_REGION_INFO", uint64(vfioDeviceGetRegion)),
		val("VFIO_DEVICE_GET_IRQ_INFO", uint64(vfioDeviceGetIRQInfo)),
		val("VFIO_DEVICE_SET_IRQS", uint64(vfioDeviceSetIRQs)),
		val("VFIO_DEVICE_RESET", uint64(vfioDeviceReset)),
		val("VFIO_IOMMU_GET_INFO", uint64(vfioIOMMUGetInfo)),
		val("VFIO_IOMMU_MAP_DMA", uint64(vfioIOMMUMapDMA)),
		val("VFIO_IOMMU_UNMAP_DMA", uint64(vfioIOMMUUnmapDMA)),

		// Constants.
		val("VFIO_API_VERSION", VFIOAPIVersion),
		val("VFIO_TYPE1_IOMMU", VFIOType1IOMMU),
		val("VFIO_TYPE1v2_IOMMU", VFIOType1v2IOMMU),
		val("VFIO_UNMAP_ALL", VFIOUnmapAll),
		val("VFIO_GROUP_FLAGS_VIABLE", VFIOGroupFlagsViable),
		val("VFIO_GROUP_FLAGS_CONTAINER_SET", VFIOGroupFlagsContainerSet),
		val("VFIO_DEVICE_FLAGS_RESET", VFIODeviceFlagsReset),
		val("VFIO_DEVICE_FLAGS_PCI", VFIODeviceFlagsPCI),
		val("VFIO_DEVICE_FLAGS_CAPS", VFIODeviceFlagsCaps),
		val("VFIO_REGION_INFO_FLAG_READ", VFIORegionInfoFlagRead),
		val("VFIO_REGION_INFO_FLAG_WRITE", VFIORegionInfoFlagWrite),
		val("VFIO_REGION_INFO_FLAG_MMAP", VFIORegionInfoFlagMmap),
		val("VFIO_REGION_INFO_FLAG_CAPS", VFIORegionInfoFlagCaps),
		val("VFIO_REGION_INFO_CAP_SPARSE_MMAP", VFIORegionInfoCapSparseMmap),
		val("VFIO_REGION_INFO_CAP_TYPE", VFIORegionInfoCapType),
		val("VFIO_REGION_INFO_CAP_MSIX_MAPPABLE", VFIORegionInfoCapMSIXMappable),
		val("VFIO_IRQ_INFO_EVENTFD", VFIOIRQInfoEventFD),
		val("VFIO_IRQ_INFO_MASKABLE", VFIOIRQInfoMaskable),
		val("VFIO_IRQ_INFO_AUTOMASKED", VFIOIRQInfoAutomasked),
		val("VFIO_IRQ_INFO_NORESIZE", VFIOIRQInfoNoResize),
		val("VFIO_IRQ_SET_DATA_NONE", VFIOIRQSetDataNone),
		val("VFIO_IRQ_SET_DATA_BOOL", VFIOIRQSetDataBool),
		val("VFIO_IRQ_SET_DATA_EVENTFD", VFIOIRQSetDataEventFD),
		val("VFIO_IRQ_SET_ACTION_MASK", VFIOIRQSetActionMask),
		val("VFIO_IRQ_SET_ACTION_UNMASK", VFIOIRQSetActionUnmask),
		val("VFIO_IRQ_SET_ACTION_TRIGGER", VFIOIRQSetActionTrigger),
		val("VFIO_PCI_BAR0_REGION_INDEX", VFIOPCIBAR0RegionIndex),
		val("VFIO_PCI_ROM_REGION_INDEX", VFIOPCIROMRegionIndex),
		val("VFIO_PCI_CONFIG_REGION_INDEX", VFIOPCIConfigRegionIndex),
		val("VFIO_PCI_VGA_REGION_INDEX", VFIOPCIVGARegionIndex),
		val("VFIO_PCI_NUM_REGIONS", VFIOPCINumRegions),
		val("VFIO_PCI_INTX_IRQ_INDEX", VFIOPCIINTxIRQIndex),
		val("VFIO_PCI_MSI_IRQ_INDEX", VFIOPCIMSIIRQIndex),
		val("VFIO_PCI_MSIX_IRQ_INDEX", VFIOPCIMSIXIRQIndex),
		val("VFIO_PCI_ERR_IRQ_INDEX", VFIOPCIErrIRQIndex),
		val("VFIO_PCI_REQ_IRQ_INDEX", VFIOPCIReqIRQIndex),
		val("VFIO_IOMMU_INFO_PGSIZES", VFIOIOMMUInfoPgsizes),
		val("VFIO_IOMMU_INFO_CAPS", VFIOIOMMUInfoCaps),
		val("VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE", VFIOIOMMUType1InfoCapIOVA),
		val("VFIO_IOMMU_TYPE1_INFO_CAP_MIGRATION", VFIOIOMMUType1InfoCapMigrate),
		val("VFIO_IOMMU_TYPE1_INFO_DMA_AVAIL", VFIOIOMMUType1InfoDMAAvail),
		val("VFIO_DMA_MAP_FLAG_READ", VFIODMAMapFlagRead),
		val("VFIO_DMA_MAP_FLAG_WRITE", VFIODMAMapFlagWrite),
	}
}
