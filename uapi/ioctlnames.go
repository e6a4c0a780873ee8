package uapi

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctlNames maps the C name of every ioctl request hpcvmm issues to its
// number, so that code outside this package (the seccomp allow-list of
// ioctl requests) can name requests without spelling a number. The
// terminal requests come from x/sys/unix (the console's raw mode and its
// restore, the window size).
var ioctlNames = map[string]uintptr{
	"KVM_GET_API_VERSION":        kvmGetAPIVersion,
	"KVM_CREATE_VM":              kvmCreateVM,
	"KVM_GET_MSR_INDEX_LIST":     kvmGetMSRIndexList,
	"KVM_CHECK_EXTENSION":        kvmCheckExtension,
	"KVM_GET_VCPU_MMAP_SIZE":     kvmGetVCPUMmapSize,
	"KVM_GET_SUPPORTED_CPUID":    kvmGetSupportedCPUID,
	"KVM_CREATE_VCPU":            kvmCreateVCPU,
	"KVM_SET_USER_MEMORY_REGION": kvmSetUserMemoryRegion,
	"KVM_SET_TSS_ADDR":           kvmSetTSSAddr,
	"KVM_SET_IDENTITY_MAP_ADDR":  kvmSetIdentityMapAddr,
	"KVM_CREATE_IRQCHIP":         kvmCreateIRQChip,
	"KVM_IRQ_LINE":               kvmIRQLine,
	"KVM_SET_GSI_ROUTING":        kvmSetGSIRouting,
	"KVM_IRQFD":                  kvmIRQFD,
	"KVM_CREATE_PIT2":            kvmCreatePIT2,
	"KVM_IOEVENTFD":              kvmIOEventFD,
	"KVM_SIGNAL_MSI":             kvmSignalMSI,
	"KVM_ENABLE_CAP":             kvmEnableCap,
	"KVM_CREATE_DEVICE":          kvmCreateDevice,
	"KVM_SET_DEVICE_ATTR":        kvmSetDeviceAttr,
	"KVM_GET_DEVICE_ATTR":        kvmGetDeviceAttr,
	"KVM_HAS_DEVICE_ATTR":        kvmHasDeviceAttr,
	"KVM_GET_STATS_FD":           kvmGetStatsFD,
	"KVM_RUN":                    kvmRun,
	"KVM_GET_REGS":               kvmGetRegs,
	"KVM_SET_REGS":               kvmSetRegs,
	"KVM_GET_SREGS":              kvmGetSregs,
	"KVM_SET_SREGS":              kvmSetSregs,
	"KVM_GET_MSRS":               kvmGetMSRs,
	"KVM_SET_MSRS":               kvmSetMSRs,
	"KVM_GET_FPU":                kvmGetFPU,
	"KVM_SET_FPU":                kvmSetFPU,
	"KVM_GET_LAPIC":              kvmGetLAPIC,
	"KVM_SET_LAPIC":              kvmSetLAPIC,
	"KVM_SET_CPUID2":             kvmSetCPUID2,
	"KVM_GET_MP_STATE":           kvmGetMPState,
	"KVM_SET_MP_STATE":           kvmSetMPState,
	"KVM_NMI":                    kvmNMI,
	"KVM_GET_XCRS":               kvmGetXCRs,
	"KVM_SET_XCRS":               kvmSetXCRs,

	"VFIO_GET_API_VERSION":        vfioGetAPIVersion,
	"VFIO_CHECK_EXTENSION":        vfioCheckExtension,
	"VFIO_SET_IOMMU":              vfioSetIOMMU,
	"VFIO_GROUP_GET_STATUS":       vfioGroupGetStatus,
	"VFIO_GROUP_SET_CONTAINER":    vfioGroupSetContainer,
	"VFIO_GROUP_UNSET_CONTAINER":  vfioGroupUnsetContainer,
	"VFIO_GROUP_GET_DEVICE_FD":    vfioGroupGetDeviceFD,
	"VFIO_DEVICE_GET_INFO":        vfioDeviceGetInfo,
	"VFIO_DEVICE_GET_REGION_INFO": vfioDeviceGetRegion,
	"VFIO_DEVICE_GET_IRQ_INFO":    vfioDeviceGetIRQInfo,
	"VFIO_DEVICE_SET_IRQS":        vfioDeviceSetIRQs,
	"VFIO_DEVICE_RESET":           vfioDeviceReset,
	"VFIO_IOMMU_GET_INFO":         vfioIOMMUGetInfo,
	"VFIO_IOMMU_MAP_DMA":          vfioIOMMUMapDMA,
	"VFIO_IOMMU_UNMAP_DMA":        vfioIOMMUUnmapDMA,

	"VHOST_GET_FEATURES":    vhostGetFeatures,
	"VHOST_SET_FEATURES":    vhostSetFeatures,
	"VHOST_SET_OWNER":       vhostSetOwner,
	"VHOST_SET_MEM_TABLE":   vhostSetMemTable,
	"VHOST_SET_VRING_NUM":   vhostSetVringNum,
	"VHOST_SET_VRING_ADDR":  vhostSetVringAddr,
	"VHOST_SET_VRING_BASE":  vhostSetVringBase,
	"VHOST_SET_VRING_KICK":  vhostSetVringKick,
	"VHOST_SET_VRING_CALL":  vhostSetVringCall,
	"VHOST_NET_SET_BACKEND": vhostNetSetBackend,

	"TUNSETIFF":       tunSetIFF,
	"TUNSETPERSIST":   tunSetPersist,
	"TUNSETOWNER":     tunSetOwner,
	"TUNSETGROUP":     tunSetGroup,
	"TUNSETOFFLOAD":   tunSetOffload,
	"TUNGETIFF":       tunGetIFF,
	"TUNSETVNETHDRSZ": tunSetVnetHdrSz,
	"TUNSETQUEUE":     tunSetQueue,

	"TCGETS":     unix.TCGETS,
	"TCSETS":     unix.TCSETS,
	"TCSETSW":    unix.TCSETSW,
	"TCSETSF":    unix.TCSETSF,
	"TIOCGWINSZ": unix.TIOCGWINSZ,
}

// IoctlRequest returns the number of the ioctl request hpcvmm knows by its
// C name (as in linux/kvm.h, linux/vfio.h, linux/vhost.h, linux/if_tun.h and
// asm-generic/ioctls.h); ok is false for a name hpcvmm never issues.
func IoctlRequest(name string) (req uintptr, ok bool) {
	req, ok = ioctlNames[name]
	return req, ok
}

// SetThreadName names the calling thread (prctl PR_SET_NAME, at most 15
// bytes kept), as /proc/PID/task/TID/comm shows it. Unlike a write of that
// file it opens nothing, so it runs under a seccomp filter that refuses
// write-opens.
func SetThreadName(name string) error {
	b := make([]byte, len(name)+1) // NUL-terminated
	copy(b, name)
	return unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
}
