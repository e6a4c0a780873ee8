package vmm

import (
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// HostCPUChecks are `hpcvmm check`'s answers about the CPU side of KVM for
// a VM of cpus vCPUs: the vCPU limit (VCPULimit, as New applies it), what
// dedicated mode gets (the exits KVM lets the guest keep, tried on a
// throwaway VM, and the per-VM halt-polling switch), and AMX (the guest
// permission, and whether KVM then reports it).
func HostCPUChecks(sys *uapi.System, cpus int, noACPI bool) []preflight.Result {
	var out []preflight.Result
	add := func(name, subject string, st preflight.Status, fix, format string, args ...any) {
		out = append(out, preflight.Result{Name: name, Subject: subject, Status: st, Detail: fmt.Sprintf(format, args...), Fix: fix})
	}
	limit, why := VCPULimit(sys, noACPI)
	if cpus > limit {
		add("vcpus", "kvm", preflight.Fail, fmt.Sprintf("use --cpus %d or fewer", limit), "%d vCPUs: %s", cpus, why)
	} else {
		add("vcpus", "kvm", preflight.Pass, "", "%d vCPUs; at most %d: %s", cpus, limit, why)
	}

	vm, err := sys.CreateVM()
	if err != nil {
		add("cpu-mode", "kvm", preflight.Warn, "", "no VM to probe dedicated mode with: %v", err)
	} else {
		out = append(out, dedicatedChecks(vm)...)
		vm.Close()
	}

	err = uapi.RequestGuestXCompPerm(uapi.XFeatureXTileData)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOSYS):
		add("amx", "cpu", preflight.Pass, "", "no AMX on this CPU or kernel (%v): nothing to pass on", err)
	case err != nil:
		add("amx", "cpu", preflight.Warn, "", "guest permission for AMX refused (%v): the guest gets no AMX", err)
	default:
		supported, err := sys.SupportedCPUID()
		var l7 uapi.CPUIDEntry
		for _, e := range supported {
			if e.Function == 7 && e.Index == 0 {
				l7 = e
			}
		}
		if err == nil && l7.EDX&ext7EDXAMXTile != 0 {
			add("amx", "cpu", preflight.Pass, "", "AMX: guest permission granted and KVM reports AMX-TILE: the guest gets it")
		} else {
			add("amx", "cpu", preflight.Warn, "use a kernel whose KVM passes AMX through (Linux 5.17+ KVM on the host, not kvm_pvm)",
				"the CPU has AMX and the guest permission was granted, but KVM reports no AMX in KVM_GET_SUPPORTED_CPUID (leaf 7.0 EDX %#x): the guest gets none", l7.EDX)
		}
	}
	return out
}

// dedicatedChecks tries dedicated mode's KVM settings on a new VM with no
// vCPUs, as New applies them.
func dedicatedChecks(vm *uapi.VM) []preflight.Result {
	var out []preflight.Result
	allowed, err := vm.CheckExtension(uapi.CapX86DisableExits)
	r := preflight.Result{Name: "cpu-mode", Subject: "kvm exits"}
	switch {
	case err != nil || allowed <= 0:
		r.Status, r.Detail = preflight.Warn, fmt.Sprintf("KVM_CAP_X86_DISABLE_EXITS not offered (%v): dedicated vCPUs still exit on HLT and PAUSE", err)
		r.Fix = "use Linux 4.17 or later on the host"
	default:
		want := dedicatedExits & allowed
		if err := vm.EnableCap(uapi.CapX86DisableExits, uint64(want)); err != nil {
			r.Status, r.Detail = preflight.Warn, fmt.Sprintf("KVM offers %s (%#x) but refused them: %v", strings.Join(exitNames(want), " "), allowed, err)
		} else {
			r.Status = preflight.Pass
			r.Detail = fmt.Sprintf("dedicated mode keeps %s in the guest (KVM_CAP_X86_DISABLE_EXITS %#x)", strings.Join(exitNames(want), " "), allowed)
			if missing := dedicatedExits &^ allowed; missing != 0 {
				r.Detail += "; not offered: " + strings.Join(exitNames(missing), " ")
			}
			if want&(uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause) != uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause {
				r.Status = preflight.Warn
			}
		}
	}
	out = append(out, r)
	if n, err := vm.CheckExtension(uapi.CapHaltPoll); err != nil || n <= 0 {
		out = append(out, preflight.Result{Name: "cpu-mode", Subject: "halt polling", Status: preflight.Warn,
			Detail: "KVM_CAP_HALT_POLL not offered: the host's halt_poll_ns applies to dedicated VMs too", Fix: "use Linux 5.12 or later on the host"})
	} else if err := vm.EnableCap(uapi.CapHaltPoll, 0); err != nil {
		out = append(out, preflight.Result{Name: "cpu-mode", Subject: "halt polling", Status: preflight.Warn,
			Detail: fmt.Sprintf("KVM refused KVM_CAP_HALT_POLL 0: %v", err)})
	} else {
		out = append(out, preflight.Result{Name: "cpu-mode", Subject: "halt polling", Status: preflight.Pass,
			Detail: "dedicated VMs turn KVM's halt polling off (KVM_CAP_HALT_POLL 0)"})
	}
	return out
}
