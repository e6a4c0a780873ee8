package vfio

import (
	"errors"
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/iommu"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// KVMDevices is the part of *uapi.VM the KVM-VFIO device needs.
type KVMDevices interface {
	CreateDevice(typ uint32) (int, error)
	SetDeviceAttrInt32(deviceFD int, group uint32, attr uint64, value int32) error
}

// KVMVFIO is the kvm-vfio pseudo device: KVM must know each VFIO group the
// VM uses, to honour the devices' no-snoop DMA (cache coherency on hosts
// whose IOMMU cannot enforce snooping) and to allow interrupt bypass
// (posted interrupts for VFIO MSI/MSI-X).
type KVMVFIO struct {
	vm     KVMDevices
	fd     int
	groups map[int]int // group number -> group fd
	closer func(int) error
}

// NewKVMVFIO creates the device (KVM_CREATE_DEVICE, KVM_DEV_TYPE_VFIO).
func NewKVMVFIO(vm KVMDevices) (*KVMVFIO, error) {
	fd, err := vm.CreateDevice(uapi.DeviceVFIO)
	if err != nil {
		return nil, fmt.Errorf("vfio: create the KVM-VFIO device: %w", err)
	}
	return &KVMVFIO{vm: vm, fd: fd, groups: map[int]int{}, closer: closeFD}, nil
}

// AddGroup is KVM_DEV_VFIO_GROUP_ADD for g; adding a group twice is a no-op.
func (k *KVMVFIO) AddGroup(g *uapi.VFIOGroup) error {
	if _, ok := k.groups[g.Group]; ok {
		return nil
	}
	if err := k.vm.SetDeviceAttrInt32(k.fd, uapi.DeviceAttrVFIOGroup, uapi.VFIOGroupAdd, int32(g.FD())); err != nil {
		return fmt.Errorf("vfio: add IOMMU group %d to KVM: %w", g.Group, err)
	}
	k.groups[g.Group] = g.FD()
	return nil
}

// Close removes every group (KVM_DEV_VFIO_GROUP_DEL) and closes the
// device. Call it before the groups are closed.
func (k *KVMVFIO) Close() error {
	var errs []error
	for n, fd := range k.groups {
		if err := k.vm.SetDeviceAttrInt32(k.fd, uapi.DeviceAttrVFIOGroup, uapi.VFIOGroupDel, int32(fd)); err != nil {
			errs = append(errs, fmt.Errorf("vfio: remove IOMMU group %d from KVM: %w", n, err))
		}
	}
	k.groups = map[int]int{}
	if k.fd >= 0 {
		if err := k.closer(k.fd); err != nil {
			errs = append(errs, fmt.Errorf("vfio: close the KVM-VFIO device: %w", err))
		}
		k.fd = -1
	}
	return errors.Join(errs...)
}

// OpenDevice opens dev (checked with CheckDevice and bound to vfio-pci)
// through the VM's container: its group is added to the container (which
// selects the type1v2 IOMMU with the first group) and to KVM, then the
// device fd is fetched from the group.
func OpenDevice(c *iommu.Container, kv *KVMVFIO, dev *host.Device) (*uapi.VFIODevice, error) {
	g, err := c.AddGroup(dev.IOMMUGroup)
	if err != nil {
		return nil, fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
	}
	if kv != nil {
		if err := kv.AddGroup(g); err != nil {
			return nil, fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
		}
	}
	d, err := g.DeviceFD(dev.BDF.String())
	if err != nil {
		return nil, fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
	}
	return d, nil
}
