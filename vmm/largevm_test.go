package vmm

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/acpi"
	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// largeTopology is n vCPUs laid out flat (APIC ID = index) or mirrored
// from a host whose CPUs 0..n/2-1 are the first threads of n/2 cores and
// n/2..n-1 their second threads (how Linux numbers an SMT host): guest
// APIC IDs 0, 2, 4, ... then 1, 3, 5, ...
func largeTopology(t *testing.T, n int, layout string) cputopo.Topology {
	t.Helper()
	if layout == "flat" {
		top, err := cputopo.Flat(n)
		require.NoError(t, err)
		return top
	}
	cpus := make([]cputopo.HostCPU, n)
	for i := range cpus {
		cpus[i] = cputopo.HostCPU{CPU: i, Core: i % (n / 2), LLC: -1}
		if i >= 2*(n/2) { // odd n: a last core of one thread
			cpus[i].Core = n / 2
		}
	}
	top, err := cputopo.Mirror(cpus)
	require.NoError(t, err)
	return top
}

// largeHostCPUID is a supported-CPUID table with both topology leaves.
func largeHostCPUID() []uapi.CPUIDEntry {
	return append(hostCPUID()[1:],
		uapi.CPUIDEntry{Function: 0, EAX: 0x1f},
		uapi.CPUIDEntry{Function: leafTopologyV2, Index: 0, Flags: 1})
}

// TestVMBeyond254VCPUs checks, at 255, 256, 288 and 1024 vCPUs, flat and
// SMT-mirrored, what a guest with x2APIC-only vCPUs depends on: the MADT
// and SRAT list every vCPU once (UID = vCPU index, x2APIC entries for IDs
// above 254, or for all of them when an xAPIC ID comes past UID 254) and
// fit the BIOS area; leaves 0xB and 0x1F give each vCPU its x2APIC ID
// with a package shift that covers every ID; KVM's x2APIC API and the
// extended destination ID are used exactly when an ID exceeds 254; IOAPIC
// interrupts are kept on the vCPUs an 8-bit destination reaches
// (irqaffinity=); and an MSI Linux addresses to the highest APIC ID
// reaches it through the router.
func TestVMBeyond254VCPUs(t *testing.T) {
	for _, n := range []int{255, 256, 288, 1024} {
		for _, layout := range []string{"flat", "smt"} {
			t.Run(fmt.Sprintf("%d-%s", n, layout), func(t *testing.T) {
				top := largeTopology(t, n, layout)
				var mmio, pio bus.Bus
				vm := &VM{cfg: Config{Memory: 1 << 30, CPUs: n}, topology: top,
					dev: devices{pci: pci.NewRoot(pci.RootConfig{MMIO: &mmio, PIO: &pio})}}
				require.NoError(t, vm.dev.pci.AssignBuses())
				w, err := addrspace.NewWindows(vm.cfg.Memory, 46)
				require.NoError(t, err)

				// Tables: every vCPU once, UID = index, and they fit.
				tables, err := vm.acpiTables(w)
				require.NoError(t, err)
				for _, r := range tables.Regions {
					assert.LessOrEqual(t, r.GPA+uint64(len(r.Data)), uint64(boot.HighMemStart), "tables fit the BIOS area")
				}
				ts, err := acpi.Build(vm.acpiPlatform(w), boot.ACPIAreaStart+acpi.RSDPLen+12)
				require.NoError(t, err)
				madt, ok := ts.Find("APIC")
				require.True(t, ok)
				uidOf := map[uint32]uint32{}
				x2 := 0
				for off := acpi.HeaderLen + 8; off < len(madt.Data); off += int(madt.Data[off+1]) {
					e := madt.Data[off:]
					switch e[0] {
					case 0:
						uidOf[uint32(e[3])] = uint32(e[2])
					case 9:
						x2++
						uidOf[binary.LittleEndian.Uint32(e[4:])] = binary.LittleEndian.Uint32(e[12:])
					}
				}
				require.Len(t, uidOf, n, "one MADT entry per vCPU")
				for i, v := range top.VCPUs {
					uid, ok := uidOf[v.APICID]
					require.True(t, ok, "APIC ID %d in the MADT", v.APICID)
					assert.EqualValues(t, i, uid, "vCPU %d's UID", i)
				}
				maxID := top.MaxAPICID()
				assert.Equal(t, maxID > maxXAPICID, x2 > 0, "x2APIC entries exactly when an ID exceeds 254")

				// CPUID: x2APIC IDs and a shift that covers them.
				for _, i := range []int{0, n / 2, n - 1} {
					out := guestCPUID(largeHostCPUID(), top, i, cpuidOptions{extDestID: vm.needsX2APIC()})
					for _, leaf := range []uint32{leafTopology, leafTopologyV2} {
						core, ok := find(out, leaf, 1)
						require.True(t, ok, "leaf %#x.1", leaf)
						assert.Equal(t, top.VCPUs[i].APICID, core.EDX, "leaf %#x: vCPU %d's x2APIC ID", leaf, i)
						assert.Greater(t, uint64(1)<<core.EAX, uint64(maxID), "leaf %#x: the package shift covers every APIC ID", leaf)
						assert.EqualValues(t, n, core.EBX, "leaf %#x: logical processors in the package", leaf)
					}
					kf, _ := find(out, leafKVMFeatures, 0)
					assert.Equal(t, vm.needsX2APIC(), kf.EAX&kvmFeatureMSIExtDestID != 0)
				}

				// Interrupt routing.
				assert.Equal(t, maxID > maxXAPICID, vm.needsX2APIC())
				cmd := vm.withIRQAffinity("console=ttyS0")
				if vm.needsX2APIC() {
					_, list, ok := strings.Cut(cmd, "irqaffinity=")
					require.True(t, ok)
					var low int
					for _, s := range strings.Split(list, ",") {
						i, err := strconv.Atoi(s)
						require.NoError(t, err)
						assert.LessOrEqual(t, top.VCPUs[i].APICID, uint32(maxXAPICID), "vCPU %d in irqaffinity", i)
						low++
					}
					assert.Equal(t, 255, low, "every vCPU an 8-bit destination reaches, only those")
				} else {
					assert.Equal(t, "console=ttyS0", cmd)
				}
				f := &recordingVM{}
				r := newIRQRouter(f)
				r.extDestID = vm.needsX2APIC()
				gsi, err := r.AllocGSI()
				require.NoError(t, err)
				// Linux's MSI address for maxID: bits 19:12 the low 8
				// bits, 11:5 bits 14:8 (extended destination ID).
				lo := uint32(0xfee00000) | (maxID&0xff)<<12 | (maxID>>8)<<5
				require.NoError(t, r.SetMSIRoute(gsi, lo, 0, 0x41))
				r.mu.Lock()
				e := r.msi[gsi]
				r.mu.Unlock()
				dest := e.MSI.AddressHi&0xffffff00 | (e.MSI.AddressLo>>12)&0xff
				assert.Equal(t, maxID, dest, "KVM's route reaches APIC ID %d", maxID)
			})
		}
	}
}

// TestVCPULimit: check and run share VCPULimit; on this host's KVM the
// limit is KVM's KVM_CAP_MAX_VCPUS or the tables' bound, whichever is
// lower, and 254 with the MP table. The tables at the ACPI bound fit.
func TestVCPULimit(t *testing.T) {
	sys, err := uapi.OpenKVM()
	if err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	defer sys.Close()
	kvmMax, err := sys.CheckExtension(uapi.CapMaxVCPUs)
	require.NoError(t, err)
	limit, why := VCPULimit(sys, false)
	assert.Equal(t, min(kvmMax, maxACPIVCPUs), limit, why)
	t.Logf("vCPU limit %d: %s", limit, why)
	limit, why = VCPULimit(sys, true)
	assert.Equal(t, 254, limit)
	assert.Contains(t, why, "MP table")

	for _, layout := range []string{"flat", "smt"} {
		var mmio, pio bus.Bus
		vm := &VM{cfg: Config{Memory: 1 << 30, CPUs: maxACPIVCPUs}, topology: largeTopology(t, maxACPIVCPUs, layout),
			dev: devices{pci: pci.NewRoot(pci.RootConfig{MMIO: &mmio, PIO: &pio})}}
		require.NoError(t, vm.dev.pci.AssignBuses())
		w, err := addrspace.NewWindows(vm.cfg.Memory, 46)
		require.NoError(t, err)
		tables, err := vm.acpiTables(w)
		require.NoError(t, err)
		end := tables.Regions[len(tables.Regions)-1]
		assert.LessOrEqual(t, end.GPA+uint64(len(end.Data)), uint64(boot.HighMemStart), "%d vCPUs' tables (%s) fit the BIOS area", maxACPIVCPUs, layout)
	}
}

func TestValidateVCPUBounds(t *testing.T) {
	cfg := validConfig(t)
	cfg.CPUs = 1024
	assert.NoError(t, cfg.Validate(), "1024 vCPUs are allowed before KVM is asked")
	cfg.CPUs = maxACPIVCPUs + 1
	assert.Equal(t, []string{"CPUs"}, fieldsOf(cfg.Validate()))
	cfg.CPUs, cfg.NoACPI = 255, true
	err := cfg.Validate()
	assert.Equal(t, []string{"CPUs"}, fieldsOf(err))
	assert.ErrorContains(t, err, "MP table")
}
