package vmm_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/vmmtest"
)

// SoakCyclesEnv sets the number of cycles of TestSoakCreateRunDestroy; the
// default (CI) is soakCIcycles, the long soak 1000:
//
//	HPCVMM_SOAK_CYCLES=1000 go test -count=1 -run '^TestSoakCreateRunDestroy$' -v -timeout 30m ./vmm/
const soakCyclesEnv = "HPCVMM_SOAK_CYCLES"

// soakCIcycles is the CI soak: long enough that a leak of one fd,
// mapping, TAP or goroutine per VM shows 50 times over.
const soakCIcycles = 50

// The bounds the Go heap and /proc/self/maps are held to after a soak
// (everything else must be exactly as before). The heap bound is far below
// what one leaked VM holds (its vmm.VM, devices, bus tables and exit
// counters: tens of KiB each, 50 KiB x 50 cycles is 2.5 MiB), and above
// what the runtime's caches move between two snapshots. The maps bound
// covers the runtime's own anonymous mappings (thread stacks and heap
// spans come and go with the vCPU threads each VM starts): measured +4 to
// +8 lines over 50 and 1,000 cycles; one leaked mapping per cycle would be
// +50. Every file or anon_inode mapping (guest RAM's memfd, kvm_run,
// BARs) is compared exactly.
var soakBounds = testenv.Bounds{Heap: 1 << 20, Maps: 32}

// TestSoakCreateRunDestroy creates, runs and destroys a VM through the Go
// API soakCIcycles times (HPCVMM_SOAK_CYCLES for more): the vmmtest guest
// (64-bit code through the Linux boot path) scans PCI bus 0 and finds the
// virtio-console and, as root with /dev/net/tun, a virtio-net on a TAP the
// VM creates and removes; then it resets the VM. Guest RAM is on 2 MiB
// hugepages when the host has 32 free, else on 4 KiB pages. Afterwards the
// process holds exactly the fds, file and anon_inode mappings, network
// interfaces, goroutines and free hugepages it held before, and the Go heap
// and /proc/self/maps are within soakBounds. Needs a usable /dev/kvm
// (kvm_pvm runs this guest); the passed-through device's soak is the
// integration scenario TestSoakPassthrough.
func TestSoakCreateRunDestroy(t *testing.T) {
	sys, err := uapi.OpenKVM()
	if err != nil {
		testenv.SkipOrFail(t, "no usable /dev/kvm: %v", err)
	}
	sys.Close()
	cycles := soakCIcycles
	if s := os.Getenv(soakCyclesEnv); s != "" {
		cycles, err = strconv.Atoi(s)
		require.NoError(t, err, "%s=%q: want a number of cycles", soakCyclesEnv, s)
	}

	// A synthetic host (the KVM backend check passes on kvm_pvm: this
	// guest is not a stock kernel); guest RAM, KVM and TAPs are real.
	tr := hosttest.New(t)
	tr.KVM()
	tr.CPUInfo(46)
	tr.Interrupts(true)
	page := guestmem.Page4K
	if free2M() >= 32 {
		page = guestmem.Page2M
	}
	tr.Node(0, "0-1", 8<<30, hosttest.Pool{Size: uint64(guestmem.Page2M), Total: 64, Free: 64})

	kernel, err := vmmtest.Kernel(t.TempDir())
	require.NoError(t, err)
	cfg := vmm.DefaultConfig()
	cfg.Kernel, cfg.Cmdline = kernel, "console=ttyS0"
	// The synthetic bzImage is its own 64-bit entry, with no compressed
	// payload to unpack on the host.
	cfg.KernelDecompress = vmm.DecompressGuest
	cfg.Memory, cfg.HugePages = 64<<20, page
	cfg.Console, cfg.Topology = vmm.ConsoleVirtio, vmm.TopologyFlat
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.SysfsRoot, cfg.ProcfsRoot = tr.Sys(), tr.Proc()
	withTAP := os.Geteuid() == 0
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		withTAP = false
	}
	if withTAP {
		cfg.Nets = []vmm.NetConfig{{TAP: "hpsoak0", Queues: 2, Vhost: vmm.VhostAuto}}
	}
	const virtioConsole, virtioNet = 0x10431af4, 0x10411af4
	check := func(g vmmtest.GuestReport) error {
		want := map[uint32]bool{virtioConsole: true, virtioNet: withTAP}
		for _, id := range g.Devices {
			delete(want, id)
		}
		for id, w := range want {
			if w {
				return fmt.Errorf("the guest did not find device %04x:%04x on bus 0 (found %v)", id&0xffff, id>>16, g.Devices)
			}
		}
		return nil
	}

	var res vmmtest.SoakResult
	soak := func() {
		res, err = vmmtest.Soak(cfg, vmmtest.SoakOptions{Cycles: cycles, Warmup: 2, Check: check, Every: max(cycles/10, 1)})
	}
	if withTAP {
		require.NoError(t, hosttest.InOwnNetns(soak), "unshare(CLONE_NEWNET) as root")
	} else {
		t.Log("not root or no /dev/net/tun: no virtio-net in the soak")
		soak()
	}
	require.NoError(t, err)
	require.Equal(t, cycles, res.Cycles)
	t.Logf("%d cycles in %v (%v each); guest RAM on %s pages; virtio-net: %v; guest saw bus 0: %s",
		res.Cycles, res.Elapsed.Round(time.Millisecond), (res.Elapsed / time.Duration(res.Cycles)).Round(time.Microsecond), page, withTAP, devices(res.Last))
	t.Logf("before: %s", res.Before)
	t.Logf("after:  %s", res.After)
	t.Logf("peaks:  fds=%d maps=%d heap_alloc=%d", res.MaxFDs, res.MaxMaps, res.MaxHeap)
	assert.Empty(t, testenv.Leaks(res.Before, res.After, soakBounds), "after %d create/run/destroy cycles", cycles)
	assert.LessOrEqual(t, res.MaxFDs, len(res.Before.FDs), "open fds between cycles never exceed the count before")
}

// free2M is the host's free 2 MiB hugepages (0 when unknown).
func free2M() uint64 {
	b, err := os.ReadFile("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	return n
}

func devices(g vmmtest.GuestReport) string {
	var parts []string
	for slot := 0; slot < 32; slot++ {
		if id, ok := g.Devices[slot]; ok {
			parts = append(parts, fmt.Sprintf("%02x.0=%04x:%04x", slot, id&0xffff, id>>16))
		}
	}
	return strings.Join(parts, " ")
}
