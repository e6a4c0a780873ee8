package queue_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

const allRing = queue.FeatureEventIdx | queue.FeatureIndirectDesc

func setup(t testing.TB, size uint16, features uint64) (queuetest.Memory, *queuetest.Driver, *queue.Queue) {
	mem := make(queuetest.Memory, 1<<20)
	d := queuetest.NewDriver(mem, size, 0x1000)
	q, err := queue.New(mem, d.Config(), features)
	require.NoError(t, err)
	return mem, d, q
}

func TestNewValidatesLayout(t *testing.T) {
	mem := make(queuetest.Memory, 1<<16)
	for _, tc := range []struct {
		name string
		cfg  queue.Config
		want string
	}{
		{"zero size", queue.Config{Size: 0}, "power of two"},
		{"not power of two", queue.Config{Size: 3}, "power of two"},
		{"too big", queue.Config{Size: 2048}, "power of two"},
		{"misaligned desc", queue.Config{Size: 8, Desc: 8}, "misaligned"},
		{"misaligned used", queue.Config{Size: 8, Device: 2}, "misaligned"},
		{"misaligned avail", queue.Config{Size: 8, Driver: 0x101}, "misaligned"},
		{"desc outside RAM", queue.Config{Size: 8, Desc: 1 << 16}, "descriptor table"},
		{"used straddles end", queue.Config{Size: 8, Device: 1<<16 - 8}, "used ring"},
	} {
		_, err := queue.New(mem, tc.cfg, 0)
		assert.ErrorContains(t, err, tc.want, tc.name)
	}
}

// shifted is guest memory whose host addresses are one byte off the
// 4-byte alignment of their guest addresses: atomic ring accesses cannot
// work on it, so New must refuse it (and never panic).
type shifted struct{ mem queuetest.Memory }

func (s shifted) Slice(gpa, n uint64) ([]byte, error) {
	if gpa+1 < gpa || gpa+1 > uint64(len(s.mem)) || n > uint64(len(s.mem))-gpa-1 {
		return nil, fmt.Errorf("shifted: %#x+%d outside RAM", gpa, n)
	}
	return s.mem[gpa+1 : gpa+1+n], nil
}

func TestNewRejectsRingsMisalignedOnTheHost(t *testing.T) {
	mem := make(queuetest.Memory, 1<<16+1)
	d := queuetest.NewDriver(mem, 8, 0x1000)
	_, err := queue.New(shifted{mem}, d.Config(), allRing)
	assert.ErrorContains(t, err, "not 4-byte aligned on the host")
}

// TestRingFieldsNextToForeignData: the avail ring at 2 mod 4 and the
// used ring's avail_event share 32-bit words with bytes that are not the
// ring's; the device reads and writes its fields without disturbing them.
func TestRingFieldsNextToForeignData(t *testing.T) {
	mem := make(queuetest.Memory, 1<<20)
	d := queuetest.NewDriver(mem, 8, 0x1000)
	d.Avail, d.UsedAt = 0x2002, 0x3000 // avail at 2 mod 4, rings apart
	cfg := d.Config()
	mem[cfg.Driver-2], mem[cfg.Driver-1] = 0xaa, 0xbb // foreign bytes before the avail ring
	availEnd := cfg.Driver + 6 + 2*8
	mem[availEnd], mem[availEnd+1] = 0xcc, 0xdd
	usedEnd := cfg.Device + 6 + 8*8
	mem[usedEnd], mem[usedEnd+1] = 0xee, 0xff // shares avail_event's word
	q, err := queue.New(mem, cfg, allRing)
	require.NoError(t, err)
	d.Chain(d.DescAddr, 3, []queuetest.Buf{{Addr: 0x10000, Len: 4, Write: true}})
	d.Publish(3)
	c := queue.NewChain(queue.MaxSize)
	ok, err := q.Pop(c)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint16(3), c.Head)
	require.NoError(t, q.Push(c.Head, 4))
	assert.False(t, q.EnableNotify())
	assert.Equal(t, uint16(1), d.AvailEvent())
	assert.Equal(t, []byte{0xaa, 0xbb}, []byte(mem[cfg.Driver-2:cfg.Driver]))
	assert.Equal(t, []byte{0xcc, 0xdd}, []byte(mem[availEnd:availEnd+2]))
	assert.Equal(t, []byte{0xee, 0xff}, []byte(mem[usedEnd:usedEnd+2]))
}

func TestPopPushChain(t *testing.T) {
	mem, d, q := setup(t, 8, allRing)
	copy(mem[0x10000:], "hello")
	d.Chain(d.DescAddr, 2, []queuetest.Buf{{Addr: 0x10000, Len: 5}, {Addr: 0x20000, Len: 100, Write: true}})
	d.Publish(2)

	c := queue.NewChain(queue.MaxSize)
	ok, err := q.Pop(c)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, uint16(2), c.Head)
	require.Len(t, c.Segments, 2)
	assert.Equal(t, "hello", string(c.Segments[0].Buf))
	assert.False(t, c.Segments[0].Writable)
	assert.True(t, c.Segments[1].Writable)
	assert.Equal(t, uint64(5), c.ReadableLen)
	assert.Equal(t, uint64(100), c.WritableLen)

	copy(c.Segments[1].Buf, "reply")
	require.NoError(t, q.Push(c.Head, 5))
	id, n, ok := d.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(2), id)
	assert.Equal(t, uint32(5), n)
	assert.Equal(t, "reply", string(mem[0x20000:0x20005]))

	ok, err = q.Pop(c)
	require.NoError(t, err)
	assert.False(t, ok, "ring drained")
	assert.Error(t, q.Push(8, 0), "head outside the queue")
}

func TestIndirectChain(t *testing.T) {
	mem, d, q := setup(t, 4, allRing)
	const table = 0x30000
	d.Chain(table, 0, []queuetest.Buf{{Addr: 0x10000, Len: 4}, {Addr: 0x10010, Len: 4}, {Addr: 0x20000, Len: 8, Write: true}})
	d.SetDesc(d.DescAddr, 1, table, 3*16, queue.DescFlagIndirect, 0)
	d.Publish(1)
	copy(mem[0x10000:], "abcd")
	copy(mem[0x10010:], "efgh")

	c := queue.NewChain(queue.MaxSize)
	ok, err := q.Pop(c)
	require.NoError(t, err)
	require.True(t, ok)
	require.Len(t, c.Segments, 3)
	assert.Equal(t, "abcd", string(c.Segments[0].Buf))
	assert.Equal(t, "efgh", string(c.Segments[1].Buf))
	assert.True(t, c.Segments[2].Writable)
}

// TestMaliciousChains checks that every way a hostile driver can build a
// bad chain is an error, not a panic or a hang.
func TestMaliciousChains(t *testing.T) {
	const table = 0x30000
	for _, tc := range []struct {
		name     string
		features uint64
		build    func(d *queuetest.Driver)
		want     string
	}{
		{"loop", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, 0x10000, 1, queue.DescFlagNext, 1)
			d.SetDesc(d.DescAddr, 1, 0x10000, 1, queue.DescFlagNext, 0)
			d.Publish(0)
		}, "loop"},
		{"self loop", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 3, 0x10000, 1, queue.DescFlagNext, 3)
			d.Publish(3)
		}, "loop"},
		{"next outside table", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, 0x10000, 1, queue.DescFlagNext, 200)
			d.Publish(0)
		}, "outside table"},
		{"head outside table", allRing, func(d *queuetest.Driver) { d.Publish(9) }, "names descriptor 9"},
		{"buffer outside RAM", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, 1<<40, 16, 0, 0)
			d.Publish(0)
		}, "outside RAM"},
		{"huge length", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, 0x10000, 0xffffffff, 0, 0)
			d.Publish(0)
		}, "outside RAM"},
		{"address wraps", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, ^uint64(0)-4, 16, 0, 0)
			d.Publish(0)
		}, "outside RAM"},
		{"readable after writable", allRing, func(d *queuetest.Driver) {
			d.Chain(d.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 4, Write: true}, {Addr: 0x10010, Len: 4}})
			d.Publish(0)
		}, "readable descriptor after"},
		{"indirect not negotiated", queue.FeatureEventIdx, func(d *queuetest.Driver) {
			d.Chain(table, 0, []queuetest.Buf{{Addr: 0x10000, Len: 4}})
			d.SetDesc(d.DescAddr, 0, table, 16, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "without VIRTIO_F_INDIRECT_DESC"},
		{"nested indirect", allRing, func(d *queuetest.Driver) {
			d.SetDesc(table, 0, table+0x100, 16, queue.DescFlagIndirect, 0)
			d.SetDesc(d.DescAddr, 0, table, 16, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "nested indirect"},
		{"indirect length not multiple of 16", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, table, 20, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "multiple of 16"},
		{"indirect zero length", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, table, 0, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "multiple of 16"},
		{"indirect table outside RAM", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, 1<<20-16, 32, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "indirect table"},
		{"indirect with next", allRing, func(d *queuetest.Driver) {
			d.SetDesc(d.DescAddr, 0, table, 16, queue.DescFlagIndirect|queue.DescFlagNext, 1)
			d.Publish(0)
		}, "NEXT set"},
		{"loop inside indirect table", allRing, func(d *queuetest.Driver) {
			d.SetDesc(table, 0, 0x10000, 1, queue.DescFlagNext, 1)
			d.SetDesc(table, 1, 0x10000, 1, queue.DescFlagNext, 0)
			d.SetDesc(d.DescAddr, 0, table, 32, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "loop"},
		{"indirect next outside its table", allRing, func(d *queuetest.Driver) {
			d.SetDesc(table, 0, 0x10000, 1, queue.DescFlagNext, 5)
			d.SetDesc(d.DescAddr, 0, table, 32, queue.DescFlagIndirect, 0)
			d.Publish(0)
		}, "outside table"},
		{"avail index runs ahead", allRing, func(d *queuetest.Driver) { d.SetAvailIdx(100) }, "ahead"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, d, q := setup(t, 8, tc.features)
			tc.build(d)
			ok, err := q.Pop(queue.NewChain(queue.MaxSize))
			assert.False(t, ok)
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

func TestChainLongerThanScatterList(t *testing.T) {
	_, d, q := setup(t, 8, allRing)
	d.Chain(d.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 1}, {Addr: 0x10000, Len: 1}, {Addr: 0x10000, Len: 1}})
	d.Publish(0)
	_, err := q.Pop(queue.NewChain(2))
	assert.ErrorContains(t, err, "more than 2 descriptors")
}

func TestNotificationSuppressionEventIdx(t *testing.T) {
	mem, d, q := setup(t, 8, allRing)
	c := queue.NewChain(queue.MaxSize)
	for i := uint16(0); i < 3; i++ {
		d.Chain(d.DescAddr, i, []queuetest.Buf{{Addr: 0x10000, Len: 1}})
		d.Publish(i)
	}
	// The driver wants an interrupt once the device has used entry 1
	// (used_event = 1 means "after used idx passes 1").
	d.SetUsedEvent(1)
	ok, err := q.Pop(c)
	require.True(t, ok)
	require.NoError(t, err)
	require.NoError(t, q.Push(c.Head, 0))
	assert.False(t, q.NeedInterrupt(), "used idx 1 has not passed used_event 1")
	ok, _ = q.Pop(c)
	require.True(t, ok)
	require.NoError(t, q.Push(c.Head, 0))
	assert.True(t, q.NeedInterrupt(), "used idx 2 passed used_event 1")
	assert.False(t, q.NeedInterrupt(), "nothing new pushed")

	// EnableNotify publishes avail_event and reports the entry still pending.
	assert.True(t, q.EnableNotify())
	assert.Equal(t, uint16(2), d.AvailEvent())
	ok, _ = q.Pop(c)
	require.True(t, ok)
	assert.False(t, q.EnableNotify())
	assert.Equal(t, uint16(3), d.AvailEvent())
	_ = mem
}

func TestNotificationSuppressionFlags(t *testing.T) {
	_, d, q := setup(t, 8, 0)
	c := queue.NewChain(queue.MaxSize)
	q.DisableNotify()
	assert.Equal(t, uint16(queue.UsedFlagNoNotify), d.UsedFlags())
	assert.False(t, q.EnableNotify())
	assert.Equal(t, uint16(0), d.UsedFlags())

	d.Chain(d.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 1}})
	d.Publish(0)
	ok, _ := q.Pop(c)
	require.True(t, ok)
	require.NoError(t, q.Push(c.Head, 0))
	d.SetAvailFlags(queue.AvailFlagNoInterrupt)
	assert.False(t, q.NeedInterrupt())
	d.Publish(0)
	ok, _ = q.Pop(c)
	require.True(t, ok)
	require.NoError(t, q.Push(c.Head, 0))
	d.SetAvailFlags(0)
	assert.True(t, q.NeedInterrupt())
}

func TestWrapAroundIndices(t *testing.T) {
	mem := make(queuetest.Memory, 1<<20)
	d := queuetest.NewDriver(mem, 4, 0x1000)
	// Start both indices just below the 16-bit wrap, as a long-running
	// driver would be.
	binary.LittleEndian.PutUint16(mem[d.UsedAt+2:], 0xfffe)
	d.SetAvailIdx(0xfffe)
	q, err := queue.New(mem, d.Config(), allRing)
	require.NoError(t, err)
	c := queue.NewChain(queue.MaxSize)
	for i := 0; i < 6; i++ {
		d.Chain(d.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 1}})
		d.Publish(0)
		ok, err := q.Pop(c)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, q.Push(c.Head, 1))
	}
	assert.Equal(t, uint16(4), d.UsedIdx())
}

// BenchmarkQueuePopPush measures one request through the ring: the driver
// publishes a two-descriptor chain, the device pops, pushes and decides on
// the interrupt. It must not allocate.
func BenchmarkQueuePopPush(b *testing.B) {
	_, d, q := setup(b, 256, allRing)
	c := queue.NewChain(queue.MaxSize)
	d.Chain(d.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 64}, {Addr: 0x20000, Len: 64, Write: true}})
	b.ReportAllocs()
	for b.Loop() {
		d.Publish(0)
		ok, err := q.Pop(c)
		if !ok || err != nil {
			b.Fatal(ok, err)
		}
		if err := q.Push(c.Head, 64); err != nil {
			b.Fatal(err)
		}
		q.NeedInterrupt()
	}
}
