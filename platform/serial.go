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
	"errors"
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

// Receive path sizes. The chip's receive FIFO is a 16550A's 16 bytes (one
// byte, the 16450's holding register, while the guest has the FIFOs
// disabled). In front of it the host end of the line holds up to
// rxHoldSize bytes the guest has not taken yet: Input blocks while that is
// full, so a stdin flood is bounded here and backpressured to the reader
// instead of dropped.
const (
	rxFIFOSize = 16
	rxHoldSize = 4096
)

// ErrInputClosed is returned by Input and ReadFrom once CloseInput was
// called: the VM is going away and nothing will drain the line any more.
var ErrInputClosed = errors.New("serial: input closed")

// Serial is a 16550A UART. The guest drives it through Read and Write (as a
// bus.Device over SerialSize ports); the host feeds it with Input or
// ReadFrom. Output is written to out synchronously, one byte per THR write.
//
// Transmission is instantaneous: THR and the transmitter are always empty
// (LSR.THRE|TEMT), so the guest never waits, and each write re-raises the
// THR-empty interrupt when enabled.
//
// Reception is flow-controlled by the guest's driver: host bytes wait on the
// host end of the line and enter the FIFO only while the driver listens
// (see listening), so the FIFO resets a driver does when it opens or closes
// the port (FCR clear, a dummy RBR read) never meet host input, and the
// FIFO is refilled as the guest reads RBR. Nothing from the host is ever
// dropped; LSR.OE can only come from loopback.
type Serial struct {
	mu  sync.Mutex
	out io.Writer
	irq func()

	// +checklocks:mu
	ier, lcr, mcr, scr byte
	// +checklocks:mu
	dll, dlm byte
	// +checklocks:mu
	fcr byte
	// +checklocks:mu
	lsrErr byte // sticky error bits, cleared by reading LSR
	// +checklocks:mu
	msrDelta byte // MSR delta bits, cleared by reading MSR
	// +checklocks:mu
	thrPending bool // THR-empty interrupt raised and not yet acknowledged

	// +checklocks:mu
	fifo [rxFIFOSize]byte // the chip's receive FIFO (ring)
	// +checklocks:mu
	fifoHead int
	// +checklocks:mu
	fifoLen int
	// +checklocks:mu
	lastRead byte    // RBR value when the FIFO is empty
	txByte   [1]byte // reused for every output byte so THR writes don't allocate

	// The host end of the line: bytes accepted by Input that the FIFO has
	// not taken yet (ring). space is signalled (under mu) whenever the
	// FIFO takes some, waking a blocked Input.
	// +checklocks:mu
	hold [rxHoldSize]byte
	// +checklocks:mu
	holdHead int
	// +checklocks:mu
	holdLen int
	space   sync.Cond
	// +checklocks:mu
	inClosed  bool
	inputBusy sync.Mutex // serializes Input callers so their bytes never interleave
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
	s := &Serial{
		out: out,
		irq: irq,
		dll: 0x0c, // 9600 baud, the usual firmware default
	}
	s.space.L = &s.mu
	return s
}

// Input sends p to the guest: it returns once every byte is on the host end
// of the line (not necessarily read by the guest yet), blocking while that
// holds rxHoldSize bytes the guest has not taken. This is the backpressure
// a console reader needs: it stops reading its source instead of the UART
// dropping bytes. It raises the received-data interrupt when the guest is
// listening. Concurrent callers are serialized. After CloseInput it returns
// the bytes queued so far and ErrInputClosed.
func (s *Serial) Input(p []byte) (int, error) {
	s.inputBusy.Lock()
	defer s.inputBusy.Unlock()
	done := 0
	for done < len(p) {
		s.mu.Lock()
		for s.holdLen == len(s.hold) && !s.inClosed {
			s.space.Wait()
		}
		if s.inClosed {
			s.mu.Unlock()
			return done, ErrInputClosed
		}
		for done < len(p) && s.holdLen < len(s.hold) {
			i := (s.holdHead + s.holdLen) % len(s.hold)
			k := copy(s.hold[i:min(len(s.hold), i+len(s.hold)-s.holdLen)], p[done:])
			s.holdLen += k
			done += k
		}
		kick := s.receive()
		s.mu.Unlock()
		if kick {
			s.irq()
		}
	}
	return done, nil
}

// ReadFrom implements io.ReaderFrom: it feeds the guest from r until r ends
// or CloseInput, with Input's backpressure (r is not read while the line is
// full). At r's end the bytes still waiting stay queued for the guest: end
// of file on stdin discards nothing. A clean end of file returns a nil error.
func (s *Serial) ReadFrom(r io.Reader) (int64, error) {
	var buf [512]byte
	var total int64
	for {
		n, rerr := r.Read(buf[:])
		if n > 0 {
			k, err := s.Input(buf[:n])
			total += int64(k)
			if err != nil {
				return total, err
			}
		}
		if rerr == io.EOF {
			return total, nil
		}
		if rerr != nil {
			return total, rerr
		}
	}
}

// CloseInput ends host input: a blocked Input returns ErrInputClosed, and so
// does every later one. Bytes already queued stay readable by the guest.
func (s *Serial) CloseInput() {
	s.mu.Lock()
	s.inClosed = true
	s.space.Broadcast()
	s.mu.Unlock()
}

// fifoCap is the receive FIFO's depth: 16 bytes with the FIFOs enabled, the
// single holding register of 16450 mode otherwise.
// +checklocks:s.mu
func (s *Serial) fifoCap() int {
	if s.fcr&fcrEnable != 0 {
		return rxFIFOSize
	}
	return 1
}

// listening reports whether the guest's driver is ready to receive: out of
// loopback, interrupts routed to the PIC (MCR.OUT2, which gates a PC UART's
// IRQ), RTS asserted (hardware flow control, which Linux also drops to
// throttle with CRTSCTS) and the received-data interrupt enabled. Linux's
// 8250 driver sets all of these only when a port is opened and clears them
// before it resets the FIFO on close, and its probe never has them all, so
// host input waits rather than meet those resets. A driver that polls LSR
// with interrupts off receives nothing; Linux does not do that.
// +checklocks:s.mu
func (s *Serial) listening() bool {
	return s.mcr&(mcrLoop|mcrOUT2|mcrRTS) == mcrOUT2|mcrRTS && s.ier&ierRDI != 0
}

// receive moves held host bytes into the FIFO while the guest listens and
// reports whether that made the received-data interrupt newly pending (the
// FIFO was empty). Called with mu held; wakes a blocked Input when it took
// bytes.
// +checklocks:s.mu
func (s *Serial) receive() bool {
	if !s.listening() || s.holdLen == 0 {
		return false
	}
	wasEmpty := s.fifoLen == 0
	moved := false
	for c := s.fifoCap(); s.fifoLen < c && s.holdLen > 0; {
		s.fifo[(s.fifoHead+s.fifoLen)%len(s.fifo)] = s.hold[s.holdHead]
		s.fifoLen++
		s.holdHead = (s.holdHead + 1) % len(s.hold)
		s.holdLen--
		moved = true
	}
	if moved {
		s.space.Broadcast()
	}
	return moved && wasEmpty && s.ier&ierRDI != 0
}

// push appends one byte received in loopback, or records an overrun when
// the FIFO is full, as on hardware.
// +checklocks:s.mu
func (s *Serial) push(b byte) {
	if s.fifoLen >= s.fifoCap() {
		s.lsrErr |= lsrOE
		return
	}
	s.fifo[(s.fifoHead+s.fifoLen)%len(s.fifo)] = b
	s.fifoLen++
}

// rxInterrupt reports whether a receive-side interrupt is enabled and
// pending.
// +checklocks:s.mu
func (s *Serial) rxInterrupt() bool {
	return s.ier&ierRDI != 0 && s.fifoLen > 0 || s.ier&ierRLSI != 0 && s.lsrErr != 0
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

// +checklocks:s.mu
func (s *Serial) readReg(reg uint64) byte {
	switch reg {
	case regRBR:
		if s.lcr&lcrDLAB != 0 {
			return s.dll
		}
		if s.fifoLen > 0 {
			s.lastRead = s.fifo[s.fifoHead]
			s.fifoHead = (s.fifoHead + 1) % len(s.fifo)
			s.fifoLen--
			// Refill from the line at once: LSR.DR stays set, so the
			// driver's receive loop goes on reading without a new
			// interrupt, as with a FIFO that keeps receiving.
			s.receive()
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
// +checklocks:s.mu
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
		if s.receive() {
			kick = true // the driver started listening: held input arrives
		}
		newly := s.ier &^ old
		if newly&ierRDI != 0 && s.fifoLen > 0 ||
			newly&ierRLSI != 0 && s.lsrErr != 0 ||
			newly&ierMSI != 0 && s.msrDelta != 0 {
			kick = true
		}
		return kick
	case regFCR:
		if (v^s.fcr)&fcrEnable != 0 || v&fcrClearRx != 0 {
			// Toggling the FIFOs or asking for it clears the receive
			// FIFO, as on hardware. Only bytes already in the FIFO go:
			// the host end of the line keeps the rest, and a driver
			// that is not listening has none in its FIFO.
			s.fifoHead, s.fifoLen = 0, 0
		}
		// Only the enable and trigger-level bits are remembered; the
		// clear bits self-clear. Bit 5 (64-byte FIFO) is 16750-only
		// and stays clear, so Linux does not detect a 16750.
		s.fcr = v & 0xc1
		return s.receive()
	case regLCR:
		s.lcr = v
		return false
	case regMCR:
		kick := s.setMCR(v & mcrMask)
		return s.receive() || kick
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
// +checklocks:s.mu
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
// +checklocks:s.mu
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

// +checklocks:s.mu
func (s *Serial) msr() byte { return s.msrLines() | s.msrDelta }

// +checklocks:s.mu
func (s *Serial) lsr() byte {
	v := byte(lsrTHRE|lsrTEMT) | s.lsrErr
	if s.fifoLen > 0 {
		v |= lsrDR
	}
	return v
}

// pendingID returns the IIR identification of the highest-priority enabled
// pending interrupt: line status, then received data, then THR empty, then
// modem status.
// +checklocks:s.mu
func (s *Serial) pendingID() byte {
	switch {
	case s.ier&ierRLSI != 0 && s.lsrErr&lsrErr != 0:
		return iirRLSI
	case s.ier&ierRDI != 0 && s.fifoLen > 0:
		return iirRDI
	case s.ier&ierTHRI != 0 && s.thrPending:
		return iirTHRI
	case s.ier&ierMSI != 0 && s.msrDelta != 0:
		return iirMSI
	}
	return iirNoInt
}
