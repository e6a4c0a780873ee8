package transport_test

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

// echoDev is a one-queue device that returns every chain with its readable
// length as the written length.
type echoDev struct {
	q        *queue.Queue
	irq      virtio.Interrupter
	chain    *queue.Chain
	notifies atomic.Int32
	resets   atomic.Int32
	features uint64
}

func (d *echoDev) Type() uint16                  { return virtio.DeviceBlock }
func (d *echoDev) Features() uint64              { return 1 << 5 }
func (d *echoDev) QueueMaxSizes() []uint16       { return []uint16{64} }
func (d *echoDev) ConfigSize() int               { return 8 }
func (d *echoDev) ReadConfig(off int, b []byte)  { copy(b, []byte("echocfg!")[off:]) }
func (d *echoDev) WriteConfig(off int, b []byte) {}
func (d *echoDev) EventFD() int                  { return -1 }
func (d *echoDev) HandleEvent() error            { return nil }
func (d *echoDev) Reset()                        { d.q = nil; d.resets.Add(1) }
func (d *echoDev) Activate(f uint64, qs []*queue.Queue, irq virtio.Interrupter) error {
	d.q, d.irq, d.features = qs[0], irq, f
	d.chain = queue.NewChain(queue.MaxSize)
	return nil
}
func (d *echoDev) QueueNotify(q int) error {
	d.notifies.Add(1)
	for {
		ok, err := d.q.Pop(d.chain)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		if err := d.q.Push(d.chain.Head, uint32(d.chain.ReadableLen)); err != nil {
			return err
		}
	}
	if d.q.NeedInterrupt() {
		d.irq.SignalQueue(q)
	}
	return nil
}

func newRig(t *testing.T) (*transporttest.Rig, *echoDev) {
	d := &echoDev{}
	r, err := transporttest.NewRig(d, make(queuetest.Memory, 1<<20))
	require.NoError(t, err)
	t.Cleanup(func() { r.T.Close() })
	return r, d
}

const goodFeatures = virtio.FeatureVersion1 | virtio.FeatureEventIdx | 1<<5

func TestPCIIdentityAndCapabilities(t *testing.T) {
	r, _ := newRig(t)
	assert.Equal(t, uint32(0x1042_1af4), r.Cfg.Read(transporttest.Slot, 0, 0, 4))
	assert.Equal(t, uint32(0x01800001), r.Cfg.Read(transporttest.Slot, 0, 8, 4), "class 0x018000, revision 1")
	assert.Equal(t, uint32(0x1100_1af4), r.Cfg.Read(transporttest.Slot, 0, pci.RegSubsysVendor, 4))
	assert.Equal(t, uint32(0), r.Cfg.Read(transporttest.Slot, 0, pci.RegInterruptPin, 1), "no INTx")

	bar4, on := r.Root.BARAddress(transporttest.Slot, transport.RegsBAR)
	require.True(t, on)
	assert.GreaterOrEqual(t, bar4, uint64(1<<32), "64-bit BAR in the 64-bit window")
	assert.Equal(t, bar4+transport.CommonOffset, r.Common)
	assert.Equal(t, bar4+transport.ISROffset, r.ISR)
	assert.Equal(t, bar4+transport.DeviceOffset, r.DevCfg)
	assert.Equal(t, bar4+transport.NotifyOffset, r.Notify)
	assert.Equal(t, uint32(4), r.NotifyMul)
	bar1, on := r.Root.BARAddress(transporttest.Slot, transport.MSIXBAR)
	require.True(t, on)
	assert.Equal(t, bar1, r.MSIXTable)
	assert.Less(t, bar1, uint64(1<<32))

	// Every vendor capability stays inside its BAR (Linux checks this).
	for _, off := range r.Cfg.FindCapabilities(transporttest.Slot, pci.CapIDVendor) {
		bar := r.Cfg.Read(transporttest.Slot, 0, off+4, 1)
		end := r.Cfg.Read(transporttest.Slot, 0, off+8, 4) + r.Cfg.Read(transporttest.Slot, 0, off+12, 4)
		if r.Cfg.Read(transporttest.Slot, 0, off+3, 1) == 5 {
			continue // PCI_CFG window: no region
		}
		assert.Equal(t, uint32(transport.RegsBAR), bar)
		assert.LessOrEqual(t, end, uint32(transport.RegsBARSize))
	}
	assert.Equal(t, uint64(1), r.Read(r.Common+18, 2), "num_queues")
	assert.Equal(t, uint64(0x216766636f68), r.Read(r.DevCfg+2, 6), "device config window")
}

func TestFeatureNegotiation(t *testing.T) {
	r, d := newRig(t)
	offered, st := r.Negotiate(goodFeatures)
	assert.Equal(t, virtio.FeatureVersion1|virtio.FeatureEventIdx|virtio.FeatureIndirectDesc|1<<5, offered)
	assert.Equal(t, uint8(virtio.StatusAcknowledge|virtio.StatusDriver|virtio.StatusFeaturesOK), st)
	// Once FEATURES_OK is set the driver features are frozen.
	r.Write(r.Common+8, 4, 0)
	r.Write(r.Common+12, 4, 0)
	assert.Equal(t, uint64(virtio.FeatureEventIdx|1<<5), r.Read(r.Common+12, 4))

	_, st = r.Negotiate(virtio.FeatureEventIdx)
	assert.Zero(t, st&virtio.StatusFeaturesOK, "legacy driver (no VERSION_1) refused")
	_, st = r.Negotiate(virtio.FeatureVersion1 | 1<<7)
	assert.Zero(t, st&virtio.StatusFeaturesOK, "feature never offered refused")
	// DRIVER_OK without FEATURES_OK is ignored: nothing starts.
	r.DriverOK()
	assert.Zero(t, r.Status()&virtio.StatusDriverOK)
	assert.Zero(t, d.notifies.Load())
	// Feature select beyond the two words reads zero.
	r.Write(r.Common, 4, 7)
	assert.Equal(t, uint64(0), r.Read(r.Common+4, 4))
}

func TestQueueConfigurationAndReset(t *testing.T) {
	r, d := newRig(t)
	r.EnableMSIX(2)
	r.Negotiate(goodFeatures)
	assert.Equal(t, uint16(0), r.SetConfigVector(0))
	assert.Equal(t, uint16(virtio.NoVector), r.SetConfigVector(9), "vector beyond the table refused")

	r.Write(r.Common+22, 2, 0)
	assert.Equal(t, uint64(64), r.Read(r.Common+24, 2), "max size offered")
	assert.Equal(t, uint64(0), r.Read(r.Common+28, 2), "not enabled")
	assert.Equal(t, uint64(0), r.Read(r.Common+30, 2), "queue_notify_off")
	r.Write(r.Common+22, 2, 5)
	assert.Equal(t, uint64(0), r.Read(r.Common+24, 2), "absent queue has size 0")

	drv := queuetest.NewDriver(r.Mem, 16, 0x1000)
	assert.Equal(t, uint16(1), r.SetupQueue(0, drv, 1))
	assert.Equal(t, uint64(1), r.Read(r.Common+28, 2))
	assert.Equal(t, drv.Config().Desc, r.Read(r.Common+32, 8))
	// Layout is frozen while enabled.
	r.Write(r.Common+24, 2, 8)
	r.Write(r.Common+32, 4, 0x5000)
	assert.Equal(t, uint64(16), r.Read(r.Common+24, 2))
	assert.Equal(t, drv.Config().Desc, r.Read(r.Common+32, 8))

	r.DriverOK()
	assert.Equal(t, uint8(0xf), r.Status()&0xf)
	assert.Equal(t, goodFeatures, d.features)
	// Status bits accumulate: a write that would clear bits does not.
	r.SetStatus(virtio.StatusAcknowledge)
	assert.Equal(t, uint8(0xf), r.Status())

	resets := d.resets.Load()
	r.SetStatus(0)
	assert.Equal(t, uint8(0), r.Status())
	assert.Equal(t, resets+1, d.resets.Load())
	r.Write(r.Common+22, 2, 0)
	assert.Equal(t, uint64(0), r.Read(r.Common+28, 2), "queue disabled by reset")
	assert.Equal(t, uint64(64), r.Read(r.Common+24, 2))
	assert.Equal(t, uint64(virtio.NoVector), r.Read(r.Common+26, 2))
	assert.Equal(t, uint64(virtio.NoVector), r.Read(r.Common+16, 2))
	assert.Equal(t, uint64(0), r.Read(r.Common+32, 8))
}

func TestIOEventFDFollowsBAR(t *testing.T) {
	r, _ := newRig(t)
	ev, ok := r.Notifier.Lookup(r.Notify)
	require.True(t, ok)
	assert.Equal(t, uint32(transport.NotifyWidth), ev.Length)
	assert.Equal(t, r.T.NotifyEventFD(0), ev.FD)

	// Linux-style 64-bit BAR move: decode off, program, decode on.
	cmd := r.Cfg.Read(transporttest.Slot, 0, pci.RegCommand, 2)
	r.Cfg.Write(transporttest.Slot, 0, pci.RegCommand, 2, cmd&^pci.CommandMemory)
	assert.Equal(t, 0, r.Notifier.Len(), "decode off: doorbell released")
	r.Cfg.Write(transporttest.Slot, 0, pci.RegBAR0+16, 4, 0x8000_0000|4)
	r.Cfg.Write(transporttest.Slot, 0, pci.RegBAR0+20, 4, 0x20)
	r.Cfg.Write(transporttest.Slot, 0, pci.RegCommand, 2, cmd)
	_, ok = r.Notifier.Lookup(0x20_8000_0000 + transport.NotifyOffset)
	assert.True(t, ok)
	assert.Equal(t, 1, r.Notifier.Len())
}

func activate(t *testing.T, r *transporttest.Rig) *queuetest.Driver {
	r.EnableMSIX(2)
	_, st := r.Negotiate(goodFeatures | virtio.FeatureIndirectDesc)
	require.NotZero(t, st&virtio.StatusFeaturesOK)
	require.Equal(t, uint16(0), r.SetConfigVector(0))
	drv := queuetest.NewDriver(r.Mem, 16, 0x1000)
	require.Equal(t, uint16(1), r.SetupQueue(0, drv, 1))
	r.DriverOK()
	require.Equal(t, uint8(0xf), r.Status())
	return drv
}

func waitUsed(t *testing.T, drv *queuetest.Driver, idx uint16) {
	require.Eventually(t, func() bool { return drv.UsedIdx() == idx }, 2*time.Second, time.Millisecond)
}

func TestDataPathThroughEventFDs(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	r, d := newRig(t)
	drv := activate(t, r)
	require.Eventually(t, func() bool { return d.notifies.Load() == 1 }, 2*time.Second, time.Millisecond, "initial pass after DRIVER_OK")
	drv.SetUsedEvent(0)
	drv.Chain(drv.DescAddr, 0, []queuetest.Buf{{Addr: 0x40000, Len: 10}, {Addr: 0x50000, Len: 10, Write: true}})
	drv.Publish(0)
	require.NoError(t, r.Kick(0))
	waitUsed(t, drv, 1)
	require.NoError(t, r.WaitInterrupt(1, 2*time.Second))
	id, n, ok := drv.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(0), id)
	assert.Equal(t, uint32(10), n)
	assert.Zero(t, r.T.NotifyExits(), "kick went through the ioeventfd")

	// A doorbell that does exit still works, and is counted.
	drv.SetUsedEvent(1)
	drv.Publish(0)
	r.KickMMIO(0)
	waitUsed(t, drv, 2)
	require.NoError(t, r.WaitInterrupt(1, 2*time.Second))
	assert.Equal(t, uint64(1), r.T.NotifyExits())
	assert.Equal(t, uint64(1), r.Read(r.ISR, 1), "ISR queue bit")
	assert.Equal(t, uint64(0), r.Read(r.ISR, 1), "read clears")
}

func TestBadChainSetsNeedsReset(t *testing.T) {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	r, _ := newRig(t)
	drv := activate(t, r)
	gen := r.Read(r.Common+21, 1)
	drv.SetDesc(drv.DescAddr, 0, 1<<40, 16, 0, 0) // buffer outside RAM
	drv.Publish(0)
	require.NoError(t, r.Kick(0))
	require.Eventually(t, func() bool { return r.Status()&virtio.StatusNeedsReset != 0 }, 2*time.Second, time.Millisecond)
	require.NoError(t, r.WaitInterrupt(0, 2*time.Second), "config-change interrupt")
	assert.NotEqual(t, gen, r.Read(r.Common+21, 1), "config generation bumped")
	select {
	case err := <-r.Errors:
		assert.ErrorContains(t, err, "outside RAM")
	default:
		t.Fatal("error not reported")
	}
	r.SetStatus(0)
	assert.Equal(t, uint8(0), r.Status(), "reset clears NEEDS_RESET")
	activate(t, r)
}

func TestBadQueueAddressSetsNeedsReset(t *testing.T) {
	r, _ := newRig(t)
	r.EnableMSIX(2)
	r.Negotiate(goodFeatures)
	drv := queuetest.NewDriver(r.Mem, 16, 0x1000)
	drv.DescAddr = 1 << 30
	r.SetupQueue(0, drv, 1)
	assert.NotZero(t, r.Status()&virtio.StatusNeedsReset)
	assert.Equal(t, uint64(0), r.Read(r.Common+28, 2), "queue stays disabled")
	r.Write(r.Common+22, 2, 0)
	r.Write(r.Common+24, 2, 128) // above the maximum
	r.Write(r.Common+28, 2, 1)
	assert.Equal(t, uint64(0), r.Read(r.Common+28, 2))
}

func TestPCICfgWindow(t *testing.T) {
	r, _ := newRig(t)
	var off int
	for _, o := range r.Cfg.FindCapabilities(transporttest.Slot, pci.CapIDVendor) {
		if r.Cfg.Read(transporttest.Slot, 0, o+3, 1) == 5 {
			off = o
		}
	}
	require.NotZero(t, off)
	// Read num_queues (common cfg offset 18, 2 bytes) through the window.
	r.Cfg.Write(transporttest.Slot, 0, off+4, 1, transport.RegsBAR)
	r.Cfg.Write(transporttest.Slot, 0, off+8, 4, transport.CommonOffset+18)
	r.Cfg.Write(transporttest.Slot, 0, off+12, 4, 2)
	assert.Equal(t, uint32(1), r.Cfg.Read(transporttest.Slot, 0, off+16, 4)&0xffff)
	// Write device_status = ACKNOWLEDGE through it.
	r.Cfg.Write(transporttest.Slot, 0, off+8, 4, transport.CommonOffset+20)
	r.Cfg.Write(transporttest.Slot, 0, off+12, 4, 1)
	r.Cfg.Write(transporttest.Slot, 0, off+16, 1, virtio.StatusAcknowledge)
	assert.Equal(t, uint8(virtio.StatusAcknowledge), r.Status())
}

func TestNewRejectsBadDevices(t *testing.T) {
	_, err := transport.New(&echoDev{}, transport.Config{})
	assert.ErrorContains(t, err, "required")
}

// BenchmarkKickRoundTrip is one request through the whole data path as KVM
// would drive it: the guest publishes a chain and its doorbell ioeventfd
// fires; the device goroutine wakes from poll, processes the chain and
// publishes the used entry. allocs/op covers every goroutine.
func BenchmarkKickRoundTrip(b *testing.B) {
	if raceEnabled {
		b.Skip("guest memory is shared with the device goroutine without Go synchronization")
	}
	d := &echoDev{}
	r, err := transporttest.NewRig(d, make(queuetest.Memory, 1<<20))
	require.NoError(b, err)
	defer r.T.Close()
	r.EnableMSIX(2)
	r.Negotiate(goodFeatures)
	r.SetConfigVector(0)
	drv := queuetest.NewDriver(r.Mem, 16, 0x1000)
	r.SetupQueue(0, drv, 1)
	r.DriverOK()
	drv.Chain(drv.DescAddr, 0, []queuetest.Buf{{Addr: 0x40000, Len: 64}})
	b.ReportAllocs()
	for b.Loop() {
		want := drv.UsedIdx() + 1
		drv.Publish(0)
		if err := r.Kick(0); err != nil {
			b.Fatal(err)
		}
		for drv.UsedIdx() != want {
			runtime.Gosched()
		}
	}
}
