package uapi

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// VM is a KVM virtual machine fd: memory slots, the in-kernel interrupt
// controllers and routing, eventfd wiring, devices, and vCPU creation.
type VM struct {
	fd       int
	mmapSize int // KVM_GET_VCPU_MMAP_SIZE, the kvm_run mapping size
}

// FD returns the VM file descriptor.
func (vm *VM) FD() int { return vm.fd }

// VCPUMmapSize returns the size of each vCPU's kvm_run mapping.
func (vm *VM) VCPUMmapSize() int { return vm.mmapSize }

// Close closes the VM fd. The kernel frees the VM once its vCPU fds and
// device fds are closed too. Closing twice is a no-op.
func (vm *VM) Close() error {
	if vm.fd < 0 {
		return nil
	}
	err := unix.Close(vm.fd)
	vm.fd = -1
	if err != nil {
		return fmt.Errorf("kvm: close VM fd: %w", err)
	}
	return nil
}

// CheckExtension is KVM_CHECK_EXTENSION on the VM fd, which answers for
// this VM (e.g. CapMaxVCPUs, CapX86DisableExits) rather than the host.
func (vm *VM) CheckExtension(c Cap) (int, error) { return checkExtension(vm.fd, c) }

// SetTSSAddr is KVM_SET_TSS_ADDR: three pages of guest-physical address
// space (not backed by a memslot) that Intel VMX needs for real-mode
// emulation. Must be called before the first vCPU runs.
func (vm *VM) SetTSSAddr(addr uint64) error {
	if _, err := ioctl(vm.fd, kvmSetTSSAddr, uintptr(addr)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_TSS_ADDR (%#x): %w", addr, err)
	}
	return nil
}

// SetIdentityMapAddr is KVM_SET_IDENTITY_MAP_ADDR: one page of
// guest-physical space for the EPT identity map of real-mode guests on VMX.
// Must be called before any vCPU is created.
func (vm *VM) SetIdentityMapAddr(addr uint64) error {
	a := addr
	if _, err := ioctlPtr(vm.fd, kvmSetIdentityMapAddr, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_IDENTITY_MAP_ADDR (%#x): %w", addr, err)
	}
	return nil
}

// CreateIRQChip is KVM_CREATE_IRQCHIP: in-kernel PICs, IOAPIC and LAPICs,
// with the default GSI routing (GSIs 0-15 to the PICs and IOAPIC, 16-23 to
// the IOAPIC).
func (vm *VM) CreateIRQChip() error {
	if _, err := ioctl(vm.fd, kvmCreateIRQChip, 0); err != nil {
		return fmt.Errorf("kvm: KVM_CREATE_IRQCHIP: %w", err)
	}
	return nil
}

// CreatePIT2 is KVM_CREATE_PIT2 with PITSpeakerDummy: an in-kernel i8254
// whose port 0x61 is also handled in the kernel, so Linux's PIT-based TSC
// calibration never leaves the kernel. Requires CreateIRQChip first.
func (vm *VM) CreatePIT2() error { return vm.CreatePIT2Flags(PITSpeakerDummy) }

// CreatePIT2Flags is KVM_CREATE_PIT2 with explicit kvm_pit_config flags
// (0 leaves port 0x61 to userspace).
func (vm *VM) CreatePIT2Flags(flags uint32) error {
	cfg := kvmPITConfig{Flags: flags}
	if _, err := ioctlPtr(vm.fd, kvmCreatePIT2, unsafe.Pointer(&cfg)); err != nil {
		return fmt.Errorf("kvm: KVM_CREATE_PIT2 (flags %#x): %w", flags, err)
	}
	return nil
}

// UserspaceMemoryRegion describes a memory slot: guest-physical
// [GuestPhysAddr, GuestPhysAddr+len(Memory)) backed by the host mapping
// Memory. Memory must be page-aligned memory that is not managed by the Go
// heap (an mmap) and must stay mapped while the slot exists; an empty
// Memory deletes the slot.
type UserspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32 // MemLogDirtyPages, MemReadonly
	GuestPhysAddr uint64
	Memory        []byte
}

// SetUserMemoryRegion is KVM_SET_USER_MEMORY_REGION: create, move, resize
// or (len(Memory) == 0) delete a memory slot.
func (vm *VM) SetUserMemoryRegion(r UserspaceMemoryRegion) error {
	k := kvmUserspaceMemoryRegion{
		Slot:          r.Slot,
		Flags:         r.Flags,
		GuestPhysAddr: r.GuestPhysAddr,
		MemorySize:    uint64(len(r.Memory)),
	}
	if len(r.Memory) > 0 {
		k.UserspaceAddr = uint64(uintptr(unsafe.Pointer(&r.Memory[0])))
	}
	if _, err := ioctlPtr(vm.fd, kvmSetUserMemoryRegion, unsafe.Pointer(&k)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_USER_MEMORY_REGION (slot %d, gpa %#x, size %#x, host %#x, flags %#x): %w",
			r.Slot, r.GuestPhysAddr, k.MemorySize, k.UserspaceAddr, r.Flags, err)
	}
	runtime.KeepAlive(r.Memory)
	return nil
}

// IRQLine is KVM_IRQ_LINE: set GSI irq's input line high or low on the
// in-kernel irqchip (edge-triggered sources pulse it).
func (vm *VM) IRQLine(irq uint32, level bool) error {
	l := kvmIRQLevel{IRQ: irq}
	if level {
		l.Level = 1
	}
	if _, err := ioctlPtr(vm.fd, kvmIRQLine, unsafe.Pointer(&l)); err != nil {
		return fmt.Errorf("kvm: KVM_IRQ_LINE (irq %d, level %v): %w", irq, level, err)
	}
	return nil
}

// MSI is struct kvm_msi's content: a message-signalled interrupt as a
// device would write it (address 0xfeeXXXXX on x86).
type MSI struct {
	AddressLo, AddressHi, Data, Flags, DevID uint32
}

// SignalMSI is KVM_SIGNAL_MSI: inject m directly. delivered is false when
// the guest blocked it (e.g. no LAPIC accepted it).
func (vm *VM) SignalMSI(m MSI) (delivered bool, err error) {
	k := kvmMSI{AddressLo: m.AddressLo, AddressHi: m.AddressHi, Data: m.Data, Flags: m.Flags, DevID: m.DevID}
	r, err := ioctlPtr(vm.fd, kvmSignalMSI, unsafe.Pointer(&k))
	if err != nil {
		return false, fmt.Errorf("kvm: KVM_SIGNAL_MSI (addr %#x:%08x, data %#x): %w", m.AddressHi, m.AddressLo, m.Data, err)
	}
	return int32(r) > 0, nil
}

// IRQRoutingEntry is one GSI route for SetGSIRouting. Type selects which of
// IRQChip (IRQRoutingIRQChip) or MSI (IRQRoutingMSI) is used.
type IRQRoutingEntry struct {
	GSI, Type, Flags uint32
	IRQChip          struct{ Chip, Pin uint32 }
	MSI              struct{ AddressLo, AddressHi, Data, DevID uint32 }
}

// maxIRQRoutes bounds the table size before asking the kernel, whose own
// limit (KVM_MAX_IRQ_ROUTES) is 4096.
const maxIRQRoutes = 4096

// SetGSIRouting is KVM_SET_GSI_ROUTING: replace the whole GSI routing table
// with entries (marshalled to the kernel's 48-byte kvm_irq_routing_entry).
// The table must include the legacy irqchip routes if they are still wanted.
func (vm *VM) SetGSIRouting(entries []IRQRoutingEntry) error {
	p, err := marshalGSIRouting(entries)
	if err != nil {
		return err
	}
	if _, err := ioctlPtr(vm.fd, kvmSetGSIRouting, p); err != nil {
		return fmt.Errorf("kvm: KVM_SET_GSI_ROUTING (%d entries): %w", len(entries), err)
	}
	return nil
}

// marshalGSIRouting builds the struct kvm_irq_routing buffer for entries.
func marshalGSIRouting(entries []IRQRoutingEntry) (unsafe.Pointer, error) {
	if len(entries) > maxIRQRoutes {
		return nil, fmt.Errorf("kvm: KVM_SET_GSI_ROUTING: %d entries, the kernel accepts at most %d", len(entries), maxIRQRoutes)
	}
	hdr, ents, p := flexBuf[kvmIRQRouting, kvmIRQRoutingEntry](len(entries))
	hdr.Nr = uint32(len(entries))
	for i, e := range entries {
		k := &ents[i]
		k.GSI, k.Type, k.Flags = e.GSI, e.Type, e.Flags
		switch e.Type {
		case IRQRoutingIRQChip:
			u := (*kvmIRQRoutingIRQChip)(unsafe.Pointer(&k.U))
			u.IRQChip, u.Pin = e.IRQChip.Chip, e.IRQChip.Pin
		case IRQRoutingMSI:
			u := (*kvmIRQRoutingMSI)(unsafe.Pointer(&k.U))
			u.AddressLo, u.AddressHi, u.Data, u.DevID = e.MSI.AddressLo, e.MSI.AddressHi, e.MSI.Data, e.MSI.DevID
		default:
			return nil, fmt.Errorf("kvm: KVM_SET_GSI_ROUTING: entry %d (gsi %d) has type %d, want IRQRoutingIRQChip or IRQRoutingMSI", i, e.GSI, e.Type)
		}
	}
	return p, nil
}

// IRQFD is KVM_IRQFD: a write to eventFD raises GSI gsi in the kernel
// without a userspace round trip. With resampleFD >= 0 the route is
// level-triggered: KVM signals resampleFD when the guest EOIs the interrupt
// so the device model can re-assert it if still pending.
func (vm *VM) IRQFD(eventFD int, gsi uint32, resampleFD int) error {
	k := kvmIRQFDArgs{FD: uint32(eventFD), GSI: gsi}
	if resampleFD >= 0 {
		k.Flags = IRQFDFlagResample
		k.ResampleFD = uint32(resampleFD)
	}
	if _, err := ioctlPtr(vm.fd, kvmIRQFD, unsafe.Pointer(&k)); err != nil {
		return fmt.Errorf("kvm: KVM_IRQFD (fd %d, gsi %d, resample fd %d): %w", eventFD, gsi, resampleFD, err)
	}
	return nil
}

// IRQFDDeassign is KVM_IRQFD with KVM_IRQFD_FLAG_DEASSIGN: undo IRQFD.
func (vm *VM) IRQFDDeassign(eventFD int, gsi uint32) error {
	k := kvmIRQFDArgs{FD: uint32(eventFD), GSI: gsi, Flags: IRQFDFlagDeassign}
	if _, err := ioctlPtr(vm.fd, kvmIRQFD, unsafe.Pointer(&k)); err != nil {
		return fmt.Errorf("kvm: KVM_IRQFD deassign (fd %d, gsi %d): %w", eventFD, gsi, err)
	}
	return nil
}

// IOEventFD describes a KVM_IOEVENTFD registration: a guest write of Len
// bytes (0: any length) to Addr (a port with IOEventFDFlagPIO, else MMIO)
// signals FD instead of exiting to userspace; with IOEventFDFlagDatamatch
// only writes of value Datamatch do.
type IOEventFD struct {
	Addr      uint64
	Len       uint32
	FD        int
	Datamatch uint64
	Flags     uint32 // IOEventFDFlagPIO, IOEventFDFlagDatamatch, IOEventFDFlagDeassign
}

// IOEventFD is KVM_IOEVENTFD: register (or, with IOEventFDFlagDeassign,
// remove) e.
func (vm *VM) IOEventFD(e IOEventFD) error {
	k := kvmIOEventFDArgs{Datamatch: e.Datamatch, Addr: e.Addr, Len: e.Len, FD: int32(e.FD), Flags: e.Flags}
	if _, err := ioctlPtr(vm.fd, kvmIOEventFD, unsafe.Pointer(&k)); err != nil {
		return fmt.Errorf("kvm: KVM_IOEVENTFD (addr %#x, len %d, fd %d, datamatch %#x, flags %#x): %w",
			e.Addr, e.Len, e.FD, e.Datamatch, e.Flags, err)
	}
	return nil
}

// CreateDevice is KVM_CREATE_DEVICE: instantiate an in-kernel device of
// type typ (e.g. DeviceVFIO) and return its fd, owned by the caller.
func (vm *VM) CreateDevice(typ uint32) (fd int, err error) {
	k := kvmCreateDeviceArgs{Type: typ}
	if _, err := ioctlPtr(vm.fd, kvmCreateDevice, unsafe.Pointer(&k)); err != nil {
		return -1, fmt.Errorf("kvm: KVM_CREATE_DEVICE (type %d): %w", typ, err)
	}
	return int(k.FD), nil
}

// SetDeviceAttr is KVM_SET_DEVICE_ATTR on a device fd from CreateDevice.
// a.Addr must point at memory the Go runtime will not move or free during
// the call; prefer SetDeviceAttrInt32 for int32 values.
func (vm *VM) SetDeviceAttr(deviceFD int, a DeviceAttr) error {
	if _, err := ioctlPtr(deviceFD, kvmSetDeviceAttr, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("kvm: KVM_SET_DEVICE_ATTR (device fd %d, group %d, attr %d): %w", deviceFD, a.Group, a.Attr, err)
	}
	return nil
}

// SetDeviceAttrInt32 is KVM_SET_DEVICE_ATTR with an int32 value, the shape
// of the kvm-vfio attributes (group DeviceAttrVFIOGroup, attr VFIOGroupAdd
// or VFIOGroupDel, value the VFIO group fd).
func (vm *VM) SetDeviceAttrInt32(deviceFD int, group uint32, attr uint64, value int32) error {
	p := heapInt32(value)
	a := DeviceAttr{Group: group, Attr: attr, Addr: uint64(uintptr(unsafe.Pointer(p)))}
	_, err := ioctlPtr(deviceFD, kvmSetDeviceAttr, unsafe.Pointer(&a))
	runtime.KeepAlive(p)
	if err != nil {
		return fmt.Errorf("kvm: KVM_SET_DEVICE_ATTR (device fd %d, group %d, attr %d, value %d): %w", deviceFD, group, attr, value, err)
	}
	return nil
}

// HasDeviceAttr is KVM_HAS_DEVICE_ATTR: whether the device supports the
// attribute (ENXIO from the kernel means no and is not an error).
func (vm *VM) HasDeviceAttr(deviceFD int, group uint32, attr uint64) (bool, error) {
	a := DeviceAttr{Group: group, Attr: attr}
	_, err := ioctlPtr(deviceFD, kvmHasDeviceAttr, unsafe.Pointer(&a))
	switch err {
	case nil:
		return true, nil
	case unix.ENXIO:
		return false, nil
	default:
		return false, fmt.Errorf("kvm: KVM_HAS_DEVICE_ATTR (device fd %d, group %d, attr %d): %w", deviceFD, group, attr, err)
	}
}

// EnableCap is KVM_ENABLE_CAP on the VM with up to four arguments (e.g.
// CapX86DisableExits with X86DisableExits* bits, CapSplitIRQChip with the
// number of IOAPIC pins).
func (vm *VM) EnableCap(c Cap, args ...uint64) error {
	if len(args) > 4 {
		return fmt.Errorf("kvm: KVM_ENABLE_CAP (%v): %d arguments, at most 4 fit struct kvm_enable_cap", c, len(args))
	}
	k := kvmEnableCapArgs{Cap: uint32(c)}
	copy(k.Args[:], args)
	if _, err := ioctlPtr(vm.fd, kvmEnableCap, unsafe.Pointer(&k)); err != nil {
		return fmt.Errorf("kvm: KVM_ENABLE_CAP (%v, args %v): %w", c, args, err)
	}
	return nil
}

// StatsFD is KVM_GET_STATS_FD on the VM: a read-only fd exposing the VM's
// binary statistics (see the kernel's Documentation/virt/kvm/api.rst). The
// error wraps ENOTTY or EINVAL on kernels without CapBinaryStatsFD.
func (vm *VM) StatsFD() (int, error) {
	r, err := ioctl(vm.fd, kvmGetStatsFD, 0)
	if err != nil {
		return -1, fmt.Errorf("kvm: KVM_GET_STATS_FD (vm): %w", err)
	}
	return int(r), nil
}

// CreateVCPU is KVM_CREATE_VCPU with APIC ID id, and maps its kvm_run.
func (vm *VM) CreateVCPU(id int) (*VCPU, error) {
	r, err := ioctl(vm.fd, kvmCreateVCPU, uintptr(id))
	if err != nil {
		return nil, fmt.Errorf("kvm: KVM_CREATE_VCPU (id %d): %w", id, err)
	}
	fd := int(r)
	mem, err := unix.Mmap(fd, 0, vm.mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("kvm: mmap kvm_run (vcpu %d, %d bytes): %w", id, vm.mmapSize, err)
	}
	c := &VCPU{ID: id, fd: fd}
	c.run = newRun(mem)
	return c, nil
}
