package vmm

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// PreflightError is New's error when the host cannot run the VM: the
// failed checks of the report `hpcvmm check` prints, with their fixes.
type PreflightError struct {
	Report preflight.Report
}

func (e *PreflightError) Error() string {
	var b strings.Builder
	b.WriteString("the host cannot run this VM (hpcvmm check shows the full report):")
	for _, r := range e.Report.Failures() {
		fmt.Fprintf(&b, "\n  %s %s: %s", r.Name, r.Subject, r.Detail)
		if r.Fix != "" {
			fmt.Fprintf(&b, "\n    fix: %s", r.Fix)
		}
	}
	return b.String()
}

// preflightRequest describes this VM to the preflight checks, on the node
// placement chose.
func (vm *VM) preflightRequest() preflight.Request {
	req := preflight.Request{
		Memory: vm.cfg.Memory, PMEMSize: uint64(vm.cfg.PMEM.Size), PageSize: uint64(vm.cfg.pageSize()), CPUs: vm.cfg.CPUs,
		NUMANode: vm.place.node, AllowBind: vm.cfg.Passthrough.Bind,
		FlatTopology: vm.cfg.Topology == TopologyFlat || vm.cfg.NoACPI, PortSlots: PassthroughSlots(),
	}
	if vm.cfg.SysfsRoot == "" || vm.cfg.SysfsRoot == "/sys" {
		// The live host's groups are in /dev/vfio; a captured sysfs
		// (tests) has none to open.
		req.GroupOpen = ProbeVFIOGroup
	}
	if vm.dev.pt != nil {
		for _, sp := range vm.dev.pt.specs {
			if sp.VF {
				req.VFs = append(req.VFs, sp.BDF.String())
			} else {
				req.GPUs = append(req.GPUs, sp.BDF.String())
			}
		}
	}
	return req
}

// ProbeVFIOGroup opens /dev/vfio/<group> read-write, as the VFIO container
// will, and closes it again: preflight's check that a device cgroup
// (Slurm's ConstrainDevices), file modes or another process do not refuse
// the group, made before guest RAM is reserved.
func ProbeVFIOGroup(group int) error {
	g, err := uapi.OpenVFIOGroupPath(filepath.Join(uapi.DevVFIODir, strconv.Itoa(group)), group)
	if err != nil {
		return err
	}
	return g.Close()
}

// checkHostFirst is New's first look at the host, right after Validate:
// the sizes against what this host could ever give (preflight.CheckInput,
// exactly as `hpcvmm check` runs it), so a guest larger than any node is
// bad input (exit 2), refused before the kernel step.
func checkHostFirst(cfg *Config) error {
	if errs := inputFieldErrors(preflight.CheckInput(cfg.host(), cfg.inputRequest())); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return nil
}

// checkKVMFirst runs preflight's KVM checks (the device, and a backend
// that can run a stock kernel: not kvm_pvm) ahead of the full preflight:
// openKernel calls it before it starts a bzImage's decompression and cache
// write, so such a host refuses in milliseconds and leaves no cache entry.
func checkKVMFirst(cfg *Config) error {
	if rep := preflight.CheckKVM(cfg.host(), preflight.Request{}); !rep.OK() {
		return &PreflightError{Report: rep}
	}
	return nil
}

// CheckHost runs the checks of New that need nothing but cfg and the
// host, and builds, reads or changes nothing: Validate, the sizes against
// this host, the KVM device and backend, and the preflight checks
// (`hpcvmm check`'s) for cfg's devices on cfg's node (with NUMANodeAuto,
// the node auto placement takes). A caller with slow work to do before
// New calls it first: `hpcvmm run -- COMMAND` before it reads IMAGE or
// builds the initramfs, so a host that cannot run the VM refuses in
// milliseconds and writes nothing. New runs the same checks again (the
// host may change in between). The errors are New's: *FieldError for
// input, *PreflightError for a host that cannot run the VM.
func CheckHost(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := checkHostFirst(&cfg); err != nil {
		return err
	}
	if err := checkKVMFirst(&cfg); err != nil {
		return err
	}
	specs, err := cfg.Passthrough.specs()
	if err != nil {
		return fieldErr("Passthrough", "%v", err)
	}
	req := preflight.Request{
		Memory: cfg.Memory, PMEMSize: uint64(cfg.PMEM.Size), PageSize: uint64(cfg.pageSize()), CPUs: cfg.CPUs, NUMANode: cfg.NUMANode,
		AllowBind: cfg.Passthrough.Bind, FlatTopology: cfg.Topology == TopologyFlat || cfg.NoACPI,
		PortSlots: PassthroughSlots(),
	}
	if cfg.SysfsRoot == "" || cfg.SysfsRoot == "/sys" {
		req.GroupOpen = ProbeVFIOGroup // as preflightRequest
	}
	for _, sp := range specs {
		if sp.VF {
			req.VFs = append(req.VFs, sp.BDF.String())
		} else {
			req.GPUs = append(req.GPUs, sp.BDF.String())
		}
	}
	if rep := preflight.Run(cfg.host(), req); !rep.OK() {
		return &PreflightError{Report: rep}
	}
	return nil
}

// host is the host cfg describes: /sys and /proc, or the test trees.
func (c *Config) host() *host.Host {
	sysRoot, procRoot := c.SysfsRoot, c.ProcfsRoot
	if sysRoot == "" {
		sysRoot = "/sys"
	}
	if procRoot == "" {
		procRoot = "/proc"
	}
	return host.New(sysRoot, procRoot)
}

// inputRequest is the part of cfg that preflight.CheckInput validates.
func (c *Config) inputRequest() preflight.Request {
	return preflight.Request{Memory: c.Memory, PageSize: uint64(c.pageSize()), CPUs: c.CPUs, NUMANode: c.NUMANode}
}

// inputFieldErrors turns preflight.CheckInput's errors into FieldErrors
// naming the Config field.
func inputFieldErrors(err error) []error {
	if err == nil {
		return nil
	}
	var list []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else {
		list = []error{err}
	}
	out := make([]error, 0, len(list))
	for _, e := range list {
		var ie *preflight.InputError
		if !errors.As(e, &ie) {
			out = append(out, e)
			continue
		}
		field := ie.Field
		if field == "PageSize" {
			field = "HugePages"
		}
		out = append(out, &FieldError{Field: field, Err: ie.Err})
	}
	return out
}
