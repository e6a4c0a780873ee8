package net

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

const fuzzNetQueue = 8

// netFuzzRig is FuzzRxTx's pair, backend and guest memory, built once per
// fuzzing process; each input gets fresh queues over re-filled memory and
// the pair's per-run state cleared.
type netFuzzRig struct {
	p         *pair
	peer      int
	irq       *countIRQ
	mem       *queuetest.SplitMemory
	h         queuetest.Hostile
	rx, tx    queuetest.Ring
	low, high []byte
	pattern   []byte
	pkt       []byte
}

func newNetFuzzRig(tb testing.TB) *netFuzzRig {
	r := &netFuzzRig{irq: &countIRQ{}}
	r.mem = queuetest.NewSplitMemory(0x1000, 0x4000)
	r.rx, r.tx = queuetest.NewRing(0, fuzzNetQueue), queuetest.NewRing(0x200, fuzzNetQueue)
	r.h = queuetest.Hostile{Mem: r.mem, Indirect: 0x400}
	r.low, r.high = make([]byte, len(r.mem.Low)), make([]byte, len(r.mem.High))
	r.pattern = make([]byte, len(r.mem.High))
	for i := range r.pattern {
		r.pattern[i] = byte(i*13 + i>>8)
	}
	r.pkt = make([]byte, rxBufSize)
	be := newSockBackend(tb, 1)
	r.peer = be.peers[0]
	var kicks [2]int
	for i := range kicks {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			tb.Fatal(err)
		}
		kicks[i] = fd
	}
	p, err := newPair(0, nil, nil, kicks[0], kicks[1], be.fds[0], 0, r.irq)
	if err != nil {
		tb.Fatal(err)
	}
	p.active = new(atomic.Int32)
	p.active.Store(1)
	r.p = p
	return r
}

// drain empties a non-blocking socket.
func drainSock(fd int, buf []byte) {
	for {
		if _, err := unix.Read(fd, buf); err != nil {
			return
		}
	}
}

// FuzzRxTx is a hostile guest on one virtio-net queue pair's userspace data
// path: the fuzzer writes both queues' descriptor tables, available rings
// (any index) and an indirect-table area, negotiates features (mergeable
// receive buffers, checksum and TSO offloads, indirect descriptors, event
// index) and sends one packet from the host side; the worker's transmit and
// receive passes run several times. Buffers lie above a hole in guest RAM,
// so the rings cannot alias them. One pair and socket pair per process.
//
// It asserts: nothing panics; the worker writes guest memory only in the
// two used rings and in the device-writable buffers of receive chains it
// returned; transmit chains come back with length 0, and every packet the
// host receives is the virtio-net header of a returned transmit chain
// (num_buffers cleared) followed by exactly that chain's readable bytes
// after the header, in chain order; receive chains come back with at most
// their writable length, and a delivered packet reads back from them, in
// order, as the host sent it with num_buffers set to the number of chains
// it took (1 without mergeable buffers).
func FuzzRxTx(f *testing.F) {
	desc := queuetest.Desc
	avail := func(idx uint16, heads ...uint16) []byte { return queuetest.Avail(fuzzNetQueue, idx, heads...) }
	var rings []byte
	rings = append(rings, desc(0, 2048, queue.DescFlagWrite, 0)...)
	rings = append(rings, desc(0x1000, 64, queue.DescFlagWrite, 0)...)
	rings = append(rings, make([]byte, 16*(fuzzNetQueue-2))...)
	rings = append(rings, avail(2, 0, 1)...)
	rings = append(rings, desc(0x2000, 12, queue.DescFlagNext, 1)...)
	rings = append(rings, desc(0x2100, 60, 0, 0)...)
	rings = append(rings, make([]byte, 16*(fuzzNetQueue-2))...)
	rings = append(rings, avail(1, 0)...)
	f.Add(rings, append(hdrBytes(Header{}), frame(100, 1)...), uint16(0))
	f.Add(rings, append(hdrBytes(Header{}), frame(1500, 2)...), uint16(3))
	f.Add(rings, []byte{1, 2, 3}, uint16(0xffff))

	r := newNetFuzzRig(f)
	f.Fuzz(func(t *testing.T, rings, pkt []byte, features uint16) { r.fuzz(t, rings, pkt, features) })
}

func (r *netFuzzRig) fuzz(t testing.TB, rings, pkt []byte, features uint16) {
	{
		pkt = pkt[:min(len(pkt), rxBufSize)]
		var feat uint64 = virtio.FeatureVersion1
		for i, b := range []uint64{FeatureMrgRxbuf, FeatureCsum, FeatureHostTSO4, FeatureHostTSO6, FeatureHostECN, FeatureHostUFO, queue.FeatureIndirectDesc, queue.FeatureEventIdx} {
			if features&(1<<i) != 0 {
				feat |= b
			}
		}
		qs := r.h.Queues(t, rings, r.pattern, feat, r.rx, r.tx)
		rxq, txq := qs[0], qs[1]
		p := r.p
		p.rxq, p.txq, p.features, p.mergeable = rxq, txq, feat, feat&FeatureMrgRxbuf != 0
		p.pendLen, p.copied, p.used, p.waitRx, p.broken = 0, 0, p.used[:0], false, false
		p.stats.txPackets.Store(0)
		drainSock(r.peer, r.pkt)
		drainSock(p.tap, r.pkt)
		if len(pkt) > 0 {
			if _, err := unix.Write(r.peer, pkt); err != nil && !errors.Is(err, unix.EAGAIN) {
				t.Fatal(err)
			}
		}
		copy(r.low, r.mem.Low)
		copy(r.high, r.mem.High)
		for i := 0; i < 3; i++ {
			if _, err := p.transmit(); err != nil {
				break
			}
		}
		for i := 0; i < 3; i++ {
			if _, err := p.receive(); err != nil {
				break
			}
		}
		r.check(t, pkt)
	}
}

func (r *netFuzzRig) check(t testing.TB, pkt []byte) {
	var wrAll []queuetest.Range
	rx := r.h.CheckUsed(t, r.rx, "receive")
	for _, c := range rx {
		wrAll = append(wrAll, c.Writable...)
	}
	// A packet still being delivered (mergeable buffers, the ring ran dry
	// part-way) holds the chains it was copied into: the device owns them
	// until it publishes them with the rest of the packet, so writes there
	// are in buffers the driver gave it.
	if r.p.pendLen != 0 {
		for _, u := range r.p.used {
			_, wr := r.h.Segments(r.rx, u.head, nil, nil)
			wrAll = append(wrAll, wr...)
		}
	}
	var txChains [][]queuetest.Range
	for _, c := range r.h.CheckUsed(t, r.tx, "transmit") {
		if c.Len != 0 {
			t.Fatalf("transmit chain %d returned with length %d: the device writes nothing to it", c.ID, c.Len)
		}
		txChains = append(txChains, c.Readable)
	}
	r.h.CheckWrites(t, r.low, r.high, []queuetest.Ring{r.rx, r.tx}, wrAll)
	// Transmitted packets: each is a returned chain's header and frame.
	// Transmit ran before receive wrote anything, so the chains' bytes are
	// the snapshot's.
	next := 0
	for {
		n, err := unix.Read(r.peer, r.pkt)
		if err != nil {
			break
		}
		got := r.pkt[:n]
		found := false
		for ; next < len(txChains) && !found; next++ {
			var want []byte
			for _, s := range txChains[next] {
				rel := s.Addr - r.mem.HighBase
				want = append(want, r.high[rel:rel+s.Len]...)
			}
			if len(want) < HeaderSize {
				continue
			}
			binary.LittleEndian.PutUint16(want[10:], 0)
			found = bytes.Equal(got, want)
		}
		if !found {
			t.Fatalf("host received a %d-byte packet that is no returned transmit chain's header and frame, in order", n)
		}
	}
	// The received packet, if delivered, reads back from its chains.
	if len(rx) == 0 || rx[0].Len == 0 || queuetest.Overlap(wrAll) {
		return
	}
	got := r.h.Written(rx)
	want := append([]byte(nil), pkt...)
	binary.LittleEndian.PutUint16(want[10:], uint16(len(rx)))
	if !bytes.Equal(got, want) {
		t.Fatalf("receive chains hold % x, the host sent % x (num_buffers %d)", got, pkt, len(rx))
	}
}
