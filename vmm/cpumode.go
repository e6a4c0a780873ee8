package vmm

import (
	"fmt"
	"slices"

	"github.com/hpcvmm/hpcvmm/cpuclaim"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// CPUMode is whether each vCPU owns its host CPU.
type CPUMode string

// The CPU modes.
const (
	// CPUModeAuto chooses: dedicated when every vCPU has a host CPU no
	// other vCPU uses (of this VM or, through the CPU claims, of another
	// hpcvmm VM on the host), shared otherwise.
	CPUModeAuto CPUMode = ""
	// CPUModeDedicated lets a vCPU keep its host CPU while the guest is
	// idle: HLT and PAUSE (and MWAIT and C-states where KVM offers them)
	// run in the guest instead of exiting to KVM, the guest is told its
	// vCPUs are never preempted (KVM_HINTS_REALTIME: it polls when idle
	// and uses native spinlocks), and KVM's halt polling is off for the
	// VM. A halted vCPU then never gives its CPU to another thread, so
	// this needs one host CPU per vCPU; hpcvmm refuses the mode otherwise.
	CPUModeDedicated CPUMode = "dedicated"
	// CPUModeShared is a cloud VM's behaviour: idle vCPUs exit to KVM
	// and give their CPU back to the host.
	CPUModeShared CPUMode = "shared"
)

// dedicatedExits are the exits a dedicated VM keeps in the guest, as far as
// KVM offers them (KVM_CAP_X86_DISABLE_EXITS answers with the bits it
// allows: MWAIT only where the host's MWAIT is usable in a guest).
const dedicatedExits = uapi.X86DisableExitsHLT | uapi.X86DisableExitsPause |
	uapi.X86DisableExitsMWait | uapi.X86DisableExitsCState

// exitNames names the bits of KVM_CAP_X86_DISABLE_EXITS for logs and check.
func exitNames(bits int) []string {
	var out []string
	for _, b := range []struct {
		bit  int
		name string
	}{{uapi.X86DisableExitsHLT, "HLT"}, {uapi.X86DisableExitsPause, "PAUSE"},
		{uapi.X86DisableExitsMWait, "MWAIT"}, {uapi.X86DisableExitsCState, "CSTATE"}} {
		if bits&b.bit != 0 {
			out = append(out, b.name)
		}
	}
	return out
}

// runDir is where the CPU claims live.
func (c *Config) runDir() string {
	if c.RunDir == "" {
		return hoststate.DefaultStateDir
	}
	return c.RunDir
}

// claimCPUs claims, for a VM without a CPU list, n of the node's CPUs that
// no other hpcvmm VM holds (cpuclaim). It returns the claim and the CPUs
// in node order, or a nil claim and why the VM cannot have CPUs of its own
// (sharedWhy) when fewer than n are free. Claims are not taken for a host
// tree that is not this host's (tests' SysfsRoot with no RunDir), for
// shared mode (a shared VM uses CPUs others may use anyway) or when this
// process may not run on every CPU of the node (a scheduler's cpuset
// already separates jobs); skipped says why, for the log.
func claimCPUs(cfg *Config, nodeID int, nodeCPUs []int) (claim *cpuclaim.Claim, cpus []int, sharedWhy, skipped string, err error) {
	n := cfg.CPUs
	switch {
	case cfg.CPUMode == CPUModeShared:
		return nil, nil, "", "shared mode", nil
	case cfg.SysfsRoot != "" && cfg.SysfsRoot != "/sys" && cfg.RunDir == "":
		return nil, nil, "", "a captured host tree (SysfsRoot) without a RunDir", nil
	}
	if allowed, aerr := affinity(); aerr == nil {
		for _, c := range nodeCPUs {
			if c < 0 || c >= 1024 || !allowed.IsSet(c) {
				return nil, nil, "", "this process may not run on every CPU of the node (a cpuset separates it)", nil
			}
		}
	}
	claim, err = cpuclaim.Take(cfg.runDir(), nodeCPUs, n)
	if err != nil {
		return nil, nil, "", "", err
	}
	got := claim.CPUs()
	if len(got) < n {
		claim.Release()
		held := len(nodeCPUs) - len(got)
		if n > len(nodeCPUs) {
			return nil, nil, fmt.Sprintf("%d vCPUs outnumber node %d's %d CPUs", n, nodeID, len(nodeCPUs)), "", nil
		}
		return nil, nil, fmt.Sprintf("only %d of node %d's %d CPUs are free: %d are claimed by other VMs (%s)",
			len(got), nodeID, len(nodeCPUs), held, cpuclaim.Dir(cfg.runDir())), "", nil
	}
	for _, c := range nodeCPUs {
		if slices.Contains(got, c) {
			cpus = append(cpus, c)
		}
	}
	return claim, cpus, "", "", nil
}

// distinctCPUs reports whether no two vCPUs share a host CPU.
func distinctCPUs(vcpuCPUs []int) bool {
	seen := make(map[int]bool, len(vcpuCPUs))
	for _, c := range vcpuCPUs {
		if seen[c] {
			return false
		}
		seen[c] = true
	}
	return true
}

// decideCPUMode applies the requested mode to the placement: dedicated
// needs a host CPU per vCPU and is refused without one; the automatic
// choice is dedicated when the placement gives one, shared otherwise.
// warn says the shared mode comes from vCPUs outnumbering their CPUs (or
// from other VMs' claims), which costs the guest.
func decideCPUMode(requested CPUMode, p placement) (mode CPUMode, why string, warn bool, err error) {
	// Distinct within the VM is not enough when other VMs' claims left
	// this one none of its own (sharedWhy).
	distinct := distinctCPUs(p.vcpuCPUs) && p.sharedWhy == ""
	uniq := len(p.vcpuCPUs)
	if !distinctCPUs(p.vcpuCPUs) {
		set := map[int]bool{}
		for _, c := range p.vcpuCPUs {
			set[c] = true
		}
		uniq = len(set)
	}
	short := fmt.Sprintf("%d vCPUs on %d host CPUs (%s)", len(p.vcpuCPUs), uniq, host.FormatCPUList(sortedUnique(p.vcpuCPUs)))
	if p.sharedWhy != "" {
		short = p.sharedWhy + "; " + short
	}
	switch requested {
	case CPUModeShared:
		return CPUModeShared, "requested", false, nil
	case CPUModeDedicated:
		if !distinct {
			return "", "", false, fieldErr("CPUMode", "dedicated needs a host CPU of its own per vCPU: %s; pass fewer --cpus, a --cpu-list with a CPU per vCPU, wait for another VM to end, or use --cpu-mode shared", short)
		}
		return CPUModeDedicated, "requested", false, nil
	}
	if distinct {
		why := "every vCPU has a host CPU of its own"
		if p.claim != nil {
			why += ", claimed in " + cpuclaim.Dir(p.claimDir)
		}
		return CPUModeDedicated, why, false, nil
	}
	return CPUModeShared, short, true, nil
}

func sortedUnique(s []int) []int {
	out := slices.Clone(s)
	slices.Sort(out)
	return slices.Compact(out)
}

// applyCPUMode prepares a dedicated VM's KVM side, before any vCPU exists
// (KVM refuses KVM_CAP_X86_DISABLE_EXITS after): the exits KVM lets the
// guest keep, and no halt polling. What KVM refuses costs only the idle
// path's latency, so each refusal is logged once, with the reason, and the
// VM goes on.
func (vm *VM) applyCPUMode() {
	if vm.cpuMode != CPUModeDedicated {
		return
	}
	allowed, err := vm.vm.CheckExtension(uapi.CapX86DisableExits)
	switch {
	case err != nil || allowed <= 0:
		vm.log.Warn("dedicated CPU mode: KVM lets the guest keep no HLT/PAUSE exits (KVM_CAP_X86_DISABLE_EXITS not offered): idle vCPUs exit to the host", "err", err)
	default:
		want := dedicatedExits & allowed
		if missing := dedicatedExits &^ allowed; missing != 0 {
			vm.log.Info("dedicated CPU mode: KVM does not offer to keep these exits in the guest", "exits", exitNames(missing),
				"why", "KVM_CAP_X86_DISABLE_EXITS reports "+fmt.Sprintf("%#x", allowed)+" (MWAIT needs a host MWAIT usable in guests; CSTATE a kernel that offers it)")
		}
		if err := vm.vm.EnableCap(uapi.CapX86DisableExits, uint64(want)); err != nil {
			vm.log.Warn("dedicated CPU mode: KVM refused to keep exits in the guest; idle vCPUs exit to the host", "exits", exitNames(want), "err", err)
		} else {
			vm.exitsKept = want
		}
	}
	if n, err := vm.vm.CheckExtension(uapi.CapHaltPoll); err != nil || n <= 0 {
		vm.log.Info("dedicated CPU mode: KVM has no per-VM halt polling switch (KVM_CAP_HALT_POLL); the host's halt_poll_ns applies", "err", err)
	} else if err := vm.vm.EnableCap(uapi.CapHaltPoll, 0); err != nil {
		vm.log.Warn("dedicated CPU mode: KVM refused to turn halt polling off for the VM", "err", err)
	} else {
		vm.haltPollOff = true
	}
	vm.log.Info("dedicated CPU mode", "exits_in_guest", exitNames(vm.exitsKept), "halt_polling_off", vm.haltPollOff, "kvm_hints_realtime", true)
}
