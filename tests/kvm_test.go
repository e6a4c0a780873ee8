//go:build integration

package tests

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// realModeProgram runs at guestCodeAddr in real mode (CS base 0): a few OUTs
// of each size to port 0x10, one to port 0x80 with an immediate port, a
// string OUT (rep outsb) of "abc" to port 0x11, then HLT.
var realModeProgram = []byte{
	0xba, 0x10, 0x00, // mov dx, 0x10
	0xb0, 0x11, // mov al, 0x11
	0xee,       // out dx, al
	0xb0, 0x22, // mov al, 0x22
	0xee,                               // out dx, al
	0x66, 0xb8, 0x44, 0x33, 0x22, 0x11, // mov eax, 0x11223344
	0x66, 0xef, // out dx, eax
	0xb8, 0xcd, 0xab, // mov ax, 0xabcd
	0xef,       // out dx, ax
	0xe6, 0x80, // out 0x80, al
	0xbe, 0x00, 0x11, // mov si, 0x1100 (guestDataAddr)
	0xb9, 0x03, 0x00, // mov cx, 3
	0xba, 0x11, 0x00, // mov dx, 0x11
	0xf3, 0x6e, // rep outsb
	0xf4, // hlt
}

const (
	guestCodeAddr = 0x1000
	guestDataAddr = 0x1100
	guestMemSize  = 0x10000
)

// ioExit is one KVM_EXIT_IO as seen by userspace.
type ioExit struct {
	Port  uint16
	Out   bool
	Size  int
	Count uint32
	Data  []byte
}

func (e ioExit) String() string {
	return fmt.Sprintf("port %#x out=%v size %d count %d data % x", e.Port, e.Out, e.Size, e.Count, e.Data)
}

// TestKVMRunsGuestCodeWithPortIO creates a VM through the project's own
// KVM layer (uapi), runs a few real-mode instructions and checks that every
// port write reaches userspace as a KVM_EXIT_IO with the right port, size
// and data, and that HLT ends the run. It proves the harness end to end
// before the boot path exists.
func TestKVMRunsGuestCodeWithPortIO(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		sys, err := uapi.OpenKVM()
		require.NoError(t, err)
		defer sys.Close()
		ver, err := sys.APIVersion()
		require.NoError(t, err)
		require.Equal(t, uapi.APIVersion, ver)
		env.Record(t, "kvm_api_version", strconv.Itoa(ver))

		vm, err := sys.CreateVM()
		require.NoError(t, err)
		defer vm.Close()

		// Guest RAM must not be Go heap memory: KVM keeps the mapping.
		mem, err := unix.Mmap(-1, 0, guestMemSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		require.NoError(t, err, "mmap guest memory")
		defer unix.Munmap(mem)
		copy(mem[guestCodeAddr:], realModeProgram)
		copy(mem[guestDataAddr:], "abc")
		require.NoError(t, vm.SetUserMemoryRegion(uapi.UserspaceMemoryRegion{Slot: 0, GuestPhysAddr: 0, Memory: mem}))

		vcpu, err := vm.CreateVCPU(0)
		require.NoError(t, err)
		defer vcpu.Close()

		sregs, err := vcpu.GetSregs()
		require.NoError(t, err)
		// Reset state has CS base 0xffff0000; flatten it so IP is a
		// physical address in our slot.
		sregs.CS.Base, sregs.CS.Selector = 0, 0
		sregs.DS.Base, sregs.DS.Selector = 0, 0
		require.NoError(t, vcpu.SetSregs(sregs))
		require.NoError(t, vcpu.SetRegs(uapi.Regs{RIP: guestCodeAddr, RFLAGS: 0x2}))

		var exits []ioExit
		halted := false
		run := vcpu.RunData()
		for i := 0; i < 100 && !halted; i++ {
			require.NoError(t, vcpu.Run(), "KVM_RUN after %d exits", len(exits))
			switch r := run.ExitReason(); r {
			case uapi.ExitIO:
				port, out, size, count, data := run.IO()
				exits = append(exits, ioExit{port, out, size, count, bytes.Clone(data)})
			case uapi.ExitHLT:
				halted = true
			default:
				regs, _ := vcpu.GetRegs()
				t.Fatalf("unexpected exit %v at rip %#x after %d I/O exits %v", r, regs.RIP, len(exits), exits)
			}
		}
		require.True(t, halted, "guest never reached HLT; I/O exits: %v", exits)
		regs, err := vcpu.GetRegs()
		require.NoError(t, err)
		require.Equal(t, uint64(guestCodeAddr+len(realModeProgram)), regs.RIP, "RIP after HLT points past the program")

		require.GreaterOrEqual(t, len(exits), 6, "exits: %v", exits)
		want := []ioExit{
			{Port: 0x10, Out: true, Size: 1, Count: 1, Data: []byte{0x11}},
			{Port: 0x10, Out: true, Size: 1, Count: 1, Data: []byte{0x22}},
			{Port: 0x10, Out: true, Size: 4, Count: 1, Data: []byte{0x44, 0x33, 0x22, 0x11}},
			{Port: 0x10, Out: true, Size: 2, Count: 1, Data: []byte{0xcd, 0xab}},
			{Port: 0x80, Out: true, Size: 1, Count: 1, Data: []byte{0xcd}},
		}
		require.Equal(t, want, exits[:len(want)])
		// KVM may deliver rep outsb as one exit with count 3 or split it;
		// either way port 0x11 must see exactly "abc", byte-sized.
		var str []byte
		for _, e := range exits[len(want):] {
			require.Equal(t, uint16(0x11), e.Port, "string I/O exit %v", e)
			require.True(t, e.Out)
			require.Equal(t, 1, e.Size)
			require.Len(t, e.Data, int(e.Count))
			str = append(str, e.Data...)
		}
		require.Equal(t, "abc", string(str))
		env.Record(t, "io_exits", strconv.Itoa(len(exits)))
		env.Record(t, "string_io_exits", strconv.Itoa(len(exits)-len(want)))
		env.Record(t, "where", string(env.Where()))
	})
}
