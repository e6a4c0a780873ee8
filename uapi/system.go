package uapi

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DevKVM is the path of the KVM control device.
const DevKVM = "/dev/kvm"

// System is an open handle on /dev/kvm: the system-wide ioctls (API version,
// capabilities, supported CPUID and MSRs) and the factory for VMs.
type System struct {
	fd int
}

// OpenKVM opens /dev/kvm read-write and close-on-exec.
func OpenKVM() (*System, error) { return OpenKVMPath(DevKVM) }

// OpenKVMPath opens a KVM control device at path; only tests and unusual
// hosts need a path other than DevKVM. The error names the path and says
// what usually fixes the failure.
func OpenKVMPath(path string) (*System, error) {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		hint := ""
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
			hint = " (is the kvm_intel or kvm_amd module loaded and virtualization enabled in the BIOS / for the nested host?)"
		case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
			hint = " (add the user to the group owning " + path + ", usually kvm, or run as root)"
		}
		return nil, fmt.Errorf("%s: %w%s", path, err, hint)
	}
	return &System{fd: fd}, nil
}

// FD returns the /dev/kvm file descriptor.
func (s *System) FD() int { return s.fd }

// Close closes /dev/kvm. VMs created from s stay valid. Closing twice is a no-op.
func (s *System) Close() error {
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("kvm: close /dev/kvm: %w", err)
	}
	return nil
}

// APIVersion returns KVM_GET_API_VERSION, which must be APIVersion (12).
func (s *System) APIVersion() (int, error) {
	r, err := ioctl(s.fd, kvmGetAPIVersion, 0)
	if err != nil {
		return 0, fmt.Errorf("kvm: KVM_GET_API_VERSION: %w", err)
	}
	return int(r), nil
}

// CheckExtension returns KVM_CHECK_EXTENSION for c: 0 when unsupported,
// otherwise 1 or a capability-specific value (e.g. a vCPU count).
func (s *System) CheckExtension(c Cap) (int, error) {
	return checkExtension(s.fd, c)
}

func checkExtension(fd int, c Cap) (int, error) {
	r, err := ioctl(fd, kvmCheckExtension, uintptr(c))
	if err != nil {
		return 0, fmt.Errorf("kvm: KVM_CHECK_EXTENSION (%v): %w", c, err)
	}
	return int(int32(r)), nil
}

// RequireCaps checks that the API version is 12 and that every capability
// in caps is present; the error names the first one missing.
func (s *System) RequireCaps(caps ...Cap) error {
	v, err := s.APIVersion()
	if err != nil {
		return err
	}
	if v != APIVersion {
		return fmt.Errorf("kvm: KVM_GET_API_VERSION returned %d, want %d: /dev/kvm is not a compatible KVM", v, APIVersion)
	}
	for _, c := range caps {
		n, err := s.CheckExtension(c)
		if err != nil {
			return err
		}
		if n <= 0 {
			return fmt.Errorf("kvm: missing capability %v (%d): the host kernel is too old or has it disabled", c, uint32(c))
		}
	}
	return nil
}

// VCPUMmapSize returns KVM_GET_VCPU_MMAP_SIZE, the size of the kvm_run
// mapping of every vCPU (kvm_run plus the PIO data and coalesced-MMIO pages).
func (s *System) VCPUMmapSize() (int, error) {
	r, err := ioctl(s.fd, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return 0, fmt.Errorf("kvm: KVM_GET_VCPU_MMAP_SIZE: %w", err)
	}
	return int(r), nil
}

// maxCPUIDEntries bounds the KVM_GET_SUPPORTED_CPUID buffer growth; the
// kernel's own limit (KVM_MAX_CPUID_ENTRIES) is 256.
const maxCPUIDEntries = 4096

// SupportedCPUID returns KVM_GET_SUPPORTED_CPUID: every CPUID leaf KVM can
// present to a guest, with the feature bits it can virtualize. The buffer
// starts at the kernel's limit and grows on E2BIG in case a future kernel
// raises it.
func (s *System) SupportedCPUID() ([]CPUIDEntry, error) {
	for n := 256; n <= maxCPUIDEntries; n *= 2 {
		hdr, ents, p := flexBuf[kvmCPUID2, kvmCPUIDEntry2](n)
		hdr.Nent = uint32(n)
		_, err := ioctlPtr(s.fd, kvmGetSupportedCPUID, p)
		if errors.Is(err, unix.E2BIG) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kvm: KVM_GET_SUPPORTED_CPUID (%d entries): %w", n, err)
		}
		got := min(int(hdr.Nent), n)
		out := make([]CPUIDEntry, got)
		for i := range out {
			e := &ents[i]
			out[i] = CPUIDEntry{Function: e.Function, Index: e.Index, Flags: e.Flags,
				EAX: e.EAX, EBX: e.EBX, ECX: e.ECX, EDX: e.EDX}
		}
		return out, nil
	}
	return nil, fmt.Errorf("kvm: KVM_GET_SUPPORTED_CPUID: more than %d entries: %w", maxCPUIDEntries, unix.E2BIG)
}

// MSRIndexList returns KVM_GET_MSR_INDEX_LIST: the MSRs KVM saves and
// restores for a guest. The first call with room for nothing learns the
// count (the kernel answers E2BIG and writes it); the loop covers a list
// that grows in between.
func (s *System) MSRIndexList() ([]uint32, error) {
	n := 0
	for range 8 {
		hdr, idx, p := flexBuf[kvmMSRList, uint32](n)
		hdr.NMSRs = uint32(n)
		_, err := ioctlPtr(s.fd, kvmGetMSRIndexList, p)
		if errors.Is(err, unix.E2BIG) {
			if int(hdr.NMSRs) <= n || hdr.NMSRs > 1<<16 {
				return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST: kernel asked for %d entries after %d: %w", hdr.NMSRs, n, err)
			}
			n = int(hdr.NMSRs)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST (%d entries): %w", n, err)
		}
		return append([]uint32(nil), idx[:min(int(hdr.NMSRs), n)]...), nil
	}
	return nil, fmt.Errorf("kvm: KVM_GET_MSR_INDEX_LIST: list kept growing: %w", unix.E2BIG)
}

// minRunMapping is the least kvm_run mapping the Run accessors need: the
// header plus the whole exit union, so union reads never leave the mapping.
const minRunMapping = int(unsafe.Sizeof(kvmRunHeader{})) + kvmRunUnionSize

// CreateVM creates a VM (KVM_CREATE_VM, default machine type) and records
// the vCPU mmap size its vCPUs will need.
func (s *System) CreateVM() (*VM, error) {
	size, err := s.VCPUMmapSize()
	if err != nil {
		return nil, err
	}
	if size < minRunMapping {
		return nil, fmt.Errorf("kvm: KVM_GET_VCPU_MMAP_SIZE returned %d, less than struct kvm_run (%d)", size, minRunMapping)
	}
	r, err := ioctl(s.fd, kvmCreateVM, 0)
	if err != nil {
		return nil, fmt.Errorf("kvm: KVM_CREATE_VM: %w", err)
	}
	return &VM{fd: int(r), mmapSize: size}, nil
}
