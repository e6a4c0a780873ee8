// The transmit path: guest output from port 0's transmitq, staged, written to
// New's out, and its interrupt (at once or deferred).

package console

import (
	"fmt"
	"time"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// txTimerFired wakes the device goroutine for a deferred transmitq
// interrupt (HandleEvent decides it).
func (c *Console) txTimerFired() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fdClosed {
		return
	}
	if err := irq.SignalEventFD(c.eventFD); err != nil && c.opts.OnError != nil {
		c.opts.OnError(fmt.Errorf("virtio-console: signal deferred interrupt: %w", err))
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

// transmit moves every available transmitq buffer to out.
//
// Each chain's bytes are copied into the staging buffer and the chain is
// returned to the driver at once; the staged bytes go to out afterwards,
// and only then does the device decide on the interrupt. Linux's hvc
// console writes 2 KiB at a time and spins, interrupts off, until the
// device returns the buffer (__send_to_port with nonblock false): returned
// before the slow host write, the guest reclaims it, moves used_event past
// it and queues its next chunk while out is being written, so the device
// finds neither an interrupt due (vring_need_event is false) nor a kick
// needed (avail_event is still behind). Returned after the write, as
// before, every chunk cost a kick, an interrupt and an interrupt window
// exit. A chain larger than the staging buffer is written straight from
// guest memory before it is returned (backpressure is unchanged: nothing
// more is taken off the ring while out blocks).
func (c *Console) transmit() error {
	return c.drainDriverQueue(c.tx, "transmitq", c.stageOut, c.flushOut, c.txInterrupt)
}

// txInterrupt decides the transmitq interrupt after a batch. An interrupt
// the driver does not want (it took every buffer, or asked for none) is
// decided at once. One it wants is deferred by txIRQDelay and then asked
// for again (txDeferredDue): Linux's hvc console spins, interrupts off,
// until its buffer is back (__send_to_port), so such an interrupt arrives
// after it took the buffer and moved used_event past it, costing an
// interrupt-window exit, an injection and a handler that finds nothing.
// Deferring never loses one: if the driver still wants it when the timer
// fires, it gets it then, and vring_need_event covers every entry since
// the last decision. Further batches meanwhile keep the first deadline,
// so the delay stays bounded.
func (c *Console) txInterrupt() {
	q := c.tx
	if q.InterruptDue() {
		if !c.txDeferred {
			c.txDeferred = true
			c.txDeadline = time.Now().Add(txIRQDelay)
			c.txTimer.Reset(txIRQDelay)
		}
		return
	}
	// Nothing due: record the decision for the entries so far (the
	// driver may have asked in between: then it gets the interrupt now).
	c.txDeferred = false
	if q.NeedInterrupt() {
		c.interrupt(transmitQ)
	}
}

// txDeferredDue decides a deferred transmitq interrupt once its deadline
// has passed (HandleEvent runs for host input too, earlier).
func (c *Console) txDeferredDue() {
	if !c.txDeferred || time.Now().Before(c.txDeadline) {
		return
	}
	c.txDeferred = false
	if c.tx != nil && c.tx.NeedInterrupt() {
		c.interrupt(transmitQ)
	}
}

// stageOut takes one transmit chain's bytes: into the staging buffer when
// they fit, else (after flushing what is staged, to keep the order)
// straight to out.
func (c *Console) stageOut(ch *queue.Chain) {
	if ch.ReadableLen > uint64(len(c.txStage)-c.txStaged) {
		c.flushOut()
	}
	if ch.ReadableLen > uint64(len(c.txStage)) {
		c.writeOut(ch)
		return
	}
	for i := range ch.Segments {
		c.txStaged += copy(c.txStage[c.txStaged:], ch.Segments[i].Buf)
	}
}

// flushOut writes the staged bytes to out.
func (c *Console) flushOut() {
	if c.txStaged == 0 {
		return
	}
	if _, err := c.out.Write(c.txStage[:c.txStaged]); err != nil {
		c.reportOut(err)
	}
	c.txStaged = 0
}

// writeOut copies one transmit chain's bytes to the host output.
func (c *Console) writeOut(ch *queue.Chain) {
	for i := range ch.Segments {
		if len(ch.Segments[i].Buf) == 0 {
			continue
		}
		if _, err := c.out.Write(ch.Segments[i].Buf); err != nil {
			c.reportOut(err)
		}
	}
}

// drainDriverQueue consumes every chain the driver made available on a
// driver-to-device queue (port 0's transmitq, the control transmitq): a
// chain with a device-writable buffer is a ring violation; use sees each
// chain before it is returned with length 0 and must not keep it. After
// each batch (the chains available when it started) flush runs (also
// before an error return), then decide settles the queue's interrupt, then
// notifications are re-armed; entries that arrived meanwhile make another
// batch. Deciding after flush gives a driver that polls for its buffers
// the time to take them.
func (c *Console) drainDriverQueue(q *queue.Queue, name string, use func(ch *queue.Chain), flush, decide func()) error {
	if q == nil {
		return nil
	}
	ch := c.chain
	for {
		q.DisableNotify()
		for {
			ok, err := q.Pop(ch)
			if err != nil {
				flush() // the chains returned before it are delivered
				return fmt.Errorf("virtio-console %s: %w", name, err)
			}
			if !ok {
				break
			}
			if ch.WritableLen > 0 || hasWritable(ch) {
				flush()
				return fmt.Errorf("virtio-console %s: chain %d has device-writable buffers", name, ch.Head)
			}
			use(ch)
			if err := q.Push(ch.Head, 0); err != nil {
				flush()
				return err
			}
		}
		flush()
		decide()
		// Re-arm, then look again: an entry the driver added before it
		// could see avail_event brings no kick.
		if !q.EnableNotify() {
			return nil
		}
	}
}
