package uapi

// The VFIO group: one IOMMU group, attached to a container, handing out device fds.

import (
	"fmt"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VFIOGroup is an open /dev/vfio/N: one IOMMU group.
type VFIOGroup struct {
	fd    int
	Group int
}

// OpenVFIOGroup opens /dev/vfio/<group>.
func OpenVFIOGroup(group int) (*VFIOGroup, error) {
	return OpenVFIOGroupPath(DevVFIODir+"/"+strconv.Itoa(group), group)
}

// OpenVFIOGroupPath opens a VFIO group node at path for group number group.
func OpenVFIOGroupPath(path string, group int) (*VFIOGroup, error) {
	fd, err := vfioOpen(path)
	if err != nil {
		return nil, err
	}
	return &VFIOGroup{fd: fd, Group: group}, nil
}

// FD returns the group's file descriptor (what KVM_DEV_VFIO_GROUP_ADD takes).
func (g *VFIOGroup) FD() int { return g.fd }

// Close closes the group. Closing twice is a no-op.
func (g *VFIOGroup) Close() error { return closeFD(&g.fd, "group "+strconv.Itoa(g.Group)) }

// Status is VFIO_GROUP_GET_STATUS.
func (g *VFIOGroup) Status() (viable, containerSet bool, err error) {
	s := vfioGroupStatus{Argsz: sizeofVFIOGroupStatus}
	if _, err := ioctlPtr(g.fd, vfioGroupGetStatus, unsafe.Pointer(&s)); err != nil {
		return false, false, fmt.Errorf("vfio: VFIO_GROUP_GET_STATUS (group %d): %w", g.Group, err)
	}
	return s.Flags&VFIOGroupFlagsViable != 0, s.Flags&VFIOGroupFlagsContainerSet != 0, nil
}

// SetContainer is VFIO_GROUP_SET_CONTAINER: attach the group to c.
func (g *VFIOGroup) SetContainer(c *VFIOContainer) error {
	fd := heapInt32(int32(c.fd))
	_, err := ioctlPtr(g.fd, vfioGroupSetContainer, unsafe.Pointer(fd))
	runtime.KeepAlive(fd)
	if err != nil {
		return fmt.Errorf("vfio: VFIO_GROUP_SET_CONTAINER (group %d, container fd %d): %w", g.Group, c.fd, err)
	}
	return nil
}

// UnsetContainer is VFIO_GROUP_UNSET_CONTAINER.
func (g *VFIOGroup) UnsetContainer() error {
	if _, err := ioctl(g.fd, vfioGroupUnsetContainer, 0); err != nil {
		return fmt.Errorf("vfio: VFIO_GROUP_UNSET_CONTAINER (group %d): %w", g.Group, err)
	}
	return nil
}

// DeviceFD is VFIO_GROUP_GET_DEVICE_FD: open the device named name (a PCI
// device's BDF, "0000:82:00.0"). The group must be in a container with an
// IOMMU set.
func (g *VFIOGroup) DeviceFD(name string) (*VFIODevice, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return nil, fmt.Errorf("vfio: VFIO_GROUP_GET_DEVICE_FD (group %d, %q): %w", g.Group, name, err)
	}
	r, err := ioctlPtr(g.fd, vfioGroupGetDeviceFD, unsafe.Pointer(p))
	runtime.KeepAlive(p)
	if err != nil {
		return nil, fmt.Errorf("vfio: VFIO_GROUP_GET_DEVICE_FD (group %d, %s): %w", g.Group, name, err)
	}
	return &VFIODevice{fd: int(r), Name: name}, nil
}
