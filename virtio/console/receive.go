// The receive path: host input read from New's in and copied into port 0's
// receiveq buffers.

package console

import (
	"errors"
	"fmt"
	"io"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

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
	if q == nil || c.gated && !c.ctl.open {
		// With MULTIPORT, buffers posted before the driver opened port 0
		// stay unused: what Linux got in them now it would discard.
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
