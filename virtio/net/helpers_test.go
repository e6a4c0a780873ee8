package net

import (
	"encoding/binary"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// sockBackend stands in for a TAP: each pair's fd is one end of a
// SOCK_SEQPACKET socket pair (one read or write = one packet, like a TAP
// queue); the test plays the host network on the other end.
type sockBackend struct {
	fds, peers []int
	offload    atomic.Uint32
	enabled    []bool
}

func newSockBackend(t testing.TB, n int) *sockBackend {
	b := &sockBackend{}
	for i := 0; i < n; i++ {
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
		require.NoError(t, err)
		// Room for several 64 KiB GSO packets in flight.
		for _, fd := range sp {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 1<<20)
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
		}
		b.fds = append(b.fds, sp[0])
		b.peers = append(b.peers, sp[1])
		b.enabled = append(b.enabled, true)
	}
	t.Cleanup(func() {
		for i := range b.fds {
			unix.Close(b.fds[i])
			unix.Close(b.peers[i])
		}
	})
	return b
}

func (b *sockBackend) QueueFDs() []int                  { return b.fds }
func (b *sockBackend) SetOffload(flags uint32) error    { b.offload.Store(flags); return nil }
func (b *sockBackend) EnableQueue(i int, on bool) error { b.enabled[i] = on; return nil }

// countIRQ is a virtio.Interrupter that counts.
type countIRQ struct{ queue, config atomic.Int64 }

func (c *countIRQ) SignalQueue(int) { c.queue.Add(1) }
func (c *countIRQ) ConfigChanged()  { c.config.Add(1) }

var _ virtio.Interrupter = (*countIRQ)(nil)

// pairRig drives one pair's worker functions synchronously (no goroutine):
// fake guest memory, the two rings, a socket-pair backend.
type pairRig struct {
	p      *pair
	mem    queuetest.Memory
	rx, tx *queuetest.Driver
	peer   int
	irq    *countIRQ
	active atomic.Int32
}

const (
	rigRxRing = 0x1000
	rigTxRing = 0x4000
	rigBufs   = 0x10000
)

func newPairRig(t testing.TB, features uint64, size uint16) *pairRig {
	r := &pairRig{mem: make(queuetest.Memory, 4<<20), irq: &countIRQ{}}
	r.rx = queuetest.NewDriver(r.mem, size, rigRxRing)
	r.tx = queuetest.NewDriver(r.mem, size, rigTxRing)
	features |= virtio.FeatureVersion1
	rxq, err := queue.New(r.mem, r.rx.Config(), features)
	require.NoError(t, err)
	txq, err := queue.New(r.mem, r.tx.Config(), features)
	require.NoError(t, err)
	be := newSockBackend(t, 1)
	r.peer = be.peers[0]
	k1, err := irq.NewEventFD()
	require.NoError(t, err)
	k2, err := irq.NewEventFD()
	require.NoError(t, err)
	p, err := newPair(0, rxq, txq, k1, k2, be.fds[0], features, r.irq)
	require.NoError(t, err)
	r.active.Store(1)
	p.active = &r.active
	t.Cleanup(func() { unix.Close(k1); unix.Close(k2); unix.Close(p.wakeFD) })
	r.p = p
	return r
}

func hdrBytes(h Header) []byte {
	b := make([]byte, HeaderSize)
	h.Put(b)
	return b
}

// frame returns an Ethernet frame of n bytes with a recognizable payload.
func frame(n int, seed byte) []byte {
	f := make([]byte, n)
	copy(f, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02, 0x68, 0x70, 0, 0, 1, 0x88, 0xb5})
	for i := 14; i < n; i++ {
		f[i] = seed + byte(i)
	}
	return f
}

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }
