package uapi

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// These tests drive the real /dev/kvm. They skip (with the reason) where it
// cannot be opened, unless HPCVMM_REQUIRE_INTEGRATION=1 says the run must
// not count a skip as a pass.

const (
	guestMemSize = 64 << 10
	guestCodeGPA = 0x1000
	testPort     = 0x10
)

func openKVM(t testing.TB) *System {
	t.Helper()
	s, err := OpenKVM()
	if err != nil {
		testenv.SkipOrFail(t, "no /dev/kvm: %v", err)
	}
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

func createVM(t testing.TB, s *System) *VM {
	t.Helper()
	vm, err := s.CreateVM()
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, vm.Close()) })
	return vm
}

// newRealModeGuest builds a VM with 64 KiB of RAM at guest-physical 0, code
// copied to 0x1000, and one vCPU in real mode about to execute it.
func newRealModeGuest(t testing.TB, code []byte, irqchip bool) (*VM, *VCPU) {
	t.Helper()
	s := openKVM(t)
	mem, err := unix.Mmap(-1, 0, guestMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, unix.Munmap(mem)) }) // runs after the VM is closed
	copy(mem[guestCodeGPA:], code)

	vm := createVM(t, s)
	// Real mode on Intel VMX without unrestricted guest needs these; they
	// are harmless elsewhere and must come before the first vCPU.
	require.NoError(t, vm.SetIdentityMapAddr(0xfffbc000))
	require.NoError(t, vm.SetTSSAddr(0xfffbd000))
	if irqchip {
		require.NoError(t, vm.CreateIRQChip())
	}
	require.NoError(t, vm.SetUserMemoryRegion(UserspaceMemoryRegion{Slot: 0, GuestPhysAddr: 0, Memory: mem}))

	vcpu, err := vm.CreateVCPU(0)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, vcpu.Close()) })

	sregs, err := vcpu.GetSregs()
	require.NoError(t, err)
	sregs.CS.Base, sregs.CS.Selector = 0, 0
	require.NoError(t, vcpu.SetSregs(sregs))
	require.NoError(t, vcpu.SetRegs(Regs{RIP: guestCodeGPA, RFLAGS: 2}))
	return vm, vcpu
}

// runUntilExit runs the vCPU, skipping interruptions by Go's own
// preemption signal, and returns the exit reason.
func runUntilExit(t testing.TB, vcpu *VCPU) ExitReason {
	t.Helper()
	for {
		err := vcpu.Run()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		require.NoError(t, err)
		return vcpu.RunData().ExitReason()
	}
}

func TestKVMSystem(t *testing.T) {
	s := openKVM(t)
	v, err := s.APIVersion()
	require.NoError(t, err)
	assert.Equal(t, APIVersion, v)

	for c := range capNames {
		n, err := s.CheckExtension(c)
		require.NoError(t, err)
		t.Logf("%-30v %d", c, n)
	}
	require.NoError(t, s.RequireCaps(CapUserMemory, CapIRQChip, CapImmediateExit))
	err = s.RequireCaps(CapUserMemory, Cap(100000))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "kvm: missing capability KVM_CAP(100000) (100000)")

	size, err := s.VCPUMmapSize()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, size, os.Getpagesize())

	cpuid, err := s.SupportedCPUID()
	require.NoError(t, err)
	require.NotEmpty(t, cpuid)
	var leaf0 *CPUIDEntry
	for i := range cpuid {
		if cpuid[i].Function == 0 {
			leaf0 = &cpuid[i]
		}
	}
	require.NotNil(t, leaf0, "leaf 0 (vendor) missing")
	vendor := make([]byte, 12)
	binary.LittleEndian.PutUint32(vendor[0:], leaf0.EBX)
	binary.LittleEndian.PutUint32(vendor[4:], leaf0.EDX)
	binary.LittleEndian.PutUint32(vendor[8:], leaf0.ECX)
	t.Logf("%d CPUID leaves, vendor %q, max basic leaf %#x", len(cpuid), vendor, leaf0.EAX)
	assert.NotZero(t, leaf0.EAX)

	msrs, err := s.MSRIndexList()
	require.NoError(t, err)
	assert.Contains(t, msrs, uint32(0x10), "IA32_TSC should be saved/restored")
	t.Logf("%d MSRs in KVM_GET_MSR_INDEX_LIST", len(msrs))
}

func TestKVMRealModeIO(t *testing.T) {
	code := []byte{
		0xb0, 0x42, // mov al, 0x42
		0xe6, testPort, // out 0x10, al
		0xb0, 0x43, // mov al, 0x43
		0xe6, testPort, // out 0x10, al
		0xf4, // hlt
	}
	_, vcpu := newRealModeGuest(t, code, false)
	run := vcpu.RunData()
	for _, want := range []byte{0x42, 0x43} {
		require.Equal(t, ExitIO, runUntilExit(t, vcpu), "%v", run.ExitReason())
		port, out, size, count, data := run.IO()
		assert.Equal(t, uint16(testPort), port)
		assert.True(t, out)
		assert.Equal(t, 1, size)
		assert.Equal(t, uint32(1), count)
		assert.Equal(t, []byte{want}, data)
	}
	require.Equal(t, ExitHLT, runUntilExit(t, vcpu))
	regs, err := vcpu.GetRegs()
	require.NoError(t, err)
	assert.Equal(t, uint64(guestCodeGPA+len(code)), regs.RIP, "RIP after hlt")
	assert.Equal(t, uint64(0x43), regs.RAX&0xff)
}

// TestKVMKick is the stop path of the VMM: a vCPU thread spinning in the
// guest must leave KVM_RUN with EINTR promptly once another goroutine sets
// immediate_exit and signals that thread.
func TestKVMKick(t *testing.T) {
	_, vcpu := newRealModeGuest(t, []byte{0xeb, 0xfe}, false) // jmp $
	run := vcpu.RunData()

	var stop atomic.Bool
	tids := make(chan int, 1)
	result := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tids <- unix.Gettid()
		for {
			err := vcpu.Run()
			if errors.Is(err, unix.EINTR) && !stop.Load() {
				continue // a stray signal, not our kick
			}
			if err == nil && !stop.Load() {
				continue // an exit KVM handled, e.g. a host interrupt
			}
			result <- err
			return
		}
	}()
	tid := <-tids
	time.Sleep(50 * time.Millisecond) // let the guest spin

	start := time.Now()
	stop.Store(true)
	run.SetImmediateExit(true)
	require.NoError(t, unix.Tgkill(unix.Getpid(), tid, unix.SIGURG))
	select {
	case err := <-result:
		require.Error(t, err)
		assert.True(t, errors.Is(err, unix.EINTR), "%v", err)
		assert.Same(t, errRunInterrupted, err, "EINTR must be the preallocated error")
		t.Logf("kick took %v, exit reason %v", time.Since(start), run.ExitReason())
	case <-time.After(5 * time.Second):
		t.Fatal("vCPU did not leave KVM_RUN within 5s of the kick")
	}

	// immediate_exit alone (no signal) makes the next KVM_RUN return at once,
	// without allocating.
	assert.True(t, run.ImmediateExit())
	allocs := testing.AllocsPerRun(20, func() {
		if err := vcpu.Run(); !errors.Is(err, unix.EINTR) {
			t.Errorf("Run with immediate_exit: got %v, want EINTR", err)
		}
	})
	assert.Zero(t, allocs)
	run.SetImmediateExit(false)
	assert.False(t, run.ImmediateExit())
}

// TestKVMIRQPlumbing exercises the interrupt and eventfd ioctls on a real VM
// with the in-kernel irqchip.
func TestKVMIRQPlumbing(t *testing.T) {
	vm, vcpu := newRealModeGuest(t, []byte{0xf4}, true)
	require.NoError(t, vm.CreatePIT2())

	// Legacy routes for GSIs 0-23 plus one MSI route at GSI 24.
	var routes []IRQRoutingEntry
	for gsi := uint32(0); gsi < 24; gsi++ {
		if gsi < 16 && gsi != 2 {
			var e IRQRoutingEntry
			e.GSI, e.Type = gsi, IRQRoutingIRQChip
			e.IRQChip.Chip, e.IRQChip.Pin = IRQChipPICMaster, gsi
			if gsi >= 8 {
				e.IRQChip.Chip, e.IRQChip.Pin = IRQChipPICSlave, gsi-8
			}
			routes = append(routes, e)
		}
		var e IRQRoutingEntry
		e.GSI, e.Type = gsi, IRQRoutingIRQChip
		e.IRQChip.Chip, e.IRQChip.Pin = IRQChipIOAPIC, gsi
		if gsi == 0 {
			e.IRQChip.Pin = 2 // the PIT's IOAPIC pin
		}
		routes = append(routes, e)
	}
	var msi IRQRoutingEntry
	msi.GSI, msi.Type = 24, IRQRoutingMSI
	msi.MSI.AddressLo, msi.MSI.Data = 0xfee00000, 0x30
	routes = append(routes, msi)
	require.NoError(t, vm.SetGSIRouting(routes))

	bad := append([]IRQRoutingEntry(nil), routes...)
	bad[0].IRQChip.Chip = 9 // no such irqchip: the kernel must refuse it
	err := vm.SetGSIRouting(bad)
	assert.ErrorIs(t, err, unix.EINVAL)

	require.NoError(t, vm.IRQLine(4, true))
	require.NoError(t, vm.IRQLine(4, false))

	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(efd)
	rfd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	require.NoError(t, err)
	defer unix.Close(rfd)

	require.NoError(t, vm.IRQFD(efd, 24, -1))
	err = vm.IRQFD(efd, 24, -1)
	assert.ErrorIs(t, err, unix.EBUSY, "the same eventfd twice")
	_, err = unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}) // fire the MSI through the irqfd
	require.NoError(t, err)
	require.NoError(t, vm.IRQFDDeassign(efd, 24))
	require.NoError(t, vm.IRQFD(efd, 10, rfd)) // level-triggered with resample
	require.NoError(t, vm.IRQFDDeassign(efd, 10))

	pio := IOEventFD{Addr: 0x510, Len: 2, FD: efd, Datamatch: 0x1234, Flags: IOEventFDFlagPIO | IOEventFDFlagDatamatch}
	require.NoError(t, vm.IOEventFD(pio))
	assert.ErrorIs(t, vm.IOEventFD(pio), unix.EEXIST)
	pio.Flags |= IOEventFDFlagDeassign
	require.NoError(t, vm.IOEventFD(pio))
	mmio := IOEventFD{Addr: 0xd0000000, Len: 4, FD: efd}
	require.NoError(t, vm.IOEventFD(mmio))
	mmio.Flags = IOEventFDFlagDeassign
	require.NoError(t, vm.IOEventFD(mmio))
	err = vm.IOEventFD(IOEventFD{Addr: 0x510, Len: 3, FD: efd, Flags: IOEventFDFlagPIO})
	assert.ErrorIs(t, err, unix.EINVAL, "length 3 is invalid")
	assert.Contains(t, err.Error(), "kvm: KVM_IOEVENTFD (addr 0x510, len 3")

	delivered, err := vm.SignalMSI(MSI{AddressLo: 0xfee00000, Data: 0x31})
	require.NoError(t, err)
	t.Logf("KVM_SIGNAL_MSI delivered=%v", delivered)

	lapic, err := vcpu.GetLAPIC()
	require.NoError(t, err)
	// Register 0x20 is the APIC ID, in bits 31:24 (xAPIC mode).
	assert.Equal(t, uint32(0), binary.LittleEndian.Uint32(lapic[0x20:])>>24)
	version := binary.LittleEndian.Uint32(lapic[0x30:])
	assert.NotZero(t, version&0xff, "LAPIC version register")
	require.NoError(t, vcpu.SetLAPIC(lapic))

	st, err := vcpu.GetMPState()
	require.NoError(t, err)
	assert.Equal(t, uint32(MPStateRunnable), st, "the BSP starts runnable")
	require.NoError(t, vcpu.SetMPState(MPStateRunnable))
}

func readStatsHeader(t *testing.T, fd int) {
	t.Helper()
	defer unix.Close(fd)
	// struct kvm_stats_header: flags, name_size, num_desc, id_offset,
	// desc_offset, data_offset (all __u32).
	hdr := make([]byte, 24)
	n, err := unix.Pread(fd, hdr, 0)
	require.NoError(t, err)
	require.Equal(t, len(hdr), n)
	nameSize := binary.LittleEndian.Uint32(hdr[4:])
	numDesc := binary.LittleEndian.Uint32(hdr[8:])
	idOff := binary.LittleEndian.Uint32(hdr[12:])
	assert.Equal(t, uint32(48), nameSize, "KVM_STATS_NAME_SIZE")
	assert.NotZero(t, numDesc)
	id := make([]byte, nameSize)
	_, err = unix.Pread(fd, id, int64(idOff))
	require.NoError(t, err)
	t.Logf("stats id %q, %d descriptors", strings.TrimRight(string(id), "\x00"), numDesc)
}

func TestKVMStatsFD(t *testing.T) {
	vm, vcpu := newRealModeGuest(t, []byte{0xf4}, false)
	fd, err := vm.StatsFD()
	require.NoError(t, err)
	readStatsHeader(t, fd)
	fd, err = vcpu.StatsFD()
	require.NoError(t, err)
	readStatsHeader(t, fd)
}

func TestKVMVCPUState(t *testing.T) {
	s := openKVM(t)
	_, vcpu := newRealModeGuest(t, []byte{0xf4}, false)

	cpuid, err := s.SupportedCPUID()
	require.NoError(t, err)
	require.NoError(t, vcpu.SetCPUID2(cpuid))
	back, err := vcpu.GetCPUID2()
	require.NoError(t, err)
	assert.Equal(t, len(cpuid), len(back), "KVM_GET_CPUID2 returns every leaf KVM_SET_CPUID2 gave")
	assert.Contains(t, back, cpuid[0])

	fpu := FPU{FCW: 0x37f, MXCSR: 0x1f80}
	fpu.XMM[3][0] = 0xab
	require.NoError(t, vcpu.SetFPU(fpu))
	got, err := vcpu.GetFPU()
	require.NoError(t, err)
	assert.Equal(t, uint16(0x37f), got.FCW)
	// MXCSR is deliberately not compared: KVM_GET_FPU does not report it
	// (it reads back 0 on 6.18); see the SetFPU doc comment.
	assert.Equal(t, uint8(0xab), got.XMM[3][0])

	const sysenterCS = 0x174
	require.NoError(t, vcpu.SetMSRs([]MSREntry{{Index: sysenterCS, Data: 0x10}}))
	msrs := []MSREntry{{Index: sysenterCS}}
	require.NoError(t, vcpu.GetMSRs(msrs))
	assert.Equal(t, uint64(0x10), msrs[0].Data)

	ignore, _ := os.ReadFile("/sys/module/kvm/parameters/ignore_msrs")
	if strings.TrimSpace(string(ignore)) != "Y" {
		err = vcpu.SetMSRs([]MSREntry{{Index: sysenterCS, Data: 0x10}, {Index: 0xdeadbeef, Data: 1}})
		require.Error(t, err)
		assert.Contains(t, err.Error(), "set 1 of 2 msrs, MSR 0xdeadbeef")
	}

	sregs, err := vcpu.GetSregs()
	require.NoError(t, err)
	assert.Equal(t, uint64(0), sregs.CS.Base)
	assert.Equal(t, uint32(0xffff), sregs.CS.Limit, "real-mode CS limit")
}

func TestKVMXCR0(t *testing.T) {
	s := openKVM(t)
	_, vcpu := newRealModeGuest(t, []byte{0xf4}, false)
	cpuid, err := s.SupportedCPUID()
	require.NoError(t, err)
	require.NoError(t, vcpu.SetCPUID2(cpuid))
	var leaf1 uint32
	for _, e := range cpuid {
		if e.Function == 1 {
			leaf1 = e.ECX
		}
	}
	if leaf1&(1<<26) == 0 {
		t.Skip("no XSAVE in KVM's supported CPUID")
	}

	x, err := vcpu.GetXCR0()
	require.NoError(t, err)
	assert.Equal(t, uint64(1), x, "architectural reset value")
	require.NoError(t, vcpu.SetXCR0(0x3)) // x87 and SSE: every XSAVE CPU has them
	x, err = vcpu.GetXCR0()
	require.NoError(t, err)
	assert.Equal(t, uint64(0x3), x)
	err = vcpu.SetXCR0(0x2) // without x87: invalid
	require.Error(t, err)
	assert.Contains(t, err.Error(), "KVM_SET_XCRS")
}

func TestKVMEnableCapAndDevice(t *testing.T) {
	s := openKVM(t)
	vm := createVM(t, s)

	mask, err := vm.CheckExtension(CapX86DisableExits)
	require.NoError(t, err)
	if mask&X86DisableExitsPause != 0 {
		require.NoError(t, vm.EnableCap(CapX86DisableExits, X86DisableExitsPause))
	} else {
		t.Logf("KVM_CAP_X86_DISABLE_EXITS mask %#x lacks PAUSE; not enabling", mask)
	}
	err = vm.EnableCap(CapX86DisableExits, 1, 2, 3, 4, 5)
	assert.ErrorContains(t, err, "at most 4")
	assert.ErrorIs(t, vm.EnableCap(Cap(100000)), unix.EINVAL)

	fd, err := vm.CreateDevice(DeviceVFIO)
	if err != nil {
		t.Skipf("kvm-vfio device unavailable on this host: %v", err)
	}
	defer unix.Close(fd)
	has, err := vm.HasDeviceAttr(fd, DeviceAttrVFIOGroup, VFIOGroupAdd)
	require.NoError(t, err)
	assert.True(t, has)
	has, err = vm.HasDeviceAttr(fd, 1000, 0)
	require.NoError(t, err)
	assert.False(t, has)
	// fd -1 is no VFIO group: the kernel must have read our int32 (EBADF),
	// not failed to read it (EFAULT).
	err = vm.SetDeviceAttrInt32(fd, DeviceAttrVFIOGroup, VFIOGroupAdd, -1)
	require.Error(t, err)
	assert.ErrorIs(t, err, unix.EBADF)
}

// ioLoop is `1: out 0x10, al; jmp 1b`: every KVM_RUN ends in an IO exit.
var ioLoop = []byte{0xe6, testPort, 0xeb, 0xfc}

func TestKVMExitPathDoesNotAllocate(t *testing.T) {
	_, vcpu := newRealModeGuest(t, ioLoop, false)
	run := vcpu.RunData()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	allocs := testing.AllocsPerRun(50, func() {
		if err := vcpu.Run(); err != nil && !errors.Is(err, unix.EINTR) {
			t.Fatal(err)
		}
		if run.ExitReason() == ExitIO {
			_, _, _, _, _ = run.IO()
		}
	})
	assert.Zero(t, allocs)
}

// BenchmarkIOExitRoundTrip measures one port-I/O exit to userspace and back.
func BenchmarkIOExitRoundTrip(b *testing.B) {
	_, vcpu := newRealModeGuest(b, ioLoop, false)
	run := vcpu.RunData()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	b.ReportAllocs()
	for b.Loop() {
		if err := vcpu.Run(); err != nil && !errors.Is(err, unix.EINTR) {
			b.Fatal(err)
		}
		if run.ExitReason() == ExitIO {
			if port, _, _, _, _ := run.IO(); port != testPort {
				b.Fatalf("IO exit on port %#x", port)
			}
		}
	}
}
