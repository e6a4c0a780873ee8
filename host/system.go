package host

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// IRState is what the host tree says about interrupt remapping.
type IRState int

// Interrupt remapping states.
const (
	// IRUnknown: no usable evidence (no /proc/interrupts, e.g. a capture).
	IRUnknown IRState = iota
	// IREnabled: interrupts are delivered through a remapping domain.
	IREnabled
	// IRDisabled: MSI/IO-APIC interrupts exist and none is remapped.
	IRDisabled
)

// String names the state.
func (s IRState) String() string {
	switch s {
	case IREnabled:
		return "enabled"
	case IRDisabled:
		return "disabled"
	}
	return "unknown"
}

// InterruptRemapping inspects /proc/interrupts. When the kernel routes
// interrupts through an Intel DMAR or AMD-Vi remapping domain, the x86 MSI
// and IO-APIC irq chips are named with an "IR-" prefix ("IR-PCI-MSIX-...",
// "IR-IO-APIC"); without remapping the same chips appear unprefixed. That is
// the only sysfs/procfs signal that reflects whether remapping is actually
// in use (intel-iommu's ecap only says the hardware could), and it needs no
// dmesg. The returned string is the evidence, for the report.
func (h *Host) InterruptRemapping() (IRState, string, error) {
	f, err := os.Open(h.Layout.Interrupts)
	if errors.Is(err, fs.ErrNotExist) || h.Layout.Interrupts == "" {
		return IRUnknown, "no /proc/interrupts in this host tree", nil
	}
	if err != nil {
		return IRUnknown, "", fmt.Errorf("host: read interrupts: %w", err)
	}
	defer f.Close()
	plain := ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for _, w := range strings.Fields(sc.Text()) {
			// Match chip names only: the last column holds free-form
			// action names that could start with anything.
			if strings.HasPrefix(w, "IR-PCI-MSI") || w == "IR-IO-APIC" || strings.HasPrefix(w, "IR-HPET") {
				return IREnabled, fmt.Sprintf("remapped irq chip %s in /proc/interrupts", w), nil
			}
			if plain == "" && (strings.HasPrefix(w, "PCI-MSI") || w == "IO-APIC") {
				plain = w
			}
		}
	}
	if err := sc.Err(); err != nil {
		return IRUnknown, "", fmt.Errorf("host: read interrupts: %w", err)
	}
	if plain != "" {
		return IRDisabled, fmt.Sprintf("irq chip %s is not remapped (no IR- chips in /proc/interrupts)", plain), nil
	}
	return IRUnknown, "no MSI or IO-APIC interrupts in /proc/interrupts", nil
}

// UnsafeInterruptsAllowed reports vfio_iommu_type1's allow_unsafe_interrupts
// parameter: when set, VFIO attaches devices even without interrupt
// remapping (accepting that a device could forge interrupts).
func (h *Host) UnsafeInterruptsAllowed() bool {
	s, err := readString(h.Layout.VFIOUnsafeInterrupts)
	return err == nil && (s == "Y" || s == "1")
}

// PhysAddrBits returns the CPU's physical address width from the first
// "address sizes : 46 bits physical, 57 bits virtual" line of /proc/cpuinfo
// (or lscpu's "Address sizes:" in a capture). It bounds the guest physical
// address space, so every guest BAR must end below 2^bits.
func (h *Host) PhysAddrBits() (int, error) {
	f, err := os.Open(h.Layout.CPUInfo)
	if err != nil {
		return 0, fmt.Errorf("host: physical address bits: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || !strings.EqualFold(strings.TrimSpace(k), "address sizes") {
			continue
		}
		for _, part := range strings.Split(v, ",") {
			f := strings.Fields(part)
			if len(f) == 3 && f[1] == "bits" && f[2] == "physical" {
				n, err := strconv.Atoi(f[0])
				if err != nil || n < 32 || n > 64 {
					return 0, fmt.Errorf("host: %s: bad address sizes line %q", h.Layout.CPUInfo, sc.Text())
				}
				return n, nil
			}
		}
		return 0, fmt.Errorf("host: %s: address sizes line %q has no \"N bits physical\"", h.Layout.CPUInfo, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("host: read %s: %w", h.Layout.CPUInfo, err)
	}
	return 0, fmt.Errorf("host: %s has no \"address sizes\" line", h.Layout.CPUInfo)
}

// MemlockLimit returns RLIMIT_MEMLOCK in bytes, and whether the process is
// exempt from it (root, which has CAP_IPC_LOCK). ok is false when the host
// tree is not the live host, so there is no meaningful limit to report.
func (h *Host) MemlockLimit() (limit uint64, exempt, ok bool, err error) {
	if h.Memlock == nil {
		return 0, false, false, nil
	}
	limit, err = h.Memlock()
	if err != nil {
		return 0, false, false, err
	}
	return limit, h.Euid != nil && h.Euid() == 0, true, nil
}

// CPUVendor returns the CPU vendor string ("GenuineIntel", "AuthenticAMD")
// from /proc/cpuinfo's vendor_id or lscpu's "Vendor ID", or "" if unknown.
// Fix commands use it to name intel_iommu= or amd_iommu=.
func (h *Host) CPUVendor() string {
	f, err := os.Open(h.Layout.CPUInfo)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if k == "vendor_id" || strings.EqualFold(k, "Vendor ID") {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// KVMBackend names the loaded KVM backend module: "kvm_intel" or
// "kvm_amd" (hardware virtualization), "kvm_pvm" (pagetable-based
// virtualization, which runs only guest kernels built for PVM), or "" when
// none is known (no module directory, or KVM built into the kernel).
func (h *Host) KVMBackend() string {
	if h.Layout.Modules == "" {
		return ""
	}
	for _, m := range []string{"kvm_intel", "kvm_amd", "kvm_pvm"} {
		if exists(filepath.Join(h.Layout.Modules, m)) {
			return m
		}
	}
	return ""
}

// NUMABalancing reports whether the kernel's automatic NUMA balancing is
// on (/proc/sys/kernel/numa_balancing non-zero); ok is false when unknown.
func (h *Host) NUMABalancing() (on, ok bool) {
	if h.Layout.NUMABalancing == "" {
		return false, false
	}
	v, err := readUint(h.Layout.NUMABalancing, 64)
	if err != nil {
		return false, false
	}
	return v != 0, true
}
