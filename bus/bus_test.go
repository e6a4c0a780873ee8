package bus

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type recorder struct {
	lastOff uint64
	writes  int
}

func (r *recorder) Read(off uint64, data []byte) {
	r.lastOff = off
	for i := range data {
		data[i] = byte(off) + byte(i)
	}
}
func (r *recorder) Write(off uint64, data []byte) { r.lastOff = off; r.writes++ }

func TestRegisterRejectsOverlapAndZeroSize(t *testing.T) {
	var b Bus
	require.NoError(t, b.Register(0x3f8, 8, "uart", &recorder{}))
	require.NoError(t, b.Register(0x60, 1, "i8042", &recorder{}))
	assert.ErrorContains(t, b.Register(0x3fc, 8, "other", &recorder{}), "overlaps uart")
	assert.ErrorContains(t, b.Register(0x3f0, 9, "other", &recorder{}), "overlaps uart")
	assert.ErrorContains(t, b.Register(0x10, 0, "zero", &recorder{}), "zero-sized")
	assert.ErrorContains(t, b.Register(^uint64(0), 2, "wrap", &recorder{}), "wraps")
	require.NoError(t, b.Register(0x3f0, 8, "below", &recorder{}))
	got := b.Ranges()
	require.Len(t, got, 3)
	assert.Equal(t, []uint64{0x60, 0x3f0, 0x3f8}, []uint64{got[0].Base, got[1].Base, got[2].Base})
}

func TestDispatchByOffsetAndUnclaimed(t *testing.T) {
	var b Bus
	uart := &recorder{}
	require.NoError(t, b.Register(0x3f8, 8, "uart", uart))
	data := make([]byte, 1)
	require.True(t, b.Read(0x3fd, data))
	assert.Equal(t, uint64(5), uart.lastOff)
	assert.Equal(t, byte(5), data[0])
	assert.True(t, b.Write(0x3f8, data))
	assert.Equal(t, 1, uart.writes)
	assert.False(t, b.Read(0x3f7, data), "below the range")
	assert.False(t, b.Read(0x400, data), "above the range")
	assert.False(t, b.Read(0x3fe, make([]byte, 4)), "access straddling the end is not dispatched")
	assert.True(t, b.Unregister(0x3f8))
	assert.False(t, b.Read(0x3f8, data))
	assert.False(t, b.Unregister(0x3f8))
}

func BenchmarkDispatch(b *testing.B) {
	var bs Bus
	for i := uint64(0); i < 32; i++ {
		_ = bs.Register(0x1000+i*0x100, 0x100, "dev", &recorder{})
	}
	data := make([]byte, 4)
	b.ReportAllocs()
	for b.Loop() {
		bs.Read(0x1a04, data)
		bs.Write(0x1f08, data)
	}
}

// TestConcurrentRegisterAndDispatch moves a range while other goroutines
// dispatch, as a guest reprogramming a BAR on one vCPU while another vCPU
// exits does. Run with -race.
func TestConcurrentRegisterAndDispatch(t *testing.T) {
	var b Bus
	require.NoError(t, b.Register(0x1000, 0x100, "fixed", &recorder{}))
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			base := uint64(0x10000 + (i%4)*0x1000)
			if b.Register(base, 0x100, "moving", &recorder{}) == nil {
				b.Unregister(base)
			}
		}
	}()
	data := make([]byte, 4)
	for {
		select {
		case <-done:
			assert.True(t, b.Read(0x1010, data), "the fixed range stays reachable")
			return
		default:
			require.True(t, b.Read(0x1010, data))
			b.Write(0x10010, data)
		}
	}
}
