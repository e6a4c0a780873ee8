// Package console is a virtio console device (virtio 1.x 5.3). Port 0 is
// the console: bytes the guest writes to port 0's transmitq go to an
// io.Writer (hpcvmm's stdout), bytes read from an io.Reader (stdin) go to
// port 0's receiveq. Guest /dev/hvc0 is this port once the guest's
// virtio_console driver binds. Options.Ports adds named ports 1..N, byte
// streams the guest opens as /dev/vportNpM (see ports.go: hpcvmm's jobs
// carry their control, stdin, stdout and stderr on them).
//
// Terminal handling (raw mode, restoring it, SIGWINCH) belongs to the
// caller; it reports the terminal size with SetSize.
//
// Host input is never dropped. One reader goroutine (started at the first
// activation) reads at most one inputChunk (4 KiB) of the io.Reader and then
// waits until the device goroutine has copied all of it into receiveq
// buffers: while the guest cannot take it (no buffers posted, or the port
// not open yet, below) input waits here and the io.Reader is not read
// (backpressure, bounded memory). End of file stops the reader only after
// its last chunk was delivered.
//
// VIRTIO_CONSOLE_F_MULTIPORT is offered (max_nr_ports 1+N) for the named
// ports and, for port 0, because its control queues let the device hold
// input back until the guest can keep it. Linux's driver posts port 0's receive buffers before it lists the
// port (add_port fills the queue, then adds the port to portdev->ports), and
// until init_port_console has run it discards what arrives for the port
// (in_intr: no port found, or the port not guest_connected). Input waiting
// at probe would be put in the first buffer and lost. With MULTIPORT the
// handshake is (struct virtio_console_control: le32 id, le16 event, le16
// value; queues 2 and 3 are control receiveq and transmitq):
//
//	driver DEVICE_READY(1)  -> device PORT_ADD(port 0)
//	driver PORT_READY(0, 1) -> device CONSOLE_PORT(0, 1), PORT_OPEN(0, 1),
//	                           RESIZE(0; cols, rows) when the size is known
//	driver PORT_OPEN(0, 1)  -> input flows to port 0
//
// PORT_READY is sent once the port is listed, but only the driver's
// PORT_OPEN(0, 1), sent by init_port_console after it set guest_connected,
// says data will be kept, so that is when input starts. (QEMU's
// virtio-serial also answers PORT_READY for a virtconsole port with
// CONSOLE_PORT and PORT_OPEN.)
// With MULTIPORT, Linux ignores the size in the configuration space, so
// SetSize sends RESIZE instead of a configuration change interrupt.
//
// A driver that does not accept MULTIPORT gets the single-port layout
// (queues 0 and 1 only) and input as soon as buffers are posted, and the
// race above remains: input already waiting when such a driver probes can
// be lost.
//
// Everything on the control transmitq is guest-controlled: short messages,
// unknown events, wrong port ids and out-of-order messages are ignored and
// reported through Options.OnError, rate-limited (ctlErrBurst, then one per
// ctlErrInterval with the count suppressed). A control receive buffer too
// small for a message gets nothing written and the message is dropped.
package console

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// Console features and layout.
const (
	// FeatureSize is VIRTIO_CONSOLE_F_SIZE: cols/rows in the config space.
	FeatureSize = uint64(1) << 0
	// FeatureMultiport is VIRTIO_CONSOLE_F_MULTIPORT: max_nr_ports in the
	// config space and the control queues (see the package doc).
	FeatureMultiport = uint64(1) << 1

	// DefaultQueueSize is the size offered for port 0's queues.
	DefaultQueueSize = 256
	// ControlQueueSize is the size offered for the control queues: the
	// handshake needs a handful of messages, and Linux fills the control
	// receiveq with one page per entry.
	ControlQueueSize = 32

	receiveQ  = 0 // port 0 receiveq: host to guest
	transmitQ = 1 // port 0 transmitq: guest to host
	ctlRecvQ  = 2 // control receiveq (c_ivq): device to driver messages
	ctlSendQ  = 3 // control transmitq (c_ovq): driver to device messages
	numQueues = 4 // port 0's pair and the control pair; each named port adds two

	// struct virtio_console_config: cols, rows, max_nr_ports, emerg_wr.
	configSize = 12

	inputChunk = 4096

	// txStageSize holds a batch of transmit chains between returning them
	// and writing their bytes out: Linux's hvc console sends at most a page
	// per chain and a port write at most 32 KiB.
	txStageSize = 64 << 10

	// txIRQDelay is how long a transmitq interrupt the driver asked for
	// waits before the device asks again whether it is still wanted (see
	// txInterrupt). Linux's hvc console takes each buffer by polling, so
	// by then it has moved used_event past it and the interrupt would
	// only find nothing to do; the only driver that sleeps on it is a
	// port writer with a full ring, which waits a millisecond longer.
	txIRQDelay = time.Millisecond
)

// Control events (virtio 1.x 5.3.6.2, struct virtio_console_control).
const (
	evDeviceReady = 0 // driver: device set up (value 1) or failed (0)
	evPortAdd     = 1 // device: a port exists (VIRTIO_CONSOLE_DEVICE_ADD)
	evPortRemove  = 2 // device: a port is gone (not used here)
	evPortReady   = 3 // driver: port set up (value 1) or failed (0)
	evConsolePort = 4 // device: this port is a console
	evResize      = 5 // device: console size follows the header
	evPortOpen    = 6 // both: port opened (1) or closed (0) on that side
	evPortName    = 7 // device: port name follows (named ports)

	ctlHeaderSize = 8  // le32 id, le16 event, le16 value
	ctlResizeSize = 12 // header, le16 cols, le16 rows

	// ctlErrBurst control-message errors are reported as they come; past
	// that at most one per ctlErrInterval, so a guest flooding bad
	// messages cannot flood the log.
	ctlErrBurst    = 10
	ctlErrInterval = 10 * time.Second
)

// Messages the device owes the driver, one bit each. They go out in bit
// order, which is the handshake's order: a console must exist before it is
// a console, and Linux ignores RESIZE for a port that is not one yet.
const (
	sendPortAdd uint8 = 1 << iota
	sendConsolePort
	sendPortOpen
	sendPortName
	sendResize
)

// Options tune a Console. The zero value is usable.
type Options struct {
	// QueueSize is the maximum size of port 0's queues (power of two up to
	// queue.MaxSize); 0 means DefaultQueueSize.
	QueueSize uint16
	// Rows and Cols are the initial console size (0 = unknown).
	Rows, Cols uint16
	// OnError hears host-side I/O errors (writing out, reading in) and
	// malformed control messages from the guest (rate-limited); the device
	// keeps running, dropping output that cannot be written. It is called
	// from the device goroutine and from the ports' reader and writer
	// goroutines.
	OnError func(error)
	// Ports are the named ports 1..N (see ports.go), offered with
	// MULTIPORT (max_nr_ports 1+N). A driver without MULTIPORT sees only
	// port 0.
	Ports []Port
}

// control is the MULTIPORT handshake state, owned by the device goroutine
// between Activate and Reset.
type control struct {
	added    bool  // PORT_ADD for port 0 went out
	ready    bool  // the driver sent PORT_READY(0, 1): port 0 is listed
	console  bool  // CONSOLE_PORT went out: RESIZE means something now
	open     bool  // the driver sent PORT_OPEN(0, 1): it keeps port 0 input
	pending  uint8 // send* bits not yet delivered
	sentRows uint16
	sentCols uint16
}

// errLimit rate-limits reported control errors (see ctlErrBurst). It lives
// across driver resets, so resetting the device does not reopen the burst.
type errLimit struct {
	reported   int
	suppressed int
	last       time.Time
}

// Console is the device model. It implements virtio.Device.
type Console struct {
	in      io.Reader
	out     io.Writer
	opts    Options
	eventFD int

	mu         sync.Mutex // rows, cols, irq, outErr, multiport
	rows, cols uint16
	irq        virtio.Interrupter
	outErr     bool
	multiport  bool // negotiated by the running driver: SetSize sends RESIZE

	// Device goroutine state (between Activate and Reset).
	rx, tx     *queue.Queue
	cin, cout  *queue.Queue // control queues, nil without MULTIPORT
	chain      *queue.Chain
	drain      [8]byte
	ctl        control
	ctlErrs    errLimit
	gated      bool // MULTIPORT: hold input until ctl.open
	ctlMsg     [ctlHeaderSize + MaxPortName]byte
	ctlRecvBuf [ctlHeaderSize]byte
	ports      []*namedPort // ids 1..N
	portRx     *queue.Chain // receive chains of named ports (see fillStream)
	portErr    error        // a ring error met while applying a control message

	// Transmit staging (see transmit): txStage[:txStaged] is guest output
	// whose chains were returned but which out has not been given yet.
	txStage  [txStageSize]byte
	txStaged int

	// Deferred transmitq interrupt (see txInterrupt): txDeferred is set,
	// and txTimer armed to signal eventFD at txDeadline, while entries
	// whose interrupt the driver asked for wait for the decision.
	txDeferred bool
	txDeadline time.Time
	txTimer    *time.Timer
	fdClosed   bool // under mu: eventFD is closed, the timer must not signal it

	// Input hand-off: the reader goroutine owns inBuf while inLen == 0;
	// after it publishes a chunk (inLen > 0) the device goroutine consumes
	// it and gives the buffer back through consumed.
	inMu     sync.Mutex
	inBuf    [inputChunk]byte
	inOff    int
	inLen    int
	consumed chan struct{}
	quit     chan struct{}
	closed   atomic.Bool
	started  sync.Once
}

var _ virtio.Device = (*Console)(nil)

// New returns a console reading guest input from in (nil for none) and
// writing guest output to out. Reading in starts when the guest driver first
// activates the device.
func New(in io.Reader, out io.Writer, opts Options) (*Console, error) {
	if out == nil {
		out = io.Discard
	}
	if opts.QueueSize == 0 {
		opts.QueueSize = DefaultQueueSize
	}
	if s := opts.QueueSize; s > queue.MaxSize || s&(s-1) != 0 {
		return nil, fmt.Errorf("virtio-console: queue size %d: must be a power of two up to %d", s, queue.MaxSize)
	}
	if err := ValidatePorts(opts.Ports); err != nil {
		return nil, fmt.Errorf("virtio-console: %w", err)
	}
	fd, err := irq.NewEventFD()
	if err != nil {
		return nil, fmt.Errorf("virtio-console: input eventfd: %w", err)
	}
	c := &Console{
		in: in, out: out, opts: opts, eventFD: fd,
		rows: opts.Rows, cols: opts.Cols,
		chain:    queue.NewChain(queue.MaxSize),
		consumed: make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}
	// One timer for the device's life: Reset re-arms it without
	// allocating.
	c.txTimer = time.AfterFunc(time.Hour, c.txTimerFired)
	c.txTimer.Stop()
	if len(opts.Ports) > 0 {
		c.portRx = queue.NewChain(queue.MaxSize)
	}
	for i, p := range opts.Ports {
		np := newNamedPort(i+1, p)
		c.ports = append(c.ports, np)
		if np.out != nil {
			// From now on: Close ends the stream even if no driver ever
			// came.
			go c.portWriteLoop(np)
		}
	}
	return c, nil
}

// SetSize reports a new terminal size to the guest. Safe from any
// goroutine. A driver without MULTIPORT reads it from the configuration
// space after a configuration-change interrupt; with MULTIPORT Linux only
// listens to RESIZE control messages, so the device goroutine sends one
// (woken through the eventfd) once port 0 is a console.
func (c *Console) SetSize(rows, cols uint16) {
	c.mu.Lock()
	changed := rows != c.rows || cols != c.cols
	c.rows, c.cols = rows, cols
	intr, multiport := c.irq, c.multiport
	c.mu.Unlock()
	if !changed || intr == nil {
		return
	}
	if !multiport {
		intr.ConfigChanged()
		return
	}
	if err := irq.SignalEventFD(c.eventFD); err != nil && c.opts.OnError != nil {
		c.opts.OnError(fmt.Errorf("virtio-console: signal resize: %w", err))
	}
}

// Close stops the input goroutines from handing more data to the guest and
// releases the eventfd. It does not close in or out or the ports'
// FromHost; a reader goroutine blocked in Read exits when that Read
// returns. Each port's ToHost is closed after the guest output already
// taken from the guest was written to it.
func (c *Console) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.quit)
	c.txTimer.Stop()
	c.mu.Lock()
	c.fdClosed = true // a timer already firing finds it and does nothing
	c.mu.Unlock()
	return unix.Close(c.eventFD)
}

// Type implements virtio.Device.
func (c *Console) Type() uint16 { return virtio.DeviceConsole }

// Features implements virtio.Device.
func (c *Console) Features() uint64 { return FeatureSize | FeatureMultiport }

// QueueMaxSizes implements virtio.Device: port 0's receiveq and transmitq,
// then the control receiveq and transmitq, then each named port's
// receiveq and transmitq (all used only with MULTIPORT).
func (c *Console) QueueMaxSizes() []uint16 {
	sizes := []uint16{c.opts.QueueSize, c.opts.QueueSize, ControlQueueSize, ControlQueueSize}
	for range c.ports {
		sizes = append(sizes, c.opts.QueueSize, c.opts.QueueSize)
	}
	return sizes
}

// ConfigSize implements virtio.Device.
func (c *Console) ConfigSize() int { return configSize }

// ReadConfig implements virtio.Device.
func (c *Console) ReadConfig(offset int, data []byte) {
	var img [configSize]byte
	c.mu.Lock()
	binary.LittleEndian.PutUint16(img[0:], c.cols)
	binary.LittleEndian.PutUint16(img[2:], c.rows)
	c.mu.Unlock()
	binary.LittleEndian.PutUint32(img[4:], uint32(1+len(c.ports))) // max_nr_ports
	clear(data)
	if offset >= 0 && offset < configSize {
		copy(data, img[offset:])
	}
}

// WriteConfig implements virtio.Device. Nothing is writable without
// VIRTIO_CONSOLE_F_EMERG_WRITE, which is not offered.
func (c *Console) WriteConfig(offset int, data []byte) {}

// Activate implements virtio.Device.
func (c *Console) Activate(features uint64, queues []*queue.Queue, irq virtio.Interrupter) error {
	if want := numQueues + 2*len(c.ports); len(queues) != want {
		return fmt.Errorf("virtio-console: activate with %d queues, want %d", len(queues), want)
	}
	multiport := features&FeatureMultiport != 0
	if multiport && (queues[ctlRecvQ] == nil || queues[ctlSendQ] == nil) {
		return errors.New("virtio-console: MULTIPORT accepted but the control queues (2 and 3) are not enabled")
	}
	c.rx, c.tx = queues[receiveQ], queues[transmitQ]
	c.cin, c.cout = nil, nil
	if multiport {
		c.cin, c.cout = queues[ctlRecvQ], queues[ctlSendQ]
	}
	c.ctl = control{}
	c.gated = multiport
	c.txDeferred = false
	for _, p := range c.ports {
		p.reset()
		if multiport {
			// Disabled queues (nil) leave the port out: it is never added.
			p.rx, p.tx = queues[p.txq-1], queues[p.txq]
		}
	}
	c.mu.Lock()
	c.irq = irq
	c.multiport = multiport
	c.mu.Unlock()
	c.started.Do(func() {
		if c.in != nil {
			go c.readLoop()
		}
		for _, p := range c.ports {
			if p.in != nil {
				go c.portReadLoop(p)
			}
		}
	})
	return nil
}

// Reset implements virtio.Device. Host input not yet delivered stays
// buffered for the next driver.
func (c *Console) Reset() {
	c.rx, c.tx, c.cin, c.cout = nil, nil, nil, nil
	c.ctl = control{}
	c.gated = false
	c.portErr = nil
	for _, p := range c.ports {
		p.reset()
	}
	// A deferred interrupt dies with the queues; a timer still running
	// only wakes the device goroutine once for nothing.
	c.txDeferred = false
	c.txTimer.Stop()
	c.mu.Lock()
	c.irq = nil
	c.multiport = false
	c.mu.Unlock()
}

// EventFD implements virtio.Device: readable when host input is waiting or
// a RESIZE is due.
func (c *Console) EventFD() int { return c.eventFD }

// HandleEvent implements virtio.Device.
func (c *Console) HandleEvent() error {
	irq.DrainEventFD(c.eventFD, c.drain[:])
	c.txDeferredDue()
	if err := c.portsEvent(); err != nil {
		return err
	}
	if c.cin != nil {
		c.queueResize()
		if err := c.sendControl(); err != nil {
			return err
		}
	}
	return c.fillReceive()
}

// QueueNotify implements virtio.Device.
func (c *Console) QueueNotify(q int) error {
	switch q {
	case receiveQ:
		// New receive buffers: deliver input that was waiting for them.
		return c.fillReceive()
	case transmitQ:
		return c.transmit()
	case ctlRecvQ:
		// New control buffers: deliver messages that were waiting.
		return c.sendControl()
	case ctlSendQ:
		return c.receiveControl()
	}
	if q > ctlSendQ {
		return c.portQueueNotify(q)
	}
	return nil
}

func (c *Console) interrupt(q int) {
	c.mu.Lock()
	irq := c.irq
	c.mu.Unlock()
	if irq != nil {
		irq.SignalQueue(q)
	}
}
