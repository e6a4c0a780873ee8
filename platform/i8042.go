package platform

import (
	"sync"

	"github.com/hpcvmm/hpcvmm/bus"
)

// Port addresses of the i8042 keyboard controller.
const (
	I8042DataPort    = 0x60 // data: controller/keyboard output, command parameters
	I8042CommandPort = 0x64 // read: status register; write: controller command
)

// Status register bits (drivers/input/serio/i8042.h).
const (
	i8042StrOBF     = 0x01 // output buffer full: a byte waits at 0x60
	i8042StrSysFlag = 0x04 // set after a successful self-test (POST)
	i8042StrCmdDat  = 0x08 // last write was to the command port
	i8042StrKeylock = 0x10 // 1 = keyboard not inhibited by the keylock
	// Bit 5 (AUX data) is never set: there is no AUX port.
)

// Controller commands (written to 0x64).
const (
	i8042CmdReadCTR   = 0x20
	i8042CmdWriteCTR  = 0x60
	i8042CmdAuxDis    = 0xa7
	i8042CmdAuxEn     = 0xa8
	i8042CmdAuxTest   = 0xa9
	i8042CmdSelfTest  = 0xaa
	i8042CmdKbdTest   = 0xab
	i8042CmdKbdDis    = 0xad
	i8042CmdKbdEn     = 0xae
	i8042CmdReadIn    = 0xc0
	i8042CmdReadOut   = 0xd0
	i8042CmdWriteOut  = 0xd1
	i8042CmdWriteKbd  = 0xd2
	i8042CmdWriteAux  = 0xd3
	i8042CmdToAux     = 0xd4
	i8042CmdReadTest  = 0xe0
	i8042CmdPulseBase = 0xf0 // 0xf0-0xff: pulse output-port bits 0-3 low where the command bit is 0
)

// Controller configuration byte (CTR) bits.
const (
	i8042CtrKbdDis = 0x10
	i8042CtrAuxDis = 0x20
)

// Output port bits.
const (
	i8042OutReset = 0x01 // CPU reset line, active low
	i8042OutA20   = 0x02
)

// I8042 is a PS/2 keyboard controller with neither keyboard nor mouse
// attached. Its job is the CPU-reset line: Linux's reboot=k writes 0xFE to
// the command port. It answers the controller commands Linux's i8042 driver
// issues while probing (read/write CTR, self-tests, AUX loop) immediately,
// so the probe never waits for a timeout, and it makes the driver conclude
// there is no AUX port. Keyboard commands go unanswered: atkbd's probe
// gives up after its own timeout in a background thread.
//
// Register the two ports separately: DataPort at I8042DataPort and
// CommandPort at I8042CommandPort, one byte each.
type I8042 struct {
	mu    sync.Mutex
	reset func()

	// +checklocks:mu
	out byte // output buffer (port 0x60)
	// +checklocks:mu
	outFull bool
	// +checklocks:mu
	status byte // sticky status bits other than OBF
	// +checklocks:mu
	ctr byte // controller configuration byte
	// +checklocks:mu
	outPort byte
	// +checklocks:mu
	pending byte // command waiting for its parameter byte at 0x60, or 0
	// +checklocks:mu
	lastRead byte
}

// NewI8042 returns a controller that calls reset when the guest pulses the
// CPU-reset line. reset is called without the controller's lock held and
// may be nil.
func NewI8042(reset func()) *I8042 {
	if reset == nil {
		reset = func() {}
	}
	return &I8042{
		reset:  reset,
		status: i8042StrSysFlag | i8042StrKeylock,
		// Interrupts on, system flag, scancode translation, AUX off:
		// what firmware leaves behind on a machine without a mouse.
		ctr:     0x01 | 0x04 | 0x40 | i8042CtrAuxDis,
		outPort: i8042OutReset | i8042OutA20,
	}
}

// DataPort returns the device for port 0x60.
func (k *I8042) DataPort() bus.Device { return i8042Data{k} }

// CommandPort returns the device for port 0x64.
func (k *I8042) CommandPort() bus.Device { return i8042Command{k} }

type i8042Data struct{ k *I8042 }

// Read returns the output buffer and empties it; with nothing buffered it
// repeats the last byte, as the latch on real hardware does.
func (d i8042Data) Read(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	k := d.k
	k.mu.Lock()
	if offset == 0 {
		if k.outFull {
			k.lastRead = k.out
			k.outFull = false
		}
		data[0] = k.lastRead
	} else {
		data[0] = 0xff
	}
	k.mu.Unlock()
	fill(data[1:], 0xff)
}

// Write delivers the parameter of a pending controller command; without
// one the byte is meant for the keyboard, which is absent.
func (d i8042Data) Write(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 {
		return
	}
	k := d.k
	v := data[0]
	doReset := false
	k.mu.Lock()
	k.status &^= i8042StrCmdDat
	cmd := k.pending
	k.pending = 0
	switch cmd {
	case i8042CmdWriteCTR:
		k.ctr = v
	case i8042CmdWriteOut:
		k.outPort = v
		doReset = v&i8042OutReset == 0
	case i8042CmdWriteKbd:
		k.put(v)
	case i8042CmdWriteAux:
		// AUX loopback. There is no AUX port, so the byte comes back
		// without the AUX flag: Linux's i8042_check_aux sees that at
		// once and skips the port instead of waiting for a timeout.
		k.put(v)
	}
	k.mu.Unlock()
	if doReset {
		k.reset()
	}
}

type i8042Command struct{ k *I8042 }

// Read returns the status register.
func (c i8042Command) Read(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	k := c.k
	k.mu.Lock()
	v := k.status
	if k.outFull {
		v |= i8042StrOBF
	}
	k.mu.Unlock()
	if offset != 0 {
		v = 0xff
	}
	data[0] = v
	fill(data[1:], 0xff)
}

// Write executes a controller command.
func (c i8042Command) Write(offset uint64, data []byte) {
	if offset != 0 || len(data) == 0 {
		return
	}
	k := c.k
	cmd := data[0]
	doReset := false
	k.mu.Lock()
	k.status |= i8042StrCmdDat
	k.pending = 0
	switch cmd {
	case i8042CmdReadCTR:
		k.put(k.ctr)
	case i8042CmdWriteCTR, i8042CmdWriteOut, i8042CmdWriteKbd, i8042CmdWriteAux, i8042CmdToAux:
		k.pending = cmd
	case i8042CmdAuxDis:
		k.ctr |= i8042CtrAuxDis
	case i8042CmdAuxEn:
		k.ctr &^= i8042CtrAuxDis
	case i8042CmdAuxTest:
		// 0x02: AUX clock line stuck high, i.e. nothing attached.
		k.put(0x02)
	case i8042CmdSelfTest:
		k.status |= i8042StrSysFlag
		k.put(0x55)
	case i8042CmdKbdTest:
		k.put(0x00)
	case i8042CmdKbdDis:
		k.ctr |= i8042CtrKbdDis
	case i8042CmdKbdEn:
		k.ctr &^= i8042CtrKbdDis
	case i8042CmdReadIn:
		k.put(0x80) // keyboard not inhibited
	case i8042CmdReadOut:
		v := k.outPort &^ 0x30
		if k.outFull {
			v |= 0x10
		}
		k.put(v)
	case i8042CmdReadTest:
		k.put(0x00)
	default:
		// 0xf0-0xff pulse output-port bits 0-3 low for each command
		// bit that is 0; bit 0 is the CPU reset line. 0xFE, the
		// command Linux's reboot=k uses, is the canonical one.
		if cmd >= i8042CmdPulseBase && cmd&i8042OutReset == 0 {
			doReset = true
		}
		// Anything else is a command this controller lacks; like the
		// real firmware it is ignored.
	}
	k.mu.Unlock()
	if doReset {
		k.reset()
	}
}

// put places a byte in the output buffer. A controller response overwrites
// an unread byte: the guest issued a new command, so the old answer is
// stale (Linux's AUX probe depends on this after an AUX loop it rejects).
// +checklocks:k.mu
func (k *I8042) put(v byte) {
	k.out = v
	k.outFull = true
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}
