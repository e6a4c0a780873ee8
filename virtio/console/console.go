// Package console is a virtio console device (virtio 1.x 5.3) with a single
// port: bytes the guest writes to its transmitq go to an io.Writer (hpcvmm's
// stdout), bytes read from an io.Reader (stdin) go to the guest's receiveq.
// Guest /dev/hvc0 is this port once the guest's virtio_console driver binds.
//
// Terminal handling (raw mode, restoring it, SIGWINCH) belongs to the
// caller; it reports the terminal size with SetSize (VIRTIO_CONSOLE_F_SIZE).
//
// Host input is never dropped. One reader goroutine (started at the first
// activation) reads at most one inputChunk (4 KiB) of the io.Reader and then
// waits until the device goroutine has copied all of it into receiveq
// buffers: while the driver has posted none (before probe, or all in use)
// input waits here and the io.Reader is not read (backpressure, bounded
// memory). End of file stops the reader only after its last chunk was
// delivered. VIRTIO_CONSOLE_F_MULTIPORT is not offered, so there is no
// control queue and no VIRTIO_CONSOLE_PORT_OPEN to wait for: Linux makes
// port 0 a console port, connected from probe.
//
// Known gap (TestConsoleInputAtLaunchVirtio fails): input already waiting
// when Linux's driver probes is put in the first receive buffer it posts,
// and the one interrupt for it finds no port yet (add_port lists the port
// only after filling the queue); the guest later reads nothing from
// /dev/hvc0 (its port shows bytes_received 0, bytes_discarded 0).
package console

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// Console features and layout.
const (
	// FeatureSize is VIRTIO_CONSOLE_F_SIZE: cols/rows in the config space.
	FeatureSize = uint64(1) << 0

	// DefaultQueueSize is the size offered for both queues.
	DefaultQueueSize = 256

	receiveQ  = 0 // port 0 receiveq: host to guest
	transmitQ = 1 // port 0 transmitq: guest to host

	// struct virtio_console_config: cols, rows, max_nr_ports, emerg_wr.
	configSize = 12

	inputChunk = 4096
)

// Options tune a Console. The zero value is usable.
type Options struct {
	// QueueSize is the maximum size of each queue (power of two up to
	// queue.MaxSize); 0 means DefaultQueueSize.
	QueueSize uint16
	// Rows and Cols are the initial console size (0 = unknown).
	Rows, Cols uint16
	// OnError hears host-side I/O errors (writing out, reading in); the
	// device keeps running, dropping output that cannot be written.
	OnError func(error)
}

// Console is the device model. It implements virtio.Device.
type Console struct {
	in      io.Reader
	out     io.Writer
	opts    Options
	eventFD int

	mu         sync.Mutex // rows, cols, irq, outErr
	rows, cols uint16
	irq        virtio.Interrupter
	outErr     bool

	// Device goroutine state (between Activate and Reset).
	rx, tx *queue.Queue
	chain  *queue.Chain
	drain  [8]byte

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
	fd, err := irq.NewEventFD()
	if err != nil {
		return nil, fmt.Errorf("virtio-console: input eventfd: %w", err)
	}
	return &Console{
		in: in, out: out, opts: opts, eventFD: fd,
		rows: opts.Rows, cols: opts.Cols,
		chain:    queue.NewChain(queue.MaxSize),
		consumed: make(chan struct{}, 1),
		quit:     make(chan struct{}),
	}, nil
}

// SetSize reports a new terminal size to the guest (configuration-change
// interrupt if the driver is running). Safe from any goroutine.
func (c *Console) SetSize(rows, cols uint16) {
	c.mu.Lock()
	changed := rows != c.rows || cols != c.cols
	c.rows, c.cols = rows, cols
	irq := c.irq
	c.mu.Unlock()
	if changed && irq != nil {
		irq.ConfigChanged()
	}
}

// Close stops the input goroutine from handing more data to the guest and
// releases the eventfd. It does not close in or out; a reader goroutine
// blocked in in.Read exits when that Read returns.
func (c *Console) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	close(c.quit)
	return unix.Close(c.eventFD)
}

// Type implements virtio.Device.
func (c *Console) Type() uint16 { return virtio.DeviceConsole }

// Features implements virtio.Device.
func (c *Console) Features() uint64 { return FeatureSize }

// QueueMaxSizes implements virtio.Device: receiveq and transmitq of port 0.
func (c *Console) QueueMaxSizes() []uint16 { return []uint16{c.opts.QueueSize, c.opts.QueueSize} }

// ConfigSize implements virtio.Device.
func (c *Console) ConfigSize() int { return configSize }

// ReadConfig implements virtio.Device.
func (c *Console) ReadConfig(offset int, data []byte) {
	var img [configSize]byte
	c.mu.Lock()
	binary.LittleEndian.PutUint16(img[0:], c.cols)
	binary.LittleEndian.PutUint16(img[2:], c.rows)
	c.mu.Unlock()
	binary.LittleEndian.PutUint32(img[4:], 1) // max_nr_ports (meaningful with MULTIPORT only)
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
	if len(queues) != 2 {
		return fmt.Errorf("virtio-console: activate with %d queues, want 2", len(queues))
	}
	c.rx, c.tx = queues[receiveQ], queues[transmitQ]
	c.mu.Lock()
	c.irq = irq
	c.mu.Unlock()
	if c.in != nil {
		c.started.Do(func() { go c.readLoop() })
	}
	return nil
}

// Reset implements virtio.Device. Host input not yet delivered stays
// buffered for the next driver.
func (c *Console) Reset() {
	c.rx, c.tx = nil, nil
	c.mu.Lock()
	c.irq = nil
	c.mu.Unlock()
}

// EventFD implements virtio.Device: readable when host input is waiting.
func (c *Console) EventFD() int { return c.eventFD }

// HandleEvent implements virtio.Device.
func (c *Console) HandleEvent() error {
	irq.DrainEventFD(c.eventFD, c.drain[:])
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

func (c *Console) reportOut(err error) {
	c.mu.Lock()
	first := !c.outErr
	c.outErr = true
	c.mu.Unlock()
	if first && c.opts.OnError != nil {
		c.opts.OnError(fmt.Errorf("virtio-console: write guest output: %w (further output errors not reported)", err))
	}
}

// transmit copies every available transmitq buffer to out and returns it.
func (c *Console) transmit() error {
	q := c.tx
	if q == nil {
		return nil
	}
	ch := c.chain
	for {
		q.DisableNotify()
		for {
			ok, err := q.Pop(ch)
			if err != nil {
				return fmt.Errorf("virtio-console transmitq: %w", err)
			}
			if !ok {
				break
			}
			if ch.WritableLen > 0 || hasWritable(ch) {
				return fmt.Errorf("virtio-console transmitq: chain %d has device-writable buffers", ch.Head)
			}
			for i := range ch.Segments {
				if len(ch.Segments[i].Buf) == 0 {
					continue
				}
				if _, err := c.out.Write(ch.Segments[i].Buf); err != nil {
					c.reportOut(err)
				}
			}
			if err := q.Push(ch.Head, 0); err != nil {
				return err
			}
		}
		if !q.EnableNotify() {
			break
		}
	}
	if q.NeedInterrupt() {
		c.interrupt(transmitQ)
	}
	return nil
}

func hasWritable(ch *queue.Chain) bool {
	for i := range ch.Segments {
		if ch.Segments[i].Writable {
			return true
		}
	}
	return false
}

// fillReceive copies pending host input into receiveq buffers.
func (c *Console) fillReceive() error {
	q := c.rx
	if q == nil {
		return nil
	}
	c.inMu.Lock()
	pushed, err := c.fillLocked(q)
	c.inMu.Unlock()
	if pushed && q.NeedInterrupt() {
		c.interrupt(receiveQ)
	}
	return err
}

func (c *Console) fillLocked(q *queue.Queue) (pushed bool, err error) {
	ch := c.chain
	for c.inOff < c.inLen {
		ok, err := q.Pop(ch)
		if err != nil {
			return pushed, fmt.Errorf("virtio-console receiveq: %w", err)
		}
		if !ok {
			// Out of buffers: ask for a kick when the driver adds some.
			if q.EnableNotify() {
				continue
			}
			return pushed, nil
		}
		if ch.ReadableLen > 0 || len(ch.Segments) > 0 && !ch.Segments[0].Writable {
			return pushed, fmt.Errorf("virtio-console receiveq: chain %d has device-readable buffers", ch.Head)
		}
		n := 0
		for i := range ch.Segments {
			k := copy(ch.Segments[i].Buf, c.inBuf[c.inOff:c.inLen])
			c.inOff += k
			n += k
			if c.inOff == c.inLen {
				break
			}
		}
		if err := q.Push(ch.Head, uint32(n)); err != nil {
			return pushed, err
		}
		pushed = true
	}
	if c.inLen > 0 && c.inOff == c.inLen {
		c.inOff, c.inLen = 0, 0
		select {
		case c.consumed <- struct{}{}:
		default:
		}
	}
	return pushed, nil
}

// readLoop moves host input to the device goroutine one chunk at a time, so
// input is read only as fast as the guest consumes it.
func (c *Console) readLoop() {
	for {
		n, err := c.in.Read(c.inBuf[:])
		if n > 0 {
			c.inMu.Lock()
			c.inOff, c.inLen = 0, n
			c.inMu.Unlock()
			if c.closed.Load() {
				return
			}
			if err := irq.SignalEventFD(c.eventFD); err != nil && c.opts.OnError != nil {
				c.opts.OnError(fmt.Errorf("virtio-console: signal input: %w", err))
			}
			select {
			case <-c.consumed:
			case <-c.quit:
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && c.opts.OnError != nil {
				c.opts.OnError(fmt.Errorf("virtio-console: read host input: %w", err))
			}
			return
		}
	}
}
