package vmm

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// NUMANodeAuto asks New to choose the NUMA node: the node of the first
// passthrough device, else the node with the most free hugepages of the
// chosen size.
const NUMANodeAuto = -1

// ConsoleKind selects which device carries the guest's interactive console.
type ConsoleKind string

// Console kinds. The 16550 UART always exists for early boot messages; the
// kind decides which device hpcvmm's stdin is wired to.
const (
	// ConsoleVirtio wires stdin/stdout to a virtio-console (the guest's
	// hvc0); the UART still prints early boot messages to stdout.
	ConsoleVirtio ConsoleKind = "virtio"
	// ConsoleSerial wires stdin/stdout to the 16550 UART (ttyS0).
	ConsoleSerial ConsoleKind = "serial"
	// ConsoleNone gives the guest no console input; the UART still
	// prints to stdout.
	ConsoleNone ConsoleKind = "none"
)

// Config describes one virtual machine. It is a plain struct: fill in the
// fields, call Validate (New calls it too), then New.
type Config struct {
	// Kernel is the path of a bzImage (boot protocol 2.06 or later with a
	// 64-bit entry point), e.g. Debian's /boot/vmlinuz-*, or of an
	// uncompressed x86-64 vmlinux ELF.
	Kernel string
	// KernelDecompress is where a bzImage's kernel is unpacked:
	// DecompressHost (the default when empty: once, cached, no in-guest
	// KASLR) or DecompressGuest (the bzImage's own decompressor).
	KernelDecompress KernelDecompress
	// KernelCache is the directory of decompressed kernels (the user's
	// own when empty: cachedir.Default, vmlinux.DefaultCacheDir for root);
	// it must not be writable by group or others.
	KernelCache string
	// KernelCacheMax bounds the kernel cache's size in bytes
	// (vmlinux.DefaultCacheMax when zero); the least recently used
	// kernels go first.
	KernelCacheMax int64
	// Initrd is the path of an initramfs; empty for none.
	Initrd string
	// PMEM is a read-only file system image the guest sees as persistent
	// memory (/dev/pmem0), mapped above guest RAM and not counted in
	// Memory; the zero value for none.
	PMEM PMEMConfig
	// ActingFor is the user hpcvmm acts for when it has more rights
	// (asuser.Acting: root in a Slurm step for SLURM_JOB_UID, setuid);
	// nil when it acts for itself. Kernel and Initrd are opened, and
	// NCCLTopoFile created, with that user's rights, so a step that runs
	// as root for a user never boots a file the user cannot read nor
	// replaces one the user cannot write (issue 30).
	ActingFor *asuser.User
	// Cmdline is the kernel command line.
	Cmdline string
	// CPUs is the number of vCPUs: 1 to VCPULimit (KVM's
	// KVM_CAP_MAX_VCPUS, at most 2048; 254 with NoACPI). Beyond 254 the
	// guest runs in x2APIC mode (vmm/x2apic.go).
	CPUs int
	// Memory is the guest RAM size in bytes, a multiple of HugePages.
	Memory uint64
	// HugePages is the page size backing guest RAM: guestmem.Page1G (the
	// default when zero), Page2M, or Page4K (development only).
	HugePages guestmem.PageSize
	// NUMANode is the host node guest RAM and vCPUs are bound to, or
	// NUMANodeAuto. Use DefaultConfig to start from NUMANodeAuto.
	NUMANode int
	// CPUList is the exact set of host CPUs to pin vCPUs to (vCPU i runs on
	// CPUList[i % len]). Empty means the CPUs of the chosen node.
	CPUList []int
	// AllowCrossNUMA permits a CPUList spanning several nodes.
	AllowCrossNUMA bool

	// CPUMode is whether each vCPU owns its host CPU (CPUModeDedicated:
	// idle vCPUs keep their CPU, HLT and PAUSE stay in the guest) or shares
	// it (CPUModeShared); CPUModeAuto (empty) is dedicated when every vCPU
	// has a host CPU no other vCPU uses, shared otherwise.
	CPUMode CPUMode
	// RunDir holds the CPU claims of the VMs on this host: without a
	// CPUList each VM claims the CPUs it pins (RunDir/cpus/N.lock, see
	// package cpuclaim) and the next VM takes the node's free ones. Empty
	// means /run/hpcvmm.
	RunDir string
	// Console selects the interactive console device.
	Console ConsoleKind
	// ConsoleRows and ConsoleCols are the virtio console's initial size
	// (0 = unknown); see (*VM).SetConsoleSize for changes.
	ConsoleRows, ConsoleCols uint16
	// Stdin feeds the interactive console; nil means no input.
	Stdin io.Reader
	// Stdout receives the guest's console output; nil means os.Stdout.
	Stdout io.Writer
	// ConsolePorts are named virtio-console ports 1..N besides the
	// console (the guest's /dev/vportNpM, found by
	// /sys/class/virtio-ports/*/name): byte streams with back-pressure and
	// end of stream both ways. Only with the virtio console.
	ConsolePorts []console.Port
	// PrefaultWorkers is the number of threads that fault guest RAM in
	// before the guest starts, each pinned to its own CPU of the guest's
	// node; at most the node's CPUs this process may run on. 0 means all of
	// them: prefault ends before any vCPU runs, so no CPU of the node is
	// busy with a vCPU yet.
	PrefaultWorkers int
	// Progress receives human-readable progress (prefault) when an
	// operation takes more than a second; nil for none.
	Progress io.Writer
	// Logger receives hpcvmm's own log; nil means slog.Default().
	Logger *slog.Logger
	// StartTime is when the process started, for the start-to-first-KVM_RUN
	// figure in the log; zero means New's start.
	StartTime time.Time
	// Nets are the guest's virtio-net interfaces, one per host TAP.
	Nets []NetConfig
	// Passthrough lists the host devices given to the guest through VFIO.
	Passthrough PassthroughConfig
	// NoACPI boots with an Intel MP table instead of ACPI tables, for
	// kernels built without ACPI. The guest then has no MCFG (config space
	// through port 0xCF8 only: 256 bytes per function), no NUMA
	// information, no power button, at most 254 vCPUs, and a flat CPU
	// topology.
	NoACPI bool
	// Topology is how the guest's CPU topology relates to the host's:
	// TopologyHost (the default) mirrors the pinned host CPUs' threads,
	// cores, shared caches and packages; TopologyFlat gives n
	// single-thread cores in one package. It also lays out the
	// passthrough devices: host puts devices that share a PCIe switch on
	// the host behind one emulated switch and the others behind their own
	// root ports, flat puts them all on bus 0 (vmm/topology.go).
	Topology TopologyKind
	// APICIDs, when set, gives vCPU i the APIC ID APICIDs[i] (one package
	// of single-thread cores) instead of a Topology-derived one: sparse and
	// large IDs (above 254: x2APIC) without hundreds of vCPUs, for tests.
	// Needs ACPI; len must equal CPUs and the first must be 0.
	APICIDs []uint32
	// NCCLTopoFile, if set, receives the guest's PCI tree as an NCCL
	// topology file (NCCL_TOPO_FILE) with the guest's bus IDs.
	NCCLTopoFile string
	// Seccomp selects the syscall filters Run installs before the first
	// KVM_RUN (SeccompOn, SeccompLog); the zero value installs none, since a
	// filter lasts as long as the process (see SeccompOff).
	Seccomp SeccompMode
	// SysfsRoot and ProcfsRoot let tests point host discovery at a captured
	// tree; empty means /sys and /proc.
	SysfsRoot, ProcfsRoot string
}

// TopologyKind selects how the guest's CPU and device topology is laid out.
type TopologyKind string

// The topology kinds.
const (
	TopologyHost TopologyKind = "host" // mirror the host's (default)
	TopologyFlat TopologyKind = "flat" // one package of single-thread cores
)

// DefaultConfig returns a Config with hpcvmm's defaults: 1 vCPU, 1 GiB of
// RAM on 1 GiB hugepages, NUMA node chosen automatically, virtio console.
func DefaultConfig() Config {
	return Config{
		CPUs:      1,
		Memory:    1 << 30,
		HugePages: guestmem.Page1G,
		NUMANode:  NUMANodeAuto,
		Console:   ConsoleVirtio,
	}
}

// FieldError is a validation error that names the Config field (and so the
// command-line flag) at fault.
type FieldError struct {
	Field string // Config field name, e.g. "Memory"
	Err   error
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %v", e.Field, e.Err) }
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Err: fmt.Errorf(format, args...)}
}

// Validate checks everything that can be checked without touching KVM or
// reserving memory. Each error names the field. Checks that need the host
// (KVM's vCPU limit, NUMA nodes, free hugepages) happen in New, still before
// any VM exists.
func (c *Config) Validate() error {
	var errs []error
	if c.Kernel == "" {
		errs = append(errs, fieldErr("Kernel", "no kernel given: give a bzImage such as /boot/vmlinuz-$(uname -r), or a vmlinux"))
	} else if err := checkReadableFile(c.openFile, c.Kernel); err != nil {
		errs = append(errs, fieldErr("Kernel", "%v", err))
	}
	switch c.KernelDecompress {
	case "", DecompressHost, DecompressGuest:
	default:
		errs = append(errs, fieldErr("KernelDecompress", "%q: want host or guest", c.KernelDecompress))
	}
	if c.KernelCacheMax < 0 {
		errs = append(errs, fieldErr("KernelCacheMax", "%d bytes: want a positive size", c.KernelCacheMax))
	}
	if c.Initrd != "" {
		if err := checkReadableFile(c.openFile, c.Initrd); err != nil {
			errs = append(errs, fieldErr("Initrd", "%v", err))
		}
	}
	errs = append(errs, c.PMEM.validate()...)
	if len(c.APICIDs) > 0 && (len(c.APICIDs) != c.CPUs || c.NoACPI) {
		errs = append(errs, fieldErr("APICIDs", "%d APIC IDs for %d vCPUs (with ACPI): give one per vCPU", len(c.APICIDs), c.CPUs))
	}
	switch c.CPUMode {
	case CPUModeAuto, CPUModeDedicated, CPUModeShared:
	default:
		errs = append(errs, fieldErr("CPUMode", "%q: want dedicated or shared", c.CPUMode))
	}
	if c.CPUMode == CPUModeDedicated && len(c.CPUList) > 0 && len(c.CPUList) < c.CPUs {
		errs = append(errs, fieldErr("CPUMode", "dedicated needs a host CPU of its own per vCPU: the CPU list has %d CPUs for %d vCPUs; list %d CPUs, ask for fewer vCPUs, or use the shared CPU mode", len(c.CPUList), c.CPUs, c.CPUs))
	}
	switch c.Topology {
	case "", TopologyHost, TopologyFlat:
	default:
		errs = append(errs, fieldErr("Topology", "%q: want host or flat", c.Topology))
	}
	if c.CPUs < 1 {
		errs = append(errs, fieldErr("CPUs", "%d vCPUs: need at least 1", c.CPUs))
	}
	if limit, why := tableVCPULimit(c.NoACPI); c.CPUs > limit {
		errs = append(errs, fieldErr("CPUs", "%d vCPUs: %s", c.CPUs, why))
	}
	// Sizes and the page size: the checks `hpcvmm check` makes too (New
	// repeats them against the host).
	errs = append(errs, inputFieldErrors(preflight.CheckInput(nil, c.inputRequest()))...)
	if c.PrefaultWorkers < 0 {
		errs = append(errs, fieldErr("PrefaultWorkers", "%d workers: want 1 or more, or 0 for one per CPU of the guest's node", c.PrefaultWorkers))
	}
	if c.NUMANode < NUMANodeAuto {
		errs = append(errs, fieldErr("NUMANode", "node %d is not a node number", c.NUMANode))
	}
	seen := map[int]bool{}
	for _, cpu := range c.CPUList {
		if cpu < 0 {
			errs = append(errs, fieldErr("CPUList", "CPU %d is not a CPU number", cpu))
		}
		if seen[cpu] {
			errs = append(errs, fieldErr("CPUList", "CPU %d is listed twice", cpu))
		}
		seen[cpu] = true
	}
	switch c.Console {
	case "", ConsoleVirtio, ConsoleSerial, ConsoleNone:
	default:
		errs = append(errs, fieldErr("Console", "unknown console %q: use virtio, serial or none", c.Console))
	}
	if len(c.ConsolePorts) > 0 && c.Console != "" && c.Console != ConsoleVirtio {
		errs = append(errs, fieldErr("ConsolePorts", "%d named ports need the virtio console, not %q", len(c.ConsolePorts), c.Console))
	}
	if err := console.ValidatePorts(c.ConsolePorts); err != nil {
		errs = append(errs, fieldErr("ConsolePorts", "%v", err))
	}
	if !validSeccomp(c.Seccomp) {
		errs = append(errs, fieldErr("Seccomp", "%q: want on, off or log", c.Seccomp))
	}
	errs = append(errs, c.validateNets()...)
	return errors.Join(errs...)
}

// pageSize returns the configured page size with the 1 GiB default applied.
func (c *Config) pageSize() guestmem.PageSize {
	if c.HugePages == 0 {
		return guestmem.Page1G
	}
	return c.HugePages
}

func checkReadableFile(open func(string) (*os.File, error), path string) error {
	f, err := open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s does not exist", path)
		}
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s is a directory, not a file", path)
	}
	return nil
}

// openFile opens a file the user named for reading, with the rights of
// the user hpcvmm acts for.
func (c *Config) openFile(path string) (*os.File, error) {
	return asuser.Open(c.ActingFor, path)
}
