package main

import (
	"fmt"
	"os"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

func init() { kvmCapabilityCheck = checkKVMCapabilities }

// checkKVMCapabilities opens the KVM device and checks the API version, the
// backend and every capability hpcvmm needs, one result per capability so
// the table shows exactly what is missing.
func checkKVMCapabilities(devPath string) []preflight.Result {
	if fi, err := os.Stat(devPath); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		// A host tree captured or built for tests: there is no KVM to ask.
		return []preflight.Result{{Name: "kvm-cap", Subject: "host", Status: preflight.Warn,
			Detail: fmt.Sprintf("%s is not a character device: capabilities not checked", devPath),
			Fix:    "run hpcvmm check on the host itself"}}
	}
	sys, err := uapi.OpenKVMPath(devPath)
	if err != nil {
		return []preflight.Result{{Name: "kvm", Subject: "host", Status: preflight.Fail,
			Detail: err.Error(), Fix: "run as root or add the user to the kvm group"}}
	}
	defer sys.Close()
	var out []preflight.Result
	if v, err := sys.APIVersion(); err != nil || v != uapi.APIVersion {
		out = append(out, preflight.Result{Name: "kvm", Subject: "api", Status: preflight.Fail,
			Detail: fmt.Sprintf("KVM_GET_API_VERSION = %d (%v), want %d", v, err, uapi.APIVersion), Fix: "upgrade the host kernel"})
		return out
	}
	for _, c := range vmm.RequiredKVMCaps {
		n, err := sys.CheckExtension(c)
		r := preflight.Result{Name: "kvm-cap", Subject: c.String(), Status: preflight.Pass, Detail: "supported"}
		if err != nil || n <= 0 {
			r.Status, r.Detail, r.Fix = preflight.Fail, fmt.Sprintf("not supported (%v)", err), "upgrade the host kernel (hpcvmm needs Linux 5.10 or later)"
		}
		out = append(out, r)
	}
	return out
}

// withCPUChecks adds the CPU side of KVM for a VM of cpus vCPUs (the vCPU
// limit `hpcvmm run` applies, dedicated mode's exits and halt polling,
// AMX; vmm.HostCPUChecks) to a KVM check, when there is one.
func withCPUChecks(check func(devPath string) []preflight.Result, cpus int) func(devPath string) []preflight.Result {
	if check == nil {
		return nil
	}
	return func(devPath string) []preflight.Result {
		out := check(devPath)
		if fi, err := os.Stat(devPath); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
			return out
		}
		sys, err := uapi.OpenKVMPath(devPath)
		if err != nil {
			return out // the capability check reported it
		}
		defer sys.Close()
		return append(out, vmm.HostCPUChecks(sys, cpus, false)...)
	}
}
