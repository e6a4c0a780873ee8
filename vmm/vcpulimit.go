package vmm

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// maxACPIVCPUs bounds the vCPUs whose ACPI tables hpcvmm builds: the MADT
// and SRAT entries of more (40 bytes a vCPU once most are x2APIC entries)
// would not fit the 128 KiB BIOS area the tables go in beside the DSDT
// (TestVCPULimitTablesFit builds them at this bound). It is above KVM's
// own default limit (KVM_MAX_VCPUS, 1024 since Linux 5.15) and every
// single NUMA node on sale.
const maxACPIVCPUs = 2048

// tableVCPULimit is the most vCPUs the guest's firmware tables describe,
// and why: the MP table (--acpi=off) has 8-bit APIC IDs, 0xff being the
// broadcast; ACPI's MADT and SRAT take x2APIC entries.
func tableVCPULimit(noACPI bool) (int, string) {
	if noACPI {
		return boot.MaxCPUs, "the MP table (--acpi=off) describes at most 254 vCPUs: use ACPI for more"
	}
	return maxACPIVCPUs, fmt.Sprintf("hpcvmm's ACPI tables describe at most %d vCPUs", maxACPIVCPUs)
}

// VCPULimit is the most vCPUs a VM may have on this host, and what sets
// it: KVM's KVM_CAP_MAX_VCPUS (KVM_CAP_NR_VCPUS on kernels without it, as
// the KVM API documents), or the guest's firmware tables (tableVCPULimit)
// when they allow fewer. `hpcvmm check` and New both ask it, so they
// agree.
func VCPULimit(sys *uapi.System, noACPI bool) (int, string) {
	limit, why := tableVCPULimit(noACPI)
	kvmMax, err := sys.CheckExtension(uapi.CapMaxVCPUs)
	name := "KVM_CAP_MAX_VCPUS"
	if err != nil || kvmMax <= 0 {
		kvmMax, err = sys.CheckExtension(uapi.CapNrVCPUs)
		name = "KVM_CAP_NR_VCPUS"
	}
	if err == nil && kvmMax > 0 && kvmMax < limit {
		return kvmMax, fmt.Sprintf("KVM on this host allows at most %d vCPUs per VM (%s)", kvmMax, name)
	}
	return limit, why
}

// checkVCPUIDs checks the vCPUs' APIC IDs against KVM_CAP_MAX_VCPU_ID
// (KVM's vCPU id is the APIC ID, and a mirrored topology's IDs can run
// past the vCPU count); without the capability KVM's bound is its vCPU
// limit.
func checkVCPUIDs(sys *uapi.System, top cputopo.Topology, kvmLimit int) error {
	maxID, err := sys.CheckExtension(uapi.CapMaxVCPUID)
	if err != nil || maxID <= 0 {
		maxID = kvmLimit
	}
	if id := top.MaxAPICID(); int64(id) >= int64(maxID) {
		return fieldErr("CPUs", "the guest topology needs APIC ID %d, and KVM on this host takes vCPU ids below %d (KVM_CAP_MAX_VCPU_ID): use --topology flat, or fewer --cpus", id, maxID)
	}
	return nil
}
