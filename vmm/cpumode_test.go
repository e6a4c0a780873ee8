package vmm

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/cpuclaim"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/uapi"
)

func TestDecideCPUMode(t *testing.T) {
	own := placement{vcpuCPUs: []int{0, 1, 2}}
	over := placement{vcpuCPUs: []int{0, 1, 0}}
	for _, tc := range []struct {
		name      string
		req       CPUMode
		p         placement
		want      CPUMode
		warn      bool
		errSubstr string
	}{
		{"auto, own CPUs", CPUModeAuto, own, CPUModeDedicated, false, ""},
		{"auto, oversubscribed", CPUModeAuto, over, CPUModeShared, true, ""},
		{"auto, others' claims", CPUModeAuto, placement{vcpuCPUs: []int{0}, sharedWhy: "only 0 of node 0's 2 CPUs are free"}, CPUModeShared, true, ""},
		{"shared asked", CPUModeShared, own, CPUModeShared, false, ""},
		{"dedicated asked", CPUModeDedicated, own, CPUModeDedicated, false, ""},
		{"dedicated refused", CPUModeDedicated, over, "", false, "3 vCPUs on 2 host CPUs (0-1)"},
		{"dedicated refused, claims", CPUModeDedicated, placement{vcpuCPUs: []int{0, 1, 0}, sharedWhy: "only 0 of node 0's 2 CPUs are free"}, "", false, "only 0 of node 0's 2 CPUs are free"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mode, why, warn, err := decideCPUMode(tc.req, tc.p)
			if tc.errSubstr != "" {
				require.Error(t, err)
				assert.Equal(t, []string{"CPUMode"}, fieldsOf(err))
				assert.Contains(t, err.Error(), tc.errSubstr)
				assert.Contains(t, err.Error(), "--cpu-mode shared", "the error says what to do")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, mode)
			assert.Equal(t, tc.warn, warn)
			assert.NotEmpty(t, why)
		})
	}
}

func TestValidateCPUMode(t *testing.T) {
	cfg := validConfig(t)
	cfg.CPUMode = "fast"
	assert.Equal(t, []string{"CPUMode"}, fieldsOf(cfg.Validate()))
	cfg = validConfig(t)
	cfg.CPUMode, cfg.CPUs, cfg.CPUList = CPUModeDedicated, 4, []int{0, 1}
	err := cfg.Validate()
	assert.Equal(t, []string{"CPUMode"}, fieldsOf(err))
	assert.ErrorContains(t, err, "2 CPUs for 4 vCPUs")
}

func TestGuestCPUIDRealtimeHint(t *testing.T) {
	for _, rt := range []bool{false, true} {
		out := guestCPUID(hostCPUID(), flat(t, 2), 1, cpuidOptions{realtime: rt})
		kf, ok := find(out, leafKVMFeatures, 0)
		require.True(t, ok)
		assert.Equal(t, rt, kf.EDX&uapi.KVMHintsRealtime != 0, "KVM_HINTS_REALTIME with dedicated vCPUs only")
	}
}

// TestGuestCPUIDKeepsAMXAndPMU: the leaves KVM reports for AMX (7.0 EDX,
// 0xD's tile components) and the PMU (0xA) reach the guest unchanged, and
// the initial XCR0 enables the tile state.
func TestGuestCPUIDKeepsAMXAndPMU(t *testing.T) {
	const amxTile, amxBF16, amxInt8 = 1 << 24, 1 << 22, 1 << 25
	sup := []uapi.CPUIDEntry{
		{Function: 0, EAX: 0xd},
		{Function: leafFeatures, ECX: featECXXSave | featECXAVX, EDX: featEDXFPU | featEDXSSE},
		{Function: 7, Index: 0, Flags: cpuidFlagSignificantIndex, EBX: ext7EBXAVX512F, EDX: amxTile | amxBF16 | amxInt8},
		{Function: 0xa, EAX: 0x08300805, EDX: 0x8603},
		{Function: leafXSave, Index: 0, Flags: cpuidFlagSignificantIndex, EAX: 0x600e7, EBX: 0x2b00, ECX: 0x2b00},
		{Function: leafXSave, Index: 17, Flags: cpuidFlagSignificantIndex, EAX: 64, EBX: 0xac0},
		{Function: leafXSave, Index: 18, Flags: cpuidFlagSignificantIndex, EAX: 8192, EBX: 0xb00, ECX: 6},
		{Function: leafKVMSignature, EAX: leafKVMFeatures},
		{Function: leafKVMFeatures},
	}
	out := guestCPUID(sup, flat(t, 1), 0, cpuidOptions{realtime: true})
	for _, want := range []struct{ fn, idx uint32 }{{7, 0}, {0xa, 0}, {leafXSave, 0}, {leafXSave, 17}, {leafXSave, 18}} {
		got, ok := find(out, want.fn, want.idx)
		require.True(t, ok, "leaf %#x.%d", want.fn, want.idx)
		orig, _ := find(sup, want.fn, want.idx)
		assert.Equal(t, orig, got, "leaf %#x.%d as KVM reports it", want.fn, want.idx)
	}
	assert.Equal(t, uint64(0x600e7), guestXCR0(out), "XCR0 carries XTILECFG and XTILEDATA")
}

// cpuModeConfig is a synthetic host tree with one node of the given CPUs and
// a config for New on it (a real KVM VM; nothing runs).
func cpuModeConfig(t *testing.T, cpus string) (Config, *hosttest.Tree) {
	t.Helper()
	sys, err := uapi.OpenKVM()
	if err != nil {
		if os.Getenv("HPCVMM_REQUIRE_INTEGRATION") == "1" {
			t.Fatalf("HPCVMM_REQUIRE_INTEGRATION=1 but KVM is unavailable: %v", err)
		}
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	sys.Close()
	tr := hosttest.New(t)
	tr.KVM()
	tr.CPUInfo(46)
	tr.Interrupts(true)
	tr.Node(0, cpus, 8<<30)
	cfg := DefaultConfig()
	cfg.Kernel = synthKernel(t)
	cfg.KernelCache = filepath.Join(t.TempDir(), "kernels")
	cfg.Cmdline = "console=ttyS0"
	cfg.Memory, cfg.HugePages = 64<<20, guestmem.Page4K
	cfg.Stdout = io.Discard
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.SysfsRoot, cfg.ProcfsRoot = tr.Sys(), tr.Proc()
	cfg.RunDir = t.TempDir()
	cfg.Topology = TopologyFlat
	return cfg, tr
}

// TestNewDedicated builds a dedicated VM on this host's KVM: KVM got the
// exits it offers to keep in the guest (HLT and PAUSE at least, where it
// offers them) before the vCPUs, halt polling is off where KVM has the
// switch, and each vCPU's KVM feature leaf carries KVM_HINTS_REALTIME.
func TestNewDedicated(t *testing.T) {
	cfg, _ := cpuModeConfig(t, "0-1")
	cfg.CPUs, cfg.CPUMode = 2, CPUModeDedicated
	vm, err := New(cfg)
	require.NoError(t, err)
	defer vm.Close()
	assert.Equal(t, CPUModeDedicated, vm.CPUMode())

	probe, err := vm.kvm.CreateVM()
	require.NoError(t, err)
	offered, _ := probe.CheckExtension(uapi.CapX86DisableExits)
	haltPoll, _ := probe.CheckExtension(uapi.CapHaltPoll)
	probe.Close()
	assert.Equal(t, offered&dedicatedExits, vm.exitsKept, "every exit KVM offers (%#x) kept in the guest", offered)
	if offered&(uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause) == uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause {
		assert.Equal(t, uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause, vm.exitsKept&(uapi.X86DisableExitsHLT|uapi.X86DisableExitsPause))
	}
	assert.Equal(t, haltPoll > 0, vm.haltPollOff)
	t.Logf("KVM offers to keep %v in the guest (%#x), kept %v; halt polling off: %v", exitNames(offered), offered, exitNames(vm.exitsKept), vm.haltPollOff)
	for _, c := range vm.cpus {
		cpuid, err := c.cpu.GetCPUID2()
		require.NoError(t, err)
		kf, ok := find(cpuid, leafKVMFeatures, 0)
		require.True(t, ok)
		assert.NotZero(t, kf.EDX&uapi.KVMHintsRealtime, "vCPU %d: KVM_HINTS_REALTIME", c.index)
	}
	assert.Equal(t, []int{0, 1}, vm.place.vcpuCPUs)
}

// TestNewSharedKeepsExits: a shared VM keeps every exit and has no hint.
func TestNewSharedKeepsExits(t *testing.T) {
	cfg, _ := cpuModeConfig(t, "0-1")
	cfg.CPUs = 3 // more vCPUs than CPUs: shared, with the warning
	var log strings.Builder
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	vm, err := New(cfg)
	require.NoError(t, err)
	defer vm.Close()
	assert.Equal(t, CPUModeShared, vm.CPUMode())
	assert.Zero(t, vm.exitsKept)
	assert.False(t, vm.haltPollOff)
	assert.Contains(t, log.String(), "3 vCPUs outnumber node 0's 2 CPUs")
	cpuid, err := vm.cpus[0].cpu.GetCPUID2()
	require.NoError(t, err)
	kf, _ := find(cpuid, leafKVMFeatures, 0)
	assert.Zero(t, kf.EDX&uapi.KVMHintsRealtime)

	cfg.CPUMode = CPUModeDedicated
	_, err = New(cfg)
	require.Error(t, err)
	assert.Equal(t, []string{"CPUMode"}, fieldsOf(err))
}

// TestNewPlacementsClaimCPUs: VMs placed without a CPU list take the
// node's free CPUs; once none are free the next is shared (automatic) or
// refused (dedicated); a closed VM's CPUs are free for the next.
func TestNewPlacementsClaimCPUs(t *testing.T) {
	cfg, _ := cpuModeConfig(t, "0-1")
	var log strings.Builder
	cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
	a, err := New(cfg)
	require.NoError(t, err)
	defer a.Close()
	b, err := New(cfg)
	require.NoError(t, err)
	defer b.Close()
	assert.Equal(t, []int{0}, a.place.vcpuCPUs)
	assert.Equal(t, []int{1}, b.place.vcpuCPUs, "the second VM skips the first's CPU")
	assert.Equal(t, CPUModeDedicated, a.CPUMode())
	assert.Equal(t, CPUModeDedicated, b.CPUMode())

	c, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, CPUModeShared, c.CPUMode(), "no CPU left: shared")
	assert.Contains(t, log.String(), "only 0 of node 0's 2 CPUs are free: 2 are claimed by other VMs")
	held, err := cpuclaim.Held(cfg.RunDir, []int{0, 1})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, held, "a shared VM claims nothing")
	c.Close()

	cfg.CPUMode = CPUModeDedicated
	_, err = New(cfg)
	require.Error(t, err)
	assert.ErrorContains(t, err, "claimed by other VMs")

	require.NoError(t, a.Close())
	d, err := New(cfg)
	require.NoError(t, err)
	defer d.Close()
	assert.Equal(t, []int{0}, d.place.vcpuCPUs, "the closed VM's CPU is free again")
	assert.Equal(t, CPUModeDedicated, d.CPUMode())
}

// TestNewAMXPermission: on a CPU with AMX, New leaves the process with the
// guest permission of XTILEDATA, and where KVM then reports AMX the vCPU's
// leaves 7 and 0xD announce it.
func TestNewAMXPermission(t *testing.T) {
	info, err := os.ReadFile("/proc/cpuinfo")
	require.NoError(t, err)
	if !strings.Contains(string(info), " amx_tile") {
		t.Skip("this CPU reports no amx_tile in /proc/cpuinfo: there is no AMX permission to ask for")
	}
	cfg, _ := cpuModeConfig(t, "0")
	vm, err := New(cfg)
	require.NoError(t, err)
	defer vm.Close()
	perm, err := uapi.GuestXCompPerm()
	require.NoError(t, err)
	require.NotZero(t, perm&(1<<uapi.XFeatureXTileData), "ARCH_GET_XCOMP_GUEST_PERM %#x lacks XTILEDATA after New", perm)
	sup7, _ := find(vm.supported, 7, 0)
	if sup7.EDX&ext7EDXAMXTile == 0 {
		t.Logf("guest permission %#x holds XTILEDATA; the CPUID half is not checked: this host's KVM reports no AMX in KVM_GET_SUPPORTED_CPUID (leaf 7.0 EDX %#x; kvm_pvm does not pass AMX through)", perm, sup7.EDX)
		return
	}
	cpuid, err := vm.cpus[0].cpu.GetCPUID2()
	require.NoError(t, err)
	l7, _ := find(cpuid, 7, 0)
	assert.NotZero(t, l7.EDX&ext7EDXAMXTile, "leaf 7.0 EDX announces AMX-TILE")
	xs, ok := find(cpuid, leafXSave, 0)
	require.True(t, ok)
	assert.Equal(t, uint32(xfeatAMXTiles), xs.EAX&xfeatAMXTiles, "leaf 0xD.0 EAX lists XTILECFG and XTILEDATA")
	tile, ok := find(cpuid, leafXSave, 18)
	require.True(t, ok)
	assert.NotZero(t, tile.EAX, "leaf 0xD.18 gives the tile data size")
}

// TestOversubscribedVCPUsAreNotSiblings: with --topology host, three vCPUs
// on two host CPUs (one core's two threads) get a flat topology, not the
// host core's threads with a third thread added; on distinct CPUs the
// mirror applies.
func TestOversubscribedVCPUsAreNotSiblings(t *testing.T) {
	cfg, tr := cpuModeConfig(t, "0-1")
	tr.CPU(0, 0, 0, "0-1")
	tr.CPU(1, 0, 0, "0-1")
	cfg.Topology = TopologyHost
	cfg.CPUs = 2
	vm, err := New(cfg)
	require.NoError(t, err)
	assert.Equal(t, 2, vm.topology.ThreadsPerCore, "two vCPUs on SMT siblings: threads of one guest core")
	vm.Close()

	cfg.CPUs = 3
	vm, err = New(cfg)
	require.NoError(t, err)
	defer vm.Close()
	assert.Equal(t, []int{0, 1, 0}, vm.place.vcpuCPUs)
	assert.Equal(t, 1, vm.topology.ThreadsPerCore, "oversubscribed: single-thread cores")
	assert.Equal(t, []uint32{0, 1, 2}, vm.topology.APICIDs())
}
