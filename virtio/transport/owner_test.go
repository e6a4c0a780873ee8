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
}

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
