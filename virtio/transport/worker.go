// The device goroutine that polls the queue doorbells the transport serves
// itself.

package transport

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
)

// +checklocks:t.mu
func (t *Transport) stopWorker() {
	if !t.running {
		return
	}
	if err := irq.SignalEventFD(t.stopFD); err != nil {
		t.report(fmt.Errorf("virtio-pci: stop device goroutine: %w", err))
	}
	<-t.done
	irq.DrainEventFD(t.stopFD, t.drain[:])
	t.running = false
}

// run is the device goroutine: it waits on the queue doorbells, the stop
// eventfd and the device's host-side eventfd, and calls the device. It never
// takes t.mu, so a reset on a vCPU thread can wait for it.
func (t *Transport) run(done chan struct{}, active []bool) {
	defer close(done)
	nq := len(t.queues)
	stopIdx := nq
	var drain [8]byte
	broken := false
	call := func(err error) {
		if err != nil && !broken {
			broken = true
			t.fail(err)
		}
	}
	for i := range nq {
		if active[i] {
			call(t.dev.QueueNotify(i))
		}
	}
	fds := t.pollFDs
	for i := range nq {
		// Queues an EventFDOwner took (inactive here) are not polled: their
		// kicks belong to the device's own workers or to the kernel.
		fds[i].Fd = int32(t.queues[i].notifyFD)
		if !active[i] {
			fds[i].Fd = -1
		}
	}
	if len(fds) > nq+1 {
		fds[nq+1].Fd = int32(t.devFD)
	}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			t.report(fmt.Errorf("virtio-pci type %d: device goroutine poll: %w", t.dev.Type(), err))
			return
		}
		if fds[stopIdx].Revents != 0 {
			return
		}
		for i := range nq {
			if fds[i].Revents&unix.POLLIN == 0 {
				continue
			}
			irq.DrainEventFD(int(fds[i].Fd), drain[:])
			if active[i] && !broken {
				call(t.dev.QueueNotify(i))
			}
		}
		if len(fds) > nq+1 && fds[nq+1].Revents&unix.POLLIN != 0 {
			if broken {
				// Leave host work queued for after the reset; stop polling
				// the fd so it does not spin (restored on the next run).
				fds[nq+1].Fd = -1
			} else {
				call(t.dev.HandleEvent())
			}
		}
	}
}
