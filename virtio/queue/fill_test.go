package queue_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// Fill stages used entries invisibly; Flush publishes them with one index
// update (virtio-net's mergeable receive buffers need all-or-nothing).
func TestFillFlush(t *testing.T) {
	mem := make(queuetest.Memory, 1<<16)
	d := queuetest.NewDriver(mem, 8, 0x1000)
	q, err := queue.New(mem, d.Config(), 0)
	require.NoError(t, err)
	c := queue.NewChain(8)
	for i := uint16(0); i < 3; i++ {
		d.Chain(d.DescAddr, i, []queuetest.Buf{{Addr: 0x4000 + 0x100*uint64(i), Len: 0x100, Write: true}})
		d.Publish(i)
	}
	for i := uint16(0); i < 3; i++ {
		ok, err := q.Pop(c)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, q.Fill(i, c.Head, uint32(10+i)))
		assert.Equal(t, uint16(0), d.UsedIdx(), "nothing visible before Flush")
	}
	q.Flush(3)
	assert.Equal(t, uint16(3), d.UsedIdx())
	assert.Equal(t, uint16(3), q.UsedIndex())
	for i := uint32(0); i < 3; i++ {
		id, n, ok := d.NextUsed()
		require.True(t, ok)
		assert.Equal(t, [2]uint32{i, 10 + i}, [2]uint32{id, n})
	}
	assert.Error(t, q.Fill(8, 0, 1), "offset beyond the ring")
	assert.Error(t, q.Fill(0, 8, 1), "head beyond the ring")
}
