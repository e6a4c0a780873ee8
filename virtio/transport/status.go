// The device status state machine (virtio 2.1): queue enabling, DRIVER_OK
// activation, reset.

package transport

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// queueVectorChanged passes a running owned queue's new interrupt
// eventfd to its owner (under t.mu). Queues the transport serves itself
// need nothing: SignalQueue reads the vector on every interrupt.
// +checklocks:t.mu
func (t *Transport) queueVectorChanged(q int, vector uint32) {
	if !t.running || q >= len(t.owned) || !t.owned[q] {
		return
	}
	owner, ok := t.dev.(CallFDOwner)
	if !ok {
		return
	}
	owner.QueueCallChanged(q, t.callFD(vector))
}

// callFD is vector's irqfd eventfd, or -1 for no vector.
func (t *Transport) callFD(vector uint32) int {
	if vector == virtio.NoVector || int(vector) >= t.msix.Vectors() {
		return -1
	}
	return t.irqfds.EventFD(int(vector))
}

// +checklocks:t.mu
func (t *Transport) enableQueue(q *queueState) {
	if q.size > q.max {
		t.fail(fmt.Errorf("queue %d: size %d exceeds maximum %d", t.queueSel, q.size, q.max))
		return
	}
	vq, err := queue.New(t.cfg.Memory, queue.Config{Size: q.size, Desc: q.desc, Driver: q.driver, Device: q.device}, t.drvFeatures)
	if err != nil {
		t.fail(fmt.Errorf("queue %d: %w", t.queueSel, err))
		return
	}
	q.q, q.enabled = vq, true
}

// setStatus runs the device status state machine (under t.mu). Status bits
// only accumulate; writing 0 resets the device.
// +checklocks:t.mu
func (t *Transport) setStatus(v uint8) {
	if v == 0 {
		t.reset()
		return
	}
	old := t.status
	v |= old
	if v&virtio.StatusFeaturesOK != 0 && old&virtio.StatusFeaturesOK == 0 {
		// Accept only a subset of what was offered, including VERSION_1:
		// this is a modern-only device.
		if t.drvFeatures&^t.offered != 0 || t.drvFeatures&virtio.FeatureVersion1 == 0 {
			v &^= virtio.StatusFeaturesOK
		}
	}
	if v&virtio.StatusDriverOK != 0 && old&virtio.StatusDriverOK == 0 {
		if v&virtio.StatusFeaturesOK == 0 {
			v &^= virtio.StatusDriverOK
		} else {
			t.status = v
			t.activate()
			return
		}
	}
	t.status = v
}

// +checklocks:t.mu
func (t *Transport) activate() {
	if t.running || t.needsReset.Load() {
		return
	}
	qs := make([]*queue.Queue, len(t.queues))
	active := make([]bool, len(t.queues))
	for i := range t.queues {
		if t.queues[i].enabled {
			qs[i], active[i] = t.queues[i].q, true
		}
	}
	t.owned = t.owned[:0]
	if owner, ok := t.dev.(EventFDOwner); ok {
		owned := owner.TakeEventFDs(t.queueFDs(), t.fail)
		for i := range active {
			own := i < len(owned) && owned[i]
			if own {
				active[i] = false
			}
			t.owned = append(t.owned, own)
		}
	}
	if err := t.dev.Activate(t.drvFeatures, qs, t); err != nil {
		t.fail(fmt.Errorf("activate: %w", err))
		return
	}
	t.running = true
	t.done = make(chan struct{})
	go t.run(t.done, active)
}

// queueFDs describes every queue for EventFDOwner (under t.mu).
func (t *Transport) queueFDs() []QueueFDs {
	fds := make([]QueueFDs, len(t.queues))
	for i := range t.queues {
		q := &t.queues[i]
		fds[i] = QueueFDs{Enabled: q.enabled, Kick: q.notifyFD, Call: t.callFD(q.vector.Load()),
			Config: queue.Config{Size: q.size, Desc: q.desc, Driver: q.driver, Device: q.device}}
	}
	return fds
}

// reset stops the device goroutine and returns everything the driver
// programmed to its initial value (under t.mu).
// +checklocks:t.mu
func (t *Transport) reset() {
	t.stopWorker()
	t.dev.Reset()
	for i := range t.queues {
		q := &t.queues[i]
		q.size, q.enabled, q.q = q.max, false, nil
		q.desc, q.driver, q.device = 0, 0, 0
		q.vector.Store(virtio.NoVector)
		irq.DrainEventFD(q.notifyFD, t.drain[:])
	}
	t.configVector.Store(virtio.NoVector)
	t.devFeatSel, t.drvFeatSel, t.drvFeatures, t.queueSel = 0, 0, 0, 0
	t.status = 0
	t.needsReset.Store(false)
	t.isr.Store(0)
}
