package harness

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Profile is everything one L1 boot needs for a group of scenarios: the QEMU
// machine and devices, L1's kernel command line, and the shell setup L1's
// /init runs before the scenarios (binding devices to vfio-pci, creating
// VFs, ...). Scenarios that share a Profile share one L1 boot.
//
// To add a profile: declare a package-level Profile with a unique Name, put
// its devices in Devices, its kernel parameters in Cmdline and its L1 setup
// in Setup, and list it in Profiles so its setup script is packed into the
// L1 initramfs. If host mode needs something the host may lack (a device),
// set HostReady so auto mode picks l1 instead on such hosts.
type Profile struct {
	// Name identifies the profile in result records, the L1 initramfs
	// (/hpcvmm/profiles/NAME.sh) and HPCVMM_TEST_PROFILE inside L1.
	Name string
	// Machine is QEMU's -machine value.
	Machine string
	// Memory is QEMU's -m value for L1.
	Memory string
	// CPUs is L1's vCPU count (HPCVMM_L1_SMP overrides it).
	CPUs int
	// SMPTopology, when set, is appended to -smp: how QEMU arranges the
	// CPUs ("threads=2": one core of two SMT threads; "cores=2"). Empty
	// leaves QEMU's default (one single-thread core per socket). With
	// HPCVMM_L1_SMP the count changes but the topology stays, and QEMU
	// refuses a count the topology does not fit.
	SMPTopology string
	// Devices are extra QEMU arguments (devices, backends, globals).
	Devices []string
	// Cmdline are extra L1 kernel parameters.
	Cmdline []string
	// Setup is a busybox sh fragment L1's /init sources (in a subshell,
	// with set -e) after loading modules and before running the scenarios;
	// a failure aborts the boot with an l1=abort record. Variables it sets
	// do not reach the scenarios: write what they need (a VF's BDF, a
	// /dev/vfio group) to files under /run/hpcvmm/.
	Setup string
	// HostReady reports why host mode cannot run this profile's scenarios
	// (nil: it can). Nil means the profile needs only /dev/kvm.
	HostReady func() error
	// Files, when set, adds what only this profile's L1 needs to its
	// initramfs (programs, libraries, scripts): such a profile boots its
	// own image, l1-NAME.cpio, so the other profiles' image (l1.cpio)
	// neither grows nor is rebuilt for it.
	Files func(im *Image) error
	// Modules are kernel modules only this profile's L1 loads, with what
	// they depend on, after the common ones and before Setup. Like Files,
	// they give the profile an image of its own.
	Modules []string
	// Timeout, when set, bounds this profile's L1 boot instead of the
	// default (defaultL1Timeout; HPCVMM_L1_TIMEOUT overrides both): for a
	// profile whose scenarios together need longer.
	Timeout time.Duration
	// Prepare, when set, runs on the outer side before L1 boots with the
	// boot's run directory, creates the files QEMU needs there (disk
	// images, a BAR's backing file) and returns QEMU arguments naming
	// them, appended after Devices. The files stay in the run directory,
	// where RunOuter's checks find them after L1 has powered off.
	Prepare func(runDir string) ([]string, error)
}

// ProfileBasic is L1 with KVM and two 1 GiB hugepages, no passthrough
// devices: enough to run guest code and boot stock kernels on real KVM.
//
// Memory: measured, -m 4G gets only one of the two 1 GiB pages (q35 splits
// RAM around the 32-bit PCI hole and the kernel finds one aligned free
// GiB), -m 5G gets both and leaves about 3 GiB of ordinary memory for L1's
// initramfs (about 35 MiB, unpacked into RAM) and L2s of 512 MiB at 4 KiB
// pages. QEMU under TCG allocates guest RAM lazily, so the size is cheap.
//
// One vCPU: testbed.md measured an L2 hang once in five runs with L1
// -smp 2 and a multi-vCPU L2, none with -smp 1 (HPCVMM_L1_SMP overrides).
var ProfileBasic = Profile{
	Name:    "basic",
	Machine: "q35",
	Memory:  "5G",
	CPUs:    1,
	// Its scenarios took 14 of the default 15 minutes in CI (2026-11-27:
	// eleven scenarios, five kernel boots in TestKernelDecompress alone).
	Timeout: 20 * time.Minute,
	// nohz=off highres=off: see ProfilePassthrough; QEMU 7.2's TCG can
	// lose L1's one-shot LAPIC timer wakeup, which hung or slowed L1.
	Cmdline: []string{"hugepagesz=1G", "hugepages=2", "nohz=off", "highres=off"},
	// The kernel silently allocates fewer boot-time hugepages when memory
	// is short; scenarios relying on them must not find out later.
	Setup: `n=$(cat /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages)
[ "$n" -eq 2 ] || { echo "L1 has $n of 2 1 GiB hugepages: raise the profile's Memory"; exit 1; }`,
}

// Profiles lists every profile whose setup is packed into the L1 initramfs.
var Profiles = []Profile{ProfileBasic, ProfilePassthrough, ProfileSwitch, ProfileCores, ProfileSlurm, ProfileJobs, ProfileJobsPassthrough}

// Validate checks that the profile can build a QEMU command line.
func (p Profile) Validate() error {
	switch {
	case p.Name == "" || strings.ContainsAny(p.Name, " /=\"'"):
		return fmt.Errorf("profile %q: name must be non-empty and free of spaces, '/', '=' and quotes", p.Name)
	case p.Machine == "":
		return fmt.Errorf("profile %s: Machine is empty", p.Name)
	case p.Memory == "":
		return fmt.Errorf("profile %s: Memory is empty", p.Name)
	case p.CPUs < 1:
		return fmt.Errorf("profile %s: CPUs = %d, need at least 1", p.Name, p.CPUs)
	}
	return nil
}

// L1Boot is what varies between L1 boots of the same profile.
type L1Boot struct {
	QEMU        string // qemu-system-x86_64
	Kernel      string // L1 bzImage
	Initrd      string // L1 initramfs
	ConsolePath string // file receiving ttyS0 (human-readable output)
	ResultsPath string // file receiving ttyS1 (result records)
	CPUs        int    // 0: the profile's
}

// KernelCmdline returns L1's kernel command line.
func (p Profile) KernelCmdline(runConfigB64 string) string {
	args := []string{
		"console=ttyS0",
		"panic=-1", // with -no-reboot a panic ends QEMU instead of hanging
		"hpcvmm.profile=" + p.Name,
	}
	if runConfigB64 != "" {
		args = append(args, "hpcvmm.run="+runConfigB64)
	}
	return strings.Join(append(args, p.Cmdline...), " ")
}

// QEMUArgs returns the qemu-system-x86_64 arguments (without the program
// name) that boot L1 for this profile.
func (p Profile) QEMUArgs(b L1Boot, runConfigB64 string) ([]string, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	for _, f := range []string{b.ConsolePath, b.ResultsPath} {
		// QEMU's "file:" chardev syntax cannot carry commas or colons.
		if strings.ContainsAny(f, ",:") {
			return nil, fmt.Errorf("profile %s: serial output path %q must not contain ',' or ':'; set HPCVMM_TEST_CACHE to a plainer directory", p.Name, f)
		}
	}
	cpus := p.CPUs
	if b.CPUs > 0 {
		cpus = b.CPUs
	}
	smp := strconv.Itoa(cpus)
	if p.SMPTopology != "" {
		smp += "," + p.SMPTopology
	}
	args := []string{
		"-accel", L1Accel(),
		"-machine", p.Machine,
		"-cpu", L1CPUModel(), // max: exposes svm+npt, so kvm_amd loads inside L1
		"-m", p.Memory,
		"-smp", smp,
		"-nodefaults", "-no-user-config", "-display", "none",
		"-no-reboot",
		"-kernel", b.Kernel,
		"-initrd", b.Initrd,
		"-append", p.KernelCmdline(runConfigB64),
		"-serial", "file:" + b.ConsolePath, // ttyS0: console
		"-serial", "file:" + b.ResultsPath, // ttyS1: result records
	}
	return append(args, p.Devices...), nil
}

// ownImage reports whether the profile boots an initramfs of its own.
func (p Profile) ownImage() bool { return p.Files != nil || len(p.Modules) > 0 }

// profileByName finds a profile in Profiles.
func profileByName(name string) (Profile, bool) {
	for _, p := range Profiles {
		if p.Name == name {
			return p, true
		}
	}
	return Profile{}, false
}

// profileScripts returns /hpcvmm/profiles/NAME.sh contents for Profiles.
func profileScripts() map[string]string {
	out := map[string]string{}
	names := make([]string, 0, len(Profiles))
	for _, p := range Profiles {
		names = append(names, p.Name)
	}
	sort.Strings(names)
	for _, n := range names {
		p, _ := profileByName(n)
		out[n] = "# setup of profile " + n + ", sourced by L1's /init\n" + p.Setup + "\n"
	}
	return out
}

// L1CPUModel is QEMU's -cpu for L1: HPCVMM_L1_CPU when set (an experiment's
// variant, e.g. "max,la57=off"), else "max".
func L1CPUModel() string {
	if m := os.Getenv("HPCVMM_L1_CPU"); m != "" {
		return m
	}
	return "max"
}

// L1Accel is QEMU's -accel for L1: HPCVMM_L1_ACCEL when set (an
// experiment's variant, e.g. "tcg,thread=single": one host thread for all
// of L1's vCPUs instead of QEMU's multi-threaded TCG), else "tcg".
func L1Accel() string {
	if a := os.Getenv("HPCVMM_L1_ACCEL"); a != "" {
		return a
	}
	return "tcg"
}
