package uapi

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// vhost ioctl numbers (linux/vhost.h); abi_net_test.go checks each.
const (
	vhostType = 0xAF

	ioVhost  uintptr = iocNone<<iocDirShift | vhostType<<iocTypeShift
	iowVhost uintptr = iocWrite<<iocDirShift | vhostType<<iocTypeShift
	iorVhost uintptr = iocRead<<iocDirShift | vhostType<<iocTypeShift

	vhostGetFeatures    = iorVhost | 8<<iocSizeShift // nr 0x00
	vhostSetFeatures    = iowVhost | 8<<iocSizeShift // nr 0x00
	vhostSetOwner       = ioVhost | 0x01
	vhostSetMemTable    = iowVhost | unsafe.Sizeof(vhostMemory{})<<iocSizeShift | 0x03
	vhostSetVringNum    = iowVhost | unsafe.Sizeof(vhostVringState{})<<iocSizeShift | 0x10
	vhostSetVringAddr   = iowVhost | unsafe.Sizeof(vhostVringAddr{})<<iocSizeShift | 0x11
	vhostSetVringBase   = iowVhost | unsafe.Sizeof(vhostVringState{})<<iocSizeShift | 0x12
	vhostSetVringKick   = iowVhost | unsafe.Sizeof(vhostVringFile{})<<iocSizeShift | 0x20
	vhostSetVringCall   = iowVhost | unsafe.Sizeof(vhostVringFile{})<<iocSizeShift | 0x21
	vhostNetSetBackend  = iowVhost | unsafe.Sizeof(vhostVringFile{})<<iocSizeShift | 0x30
	vhostPageSize       = 0x1000
	vhostMaxMemRegions  = 64 // the vhost module's default max_mem_regions
	vhostFileUnbind     = -1
	vhostNetVirtioHdrFB = 27
)

// Vhost feature bits (linux/vhost_types.h) beyond the virtio ones.
const (
	// VhostNetFVirtioNetHdr (VHOST_NET_F_VIRTIO_NET_HDR) makes vhost add
	// and strip the virtio-net header itself; hpcvmm leaves it clear and
	// lets the TAP (IFF_VNET_HDR) carry the header.
	VhostNetFVirtioNetHdr = uint64(1) << vhostNetVirtioHdrFB
	// VhostFLogAll (VHOST_F_LOG_ALL) is dirty logging for migration.
	VhostFLogAll = uint64(1) << 26
)

// vhostVringState mirrors struct vhost_vring_state.
type vhostVringState struct {
	Index uint32
	Num   uint32
}

// vhostVringFile mirrors struct vhost_vring_file.
type vhostVringFile struct {
	Index uint32
	FD    int32
}

// vhostVringAddr mirrors struct vhost_vring_addr.
type vhostVringAddr struct {
	Index         uint32
	Flags         uint32
	DescUserAddr  uint64
	UsedUserAddr  uint64
	AvailUserAddr uint64
	LogGuestAddr  uint64
}

// vhostMemory mirrors the header of struct vhost_memory.
type vhostMemory struct {
	NRegions uint32
	Padding  uint32
}

// vhostMemoryRegion mirrors struct vhost_memory_region.
type vhostMemoryRegion struct {
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
	FlagsPadding  uint64
}

// VhostRegion is one piece of guest RAM for VhostNet.SetMemTable: its
// guest-physical address and its host mapping (which must stay mapped for
// as long as the vhost instance lives).
type VhostRegion struct {
	GPA  uint64
	Data []byte
}

// VhostNet is an open /dev/vhost-net instance: one receive/transmit vring
// pair (index 0 receive, 1 transmit) served by a kernel thread.
type VhostNet struct {
	fd int
}

// OpenVhostNet opens /dev/vhost-net. Read-only: virtio-net opens its
// instances when the guest's driver writes DRIVER_OK, after the seccomp
// filter is on, and that filter refuses write-opens (a compromised thread
// must not open files for writing). vhost-net needs no write access: its
// open and every ioctl hpcvmm makes ignore the file's access mode, and
// read/write on it carry only IOTLB messages, which hpcvmm does not use.
func OpenVhostNet() (*VhostNet, error) {
	fd, err := unix.Open("/dev/vhost-net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vhost: open /dev/vhost-net: %w", err)
	}
	return &VhostNet{fd: fd}, nil
}

// Close releases the instance; the kernel stops its worker and drops its
// references to the TAP and the eventfds.
func (v *VhostNet) Close() error {
	if v.fd < 0 {
		return nil
	}
	err := unix.Close(v.fd)
	v.fd = -1
	if err != nil {
		return fmt.Errorf("vhost: close: %w", err)
	}
	return nil
}

// SetOwner binds the instance to the calling process (VHOST_SET_OWNER):
// the kernel worker then works in this process's address space.
func (v *VhostNet) SetOwner() error {
	if _, err := ioctl(v.fd, vhostSetOwner, 0); err != nil {
		return fmt.Errorf("vhost: VHOST_SET_OWNER: %w", err)
	}
	return nil
}

// Features returns the feature bits the kernel supports (VHOST_GET_FEATURES).
func (v *VhostNet) Features() (uint64, error) {
	var f uint64
	if _, err := ioctlPtr(v.fd, vhostGetFeatures, unsafe.Pointer(&f)); err != nil {
		return 0, fmt.Errorf("vhost: VHOST_GET_FEATURES: %w", err)
	}
	return f, nil
}

// SetFeatures sets the negotiated feature bits (VHOST_SET_FEATURES).
func (v *VhostNet) SetFeatures(f uint64) error {
	if _, err := ioctlPtr(v.fd, vhostSetFeatures, unsafe.Pointer(&f)); err != nil {
		return fmt.Errorf("vhost: VHOST_SET_FEATURES %#x: %w", f, err)
	}
	return nil
}

// SetMemTable gives the kernel the guest-physical to host-virtual map of
// guest RAM (VHOST_SET_MEM_TABLE). Regions must be page aligned.
func (v *VhostNet) SetMemTable(regions []VhostRegion) error {
	if len(regions) == 0 || len(regions) > vhostMaxMemRegions {
		return fmt.Errorf("vhost: VHOST_SET_MEM_TABLE: %d regions outside 1-%d", len(regions), vhostMaxMemRegions)
	}
	hdr, elems, p := flexBuf[vhostMemory, vhostMemoryRegion](len(regions))
	hdr.NRegions = uint32(len(regions))
	for i, r := range regions {
		if len(r.Data) == 0 {
			return fmt.Errorf("vhost: VHOST_SET_MEM_TABLE: region %d at %#x is empty", i, r.GPA)
		}
		hva := uint64(uintptr(unsafe.Pointer(&r.Data[0])))
		if r.GPA%vhostPageSize != 0 || hva%vhostPageSize != 0 || uint64(len(r.Data))%vhostPageSize != 0 {
			return fmt.Errorf("vhost: VHOST_SET_MEM_TABLE: region %d (gpa %#x, host %#x, size %#x) not page aligned", i, r.GPA, hva, len(r.Data))
		}
		elems[i] = vhostMemoryRegion{GuestPhysAddr: r.GPA, MemorySize: uint64(len(r.Data)), UserspaceAddr: hva}
	}
	if _, err := ioctlPtr(v.fd, vhostSetMemTable, p); err != nil {
		return fmt.Errorf("vhost: VHOST_SET_MEM_TABLE (%d regions): %w", len(regions), err)
	}
	return nil
}

func (v *VhostNet) vringState(req uintptr, name string, index, num uint32) error {
	s := vhostVringState{Index: index, Num: num}
	if _, err := ioctlPtr(v.fd, req, unsafe.Pointer(&s)); err != nil {
		return fmt.Errorf("vhost: %s (vring %d, %d): %w", name, index, num, err)
	}
	return nil
}

// SetVringNum sets vring index's size (VHOST_SET_VRING_NUM).
func (v *VhostNet) SetVringNum(index, num uint32) error {
	return v.vringState(vhostSetVringNum, "VHOST_SET_VRING_NUM", index, num)
}

// SetVringBase sets the next available index the kernel will read
// (VHOST_SET_VRING_BASE).
func (v *VhostNet) SetVringBase(index, base uint32) error {
	return v.vringState(vhostSetVringBase, "VHOST_SET_VRING_BASE", index, base)
}

// SetVringAddr gives vring index's descriptor table, available ring and
// used ring as host mappings of guest memory (VHOST_SET_VRING_ADDR).
func (v *VhostNet) SetVringAddr(index uint32, desc, avail, used []byte) error {
	if len(desc) == 0 || len(avail) == 0 || len(used) == 0 {
		return fmt.Errorf("vhost: VHOST_SET_VRING_ADDR (vring %d): empty ring", index)
	}
	a := vhostVringAddr{
		Index:         index,
		DescUserAddr:  uint64(uintptr(unsafe.Pointer(&desc[0]))),
		AvailUserAddr: uint64(uintptr(unsafe.Pointer(&avail[0]))),
		UsedUserAddr:  uint64(uintptr(unsafe.Pointer(&used[0]))),
	}
	if _, err := ioctlPtr(v.fd, vhostSetVringAddr, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("vhost: VHOST_SET_VRING_ADDR (vring %d): %w", index, err)
	}
	return nil
}

func (v *VhostNet) vringFile(req uintptr, name string, index uint32, fd int) error {
	f := vhostVringFile{Index: index, FD: int32(fd)}
	if _, err := ioctlPtr(v.fd, req, unsafe.Pointer(&f)); err != nil {
		return fmt.Errorf("vhost: %s (vring %d, fd %d): %w", name, index, fd, err)
	}
	return nil
}

// SetVringKick sets the eventfd the kernel polls for vring index's driver
// notifications (VHOST_SET_VRING_KICK).
func (v *VhostNet) SetVringKick(index uint32, fd int) error {
	return v.vringFile(vhostSetVringKick, "VHOST_SET_VRING_KICK", index, fd)
}

// SetVringCall sets the eventfd the kernel signals to interrupt the guest
// for vring index (VHOST_SET_VRING_CALL); -1 for none.
func (v *VhostNet) SetVringCall(index uint32, fd int) error {
	return v.vringFile(vhostSetVringCall, "VHOST_SET_VRING_CALL", index, fd)
}

// SetBackend attaches vring index to a TAP queue's file descriptor, or
// detaches it with -1 (VHOST_NET_SET_BACKEND). Attaching starts the data
// path.
func (v *VhostNet) SetBackend(index uint32, fd int) error {
	return v.vringFile(vhostNetSetBackend, "VHOST_NET_SET_BACKEND", index, fd)
}
