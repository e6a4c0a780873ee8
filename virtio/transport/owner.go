// Optional interfaces of a virtio.Device that takes over some of its
// queues' eventfds (polling workers, vhost).

package transport

import (
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// QueueFDs describe one queue to a device that implements EventFDOwner.
type QueueFDs struct {
	// Enabled reports whether the driver enabled the queue; the other
	// fields are meaningful only then.
	Enabled bool
	// Config is the ring layout the driver programmed.
	Config queue.Config
	// Kick is the queue's notification eventfd: the KVM ioeventfd on its
	// doorbell signals it (and so does a doorbell write that exits).
	Kick int
	// Call is the irqfd eventfd of the queue's MSI-X vector: a write
	// raises the vector in KVM (held by the eventfd while the vector is
	// masked, delivered when the guest unmasks it), or -1 when the driver
	// gave the queue no vector.
	Call int
}

// EventFDOwner is an optional interface of a virtio.Device that waits on
// some of its queues' doorbells itself instead of through the transport's
// goroutine: it polls them on its own workers (one per queue pair, say) or
// hands them to the kernel (vhost: Kick as the vring's kick, Call as its
// call eventfd, so the data path bypasses hpcvmm entirely).
//
// The transport calls TakeEventFDs after DRIVER_OK, just before Activate,
// with one QueueFDs per queue, and fail, which marks the device
// DEVICE_NEEDS_RESET and is safe from any goroutine. The device returns
// which queues it owns: the transport neither polls their Kick eventfds nor
// calls QueueNotify for them. The eventfds stay the transport's: the device
// must not close them and must stop using them in Reset.
type EventFDOwner interface {
	TakeEventFDs(queues []QueueFDs, fail func(error)) (owned []bool)
}

// CallFDOwner is an optional interface of an EventFDOwner that hands the
// Call eventfds of its queues to someone else (vhost): the driver may move
// a queue to another MSI-X vector after DRIVER_OK, and the interrupt
// eventfd must follow it. The transport calls QueueCallChanged under its lock
// when the driver changes the vector of a queue the device owns while the
// device is running; call is the new vector's irqfd eventfd, or -1 when
// the driver gave the queue no vector (VIRTIO_MSI_NO_VECTOR: no
// interrupts). Like the ones in QueueFDs, the eventfd stays the
// transport's.
type CallFDOwner interface {
	QueueCallChanged(q int, call int)
}
