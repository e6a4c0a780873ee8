// Package host is hpcvmm's only reader of sysfs and procfs. Every path is
// rooted at a directory so the same code runs against the live host ("/sys",
// "/proc"), against the real-host capture in testdata/gpu-host-sysfs/ (the module's copy of the shared capture)
// and against synthetic trees built by tests: NUMA nodes, CPU lists, hugepage
// pools, PCI devices (IDs, driver, BARs, SR-IOV links, configuration space
// capabilities), IOMMU groups, interrupt remapping, the host's physical
// address width, /dev/kvm and RLIMIT_MEMLOCK.
//
// The package only reads; it never writes to sysfs. Fix commands produced by
// preflight name the canonical /sys paths, never the test root.
package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Layout is where each piece of host information lives. StandardLayout
// describes a live kernel's sysfs/procfs below two roots; CaptureLayout
// describes the flattened capture format of testdata/gpu-host-sysfs/.
// An empty path means "not available on this host tree".
type Layout struct {
	// PCIDevices holds one directory per function, named by BDF
	// (/sys/bus/pci/devices).
	PCIDevices string
	// Nodes holds nodeN directories (/sys/devices/system/node) or, in a
	// capture, flattened nodeN.cpulist / nodeN.meminfo files.
	Nodes string
	// CPUOnline is the online CPU list (/sys/devices/system/cpu/online),
	// used for the single pseudo-node of a kernel without NUMA.
	CPUOnline string
	// CPUs holds cpuN directories with topology/ and cache/
	// (/sys/devices/system/cpu); empty in a capture, whose lscpu.txt
	// (CPUInfo) describes the topology instead.
	CPUs string
	// Hugepages is the global hugepage pool directory (/sys/kernel/mm/hugepages),
	// used when there is no per-node information.
	Hugepages string
	// IOMMUGroups is /sys/kernel/iommu_groups.
	IOMMUGroups string
	// Interrupts is /proc/interrupts, the interrupt-remapping signal.
	Interrupts string
	// VFIOUnsafeInterrupts is vfio_iommu_type1's allow_unsafe_interrupts
	// module parameter.
	VFIOUnsafeInterrupts string
	// CPUInfo is /proc/cpuinfo, or lscpu output in a capture; both carry an
	// "address sizes" line.
	CPUInfo string
	// KVM is the KVM device node (/dev/kvm).
	KVM string
	// Modules is /sys/module: which KVM backend is loaded.
	Modules string
	// NUMABalancing is /proc/sys/kernel/numa_balancing.
	NUMABalancing string
	// NetClass and BlockClass are /sys/class/net and /sys/class/block:
	// every network interface and block device (partitions included), each
	// a link into its device's directory, so those below a PCI function
	// are found whatever the driver nests between (DeviceUse).
	NetClass, BlockClass string
	// Mountinfo is /proc/self/mountinfo, NetRoute /proc/net/route,
	// IfInet6 /proc/net/if_inet6 and Swaps /proc/swaps: what the host
	// uses its interfaces and disks for (DeviceUse).
	Mountinfo, NetRoute, IfInet6, Swaps string
}

// Host reads one host tree. The zero value is not usable; call New or
// NewWithLayout.
type Host struct {
	// Layout is where this host's files live.
	Layout Layout
	// Memlock returns the process's RLIMIT_MEMLOCK soft limit in bytes
	// (unix.RLIM_INFINITY for unlimited). It is nil unless the tree is the
	// live host, because a capture has no meaningful process limits.
	Memlock func() (uint64, error)
	// Euid returns the effective user ID; nil unless the tree is the live
	// host. Root (CAP_IPC_LOCK) is not bound by RLIMIT_MEMLOCK.
	Euid func() int
}

// StandardLayout is the layout of a running kernel's sysfs and procfs mounted
// at sysRoot and procRoot. /dev is taken to be beside sysRoot, so "/sys"
// pairs with "/dev/kvm" and a test tree "T/sys" with "T/dev/kvm".
func StandardLayout(sysRoot, procRoot string) Layout {
	sysRoot = filepath.Clean(sysRoot)
	procRoot = filepath.Clean(procRoot)
	return Layout{
		PCIDevices:           filepath.Join(sysRoot, "bus/pci/devices"),
		Nodes:                filepath.Join(sysRoot, "devices/system/node"),
		CPUOnline:            filepath.Join(sysRoot, "devices/system/cpu/online"),
		CPUs:                 filepath.Join(sysRoot, "devices/system/cpu"),
		Hugepages:            filepath.Join(sysRoot, "kernel/mm/hugepages"),
		IOMMUGroups:          filepath.Join(sysRoot, "kernel/iommu_groups"),
		VFIOUnsafeInterrupts: filepath.Join(sysRoot, "module/vfio_iommu_type1/parameters/allow_unsafe_interrupts"),
		Interrupts:           filepath.Join(procRoot, "interrupts"),
		CPUInfo:              filepath.Join(procRoot, "cpuinfo"),
		KVM:                  filepath.Join(filepath.Dir(sysRoot), "dev/kvm"),
		Modules:              filepath.Join(sysRoot, "module"),
		NUMABalancing:        filepath.Join(procRoot, "sys/kernel/numa_balancing"),
		NetClass:             filepath.Join(sysRoot, "class/net"),
		BlockClass:           filepath.Join(sysRoot, "class/block"),
		Mountinfo:            filepath.Join(procRoot, "self/mountinfo"),
		NetRoute:             filepath.Join(procRoot, "net/route"),
		IfInet6:              filepath.Join(procRoot, "net/if_inet6"),
		Swaps:                filepath.Join(procRoot, "swaps"),
	}
}

// CaptureLayout is the layout of a flattened host capture such as
// testdata/gpu-host-sysfs/: the /sys/bus/pci/devices/* directories
// at the top (symlinks recorded as "<name>.link" text files holding the
// readlink result), node/nodeN.cpulist, node/nodeN.meminfo,
// node/hugepage-sizes and lscpu.txt. A capture records no IOMMU groups
// directory, /proc/interrupts or /dev/kvm, so those read as absent.
func CaptureLayout(dir string) Layout {
	dir = filepath.Clean(dir)
	return Layout{
		PCIDevices:  dir,
		Nodes:       filepath.Join(dir, "node"),
		IOMMUGroups: filepath.Join(dir, "kernel/iommu_groups"),
		CPUInfo:     filepath.Join(dir, "lscpu.txt"),
		KVM:         filepath.Join(dir, "dev/kvm"),
	}
}

// New returns a Host rooted at sysRoot and procRoot ("/sys" and "/proc" for
// the live host). If sysRoot has no bus/pci/devices but looks like a capture
// (lscpu.txt or BDF-named directories at its top), the capture layout is
// used, so `hpcvmm check --sysfs testdata/gpu-host-sysfs` works.
// Process limits (Memlock, Euid) are wired only for the live host.
func New(sysRoot, procRoot string) *Host {
	l := StandardLayout(sysRoot, procRoot)
	if !exists(l.PCIDevices) && isCapture(sysRoot) {
		l = CaptureLayout(sysRoot)
	}
	h := NewWithLayout(l)
	if filepath.Clean(sysRoot) == "/sys" {
		h.Memlock = liveMemlock
		h.Euid = os.Geteuid
	}
	return h
}

// NewWithLayout returns a Host reading the given layout, without process
// limits; set Memlock and Euid to supply them.
func NewWithLayout(l Layout) *Host {
	return &Host{Layout: l}
}

func isCapture(dir string) bool {
	if exists(filepath.Join(dir, "lscpu.txt")) {
		return true
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := ParseBDF(e.Name()); err == nil {
			return true
		}
	}
	return false
}

func liveMemlock() (uint64, error) {
	var r unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &r); err != nil {
		return 0, fmt.Errorf("host: getrlimit(RLIMIT_MEMLOCK): %w", err)
	}
	return r.Cur, nil
}

// KVMPresent reports whether the KVM device node exists. Opening it and
// asking for capabilities is the uapi package's job.
func (h *Host) KVMPresent() bool {
	return h.Layout.KVM != "" && exists(h.Layout.KVM)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// readString reads a sysfs attribute and trims the trailing newline.
func readString(p string) (string, error) {
	if p == "" {
		return "", fs.ErrNotExist
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readUint reads a sysfs attribute holding a number in C notation
// ("0x10de", "42").
func readUint(p string, bits int) (uint64, error) {
	s, err := readString(p)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(s, 0, bits)
	if err != nil {
		return 0, fmt.Errorf("host: parse %s: %w", p, err)
	}
	return v, nil
}

// readLink returns the target of the symlink dir/name, or, in a capture, the
// contents of dir/name.link. ok is false when neither exists (for a driver
// link: no driver bound). An empty .link file also means "no link".
func readLink(dir, name string) (target string, ok bool, err error) {
	t, err := os.Readlink(filepath.Join(dir, name))
	if err == nil {
		return t, true, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return "", false, fmt.Errorf("host: readlink %s: %w", filepath.Join(dir, name), err)
	}
	s, err := readString(filepath.Join(dir, name+".link"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("host: read %s.link: %w", filepath.Join(dir, name), err)
	}
	if s == "" {
		return "", false, nil
	}
	return s, true, nil
}
