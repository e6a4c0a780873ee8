package net

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// putTx writes header+frame into guest memory at addr, split over two
// descriptors at the header boundary plus one in the middle of the frame,
// and publishes the chain.
func (r *pairRig) putTx(head uint16, addr uint64, h Header, f []byte) {
	copy(r.mem[addr:], hdrBytes(h))
	copy(r.mem[addr+HeaderSize:], f)
	half := uint32(len(f) / 2)
	r.tx.Chain(r.tx.DescAddr, head, []queuetest.Buf{
		{Addr: addr, Len: HeaderSize},
		{Addr: addr + HeaderSize, Len: half},
		{Addr: addr + HeaderSize + uint64(half), Len: uint32(len(f)) - half},
	})
	r.tx.Publish(head)
}

func (r *pairRig) readPeer(t testing.TB) []byte {
	buf := make([]byte, 1<<17)
	n, err := unix.Read(r.peer, buf)
	require.NoError(t, err)
	return buf[:n]
}

func TestTransmitSendsValidatedHeaderAndFrame(t *testing.T) {
	r := newPairRig(t, FeatureCsum|FeatureHostTSO4, 16)
	f := frame(1514, 1)
	h := Header{Flags: HdrNeedsCsum, CsumStart: 34, CsumOffset: 16, NumBuffers: 7}
	r.putTx(0, rigBufs, h, f)
	more, err := r.p.transmit()
	require.NoError(t, err)
	assert.False(t, more)
	got := r.readPeer(t)
	require.Len(t, got, HeaderSize+len(f))
	gh, _ := ParseHeader(got)
	assert.Equal(t, uint16(0), gh.NumBuffers, "num_buffers is cleared on transmit")
	h.NumBuffers = 0
	assert.Equal(t, h, gh)
	assert.Equal(t, f, got[HeaderSize:])
	id, n, ok := r.tx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(0), id)
	assert.Equal(t, uint32(0), n, "transmit buffers are returned with 0 bytes written")
	assert.Equal(t, int64(1), r.irq.queue.Load())
	s := Stats{}
	r.p.stats.addTo(&s)
	assert.Equal(t, Stats{TxPackets: 1, TxBytes: 1514}, s)
}

func TestTransmitDropsInvalidHeader(t *testing.T) {
	r := newPairRig(t, FeatureCsum, 16) // no HOST_TSO4
	r.putTx(0, rigBufs, Header{Flags: HdrNeedsCsum, GSOType: GSOTCPv4, GSOSize: 1448, CsumStart: 34, CsumOffset: 16}, frame(9000, 2))
	r.putTx(3, rigBufs+0x4000, Header{}, frame(60, 3))
	_, err := r.p.transmit()
	require.NoError(t, err)
	got := r.readPeer(t)
	assert.Equal(t, frame(60, 3), got[HeaderSize:], "only the valid packet reaches the host")
	_, err = unix.Read(r.peer, make([]byte, 100))
	assert.ErrorIs(t, err, unix.EAGAIN)
	for _, want := range []uint32{0, 3} {
		id, _, ok := r.tx.NextUsed()
		require.True(t, ok)
		assert.Equal(t, want, id, "the dropped packet's buffer is returned too")
	}
	assert.Equal(t, uint64(1), r.p.stats.txDropped.Load())
}

func TestTransmitBadChainIsProtocolError(t *testing.T) {
	r := newPairRig(t, 0, 16)
	r.tx.Chain(r.tx.DescAddr, 0, []queuetest.Buf{{Addr: uint64(len(r.mem)) - 4, Len: 64}})
	r.tx.Publish(0)
	_, err := r.p.transmit()
	require.Error(t, err, "a descriptor outside guest RAM")
}

// postRx adds n receive chains of size bytes each (one descriptor).
func (r *pairRig) postRx(first uint16, n int, size uint32, base uint64) {
	for i := 0; i < n; i++ {
		h := first + uint16(i)
		r.rx.Chain(r.rx.DescAddr, h, []queuetest.Buf{{Addr: base + uint64(i)*uint64(size), Len: size, Write: true}})
		r.rx.Publish(h)
	}
}

func TestReceiveMergeable(t *testing.T) {
	r := newPairRig(t, FeatureMrgRxbuf|FeatureGuestCsum, 64)
	r.postRx(0, 4, 1536, rigBufs)
	pkt := append(hdrBytes(Header{Flags: HdrDataValid}), frame(4000-HeaderSize, 5)...)
	_, err := unix.Write(r.peer, pkt)
	require.NoError(t, err)
	_, err = r.p.receive()
	require.NoError(t, err)
	var got []byte
	var lens []uint32
	for {
		id, n, ok := r.rx.NextUsed()
		if !ok {
			break
		}
		lens = append(lens, n)
		got = append(got, r.mem[rigBufs+uint64(id)*1536:][:n]...)
	}
	assert.Equal(t, []uint32{1536, 1536, 928}, lens)
	require.Len(t, got, len(pkt))
	assert.Equal(t, uint16(3), le16(got[10:]), "num_buffers")
	assert.Equal(t, pkt[HeaderSize:], got[HeaderSize:])
	assert.Equal(t, pkt[:10], got[:10])
	assert.Equal(t, int64(1), r.irq.queue.Load())
}

func TestReceiveWaitsForBuffersWithoutDropping(t *testing.T) {
	r := newPairRig(t, FeatureMrgRxbuf, 64)
	r.postRx(0, 1, 1024, rigBufs)
	pkt := append(hdrBytes(Header{}), frame(3000, 9)...)
	_, err := unix.Write(r.peer, pkt)
	require.NoError(t, err)
	_, err = r.p.receive()
	require.NoError(t, err)
	assert.Equal(t, uint16(0), r.rx.UsedIdx(), "nothing published while the packet is incomplete")
	assert.True(t, r.p.waitRx)
	r.postRx(1, 3, 1024, rigBufs+0x1000*4)
	r.p.waitRx = false
	_, err = r.p.receive()
	require.NoError(t, err)
	assert.Equal(t, uint16(3), r.rx.UsedIdx(), "all three buffers the packet needs published at once")
	assert.Equal(t, uint16(3), le16(r.mem[rigBufs+10:]))
	assert.Equal(t, uint64(0), r.p.stats.rxDropped.Load())
}

func TestReceiveWithoutMergeableDropsOversize(t *testing.T) {
	r := newPairRig(t, 0, 16)
	r.rx.Chain(r.rx.DescAddr, 0, []queuetest.Buf{{Addr: rigBufs, Len: HeaderSize, Write: true}, {Addr: rigBufs + 0x100, Len: 1514, Write: true}})
	r.rx.Publish(0)
	r.rx.Chain(r.rx.DescAddr, 2, []queuetest.Buf{{Addr: rigBufs + 0x1000, Len: HeaderSize, Write: true}, {Addr: rigBufs + 0x1100, Len: 1514, Write: true}})
	r.rx.Publish(2)
	_, err := unix.Write(r.peer, append(hdrBytes(Header{}), frame(2000, 1)...))
	require.NoError(t, err)
	small := append(hdrBytes(Header{}), frame(100, 2)...)
	_, err = unix.Write(r.peer, small)
	require.NoError(t, err)
	_, err = r.p.receive()
	require.NoError(t, err)
	id, n, ok := r.rx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, [2]uint32{0, 0}, [2]uint32{id, n}, "the oversize packet is dropped, its chain returned empty")
	id, n, ok = r.rx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, [2]uint32{2, uint32(len(small))}, [2]uint32{id, n})
	assert.Equal(t, uint16(1), le16(r.mem[rigBufs+0x1000+10:]), "num_buffers is 1 without mergeable buffers")
	assert.True(t, bytes.Equal(small[HeaderSize:], r.mem[rigBufs+0x1100:][:100]))
	assert.Equal(t, uint64(1), r.p.stats.rxDropped.Load())
}

func TestReceiveRejectsReadOnlyChain(t *testing.T) {
	r := newPairRig(t, FeatureMrgRxbuf, 16)
	r.rx.Chain(r.rx.DescAddr, 0, []queuetest.Buf{{Addr: rigBufs, Len: 1536}})
	r.rx.Publish(0)
	_, err := unix.Write(r.peer, append(hdrBytes(Header{}), frame(60, 1)...))
	require.NoError(t, err)
	_, err = r.p.receive()
	require.ErrorIs(t, err, errNoRxBuffer)
}

// BenchmarkTransmit moves one 1514-byte (and one 64 KiB GSO) packet per
// iteration from the transmit ring to the backend: pop, validate, writev,
// push, interrupt decision.
func BenchmarkTransmit(b *testing.B) {
	for _, size := range []int{1514, 65000} {
		b.Run(byteSize(size), func(b *testing.B) {
			r := newPairRig(b, FeatureCsum|FeatureHostTSO4, 256)
			h := Header{}
			if size > 1514 {
				h = Header{Flags: HdrNeedsCsum, GSOType: GSOTCPv4, GSOSize: 1448, HdrLen: 66, CsumStart: 34, CsumOffset: 16}
			}
			f := frame(size, 1)
			buf := make([]byte, 1<<17)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.putTx(uint16(i*3)%256, rigBufs, h, f)
				if _, err := r.p.transmit(); err != nil {
					b.Fatal(err)
				}
				if _, err := unix.Read(r.peer, buf); err != nil {
					b.Fatal(err)
				}
				r.tx.NextUsed()
			}
		})
	}
}

// BenchmarkReceive moves one packet per iteration from the backend into
// mergeable receive buffers.
func BenchmarkReceive(b *testing.B) {
	for _, size := range []int{1514, 65000} {
		b.Run(byteSize(size), func(b *testing.B) {
			r := newPairRig(b, FeatureMrgRxbuf|FeatureGuestCsum, 256)
			pkt := append(hdrBytes(Header{}), frame(size, 1)...)
			const bufSize = 4096
			nbuf := (len(pkt) + bufSize - 1) / bufSize
			for i := 0; i < 256; i++ {
				r.rx.Chain(r.rx.DescAddr, uint16(i), []queuetest.Buf{{Addr: rigBufs + uint64(i%32)*bufSize, Len: bufSize, Write: true}})
			}
			head := 0
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for k := 0; k < nbuf; k++ {
					r.rx.Publish(uint16(head % 256))
					head++
				}
				if _, err := unix.Write(r.peer, pkt); err != nil {
					b.Fatal(err)
				}
				if _, err := r.p.receive(); err != nil {
					b.Fatal(err)
				}
				for k := 0; k < nbuf; k++ {
					if _, _, ok := r.rx.NextUsed(); !ok {
						b.Fatal("packet not delivered")
					}
				}
			}
		})
	}
}

func byteSize(n int) string {
	if n > 1514 {
		return "64KiB-GSO"
	}
	return "1514B"
}

func FuzzNetHeader(f *testing.F) {
	f.Add(hdrBytes(Header{}), 60, uint64(0))
	f.Add(hdrBytes(Header{Flags: HdrNeedsCsum, GSOType: GSOTCPv4 | GSOECN, GSOSize: 1448, HdrLen: 66, CsumStart: 34, CsumOffset: 16}), 65000, FeatureCsum|FeatureHostTSO4|FeatureHostECN)
	f.Add([]byte{1, 3, 0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0}, 14, FeatureHostUFO|FeatureCsum)
	f.Fuzz(func(t *testing.T, b []byte, frameLen int, features uint64) {
		h, ok := ParseHeader(b)
		if !ok {
			require.Less(t, len(b), HeaderSize)
			return
		}
		out := make([]byte, HeaderSize)
		h.Put(out)
		require.Equal(t, b[:HeaderSize], out, "Put(ParseHeader(b)) round-trips")
		if ValidateTx(h, frameLen, features) != nil {
			return
		}
		// Whatever passes stays inside the frame and the features.
		require.GreaterOrEqual(t, frameLen, minFrame)
		require.LessOrEqual(t, frameLen, maxFrame)
		if h.Flags&HdrNeedsCsum != 0 {
			require.NotZero(t, features&FeatureCsum)
			require.LessOrEqual(t, int(h.CsumStart)+int(h.CsumOffset)+2, frameLen)
		}
		if h.GSOType != GSONone {
			require.NotZero(t, h.GSOSize)
			require.LessOrEqual(t, int(h.HdrLen), frameLen)
		}
	})
}
