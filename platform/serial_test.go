package platform

import (
	"bytes"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/bus"
)

var _ bus.Device = (*Serial)(nil)

type serialRig struct {
	s    *Serial
	out  *bytes.Buffer
	irqs atomic.Int32
}

func newSerialRig() *serialRig {
	r := &serialRig{out: &bytes.Buffer{}}
	r.s = NewSerial(r.out, func() { r.irqs.Add(1) })
	return r
}

func (r *serialRig) in(reg uint64) byte {
	b := []byte{0}
	r.s.Read(reg, b)
	return b[0]
}

func (r *serialRig) outb(reg uint64, v byte) { r.s.Write(reg, []byte{v}) }

// linuxProbe replays the UART detection of Linux's 8250 driver
// (drivers/tty/serial/8250/8250_port.c: autoconfig, autoconfig_16550a) and
// returns the type it would settle on.
func linuxProbe(t *testing.T, r *serialRig) string {
	t.Helper()
	// Existence test through IER.
	scratch := r.in(regIER)
	r.outb(regIER, 0)
	scratch2 := r.in(regIER) & 0x0f
	r.outb(regIER, 0x0f)
	scratch3 := r.in(regIER) & 0x0f
	r.outb(regIER, scratch)
	if scratch2 != 0 || scratch3 != 0x0f {
		return "none (IER test)"
	}
	saveMCR, saveLCR := r.in(regMCR), r.in(regLCR)
	// Loopback test: LOOP|OUT2|RTS must read back as DCD|CTS.
	r.outb(regMCR, mcrLoop|0x0a)
	status1 := r.in(regMSR) & 0xf0
	r.outb(regMCR, saveMCR)
	if status1 != msrDCD|msrCTS {
		return "none (loopback test)"
	}
	// FIFO detection through IIR bits 6-7.
	r.outb(regLCR, 0xbf)
	r.outb(regFCR, 0) // EFR on enhanced parts
	r.outb(regLCR, 0)
	r.outb(regFCR, fcrEnable)
	kind := r.in(regIIR) >> 6
	r.outb(regLCR, saveLCR)
	if kind != 3 {
		return [...]string{"8250/16450", "unknown", "16550"}[kind]
	}
	// autoconfig_16550a: EFR under DLAB must read as non-zero (it is IIR).
	r.outb(regLCR, 0x80)
	if r.in(regFCR) == 0 {
		return "16650 family"
	}
	r.outb(regLCR, 0xbf)
	if r.in(regFCR) == 0 {
		return "EFRv2 part"
	}
	// National Semiconductor SuperIO: EXCR1 under LCR 0xE0 tracks MCR.LOOP.
	r.outb(regLCR, 0)
	st1 := r.in(regMCR)
	r.outb(regLCR, 0xe0)
	st2 := r.in(regFCR)
	if (st2^st1)&mcrLoop == 0 {
		r.outb(regLCR, 0)
		r.outb(regMCR, st1^mcrLoop)
		r.outb(regLCR, 0xe0)
		st2 = r.in(regFCR)
		r.outb(regLCR, 0)
		r.outb(regMCR, st1)
		if (st2^st1)&mcrLoop != 0 {
			return "NS16550A"
		}
	}
	// TI16750: 64-byte FIFO bit 5 settable only with DLAB.
	r.outb(regLCR, 0)
	r.outb(regFCR, fcrEnable|0x20)
	s1 := r.in(regIIR) & 0xe0
	r.outb(regFCR, fcrEnable)
	r.outb(regLCR, 0x80)
	r.outb(regFCR, fcrEnable|0x20)
	s2 := r.in(regIIR) & 0xe0
	r.outb(regFCR, fcrEnable)
	r.outb(regLCR, 0)
	if s1 == 0xc0 && s2 == 0xe0 {
		return "16750"
	}
	// XScale: IER bit 6 (UUE) writable.
	ier := r.in(regIER)
	r.outb(regIER, ier&^0x40)
	if r.in(regIER)&0x40 == 0 {
		r.outb(regIER, ier|0x40)
		if r.in(regIER)&0x40 != 0 {
			return "XScale"
		}
	}
	r.outb(regIER, ier)
	// Scratch register.
	r.outb(regSCR, 0xa5)
	if r.in(regSCR) != 0xa5 {
		return "no scratch"
	}
	return "16550A"
}

func TestSerialLinuxProbe(t *testing.T) {
	r := newSerialRig()
	assert.Equal(t, "16550A", linuxProbe(t, r))
	assert.Empty(t, r.out.String(), "probing transmits nothing")
	assert.Equal(t, byte(0), r.in(regMCR)&mcrLoop, "probe restored MCR")
}

// TestSerialTHRETest replays the THRE re-assertion test of Linux's
// serial8250_do_startup; a UART failing it gets a polling timer.
func TestSerialTHRETest(t *testing.T) {
	r := newSerialRig()
	r.outb(regFCR, fcrEnable)
	require.NotZero(t, r.in(regLSR)&lsrTHRE)
	r.outb(regIER, ierTHRI)
	iir1 := r.in(regIIR)
	r.outb(regIER, 0)
	r.outb(regIER, ierTHRI)
	iir := r.in(regIIR)
	r.outb(regIER, 0)
	assert.Equal(t, byte(iirFIFO|iirTHRI), iir1)
	assert.Equal(t, byte(iirFIFO|iirTHRI), iir, "THRE re-asserted on re-enable")
	assert.Equal(t, int32(2), r.irqs.Load(), "each enable with THR empty pulses the irq")
}

func TestSerialOutput(t *testing.T) {
	r := newSerialRig()
	for _, c := range []byte("hello, world\n") {
		r.outb(regTHR, c)
	}
	assert.Equal(t, "hello, world\n", r.out.String())
	assert.Equal(t, int32(0), r.irqs.Load(), "THRI disabled: no interrupts")
	assert.Equal(t, byte(lsrTHRE|lsrTEMT), r.in(regLSR))

	// With THRI enabled every write re-raises THR empty.
	r.outb(regIER, ierTHRI)
	base := r.irqs.Load()
	assert.Equal(t, byte(iirTHRI), r.in(regIIR))
	assert.Equal(t, byte(iirNoInt), r.in(regIIR), "reading IIR acknowledged THRE")
	r.outb(regTHR, 'x')
	assert.Equal(t, base+1, r.irqs.Load())
	assert.Equal(t, byte(iirTHRI), r.in(regIIR))
	r.outb(regIER, ierTHRI) // unchanged: no new interrupt
	assert.Equal(t, base+1, r.irqs.Load())
}

func TestSerialDivisorLatch(t *testing.T) {
	r := newSerialRig()
	r.outb(regLCR, lcrDLAB|0x03)
	r.outb(regDLL, 0x01)
	r.outb(regDLM, 0x02)
	assert.Equal(t, byte(0x01), r.in(regDLL))
	assert.Equal(t, byte(0x02), r.in(regDLM))
	assert.Empty(t, r.out.String(), "THR write under DLAB sets the divisor")
	r.outb(regLCR, 0x03)
	assert.Equal(t, byte(0), r.in(regIER), "IER untouched by the DLM write")
	assert.Equal(t, byte(0x03), r.in(regLCR))
	r.outb(regIER, 0xff)
	assert.Equal(t, byte(ierMask), r.in(regIER), "reserved IER bits read as 0")
}

// linuxOpen replays what Linux's 8250 driver does to the UART when a tty
// opens the port (8250_port.c serial8250_do_startup, then the tty layer
// raising DTR/RTS): FIFOs reset, a dummy read of every status register and
// RBR, OUT2 on, the THRE test, another dummy read, then RLSI|RDI enabled.
func linuxOpen(r *serialRig) {
	r.outb(regFCR, fcrEnable)
	r.outb(regFCR, fcrEnable|fcrClearRx|0x04)
	r.outb(regFCR, 0)
	r.in(regLSR)
	r.in(regRBR)
	r.in(regIIR)
	r.in(regMSR)
	r.outb(regLCR, 0x03)
	r.outb(regMCR, mcrOUT2)
	r.outb(regIER, ierTHRI)
	r.in(regIIR)
	r.outb(regIER, 0)
	r.in(regLSR)
	r.in(regRBR)
	r.in(regIIR)
	r.in(regMSR)
	r.outb(regIER, ierRLSI|ierRDI)
	r.outb(regFCR, fcrEnable|0x80) // set_termios: FIFO on, 8-byte trigger
	r.outb(regMCR, mcrOUT2|mcrDTR|mcrRTS)
}

// isrRead plays the driver's receive loop: RBR while LSR.DR.
func isrRead(r *serialRig) []byte {
	var got []byte
	for r.in(regLSR)&lsrDR != 0 {
		got = append(got, r.in(regRBR))
	}
	return got
}

// TestSerialInputBeforeOpenSurvivesOpen: input hpcvmm has at launch reaches
// a guest that opens ttyS0 later, although the driver resets the FIFO and
// reads RBR while opening; it raises the received-data interrupt once the
// driver listens.
func TestSerialInputBeforeOpenSurvivesOpen(t *testing.T) {
	r := newSerialRig()
	linuxProbe(t, r)
	r.s.Input([]byte("typed at launch\n"))
	irqs := r.irqs.Load()
	linuxOpen(r)
	assert.Greater(t, r.irqs.Load(), irqs, "received-data interrupt once the driver listens")
	assert.Equal(t, byte(iirRDI|iirFIFO), r.in(regIIR))
	assert.Equal(t, "typed at launch\n", string(isrRead(r)))
	assert.Equal(t, byte(iirNoInt|iirFIFO), r.in(regIIR))
}

// TestSerialInputBeyondFIFONotDropped: far more input than the FIFO (and
// the host end of the line) holds arrives complete and in order, with no
// overrun, as the guest keeps reading.
func TestSerialInputBeyondFIFONotDropped(t *testing.T) {
	r := newSerialRig()
	linuxOpen(r)
	want := make([]byte, 100_000)
	for i := range want {
		want[i] = byte(i * 7)
	}
	go r.s.Input(want)
	var got []byte
	deadline := time.Now().Add(5 * time.Second)
	for len(got) < len(want) && time.Now().Before(deadline) {
		lsr := r.in(regLSR)
		require.Zero(t, lsr&lsrOE, "overrun after %d bytes", len(got))
		if lsr&lsrDR != 0 {
			got = append(got, r.in(regRBR))
		}
	}
	require.Equal(t, len(want), len(got), "bytes received")
	assert.Equal(t, want, got)
}

// TestSerialInputBackpressure: while the guest does not read, Input stops
// accepting once the line holds its bound (a console feeder then stops
// reading stdin), and completes as soon as the guest reads.
func TestSerialInputBackpressure(t *testing.T) {
	r := newSerialRig()
	linuxOpen(r)
	big := make([]byte, 3*rxHoldSize)
	done := make(chan struct{})
	go func() { r.s.Input(big); close(done) }()
	select {
	case <-done:
		t.Fatal("Input accepted 3x the line's bound with nobody reading: input must wait, not be dropped")
	case <-time.After(100 * time.Millisecond):
	}
	n := len(isrRead(r))
	for n < len(big) {
		if r.in(regLSR)&lsrDR != 0 {
			r.in(regRBR)
			n++
		}
	}
	<-done
	assert.Zero(t, r.in(regLSR)&(lsrDR|lsrOE))
}

// TestSerialReadFromEOFKeepsQueued: ReadFrom (the console feeder) returns at
// the end of its reader, and what it queued still reaches the guest.
func TestSerialReadFromEOFKeepsQueued(t *testing.T) {
	r := newSerialRig()
	n, err := r.s.ReadFrom(strings.NewReader("last line before EOF\n"))
	require.NoError(t, err)
	assert.Equal(t, int64(21), n)
	linuxOpen(r)
	assert.Equal(t, "last line before EOF\n", string(isrRead(r)))
}

// TestSerialCloseInputUnblocks: a feeder blocked on a full line returns
// ErrInputClosed when the VM goes away.
func TestSerialCloseInputUnblocks(t *testing.T) {
	r := newSerialRig()
	errc := make(chan error, 1)
	go func() {
		_, err := r.s.ReadFrom(bytes.NewReader(make([]byte, 2*rxHoldSize)))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	r.s.CloseInput()
	select {
	case err := <-errc:
		assert.ErrorIs(t, err, ErrInputClosed)
	case <-time.After(2 * time.Second):
		t.Fatal("ReadFrom still blocked after CloseInput")
	}
	_, err := r.s.Input([]byte("x"))
	assert.ErrorIs(t, err, ErrInputClosed)
}

// TestSerialNotListeningHoldsInput: with the port closed (OUT2, RTS or RDI
// off) input stays on the line: no data ready, no interrupt.
func TestSerialNotListeningHoldsInput(t *testing.T) {
	r := newSerialRig()
	_, err := r.s.Input([]byte("ab"))
	require.NoError(t, err)
	r.outb(regIER, ierRDI)
	assert.Zero(t, r.irqs.Load(), "RDI alone: interrupts not routed (no OUT2)")
	assert.Zero(t, r.in(regLSR)&lsrDR)
	r.outb(regMCR, mcrOUT2|mcrRTS)
	assert.Equal(t, int32(1), r.irqs.Load(), "listening: data ready and interrupt")
	assert.Equal(t, byte(iirRDI), r.in(regIIR))
	assert.Equal(t, byte('a'), r.in(regRBR))
	r.outb(regMCR, mcrOUT2) // RTS off: flow control stops the line
	assert.Equal(t, byte('b'), r.in(regRBR), "the FIFO keeps what it received")
	assert.Equal(t, byte('b'), r.in(regRBR), "empty RBR repeats the last byte")
	_, err = r.s.Input([]byte("c"))
	require.NoError(t, err)
	assert.Zero(t, r.in(regLSR)&lsrDR, "no RTS: c waits")
	r.outb(regMCR, mcrOUT2|mcrRTS)
	assert.Equal(t, byte('c'), r.in(regRBR))
	// FCR clear-receive discards the FIFO's bytes only.
	r.outb(regIER, 0)
	_, err = r.s.Input([]byte("zz"))
	require.NoError(t, err)
	r.outb(regFCR, fcrEnable|fcrClearRx)
	r.outb(regIER, ierRDI)
	assert.Equal(t, "zz", string(isrRead(r)))
}

// TestSerialOverrun: the only overrun left is the chip's own, in loopback:
// a 17th byte into the 16-byte FIFO.
func TestSerialOverrun(t *testing.T) {
	r := newSerialRig()
	r.outb(regFCR, fcrEnable)
	r.outb(regIER, ierRLSI)
	r.outb(regMCR, mcrLoop)
	for i := 0; i <= rxFIFOSize; i++ {
		r.outb(regTHR, byte(i))
	}
	assert.Equal(t, byte(iirRLSI|iirFIFO), r.in(regIIR))
	assert.Equal(t, byte(lsrOE|lsrDR|lsrTHRE|lsrTEMT), r.in(regLSR))
	assert.Equal(t, byte(lsrDR|lsrTHRE|lsrTEMT), r.in(regLSR), "reading LSR clears OE")
	assert.Equal(t, byte(iirNoInt|iirFIFO), r.in(regIIR))
}

func TestSerialIIRPriority(t *testing.T) {
	r := newSerialRig()
	r.outb(regIER, ierRDI|ierTHRI|ierRLSI|ierMSI)
	r.outb(regMCR, mcrLoop) // CTS, DSR and DCD drop: modem-status change
	r.outb(regTHR, 'a')
	r.outb(regTHR, 'b') // 16450 mode: one byte of FIFO, so an overrun

	assert.Equal(t, byte(iirRLSI), r.in(regIIR), "line status first")
	r.in(regLSR)
	assert.Equal(t, byte(iirRDI), r.in(regIIR), "then received data")
	r.outb(regFCR, fcrClearRx)
	assert.Equal(t, byte(iirTHRI), r.in(regIIR), "then THR empty")
	assert.Equal(t, byte(iirMSI), r.in(regIIR), "then modem status")
	assert.Equal(t, byte(msrDCTS|msrDDSR|msrDDCD), r.in(regMSR))
	assert.Equal(t, byte(iirNoInt), r.in(regIIR), "reading MSR cleared the delta")
}

func TestSerialLoopback(t *testing.T) {
	r := newSerialRig()
	r.outb(regIER, ierRDI)
	r.outb(regMCR, mcrLoop)
	r.in(regMSR) // clear the deltas of entering loopback
	n := r.irqs.Load()
	r.outb(regTHR, 'L')
	assert.Empty(t, r.out.String(), "loopback keeps bytes inside the chip")
	assert.Equal(t, n+1, r.irqs.Load())
	assert.Equal(t, byte('L'), r.in(regRBR))

	r.outb(regMCR, mcrLoop|mcrDTR|mcrOUT1)
	assert.Equal(t, byte(msrDSR|msrRI|msrDDSR), r.in(regMSR))
	r.outb(regMCR, mcrLoop)
	assert.Equal(t, byte(msrDDSR|msrTERI), r.in(regMSR), "RI trailing edge")
	r.outb(regMCR, 0)
	assert.Equal(t, byte(msrDCD|msrDSR|msrCTS), r.in(regMSR)&0xf0, "outside loopback the line looks connected")
}

func TestSerialWideAccess(t *testing.T) {
	r := newSerialRig()
	// A 16-bit write at SCR-1 covers MSR (ignored) and SCR.
	r.s.Write(regMSR, []byte{0x00, 0x5a})
	assert.Equal(t, byte(0x5a), r.in(regSCR))
	d := []byte{0, 0, 0, 0}
	r.s.Read(regLSR, d)
	assert.Equal(t, []byte{lsrTHRE | lsrTEMT, msrDCD | msrDSR | msrCTS, 0x5a, 0xff}, d)
	d = []byte{0}
	r.s.Read(100, d)
	assert.Equal(t, byte(0xff), d[0])
}

func TestSerialConcurrentInput(t *testing.T) {
	r := newSerialRig()
	linuxOpen(r)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 1000; i++ {
			r.s.Input([]byte{byte(i)})
		}
	}()
	got := 0
	for got < 1000 {
		if r.in(regLSR)&lsrDR != 0 {
			assert.Equal(t, byte(got), r.in(regRBR))
			got++
		}
	}
	wg.Wait()
}

func FuzzSerial(f *testing.F) {
	f.Add([]byte{0, 'a', 1, 0x0f, 4, 0x10, 0, 'b', 2, 0x07}, []byte("in"))
	f.Add([]byte{3, 0x80, 0, 1, 1, 2, 3, 3, 0xff, 0xff, 0xff}, []byte{})
	f.Fuzz(func(t *testing.T, ops []byte, input []byte) {
		r := newSerialRig()
		// Within the line's bound, so Input does not wait for a reader.
		_, err := r.s.Input(input[:min(len(input), rxHoldSize)])
		if err != nil {
			t.Fatal(err)
		}
		// Each op: offset byte, width selector, value.
		for i := 0; i+2 < len(ops); i += 3 {
			off := uint64(ops[i])
			if ops[i]&0x80 != 0 {
				off = ^uint64(0) - uint64(ops[i]&0x7f) // offsets near the top of the range
			}
			width := int(ops[i+1] % 9)
			data := bytes.Repeat([]byte{ops[i+2]}, width)
			if ops[i+1]&0x80 != 0 {
				r.s.Read(off, data)
			} else {
				r.s.Write(off, data)
			}
		}
		if r.in(regLSR)&(lsrTHRE|lsrTEMT) != lsrTHRE|lsrTEMT {
			t.Fatal("transmitter must always be empty")
		}
	})
}

func BenchmarkSerialTHRWrite(b *testing.B) {
	s := NewSerial(discard{}, func() {})
	s.Write(regIER, []byte{ierTHRI})
	data := []byte{'x'}
	b.ReportAllocs()
	for b.Loop() {
		s.Write(regTHR, data)
	}
}

func TestSerialTHRWriteAllocs(t *testing.T) {
	s := NewSerial(discard{}, func() {})
	s.Write(regIER, []byte{ierTHRI})
	data := []byte{'x'}
	assert.Zero(t, testing.AllocsPerRun(1000, func() { s.Write(regTHR, data) }))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestSerialReceiveAllocs: host input through the line into the FIFO and the
// guest's LSR/RBR reads on the vCPU exit path allocate nothing.
func TestSerialReceiveAllocs(t *testing.T) {
	r := newSerialRig()
	linuxOpen(r)
	in := []byte{'x'}
	lsr, rbr := []byte{0}, []byte{0}
	assert.Zero(t, testing.AllocsPerRun(1000, func() {
		if _, err := r.s.Input(in); err != nil {
			t.Fatal(err)
		}
		r.s.Read(regLSR, lsr)
		r.s.Read(regRBR, rbr)
	}))
}
