package transport_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

// ownerDev has two queues and takes queue 0's eventfds (as virtio-net
// does for its data queues); queue 1 stays with the transport.
type ownerDev struct {
	echoDev
	got      []transport.QueueFDs
	fail     func(error)
	notified [2]int
	calls    []int // QueueCallChanged: 100*q + fd
}

func (d *ownerDev) QueueCallChanged(q, call int) { d.calls = append(d.calls, 100*q+call) }

func (d *ownerDev) QueueMaxSizes() []uint16 { return []uint16{64, 64} }
func (d *ownerDev) TakeEventFDs(q []transport.QueueFDs, fail func(error)) []bool {
	d.got, d.fail = append([]transport.QueueFDs(nil), q...), fail
	return []bool{true, false}
}
func (d *ownerDev) Activate(f uint64, qs []*queue.Queue, irq virtio.Interrupter) error {
	return d.echoDev.Activate(f, qs[1:], irq)
}
func (d *ownerDev) QueueNotify(q int) error {
	d.notified[q]++
	return d.echoDev.QueueNotify(q)
}

func TestEventFDOwner(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	d := &ownerDev{}
	mem := make(queuetest.Memory, 1<<20)
	r, err := transporttest.NewRig(d, mem)
	require.NoError(t, err)
	t.Cleanup(func() { r.T.Close() })
	r.EnableMSIX(3)
	_, st := r.Negotiate(goodFeatures)
	require.NotZero(t, st&virtio.StatusFeaturesOK)
	q0 := queuetest.NewDriver(mem, 16, 0x1000)
	q1 := queuetest.NewDriver(mem, 16, 0x4000)
	require.Equal(t, uint16(2), r.SetupQueue(0, q0, 2))
	require.Equal(t, uint16(1), r.SetupQueue(1, q1, 1))
	r.DriverOK()

	require.Len(t, d.got, 2)
	assert.True(t, d.got[0].Enabled)
	assert.Equal(t, q0.Config(), d.got[0].Config)
	assert.Equal(t, r.T.NotifyEventFD(0), d.got[0].Kick)
	assert.Equal(t, r.T.IRQFDs().EventFD(2), d.got[0].Call, "call is the irqfd of the queue's vector")
	assert.Equal(t, r.T.IRQFDs().EventFD(1), d.got[1].Call)
	assert.NotNil(t, d.fail)

	// A kick on the owned queue is left for the device: the transport
	// neither drains it nor calls QueueNotify(0).
	require.NoError(t, r.Kick(0))
	q1.Chain(q1.DescAddr, 0, []queuetest.Buf{{Addr: 0x8000, Len: 8}})
	q1.Publish(0)
	require.NoError(t, r.Kick(1))
	require.NoError(t, r.WaitInterrupt(1, 5*time.Second))
	var b [8]byte
	n, err := unix.Read(r.T.NotifyEventFD(0), b[:])
	require.NoError(t, err)
	assert.Equal(t, 8, n, "queue 0's kick is still in its eventfd")
	r.SetStatus(0) // reset stops the goroutine before reading notified
	assert.Equal(t, 0, d.notified[0])
	assert.GreaterOrEqual(t, d.notified[1], 1)
}

// TestCallFDOwnerFollowsVector: a vector change of an owned queue after
// DRIVER_OK reaches the owner with the new vector's irqfd eventfd (or -1);
// changes before DRIVER_OK, on queues the transport serves, and after a
// reset do not.
func TestCallFDOwnerFollowsVector(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	d := &ownerDev{}
	mem := make(queuetest.Memory, 1<<20)
	r, err := transporttest.NewRig(d, mem)
	require.NoError(t, err)
	t.Cleanup(func() { r.T.Close() })
	r.EnableMSIX(3)
	r.Negotiate(goodFeatures)
	setVec := func(q int, v uint16) {
		r.Write(r.Common+22, 2, uint64(q))
		r.Write(r.Common+26, 2, uint64(v))
	}
	q0 := queuetest.NewDriver(mem, 16, 0x1000)
	q1 := queuetest.NewDriver(mem, 16, 0x4000)
	r.SetupQueue(0, q0, 1)
	setVec(0, 2) // before DRIVER_OK: only what TakeEventFDs sees counts
	r.SetupQueue(1, q1, 1)
	r.DriverOK()
	require.Len(t, d.got, 2)
	assert.Equal(t, r.T.IRQFDs().EventFD(2), d.got[0].Call)
	assert.Empty(t, d.calls)

	irq := r.T.IRQFDs()
	setVec(0, 1)
	setVec(1, 2) // the transport's own queue: nothing to tell
	setVec(0, virtio.NoVector)
	setVec(0, virtio.NoVector)
	assert.Equal(t, []int{irq.EventFD(1), -1}, d.calls)

	r.SetStatus(0)
	setVec(0, 1)
	assert.Len(t, d.calls, 2, "not running after a reset")
}
