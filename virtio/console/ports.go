// Named ports 1..N (Options.Ports): byte streams between a host
// io.Reader/io.WriteCloser and the guest's /dev/vportNpM, used by hpcvmm's
// jobs for the control, stdin, stdout and stderr streams.
//
// What Linux's virtio_console driver does with a non-console port, and so
// what this device does:
//
//   - Queues: with MULTIPORT port i ≥ 1 has receiveq 2+2i and transmitq
//     3+2i; max_nr_ports (config space) is 1+N. The driver creates all of
//     them at probe.
//   - After DEVICE_READY the device sends PORT_ADD(i); add_port fills the
//     port's receiveq, creates /dev/vportNpM and answers PORT_READY(i, 1).
//     The device then sends PORT_OPEN(i, 1) (host connected) and
//     PORT_NAME(i) with the name after the header; the name appears in
//     /sys/class/virtio-ports/vportNpM/name only when PORT_NAME arrived.
//     PORT_OPEN goes first so that a guest that finds the port by its name
//     already sees the host connected: port_fops_read returns 0 (end of
//     file) at once when the host is not connected and nothing is buffered.
//   - A guest open sets guest_connected and sends PORT_OPEN(i, 1); only one
//     open at a time (EBUSY). Data arriving while the port is not open is
//     discarded by in_intr, so host input for port i is held back until the
//     guest's PORT_OPEN(i, 1), exactly as for port 0. The guest's close sends
//     PORT_OPEN(i, 0) and discards what it had buffered.
//   - End of the host's stream: after the last byte was put in the used
//     ring, PORT_OPEN(i, 0). port_fops_read then hands out what is buffered
//     (port_has_data reads the used ring itself, so the order of the data
//     interrupt and the control message does not matter) and returns 0 once
//     it is empty. A guest write blocks while the host is not connected, so
//     a port whose host input ended takes no more guest output: streams are
//     one-way in practice (stdin, stdout), or never end (control).
//   - Guest writes: port_fops_write queues up to 32 KiB per write without
//     waiting for the device and sleeps on the transmitq interrupt when the
//     ring is full; that interrupt is raised as the driver asks.
//
// Concurrency: the device goroutine never blocks on a port's reader or
// writer. Each FromHost has a reader goroutine that hands one chunk at a
// time to the device goroutine (as port 0's input does). Each ToHost has a
// writer goroutine fed through a ring of outRingSize bytes: the device
// goroutine copies transmit chains into it and returns them; when it is
// full the port's chain in progress is held (not returned) and the port's
// transmitq is left alone until the writer has made room and woken the
// device through its eventfd. So a ToHost that blocks holds only its own
// port's chains. Port 0's output, by contrast, is still written on the
// device goroutine (console.go's staging): a console writer that blocks
// holds every port, so hpcvmm's jobs give port 0 a writer that does not
// block for long (stderr, or nothing with --quiet).

package console

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// Port is a named virtio-console port (ids 1..N in the order of
// Options.Ports).
type Port struct {
	// Name is sent as VIRTIO_CONSOLE_PORT_NAME: the guest reads it in
	// /sys/class/virtio-ports/vportNpM/name. 1 to MaxPortName printable
	// ASCII bytes, unique among the ports.
	Name string
	// FromHost is read for bytes to the guest. io.EOF (or an error,
	// reported through OnError) ends the stream: after its last byte the
	// guest reads end of file. nil: no input (the guest's reads wait).
	FromHost io.Reader
	// ToHost receives the guest's bytes in order. A Write that blocks
	// holds this port's transmit chains (back-pressure) and nothing else.
	// It is closed when the guest closes the port after writing (end of
	// stream) or when the Console is closed, after every byte the guest
	// wrote before was written. nil: the guest's bytes are discarded.
	ToHost io.WriteCloser
}

// Named-port limits.
const (
	// MaxPorts is the most named ports a Console takes: each costs two
	// queues and their MSI-X vectors.
	MaxPorts = 16
	// MaxPortName is the longest port name in bytes (Linux takes up to
	// a page; names are short identifiers).
	MaxPortName = 255
)

// Buffer sizes, variables only so that tests can shrink them to reach the
// partial-copy paths with small inputs.
var (
	// portChunk is how much of a FromHost one hand-off carries: eight of
	// Linux's page-sized receive buffers.
	portChunk = 32 << 10
	// outRingSize bounds the guest output a port holds between its
	// transmit chains and its ToHost: two of Linux's largest port writes.
	outRingSize = 64 << 10
)

// namedPort is port id ≥ 1. Fields are the device goroutine's unless noted.
type namedPort struct {
	id     uint32
	name   string
	rx, tx *queue.Queue
	txq    int // transmitq index (receiveq is txq-1)

	// Control state, reset with the device.
	added     bool  // PORT_ADD went out
	ready     bool  // the driver sent PORT_READY(id, 1)
	guestOpen bool  // the driver sent PORT_OPEN(id, 1): it keeps input
	pending   uint8 // send* bits not yet delivered
	hostOpen  bool  // value of the next PORT_OPEN the device sends

	// Transmit: held is a chain popped from tx and not yet returned
	// because the ring had no room for all of it; heldSeg/heldOff is how
	// far it was copied.
	chain   *queue.Chain
	held    bool
	heldSeg int
	heldOff int
	// closing: the guest closed the port; ToHost is closed once every
	// chain it queued before is in the ring. outDone: that happened, later
	// output is discarded.
	closing bool
	outDone bool

	in  *inStream  // nil without FromHost
	out *outStream // nil without ToHost
}

// inStream hands a FromHost to the device goroutine one chunk at a time
// (the port 0 scheme): the reader goroutine owns buf while n == 0.
type inStream struct {
	r        io.Reader
	mu       sync.Mutex
	buf      []byte
	off, n   int
	eof      bool // the stream ended after its last chunk was consumed
	consumed chan struct{}
}

// outStream is a port's guest output between the device goroutine (which
// writes at w) and the writer goroutine (which writes buf out from r).
type outStream struct {
	w         io.WriteCloser
	mu        sync.Mutex
	buf       []byte
	r, wr     uint64 // bytes taken out, bytes put in (r ≤ wr ≤ r+len(buf))
	closeReq  bool   // close w once r == wr
	wantSpace bool   // the device waits for room: signal the eventfd
	data      chan struct{}
	failed    atomic.Bool // a Write failed: further output is discarded
}

// ValidatePorts checks named ports as New does, for callers that validate
// their configuration before building anything.
func ValidatePorts(ports []Port) error {
	if len(ports) > MaxPorts {
		return fmt.Errorf("ports: %d ports, at most %d", len(ports), MaxPorts)
	}
	seen := make(map[string]bool, len(ports))
	for i, p := range ports {
		if p.Name == "" || len(p.Name) > MaxPortName {
			return fmt.Errorf("ports[%d]: name %q must be 1 to %d bytes", i, p.Name, MaxPortName)
		}
		for j := 0; j < len(p.Name); j++ {
			if b := p.Name[j]; b <= ' ' || b >= 0x7f || b == '/' {
				return fmt.Errorf("ports[%d]: name %q: use printable ASCII without spaces or '/'", i, p.Name)
			}
		}
		if seen[p.Name] {
			return fmt.Errorf("ports[%d]: name %q used twice", i, p.Name)
		}
		seen[p.Name] = true
	}
	return nil
}

func newNamedPort(id int, p Port) *namedPort {
	np := &namedPort{id: uint32(id), name: p.Name, txq: 3 + 2*id, chain: queue.NewChain(queue.MaxSize), hostOpen: true}
	if p.FromHost != nil {
		np.in = &inStream{r: p.FromHost, buf: make([]byte, portChunk), consumed: make(chan struct{}, 1)}
	}
	if p.ToHost != nil {
		np.out = &outStream{w: p.ToHost, buf: make([]byte, outRingSize), data: make(chan struct{}, 1)}
	}
	return np
}

// reset forgets the driver's state; host input not delivered and guest
// output already taken stay.
func (p *namedPort) reset() {
	if p.closing && !p.outDone {
		// The guest closed the port, then reset the device before all its
		// chains were taken: they are gone with the rings.
		p.endOutput()
	}
	p.rx, p.tx = nil, nil
	p.added, p.ready, p.guestOpen = false, false, false
	p.pending = 0
	p.held = false
}

// portByID returns named port id, or nil.
func (c *Console) portByID(id uint32) *namedPort {
	if id == 0 || uint64(id) > uint64(len(c.ports)) {
		return nil
	}
	return c.ports[id-1]
}

// signal wakes the device goroutine from a port's goroutine. Under mu, as
// the deferred-interrupt timer does: once Close has closed the eventfd its
// number may belong to another file.
func (c *Console) signal(what string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fdClosed {
		return
	}
	if err := irq.SignalEventFD(c.eventFD); err != nil && c.opts.OnError != nil {
		c.opts.OnError(fmt.Errorf("virtio-console: signal %s: %w", what, err))
	}
}

// portReadLoop is a FromHost's reader goroutine.
func (c *Console) portReadLoop(p *namedPort) {
	s := p.in
	for {
		n, err := s.r.Read(s.buf)
		if n > 0 {
			s.mu.Lock()
			s.off, s.n = 0, n
			s.mu.Unlock()
			if c.closed.Load() {
				return
			}
			c.signal("port input")
			select {
			case <-s.consumed:
			case <-c.quit:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && c.opts.OnError != nil {
				c.opts.OnError(fmt.Errorf("virtio-console: read host input for port %q: %w (the guest reads end of file)", p.name, err))
			}
			s.mu.Lock()
			s.eof = true
			s.mu.Unlock()
			c.signal("port input end")
			return
		}
	}
}

// portWriteLoop is a ToHost's writer goroutine.
func (c *Console) portWriteLoop(p *namedPort) {
	s := p.out
	size := uint64(len(s.buf))
	for {
		s.mu.Lock()
		for s.r == s.wr && !s.closeReq {
			s.mu.Unlock()
			select {
			case <-s.data:
			case <-c.quit:
				// The console is gone: write what is staged, then end
				// the stream (the device goroutine no longer runs).
				s.mu.Lock()
				s.closeReq = true
				s.mu.Unlock()
			}
			s.mu.Lock()
		}
		if s.r == s.wr {
			s.mu.Unlock()
			if err := s.w.Close(); err != nil && c.opts.OnError != nil {
				c.opts.OnError(fmt.Errorf("virtio-console: close output of port %q: %w", p.name, err))
			}
			return
		}
		start := s.r % size
		end := min(size, start+(s.wr-s.r))
		s.mu.Unlock()
		// The device goroutine writes only outside [r, wr), so buf[start:end]
		// is the writer's until r moves.
		if !s.failed.Load() {
			if _, err := s.w.Write(s.buf[start:end]); err != nil {
				s.failed.Store(true)
				if c.opts.OnError != nil {
					c.opts.OnError(fmt.Errorf("virtio-console: write output of port %q: %w (further output discarded)", p.name, err))
				}
			}
		}
		s.mu.Lock()
		s.r += end - start
		wake := s.wantSpace
		s.wantSpace = false
		s.mu.Unlock()
		if wake {
			c.signal("port output room")
		}
	}
}

// fillPort copies pending host input into port p's receive buffers while
// the guest has the port open, and notices the end of the stream.
func (c *Console) fillPort(p *namedPort) error {
	s := p.in
	if s == nil {
		return nil
	}
	s.mu.Lock()
	pushed := false
	var err error
	if p.rx != nil && p.guestOpen {
		pushed, err = c.fillStream(p, s)
	}
	ended := s.eof && s.n == 0
	s.mu.Unlock()
	if pushed && p.rx.NeedInterrupt() {
		c.interrupt(p.txq - 1)
	}
	if ended && p.hostOpen {
		// Every byte is in the used ring: the guest reads end of file
		// after them.
		p.hostOpen = false
		if p.ready {
			p.pending |= sendPortOpen
		}
	}
	return err
}

func (c *Console) fillStream(p *namedPort, s *inStream) (pushed bool, err error) {
	// Not c.chain: a guest's PORT_OPEN fills the port while the control
	// message's chain, in c.chain, is still to be returned.
	q, ch := p.rx, c.portRx
	for s.off < s.n {
		ok, err := q.Pop(ch)
		if err != nil {
			return pushed, fmt.Errorf("virtio-console port %d receiveq: %w", p.id, err)
		}
		if !ok {
			if q.EnableNotify() {
				continue
			}
			return pushed, nil
		}
		if ch.ReadableLen > 0 || len(ch.Segments) > 0 && !ch.Segments[0].Writable {
			return pushed, fmt.Errorf("virtio-console port %d receiveq: chain %d has device-readable buffers", p.id, ch.Head)
		}
		n := 0
		for i := range ch.Segments {
			k := copy(ch.Segments[i].Buf, s.buf[s.off:s.n])
			s.off += k
			n += k
			if s.off == s.n {
				break
			}
		}
		if err := q.Push(ch.Head, uint32(n)); err != nil {
			return pushed, err
		}
		pushed = true
	}
	if s.n > 0 {
		s.off, s.n = 0, 0
		select {
		case s.consumed <- struct{}{}:
		default:
		}
	}
	return pushed, nil
}

// transmitPort moves port p's transmit chains into its output ring (or
// discards them without a ToHost) until the ring is full or the transmitq
// empty.
func (c *Console) transmitPort(p *namedPort) error {
	q := p.tx
	if q == nil {
		return nil
	}
	pushed := false
	decide := func() {
		if pushed && q.NeedInterrupt() {
			c.interrupt(p.txq)
		}
		pushed = false
	}
	for {
		q.DisableNotify()
		for {
			if !p.held {
				ok, err := q.Pop(p.chain)
				if err != nil {
					decide()
					return fmt.Errorf("virtio-console port %d transmitq: %w", p.id, err)
				}
				if !ok {
					break
				}
				if p.chain.WritableLen > 0 || hasWritable(p.chain) {
					decide()
					return fmt.Errorf("virtio-console port %d transmitq: chain %d has device-writable buffers", p.id, p.chain.Head)
				}
				switch {
				case !p.ready:
					c.ctlError("port %d: transmit chain before the port was set up (PORT_READY): %d bytes discarded", p.id, p.chain.ReadableLen)
				case p.outDone && p.chain.ReadableLen > 0:
					c.ctlError("port %d: output after the guest closed the port: %d bytes discarded", p.id, p.chain.ReadableLen)
				case p.out != nil && !p.outDone:
					p.held, p.heldSeg, p.heldOff = true, 0, 0
				}
			}
			if p.held {
				if !c.stagePort(p) {
					// No room: the writer wakes the device when there is.
					decide()
					return nil
				}
				p.held = false
			}
			if err := q.Push(p.chain.Head, 0); err != nil {
				decide()
				return err
			}
			pushed = true
		}
		decide()
		if !q.EnableNotify() {
			break
		}
	}
	if p.closing && !p.outDone {
		// The guest closed the port and everything it wrote before is in
		// the ring: end the stream after it.
		p.endOutput()
	}
	return nil
}

// endOutput has the writer close ToHost once the ring is written out.
func (p *namedPort) endOutput() {
	p.outDone = true
	if s := p.out; s != nil {
		s.mu.Lock()
		s.closeReq = true
		s.mu.Unlock()
		select {
		case s.data <- struct{}{}:
		default:
		}
	}
}

// stagePort copies as much of p's held chain into its output ring as fits
// and reports whether all of it is in. When the ring is full it sets
// wantSpace under the lock the writer takes to move r, so the writer's
// wakeup cannot be missed.
func (c *Console) stagePort(p *namedPort) bool {
	s := p.out
	size := uint64(len(s.buf))
	segs := p.chain.Segments
	for {
		s.mu.Lock()
		free := size - (s.wr - s.r)
		wr := s.wr
		if free == 0 {
			s.wantSpace = true
			s.mu.Unlock()
			return false
		}
		s.mu.Unlock()
		// The writer reads only [r, wr): the free part is the device's.
		put := uint64(0)
		for p.heldSeg < len(segs) && put < free {
			src := segs[p.heldSeg].Buf[p.heldOff:]
			at := (wr + put) % size
			n := min(uint64(len(src)), free-put, size-at)
			copy(s.buf[at:at+n], src[:n])
			put += n
			p.heldOff += int(n)
			if p.heldOff == len(segs[p.heldSeg].Buf) {
				p.heldSeg, p.heldOff = p.heldSeg+1, 0
			}
		}
		if put > 0 {
			s.mu.Lock()
			s.wr += put
			s.mu.Unlock()
			select {
			case s.data <- struct{}{}:
			default:
			}
		}
		if p.heldSeg == len(segs) {
			return true
		}
	}
}

// portsEvent runs the named ports' host-side work after the eventfd fired:
// new input, input ended, room in an output ring.
func (c *Console) portsEvent() error {
	for _, p := range c.ports {
		if err := c.fillPort(p); err != nil {
			return err
		}
		if p.held || p.closing && !p.outDone {
			if err := c.transmitPort(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// portQueueNotify handles a kick on a named port's queue q ≥ 4.
func (c *Console) portQueueNotify(q int) error {
	p := c.portByID(uint32((q - 2) / 2))
	if p == nil {
		return nil
	}
	if q%2 == 0 {
		return c.fillPort(p)
	}
	if p.held {
		// Waiting for room in the ring; the writer's wakeup resumes.
		return nil
	}
	return c.transmitPort(p)
}

// portControl applies a driver message for named port p (event is
// PORT_READY or PORT_OPEN, value 0 or 1).
func (c *Console) portControl(p *namedPort, event, value uint16) error {
	if p.rx == nil || p.tx == nil {
		c.ctlError("control event %d for port %d whose queues the driver did not enable", event, p.id)
		return nil
	}
	if !p.added {
		c.ctlError("control event %d for port %d before the device added it", event, p.id)
		return nil
	}
	if event == evPortReady {
		if value == 0 {
			c.ctlError("driver reports PORT_READY 0: it failed to add port %d", p.id)
			return nil
		}
		p.ready = true
		p.pending |= sendPortOpen | sendPortName
		return nil
	}
	if !p.ready {
		c.ctlError("PORT_OPEN for port %d before PORT_READY", p.id)
		return nil
	}
	if value == 1 {
		p.guestOpen = true
		p.closing = false
		return c.fillPort(p)
	}
	if !p.guestOpen {
		return nil // a close without an open: nothing was written
	}
	p.guestOpen = false
	// End of the guest's stream, after everything it queued before.
	p.closing = true
	if p.held {
		return nil
	}
	return c.transmitPort(p)
}
