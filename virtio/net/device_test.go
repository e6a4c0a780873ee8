package net

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

type devGuest struct {
	*transporttest.Rig
	dev    *Device
	be     *sockBackend
	queues []*queuetest.Driver
}

// bootDevice brings the device up as Linux's virtio_net would: MSI-X with
// vector 0 for config and vector q+1 for queue q, features, every queue,
// DRIVER_OK.
func bootDevice(t *testing.T, pairs int, want uint64) *devGuest {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutines without Go synchronization, as with a real guest")
	}
	be := newSockBackend(t, pairs)
	dev, err := New(be, Options{Name: "test0", MTU: 1500, Vhost: VhostOff})
	require.NoError(t, err)
	mem := make(queuetest.Memory, 8<<20)
	rig, err := transporttest.NewRig(dev, mem)
	require.NoError(t, err)
	t.Cleanup(func() { rig.T.Close() })
	g := &devGuest{Rig: rig, dev: dev, be: be}
	nq := len(dev.QueueMaxSizes())
	rig.EnableMSIX(nq + 1)
	_, status := rig.Negotiate(want | virtio.FeatureVersion1 | virtio.FeatureEventIdx)
	require.NotZero(t, status&virtio.StatusFeaturesOK)
	require.Equal(t, uint16(0), rig.SetConfigVector(0))
	for q := 0; q < nq; q++ {
		d := queuetest.NewDriver(mem, 64, 0x10000*uint64(q+1))
		require.Equal(t, uint16(q+1), rig.SetupQueue(q, d, uint16(q+1)))
		g.queues = append(g.queues, d)
	}
	rig.DriverOK()
	require.Zero(t, rig.Status()&virtio.StatusNeedsReset)
	return g
}

const bufBase = 0x400000

func TestDeviceConfigAndFeatures(t *testing.T) {
	be := newSockBackend(t, 2)
	mac, err := ParseMAC("02:00:00:aa:bb:cc")
	require.NoError(t, err)
	d, err := New(be, Options{Name: "t", MAC: mac, MTU: 9000, Vhost: VhostOff})
	require.NoError(t, err)
	f := d.Features()
	for _, bit := range []uint64{FeatureCsum, FeatureGuestCsum, FeatureMAC, FeatureMTU, FeatureStatus, FeatureMrgRxbuf, FeatureHostTSO4, FeatureGuestTSO6, FeatureCtrlVQ, FeatureMQ} {
		assert.NotZero(t, f&bit, "feature %#x offered", bit)
	}
	assert.Equal(t, []uint16{256, 256, 256, 256, 64}, d.QueueMaxSizes(), "rx0 tx0 rx1 tx1 ctrl")
	cfg := make([]byte, configSize)
	d.ReadConfig(0, cfg)
	assert.Equal(t, []byte(mac), cfg[:6])
	assert.Equal(t, uint16(statusLinkUp), binary.LittleEndian.Uint16(cfg[6:]))
	assert.Equal(t, uint16(2), binary.LittleEndian.Uint16(cfg[8:]))
	assert.Equal(t, uint16(9000), binary.LittleEndian.Uint16(cfg[10:]))
	irq := &countIRQ{}
	d.SetLinkUp(false, irq)
	d.ReadConfig(6, cfg[:2])
	assert.Equal(t, []byte{0, 0}, cfg[:2])
	assert.Equal(t, int64(1), irq.config.Load(), "link change raises a config interrupt")
	d.ReadConfig(11, cfg[:4]) // partly past the end: no panic, zeros beyond
	assert.Equal(t, []byte{0x23, 0, 0, 0}, cfg[:4])

	one, err := New(newSockBackend(t, 1), Options{Name: "tap9", Vhost: VhostOff})
	require.NoError(t, err)
	assert.Zero(t, one.Features()&(FeatureMQ|FeatureCtrlVQ|FeatureMTU))
	assert.Equal(t, DeriveMAC("tap9"), one.MAC())
	assert.Equal(t, MACOUI[:], []byte(one.MAC()[:3]))

	_, err = New(be, Options{Pairs: 3, Vhost: VhostOff})
	assert.ErrorContains(t, err, "3 queue pairs with 2 backend queues")
}

func TestParseMAC(t *testing.T) {
	for _, bad := range []string{"", "02:00:00:00:00", "zz:00:00:00:00:01", "01:00:00:00:00:01", "00:00:00:00:00:00", "02:00:00:00:00:00:00:01"} {
		_, err := ParseMAC(bad)
		assert.Error(t, err, bad)
	}
	m, err := ParseMAC("02-68-70-01-02-03")
	require.NoError(t, err)
	assert.Equal(t, "02:68:70:01:02:03", m.String())
	assert.Equal(t, DeriveMAC("tap0"), DeriveMAC("tap0"), "stable")
	assert.NotEqual(t, DeriveMAC("tap0"), DeriveMAC("tap1"))
}

func TestDeviceDataPathThroughTransport(t *testing.T) {
	g := bootDevice(t, 1, FeatureMrgRxbuf|FeatureCsum|FeatureGuestCsum|FeatureGuestTSO4|FeatureHostTSO4)
	assert.Equal(t, uint32(uapi.TunFCsum|uapi.TunFTSO4), g.be.offload.Load(), "TUNSETOFFLOAD follows the guest's receive features")
	rx, tx := g.queues[0], g.queues[1]

	// Receive: post buffers, kick, then the host sends.
	for i := uint16(0); i < 8; i++ {
		rx.Chain(rx.DescAddr, i, []queuetest.Buf{{Addr: bufBase + uint64(i)*2048, Len: 2048, Write: true}})
		rx.Publish(i)
	}
	require.NoError(t, g.Kick(0))
	pkt := append(hdrBytes(Header{Flags: HdrDataValid}), frame(3000, 4)...)
	_, err := unix.Write(g.be.peers[0], pkt)
	require.NoError(t, err)
	require.NoError(t, g.WaitInterrupt(1, 5*time.Second))
	require.Equal(t, uint16(2), rx.UsedIdx())
	assert.Equal(t, uint16(2), le16(g.Mem[bufBase+10:]))
	assert.Equal(t, pkt[HeaderSize:HeaderSize+2036], []byte(g.Mem[bufBase+HeaderSize:bufBase+2048]))

	// Transmit.
	copy(g.Mem[bufBase+0x10000:], append(hdrBytes(Header{}), frame(60, 7)...))
	tx.Chain(tx.DescAddr, 0, []queuetest.Buf{{Addr: bufBase + 0x10000, Len: HeaderSize + 60}})
	tx.Publish(0)
	require.NoError(t, g.Kick(1))
	require.NoError(t, g.WaitInterrupt(2, 5*time.Second))
	buf := make([]byte, 2048)
	n, err := unix.Read(g.be.peers[0], buf)
	require.NoError(t, err)
	assert.Equal(t, frame(60, 7), buf[HeaderSize:n])
	s := g.dev.Stats()
	assert.Equal(t, uint64(1), s.TxPackets)
	assert.Equal(t, uint64(1), s.RxPackets)
	assert.Zero(t, g.T.NotifyExits())

	// A broken descriptor on the transmit queue marks the device
	// DEVICE_NEEDS_RESET; a reset brings it back.
	tx.Chain(tx.DescAddr, 1, []queuetest.Buf{{Addr: uint64(len(g.Mem)) + 0x1000, Len: 64}})
	tx.Publish(1)
	require.NoError(t, g.Kick(1))
	require.Eventually(t, func() bool { return g.Status()&virtio.StatusNeedsReset != 0 }, 5*time.Second, time.Millisecond)
	g.SetStatus(0)
	assert.Equal(t, uint8(0), g.Status())
	assert.Equal(t, uint64(1), g.dev.Stats().TxPackets, "counters survive a reset")
}

func TestDeviceMultiqueueControl(t *testing.T) {
	g := bootDevice(t, 2, FeatureMrgRxbuf|FeatureCtrlVQ|FeatureMQ)
	assert.Equal(t, []bool{true, false}, g.be.enabled, "only pair 0 is in use after DRIVER_OK")
	assert.Equal(t, 1, g.dev.ActivePairs())
	ctrl := g.queues[4]
	cmd := func(head uint16, class, code byte, arg uint16) byte {
		a := uint64(bufBase + 0x20000 + uint64(head)*0x100)
		g.Mem[a], g.Mem[a+1] = class, code
		binary.LittleEndian.PutUint16(g.Mem[a+2:], arg)
		g.Mem[a+0x80] = 0xee
		ctrl.Chain(ctrl.DescAddr, head, []queuetest.Buf{{Addr: a, Len: 2}, {Addr: a + 2, Len: 2}, {Addr: a + 0x80, Len: 1, Write: true}})
		ctrl.SetUsedEvent(ctrl.UsedIdx()) // EVENT_IDX: interrupt for the next entry
		ctrl.Publish(head)
		require.NoError(t, g.Kick(4))
		require.NoError(t, g.WaitInterrupt(5, 5*time.Second))
		return g.Mem[a+0x80]
	}
	assert.Equal(t, byte(ctrlOK), cmd(0, ctrlClassMQ, ctrlMQPairsSet, 2))
	assert.Equal(t, []bool{true, true}, g.be.enabled)
	assert.Equal(t, 2, g.dev.ActivePairs())
	assert.Equal(t, byte(ctrlErr), cmd(3, ctrlClassMQ, ctrlMQPairsSet, 3), "more pairs than offered")
	assert.Equal(t, byte(ctrlErr), cmd(6, 0, 0, 1), "VIRTIO_NET_CTRL_RX was not offered")
	assert.Equal(t, byte(ctrlOK), cmd(9, ctrlClassMQ, ctrlMQPairsSet, 1))
	assert.Equal(t, []bool{true, false}, g.be.enabled)

	// Pair 1 carries traffic once enabled.
	assert.Equal(t, byte(ctrlOK), cmd(12, ctrlClassMQ, ctrlMQPairsSet, 2))
	rx1 := g.queues[2]
	rx1.Chain(rx1.DescAddr, 0, []queuetest.Buf{{Addr: bufBase, Len: 4096, Write: true}})
	rx1.Publish(0)
	require.NoError(t, g.Kick(2))
	_, err := unix.Write(g.be.peers[1], append(hdrBytes(Header{}), frame(100, 1)...))
	require.NoError(t, err)
	require.NoError(t, g.WaitInterrupt(3, 5*time.Second))
	_, n, ok := rx1.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(HeaderSize+100), n)
}

// The queue helper keeps chains bounded: make sure a control chain that
// is all readable is a protocol error, not a panic.
func TestControlWithoutAckBuffer(t *testing.T) {
	g := bootDevice(t, 2, FeatureCtrlVQ|FeatureMQ)
	ctrl := g.queues[4]
	ctrl.Chain(ctrl.DescAddr, 0, []queuetest.Buf{{Addr: bufBase, Len: 4}})
	ctrl.Publish(0)
	require.NoError(t, g.Kick(4))
	require.Eventually(t, func() bool { return g.Status()&virtio.StatusNeedsReset != 0 }, 5*time.Second, time.Millisecond)
}
