// The MULTIPORT control queues: the handshake that holds port 0's input back
// until the driver keeps it, and RESIZE (see the package doc).

package console

import (
	"encoding/binary"
	"fmt"
	"time"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// receiveControl handles every message on the control transmitq. Ring
// violations (a device-writable buffer) are errors like on port 0's
// transmitq; a malformed message is reported and ignored.
func (c *Console) receiveControl() error {
	if err := c.drainDriverQueue(c.cout, "control transmitq", c.readControl, func() {}, c.ctlSendInterrupt); err != nil {
		return err
	}
	if err := c.portErr; err != nil {
		// A named port's ring broke while a control message was applied.
		c.portErr = nil
		return err
	}
	if err := c.sendControl(); err != nil {
		return err
	}
	// PORT_OPEN may have opened the gate for input already waiting.
	return c.fillReceive()
}

// ctlSendInterrupt raises the control transmitq's interrupt at once when
// the driver wants it: control messages are rare, and Linux waits for
// nothing on this queue but its buffers.
func (c *Console) ctlSendInterrupt() {
	if c.cout.NeedInterrupt() {
		c.interrupt(ctlSendQ)
	}
}

// readControl applies the control message in one chain. Linux sends the
// 8-byte header in one buffer; it is gathered from however many the guest
// used, and bytes past it carry nothing a driver sends.
func (c *Console) readControl(ch *queue.Chain) {
	n := 0
	for i := range ch.Segments {
		n += copy(c.ctlRecvBuf[n:], ch.Segments[i].Buf)
		if n == len(c.ctlRecvBuf) {
			break
		}
	}
	c.handleControl(c.ctlRecvBuf[:n], ch.ReadableLen)
}

// handleControl applies one driver message (msg is its first bytes, total
// its length in the chain).
func (c *Console) handleControl(msg []byte, total uint64) {
	if len(msg) < ctlHeaderSize {
		c.ctlError("short control message: %d bytes, want %d", total, ctlHeaderSize)
		return
	}
	id := binary.LittleEndian.Uint32(msg[0:])
	event := binary.LittleEndian.Uint16(msg[4:])
	value := binary.LittleEndian.Uint16(msg[6:])
	switch event {
	case evDeviceReady, evPortReady, evPortOpen:
		if value > 1 {
			c.ctlError("control event %d for port %d: value %d, want 0 or 1", event, id, value)
			return
		}
	default:
		c.ctlError("unexpected control event %d (value %d) for port %d from the driver", event, value, id)
		return
	}
	if event == evDeviceReady {
		// id is unused (Linux sends VIRTIO_CONSOLE_BAD_ID).
		if value == 0 {
			c.ctlError("driver reports DEVICE_READY 0: it failed to set up the device")
			return
		}
		c.ctl.pending |= sendPortAdd
		for _, p := range c.ports {
			if p.rx != nil && p.tx != nil {
				p.pending |= sendPortAdd
			}
		}
		return
	}
	if id != 0 {
		p := c.portByID(id)
		if p == nil {
			if len(c.ports) == 0 {
				c.ctlError("control event %d for port %d: only port 0 exists", event, id)
			} else {
				c.ctlError("control event %d for port %d: only ports 0 to %d exist", event, id, len(c.ports))
			}
			return
		}
		c.portErr = c.portControl(p, event, value)
		return
	}
	if event == evPortReady {
		if !c.ctl.added {
			c.ctlError("PORT_READY for port 0 before the device added it")
			return
		}
		if value == 0 {
			c.ctlError("driver reports PORT_READY 0: it failed to add port 0")
			return
		}
		c.ctl.ready = true
		c.ctl.pending |= sendConsolePort | sendPortOpen
		return
	}
	// PORT_OPEN: Linux sends it from init_port_console after setting
	// guest_connected, so input sent from now on is kept.
	if !c.ctl.ready {
		c.ctlError("PORT_OPEN for port 0 before PORT_READY")
		return
	}
	c.ctl.open = value == 1
}

// queueResize schedules RESIZE when port 0 is a console and the size the
// guest has is not the current one.
func (c *Console) queueResize() {
	if !c.ctl.console {
		return
	}
	c.mu.Lock()
	rows, cols := c.rows, c.cols
	c.mu.Unlock()
	if rows != 0 && cols != 0 && (rows != c.ctl.sentRows || cols != c.ctl.sentCols) {
		c.ctl.pending |= sendResize
	}
}

// sendControl delivers the pending messages in order into control receiveq
// buffers, as many as there are buffers for.
func (c *Console) sendControl() error {
	q := c.cin
	if q == nil {
		return nil
	}
	ch := c.chain
	pushed := false
	for c.controlPending() {
		ok, err := q.Pop(ch)
		if err != nil {
			return fmt.Errorf("virtio-console control receiveq: %w", err)
		}
		if !ok {
			if q.EnableNotify() {
				continue
			}
			break
		}
		if ch.ReadableLen > 0 || len(ch.Segments) > 0 && !ch.Segments[0].Writable {
			return fmt.Errorf("virtio-console control receiveq: chain %d has device-readable buffers", ch.Head)
		}
		msg := c.nextControl()
		written := uint32(0)
		if ch.WritableLen < uint64(len(msg)) {
			// A partial message would be read as a whole one; Linux
			// posts a page per buffer, so this is a broken driver.
			c.ctlError("control receive buffer of %d bytes for a %d-byte message: message dropped", ch.WritableLen, len(msg))
		} else {
			rest := msg
			for i := range ch.Segments {
				rest = rest[copy(ch.Segments[i].Buf, rest):]
			}
			written = uint32(len(msg))
		}
		if err := q.Push(ch.Head, written); err != nil {
			return err
		}
		pushed = true
	}
	if pushed && q.NeedInterrupt() {
		c.interrupt(ctlRecvQ)
	}
	return nil
}

// controlPending reports whether any port has a message to send.
func (c *Console) controlPending() bool {
	if c.ctl.pending != 0 {
		return true
	}
	for _, p := range c.ports {
		if p.pending != 0 {
			return true
		}
	}
	return false
}

// nextControl takes the first pending message off ctl.pending (port 0's
// first, then the named ports' in id order), updates the state it implies,
// and returns its bytes (in c.ctlMsg).
func (c *Console) nextControl() []byte {
	if c.ctl.pending == 0 {
		for _, p := range c.ports {
			if p.pending != 0 {
				return c.nextPortControl(p)
			}
		}
	}
	m := c.ctl.pending & -c.ctl.pending
	c.ctl.pending &^= m
	b := c.ctlMsg[:ctlHeaderSize]
	binary.LittleEndian.PutUint32(b[0:], 0) // port 0
	binary.LittleEndian.PutUint16(b[6:], 1)
	switch m {
	case sendPortAdd:
		binary.LittleEndian.PutUint16(b[4:], evPortAdd)
		c.ctl.added = true
	case sendConsolePort:
		binary.LittleEndian.PutUint16(b[4:], evConsolePort)
		c.ctl.console = true
		c.queueResize() // the initial size, now that Linux listens
	case sendPortOpen:
		// The host side is always connected: stdout takes output.
		binary.LittleEndian.PutUint16(b[4:], evPortOpen)
	case sendResize:
		b = c.ctlMsg[:ctlResizeSize]
		binary.LittleEndian.PutUint16(b[4:], evResize)
		binary.LittleEndian.PutUint16(b[6:], 0) // value unused
		c.mu.Lock()
		c.ctl.sentRows, c.ctl.sentCols = c.rows, c.cols
		c.mu.Unlock()
		// struct virtio_console_resize: columns first.
		binary.LittleEndian.PutUint16(b[8:], c.ctl.sentCols)
		binary.LittleEndian.PutUint16(b[10:], c.ctl.sentRows)
	}
	return b
}

// ctlError reports a guest control-protocol error, rate-limited: the guest
// controls how often this happens.
func (c *Console) ctlError(format string, args ...any) {
	if c.opts.OnError == nil {
		return
	}
	now := time.Now()
	e := &c.ctlErrs
	if e.reported >= ctlErrBurst && now.Sub(e.last) < ctlErrInterval {
		e.suppressed++
		return
	}
	err := fmt.Errorf("virtio-console control: "+format, args...)
	if e.suppressed > 0 {
		err = fmt.Errorf("%w (%d similar errors suppressed)", err, e.suppressed)
	}
	e.reported++
	e.suppressed = 0
	e.last = now
	c.opts.OnError(err)
}

// nextPortControl takes named port p's first pending message: PORT_ADD,
// PORT_OPEN (host connected, or not once its input ended), PORT_NAME. The
// order is Linux's need: PORT_OPEN before PORT_NAME, so a guest that finds
// the port by name never sees it unconnected (its read would return end of
// file).
func (c *Console) nextPortControl(p *namedPort) []byte {
	m := p.pending & -p.pending
	p.pending &^= m
	b := c.ctlMsg[:ctlHeaderSize]
	binary.LittleEndian.PutUint32(b[0:], p.id)
	binary.LittleEndian.PutUint16(b[6:], 1)
	switch m {
	case sendPortAdd:
		binary.LittleEndian.PutUint16(b[4:], evPortAdd)
		p.added = true
	case sendPortOpen:
		binary.LittleEndian.PutUint16(b[4:], evPortOpen)
		if !p.hostOpen {
			binary.LittleEndian.PutUint16(b[6:], 0)
		}
	case sendPortName:
		binary.LittleEndian.PutUint16(b[4:], evPortName)
		b = c.ctlMsg[:ctlHeaderSize+copy(c.ctlMsg[ctlHeaderSize:], p.name)]
	}
	return b
}
