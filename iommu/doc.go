// Package iommu is hpcvmm's DMA address space for passed-through devices: one
// VFIO type1 container (/dev/vfio/vfio, VFIO_TYPE1v2_IOMMU) shared by every
// device of the VM, so the host IOMMU holds a single set of page tables and
// devices can reach each other (peer-to-peer) through it.
//
// Guest RAM is mapped with IOVA = guest physical address, exactly one
// VFIO_IOMMU_MAP_DMA per contiguous RAM region (never per page: type1 allows
// only 65,535 mappings by default, and every call pins and walks its pages),
// after checking each range against what the container reports: the usable
// IOVA ranges (the IOMMU's address width minus reserved windows such as the
// x86 MSI range 0xfee00000-0xfeefffff) and the page-size bitmap (the smallest
// page is the mapping granularity). The number of MAP_DMA calls is counted
// so tests and benchmarks can show the one-call-per-region property.
//
// BARs of passed-through devices may be mapped too (MapBAR), at the address
// the guest gave them, so one device can DMA into another's BAR (GPUDirect
// P2P and RDMA). The kernel walks VM_PFNMAP BAR mappings page by page on
// older kernels (6.1 took minutes for a 64 GiB BAR in the test bed), so
// callers map a BAR once per address, not on every decode toggle.
//
// # iommufd later
//
// The Linux successor to the type1 container is iommufd (/dev/iommu with
// IOMMU_IOAS_ALLOC, IOMMU_IOAS_MAP, and devices opened through
// /dev/vfio/devices/vfioN bound with VFIO_DEVICE_BIND_IOMMUFD). Its model maps
// one to one onto this package: Container is an IOAS, AddGroup becomes
// "attach a device cdev to the IOAS", MapGuestRAM/MapBAR/Unmap become
// IOMMU_IOAS_MAP/UNMAP with a fixed IOVA, and IOVA ranges come from
// IOMMU_IOAS_IOVA_RANGES. All policy (validation, counting, one mapping per
// region, bookkeeping for UnmapAll) sits above the Backend interface, so an
// iommufd backend is a new Backend implementation plus a different way to
// attach devices; the vfio package only needs a device fd either way.
package iommu
