package vmm

import (
	"errors"
	"io"
	"log/slog"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// BenchmarkExitDispatch runs a real-mode guest that writes the UART's
// scratch register in a loop, so every iteration is one KVM_RUN, one port
// I/O exit and its dispatch through the bus to the 16550 model: the vCPU
// exit path as the VM runs it. It must not allocate.
func BenchmarkExitDispatch(b *testing.B) {
	sys, err := uapi.OpenKVM()
	if err != nil {
		b.Skipf("no usable /dev/kvm: %v", err)
	}
	defer sys.Close()
	kvm, err := sys.CreateVM()
	require.NoError(b, err)
	defer kvm.Close()
	mem, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	require.NoError(b, err)
	defer unix.Munmap(mem)
	// mov dx, 0x3ff; l: out dx, al; jmp l
	copy(mem[0x1000:], []byte{0xba, 0xff, 0x03, 0xee, 0xeb, 0xfd})
	require.NoError(b, kvm.SetTSSAddr(tssAddr))
	require.NoError(b, kvm.SetUserMemoryRegion(uapi.UserspaceMemoryRegion{Memory: mem}))
	c, err := kvm.CreateVCPU(0)
	require.NoError(b, err)
	defer c.Close()
	sregs, err := c.GetSregs()
	require.NoError(b, err)
	sregs.CS.Base, sregs.CS.Selector = 0, 0
	require.NoError(b, c.SetSregs(sregs))
	require.NoError(b, c.SetRegs(uapi.Regs{RIP: 0x1000, RFLAGS: 2}))

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	vm := &VM{log: log, dev: devices{unhandledPIO: platform.NewUnhandled(log, "port I/O"), unhandledMMIO: platform.NewUnhandled(log, "MMIO")}}
	require.NoError(b, vm.dev.pio.Register(serialBase, 8, "serial0", platform.NewSerial(os.Stdout, nil)))
	v := &vcpu{cpu: c, run: c.RunData(), vm: vm}

	b.ReportAllocs()
	for b.Loop() {
		err := c.Run()
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			b.Fatal(err)
		}
		reason := v.run.ExitReason()
		if reason != uapi.ExitIO {
			b.Fatalf("exit %v, want KVM_EXIT_IO", reason)
		}
		if err := v.handleExit(reason); err != nil {
			b.Fatal(err)
		}
	}
}
