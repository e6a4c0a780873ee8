// Package platform models the few legacy PC devices a Linux guest expects
// even on a minimal machine: a 16550A UART for the console, the i8042
// keyboard controller for its CPU-reset line (reboot=k), and a sink that
// answers accesses nothing claims with all ones and logs each address once.
//
// Every device here sits on the vCPU exit path and takes guest-controlled
// input, so none of them panics on any offset, width or value, and the
// common accesses allocate nothing.
package platform

import (
	"io"
	"sync"
)

// Conventional placement of the first serial port.
const (
	COM1Base = 0x3f8 // port-I/O base of COM1
	COM1IRQ  = 4     // ISA IRQ line of COM1
	// SerialSize is the number of port addresses a 16550 decodes.
	SerialSize = 8
)

// UART register offsets (include/uapi/linux/serial_reg.h).
const (
	regRBR = 0 // receive buffer (read, DLAB=0)
	regTHR = 0 // transmit holding (write, DLAB=0)
	regDLL = 0 // divisor latch low (DLAB=1)
	regIER = 1 // interrupt enable (DLAB=0)
	regDLM = 1 // divisor latch high (DLAB=1)
	regIIR = 2 // interrupt identification (read)
	regFCR = 2 // FIFO control (write)
	regLCR = 3 // line control
	regMCR = 4 // modem control
	regLSR = 5 // line status
	regMSR = 6 // modem status
	regSCR = 7 // scratch
)

// Register bits.
const (
	ierRDI  = 0x01 // received data available
	ierTHRI = 0x02 // transmit holding register empty
	ierRLSI = 0x04 // receiver line status
	ierMSI  = 0x08 // modem status
	ierMask = 0x0f // a 16550A implements only these; Linux's XScale probe writes bit 6

	iirNoInt   = 0x01
	iirMSI     = 0x00
	iirTHRI    = 0x02
	iirRDI     = 0x04
	iirRLSI    = 0x06
	iirFIFO    = 0xc0 // both FIFO-enabled bits: what makes Linux say "16550A"
	fcrEnable  = 0x01
	fcrClearRx = 0x02

	lcrDLAB = 0x80

	mcrDTR  = 0x01
	mcrRTS  = 0x02
	mcrOUT1 = 0x04
	mcrOUT2 = 0x08
	mcrLoop = 0x10
	mcrMask = 0x1f

	lsrDR   = 0x01
	lsrOE   = 0x02
	lsrTHRE = 0x20
	lsrTEMT = 0x40
	lsrErr  = lsrOE // the only error this model can produce: input overflow

	msrDCTS  = 0x01
	msrDDSR  = 0x02
	msrTERI  = 0x04
	msrDDCD  = 0x08
	msrCTS   = 0x10
	msrDSR   = 0x20
	msrRI    = 0x40
	msrDCD   = 0x80
	msrDelta = 0x0f
)

// rxCap bounds the receive queue. A real 16550A holds 16 bytes; the model
// holds more so a paste into the console is not lost while the guest is
// busy, and still bounds what a stdin flood can pin in memory. Bytes beyond
// it are dropped with an overrun, as on hardware.
const rxCap = 64 << 10

// Serial is a 16550A UART. The guest drives it through Read and Write (as a
// bus.Device over SerialSize ports); the host feeds it with Input. Output
// is written to out synchronously, one byte per THR write.
//
// Transmission is instantaneous: THR and the transmitter are always empty
// (LSR.THRE|TEMT), so the guest never waits, and each write re-raises the
// THR-empty interrupt when enabled.
type Serial struct {
	mu  sync.Mutex
	out io.Writer
	irq func()

	ier, lcr, mcr, scr byte
	dll, dlm           byte
	fcr                byte
	lsrErr             byte // sticky error bits, cleared by reading LSR
	msrDelta           byte // MSR delta bits, cleared by reading MSR
	thrPending         bool // THR-empty interrupt raised and not yet acknowledged

	rx       []byte // ring buffer of rxCap bytes
	rxHead   int
	rxLen    int
	txByte   [1]byte // reused for every output byte so THR writes don't allocate
	lastRead byte    // RBR value when the queue is empty
}

// NewSerial returns a UART that writes guest output to out and calls irq to
// pulse its interrupt line (IRQ 4 for COM1) whenever an enabled interrupt
// condition becomes pending. irq may be called from the vCPU thread and
// from the goroutine calling Input, but never with the UART's lock held.
// out and irq may be nil.
func NewSerial(out io.Writer, irq func()) *Serial {
	if out == nil {
		out = io.Discard
	}
	if irq == nil {
		irq = func() {}
	}
	return &Serial{
		out: out,
		irq: irq,
		dll: 0x0c, // 9600 baud, the usual firmware default
		rx:  make([]byte, rxCap),
	}
}

// Input queues bytes received from the host side (the console's stdin) and
// raises the received-data interrupt if the guest enabled it. It is safe to
// call concurrently with guest accesses. Bytes that do not fit are dropped
// and reported to the guest as an overrun.
func (s *Serial) Input(p []byte) {
	if len(p) == 0 {
		return
	}
	s.mu.Lock()
	for _, b := range p {
		s.push(b)
	}
	kick := s.rxInterrupt()
	s.mu.Unlock()
	if kick {
		s.irq()
	}
}

// push appends one received byte, or records an overrun when the queue is
// full.
func (s *Serial) push(b byte) {
	if s.rxLen == len(s.rx) {
		s.lsrErr |= lsrOE
		return
	}
	s.rx[(s.rxHead+s.rxLen)%len(s.rx)] = b
	s.rxLen++
}

// rxInterrupt reports whether a receive-side interrupt is enabled and
// pending.
func (s *Serial) rxInterrupt() bool {
	return s.ier&ierRDI != 0 && s.rxLen > 0 || s.ier&ierRLSI != 0 && s.lsrErr != 0
}

// Read implements bus.Device. An access wider than a byte reads consecutive
// registers, as the ISA bus splits it; bytes past the last register read as
// all ones.
func (s *Serial) Read(offset uint64, data []byte) {
	s.mu.Lock()
	for i := range data {
		if offset >= SerialSize || uint64(i) >= SerialSize-offset {
			data[i] = 0xff
			continue
		}
		data[i] = s.readReg(offset + uint64(i))
	}
	s.mu.Unlock()
}

// Write implements bus.Device. An access wider than a byte writes
// consecutive registers; bytes past the last register are ignored.
func (s *Serial) Write(offset uint64, data []byte) {
	kick := false
	s.mu.Lock()
	for i, v := range data {
		if offset >= SerialSize || uint64(i) >= SerialSize-offset {
			break
		}
		if s.writeReg(offset+uint64(i), v) {
			kick = true
		}
	}
	s.mu.Unlock()
	if kick {
		s.irq()
	}
}

func (s *Serial) readReg(reg uint64) byte {
	switch reg {
	case regRBR:
		if s.lcr&lcrDLAB != 0 {
			return s.dll
		}
		if s.rxLen > 0 {
			s.lastRead = s.rx[s.rxHead]
			s.rxHead = (s.rxHead + 1) % len(s.rx)
			s.rxLen--
		}
		return s.lastRead
	case regIER:
		if s.lcr&lcrDLAB != 0 {
			return s.dlm
		}
		return s.ier
	case regIIR:
		id := s.pendingID()
		if id == iirTHRI {
			// Reading IIR while it reports THR empty acknowledges that
			// interrupt (16550 datasheet); Linux's THRE test relies on
			// it being re-raised only by re-enabling THRI or a write.
			s.thrPending = false
		}
		if s.fcr&fcrEnable != 0 {
			id |= iirFIFO
		}
		return id
	case regLCR:
		return s.lcr
	case regMCR:
		return s.mcr
	case regLSR:
		v := s.lsr()
		s.lsrErr = 0
		return v
	case regMSR:
		v := s.msr()
		s.msrDelta = 0
		return v
	case regSCR:
		return s.scr
	}
	return 0xff
}

// writeReg performs one register write and reports whether an enabled
// interrupt condition became pending.
func (s *Serial) writeReg(reg uint64, v byte) bool {
	switch reg {
	case regTHR:
		if s.lcr&lcrDLAB != 0 {
			s.dll = v
			return false
		}
		kick := false
		if s.mcr&mcrLoop != 0 {
			// Loopback: the transmitter feeds the receiver and
			// nothing leaves the chip.
			s.push(v)
			kick = s.rxInterrupt()
		} else {
			s.txByte[0] = v
			// A console that stopped accepting output must not stop
			// the guest; the byte is lost, as on a disconnected line.
			_, _ = s.out.Write(s.txByte[:])
		}
		// The byte left instantly, so THR is empty again.
		s.thrPending = s.ier&ierTHRI != 0
		return kick || s.thrPending
	case regIER:
		if s.lcr&lcrDLAB != 0 {
			s.dlm = v
			return false
		}
		old := s.ier
		s.ier = v & ierMask
		kick := false
		if s.ier&ierTHRI != 0 && old&ierTHRI == 0 {
			// Enabling THRI with THR empty raises the interrupt at
			// once; Linux's 8250 driver starts transmitting this way.
			s.thrPending = true
			kick = true
		} else if s.ier&ierTHRI == 0 {
			s.thrPending = false
		}
		newly := s.ier &^ old
		if newly&ierRDI != 0 && s.rxLen > 0 ||
			newly&ierRLSI != 0 && s.lsrErr != 0 ||
			newly&ierMSI != 0 && s.msrDelta != 0 {
			kick = true
		}
		return kick
	case regFCR:
		if (v^s.fcr)&fcrEnable != 0 || v&fcrClearRx != 0 {
			// Toggling the FIFOs or asking for it clears the receive
			// FIFO; input the guest never saw is discarded as on
			// hardware.
			s.rxHead, s.rxLen = 0, 0
		}
		// Only the enable and trigger-level bits are remembered; the
		// clear bits self-clear. Bit 5 (64-byte FIFO) is 16750-only
		// and stays clear, so Linux does not detect a 16750.
		s.fcr = v & 0xc1
		return false
	case regLCR:
		s.lcr = v
		return false
	case regMCR:
		return s.setMCR(v & mcrMask)
	case regLSR, regMSR:
		// Read-only on a 16550A (writes are factory test hooks).
		return false
	case regSCR:
		s.scr = v
		return false
	}
	return false
}

// setMCR updates MCR and, in loopback mode, the modem-status deltas that
// the changed output lines produce.
func (s *Serial) setMCR(v byte) bool {
	before := s.msrLines()
	s.mcr = v
	after := s.msrLines()
	changed := before ^ after
	if changed&msrCTS != 0 {
		s.msrDelta |= msrDCTS
	}
	if changed&msrDSR != 0 {
		s.msrDelta |= msrDDSR
	}
	if before&msrRI != 0 && after&msrRI == 0 {
		s.msrDelta |= msrTERI // trailing edge of ring indicator
	}
	if changed&msrDCD != 0 {
		s.msrDelta |= msrDDCD
	}
	return changed != 0 && s.ier&ierMSI != 0 && s.msrDelta != 0
}

// msrLines returns the MSR status bits (without deltas). Outside loopback
// the line looks like a connected null-modem: carrier, DSR and CTS
// asserted, no ring. In loopback the outputs are wired back to the inputs:
// RTS->CTS, DTR->DSR, OUT1->RI, OUT2->DCD, which Linux's probe checks.
func (s *Serial) msrLines() byte {
	if s.mcr&mcrLoop == 0 {
		return msrDCD | msrDSR | msrCTS
	}
	var v byte
	if s.mcr&mcrRTS != 0 {
		v |= msrCTS
	}
	if s.mcr&mcrDTR != 0 {
		v |= msrDSR
	}
	if s.mcr&mcrOUT1 != 0 {
		v |= msrRI
	}
	if s.mcr&mcrOUT2 != 0 {
		v |= msrDCD
	}
	return v
}

func (s *Serial) msr() byte { return s.msrLines() | s.msrDelta }

func (s *Serial) lsr() byte {
	v := byte(lsrTHRE|lsrTEMT) | s.lsrErr
	if s.rxLen > 0 {
		v |= lsrDR
	}
	return v
}

// pendingID returns the IIR identification of the highest-priority enabled
// pending interrupt: line status, then received data, then THR empty, then
// modem status.
func (s *Serial) pendingID() byte {
	switch {
	case s.ier&ierRLSI != 0 && s.lsrErr&lsrErr != 0:
		return iirRLSI
	case s.ier&ierRDI != 0 && s.rxLen > 0:
		return iirRDI
	case s.ier&ierTHRI != 0 && s.thrPending:
		return iirTHRI
	case s.ier&ierMSI != 0 && s.msrDelta != 0:
		return iirMSI
	}
	return iirNoInt
}
