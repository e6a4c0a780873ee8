package platform

import (
	"sync"
	"sync/atomic"

	"github.com/hpcvmm/hpcvmm/acpi"
)

// ACPI hardware-reduced platform registers (ACPI 6.5 §4.1 "Hardware-Reduced
// ACPI", §4.8.3.7 sleep control/status, §4.8.3.6 reset register) and the
// Generic Event Device (§5.6.9) that carries the power button. The FADT and
// DSDT (package acpi) point the guest at these; every access is
// guest-controlled and only ever changes the few bits defined here.

// Port addresses of the ACPI registers, one byte each, in a block no legacy
// device or BAR window uses (BARs' I/O window starts at 0xc000).
const (
	ACPISleepControlPort = 0x600 // FADT SLEEP_CONTROL_REG
	ACPISleepStatusPort  = 0x601 // FADT SLEEP_STATUS_REG
	ACPIResetPort        = 0x602 // FADT RESET_REG
	ACPIPortsSize        = 3
)

// ACPI register values.
const (
	// ACPIResetValue is FADT RESET_VALUE: writing it to the reset register
	// resets the machine.
	ACPIResetValue = 0x1
	// ACPISleepTypeS5 is the SLP_TYP the DSDT's \_S5_ package gives: with
	// SLP_EN it powers the machine off.
	ACPISleepTypeS5 = 5

	// sleepTypeMask is SLP_TYPx, bits 4:2 of the sleep control register
	// (the bit layout is package acpi's, which the FADT describes).
	sleepTypeMask = 7 << acpi.SleepTypeShift
)

// ACPIPM is the hardware-reduced sleep control, sleep status and reset
// registers. A guest's poweroff writes SLP_TYP=S5|SLP_EN to sleep control;
// its reboot (reboot=a, or the ACPI reset Linux tries first by default)
// writes ACPIResetValue to the reset register. Other sleep states are not
// supported: the write is ignored, as a platform without them would.
type ACPIPM struct {
	onPowerOff, onReset func()
	ignored             atomic.Uint64
}

// NewACPIPM returns the registers; onPowerOff and onReset run on the vCPU
// thread that wrote them.
func NewACPIPM(onPowerOff, onReset func()) *ACPIPM {
	return &ACPIPM{onPowerOff: onPowerOff, onReset: onReset}
}

// Read implements bus.Device for the three ports. Sleep status reads WAK_STS
// clear (the machine never sleeps); the others read 0.
func (p *ACPIPM) Read(offset uint64, data []byte) {
	clear(data)
}

// Write implements bus.Device.
func (p *ACPIPM) Write(offset uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	switch offset + ACPISleepControlPort {
	case ACPISleepControlPort:
		if v&acpi.SleepEnable == 0 {
			return
		}
		if (v&sleepTypeMask)>>acpi.SleepTypeShift == ACPISleepTypeS5 {
			p.onPowerOff()
			return
		}
		p.ignored.Add(1)
	case ACPIResetPort:
		if v == ACPIResetValue {
			p.onReset()
			return
		}
		p.ignored.Add(1)
	}
	// Sleep status: writing WAK_STS clears it; it is never set.
}

// Ignored counts writes that asked for something unsupported (a sleep state
// other than S5, a wrong reset value): a guest that expected them waits.
func (p *ACPIPM) Ignored() uint64 { return p.ignored.Load() }

// GED event bits in the event register (the DSDT's _EVT method tests them).
const (
	// GEDPowerButton is set when the power button was pressed: _EVT then
	// notifies \_SB.PWRB with 0x80 (button pressed).
	GEDPowerButton = acpi.GEDPowerButton
)

// GEDSize is the GED's MMIO register block: one 32-bit event register.
const GEDSize = acpi.GEDRegisterLen

// GED is the Generic Event Device's event register: Press sets a bit and
// raises the GED interrupt; the guest's _EVT handler reads the register,
// which returns the pending bits and clears them (read-to-clear, so an
// event is handled once however many vCPUs look). Writes are ignored.
type GED struct {
	mu sync.Mutex
	// +checklocks:mu
	pending uint32
	raise   func()
	// OnRead, if set, hears each event-register read with the events it
	// returned (the guest's _EVT ran): evidence in the log that the guest's
	// ACPI handled a press.
	OnRead func(events uint32)
}

// NewGED returns the device; raise injects its interrupt (an edge on its
// GSI).
func NewGED(raise func()) *GED { return &GED{raise: raise} }

// Press records event bits (GEDPowerButton) and raises the interrupt.
func (g *GED) Press(event uint32) {
	g.mu.Lock()
	g.pending |= event
	g.mu.Unlock()
	g.raise()
}

// Read implements bus.Device: an aligned 4-byte read of offset 0 returns
// and clears the pending events; anything else reads 0.
func (g *GED) Read(offset uint64, data []byte) {
	clear(data)
	if offset != 0 || len(data) != 4 {
		return
	}
	g.mu.Lock()
	v := g.pending
	g.pending = 0
	g.mu.Unlock()
	data[0], data[1], data[2], data[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	if g.OnRead != nil {
		g.OnRead(v)
	}
}

// Write implements bus.Device: the register is read-only.
func (g *GED) Write(offset uint64, data []byte) {}
