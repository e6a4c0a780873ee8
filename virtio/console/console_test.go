package console_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

const (
	rxVec  = 1
	txVec  = 2
	cfgVec = 0
)

type guest struct {
	*transporttest.Rig
	con    *console.Console
	rx, tx *queuetest.Driver
	out    *testenv.LockedBuffer
	in     *io.PipeWriter
}

// boot brings the console up as Linux's virtio_console would: MSI-X with a
// config vector and one per queue, VERSION_1 + EVENT_IDX + F_SIZE, both
// queues, DRIVER_OK.
func boot(t *testing.T) *guest {
	pr, pw := io.Pipe()
	g := bootWith(t, pr)
	t.Cleanup(func() { pw.Close() })
	g.in = pw
	return g
}

// bootWith is boot with in as hpcvmm's stdin, and the receive queue set up
// but without buffers: a test posts them with postRx.
func bootWith(t *testing.T, in io.Reader) *guest {
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	out := &testenv.LockedBuffer{}
	con, err := console.New(in, out, console.Options{Rows: 24, Cols: 80, QueueSize: 64})
	require.NoError(t, err)
	rig, err := transporttest.NewRig(con, make(queuetest.Memory, 4<<20))
	require.NoError(t, err)
	t.Cleanup(func() {
		rig.T.Close()
		con.Close()
	})
	g := &guest{Rig: rig, con: con, out: out}
	g.EnableMSIX(3)
	_, st := g.Negotiate(virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureSize)
	require.NotZero(t, st&virtio.StatusFeaturesOK)
	require.Equal(t, uint16(cfgVec), g.SetConfigVector(cfgVec))
	g.rx = queuetest.NewDriver(g.Mem, 64, 0x1000)
	g.tx = queuetest.NewDriver(g.Mem, 64, 0x10000)
	require.Equal(t, uint16(rxVec), g.SetupQueue(0, g.rx, rxVec))
	require.Equal(t, uint16(txVec), g.SetupQueue(1, g.tx, txVec))
	g.DriverOK()
	require.Equal(t, uint8(0xf), g.Status())
	return g
}

func waitUsed(t *testing.T, d *queuetest.Driver, idx uint16) {
	t.Helper()
	require.Eventually(t, func() bool { return d.UsedIdx() == idx }, 2*time.Second, time.Millisecond)
}

func TestConsoleConfigAndIdentity(t *testing.T) {
	g := boot(t)
	assert.Equal(t, uint32(0x1043_1af4), g.Cfg.Read(transporttest.Slot, 0, 0, 4), "1af4:1043")
	assert.Equal(t, uint32(0x07800001), g.Cfg.Read(transporttest.Slot, 0, 8, 4), "communication controller, revision 1")
	assert.Equal(t, uint64(80), g.Read(g.DevCfg, 2), "cols")
	assert.Equal(t, uint64(24), g.Read(g.DevCfg+2, 2), "rows")

	gen := g.Read(g.Common+21, 1)
	g.con.SetSize(50, 132)
	require.NoError(t, g.WaitInterrupt(cfgVec, 2*time.Second), "config-change interrupt")
	assert.Equal(t, uint64(132), g.Read(g.DevCfg, 2))
	assert.Equal(t, uint64(50), g.Read(g.DevCfg+2, 2))
	assert.NotEqual(t, gen, g.Read(g.Common+21, 1))
	g.con.SetSize(50, 132)
	assert.False(t, g.Interrupted(cfgVec), "no interrupt when nothing changed")
}

func TestConsoleTransmitEndToEnd(t *testing.T) {
	g := boot(t)
	copy(g.Mem[0x100000:], "hello ")
	copy(g.Mem[0x100100:], "from guest\n")
	copy(g.Mem[0x100200:], "second\n")
	g.tx.SetUsedEvent(1) // interrupt once both chains are used
	g.tx.Chain(g.tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x100000, Len: 6}, {Addr: 0x100100, Len: 11}})
	g.tx.Chain(g.tx.DescAddr, 2, []queuetest.Buf{{Addr: 0x100200, Len: 7}})
	g.tx.Publish(0)
	g.tx.Publish(2)
	require.NoError(t, g.Kick(1))
	waitUsed(t, g.tx, 2)
	assert.Equal(t, "hello from guest\nsecond\n", g.out.String())
	require.NoError(t, g.WaitInterrupt(txVec, 2*time.Second))
	id, n, ok := g.tx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, [2]uint32{0, 0}, [2]uint32{id, n})
	id, _, ok = g.tx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, uint32(2), id)
	assert.Equal(t, uint16(2), g.tx.AvailEvent(), "device asks for the next kick")
	assert.Zero(t, g.T.NotifyExits(), "no doorbell reached the VMM")
}

func TestConsoleReceiveEndToEnd(t *testing.T) {
	g := boot(t)
	g.rx.SetUsedEvent(0)
	g.rx.Chain(g.rx.DescAddr, 0, []queuetest.Buf{{Addr: 0x200000, Len: 8, Write: true}})
	g.rx.Chain(g.rx.DescAddr, 1, []queuetest.Buf{{Addr: 0x200100, Len: 64, Write: true}})
	g.rx.Publish(0)
	g.rx.Publish(1)
	require.NoError(t, g.Kick(0))

	_, err := g.in.Write([]byte("typed on the host\n"))
	require.NoError(t, err)
	waitUsed(t, g.rx, 2)
	require.NoError(t, g.WaitInterrupt(rxVec, 2*time.Second))
	_, n0, _ := g.rx.NextUsed()
	_, n1, _ := g.rx.NextUsed()
	assert.Equal(t, uint32(8), n0)
	assert.Equal(t, uint32(10), n1)
	got := string(g.Mem[0x200000:0x200008]) + string(g.Mem[0x200100:0x200100+10])
	assert.Equal(t, "typed on the host\n", got)

	// Input with no receive buffers waits for the guest to add one.
	go g.in.Write([]byte("late"))
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, uint16(2), g.rx.UsedIdx())
	g.rx.Chain(g.rx.DescAddr, 2, []queuetest.Buf{{Addr: 0x200200, Len: 64, Write: true}})
	g.rx.Publish(2)
	require.NoError(t, g.Kick(0))
	waitUsed(t, g.rx, 3)
	assert.Equal(t, "late", string(g.Mem[0x200200:0x200204]))
}

func TestConsoleMaliciousTransmitChain(t *testing.T) {
	g := boot(t)
	// A device-writable buffer in the transmitq violates the spec.
	g.tx.Chain(g.tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x100000, Len: 4}, {Addr: 0x100100, Len: 4, Write: true}})
	g.tx.Publish(0)
	require.NoError(t, g.Kick(1))
	require.Eventually(t, func() bool { return g.Status()&virtio.StatusNeedsReset != 0 }, 2*time.Second, time.Millisecond)
	require.NoError(t, g.WaitInterrupt(cfgVec, 2*time.Second))
	assert.Empty(t, g.out.String())
}

type nopIRQ struct{ n int }

func (i *nopIRQ) SignalQueue(int) { i.n++ }
func (i *nopIRQ) ConfigChanged()  {}

// BenchmarkConsoleTransmit measures guest-to-host console output per
// request on the device goroutine's path (pop, copy to the staging buffer,
// push, write to the host writer, interrupt decision, the deferred
// interrupt's wakeup), for a short line and a full page. The
// throughput column is guest-to-host bytes/s excluding the guest's own
// kick and wakeup; allocs/op must be 0.
func BenchmarkConsoleTransmit(b *testing.B) {
	for _, size := range []uint32{64, 4096} {
		b.Run(map[uint32]string{64: "64B", 4096: "4KiB"}[size], func(b *testing.B) {
			mem := make(queuetest.Memory, 1<<20)
			rx := queuetest.NewDriver(mem, 256, 0x1000)
			tx := queuetest.NewDriver(mem, 256, 0x10000)
			feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx
			rq, err := queue.New(mem, rx.Config(), feat)
			require.NoError(b, err)
			tq, err := queue.New(mem, tx.Config(), feat)
			require.NoError(b, err)
			con, err := console.New(nil, io.Discard, console.Options{})
			require.NoError(b, err)
			defer con.Close()
			irq := &nopIRQ{}
			require.NoError(b, con.Activate(feat, []*queue.Queue{rq, tq, nil, nil}, irq))
			tx.Chain(tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x80000, Len: size}})
			pfd := []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				// The guest's used_event follows its last seen used index,
				// as Linux's does, so every request asks for an interrupt;
				// deferred ones are decided when the eventfd says so, as
				// the transport's goroutine would.
				binary.LittleEndian.PutUint16(mem[tx.Avail+4+2*256:], tx.UsedIdx())
				tx.Publish(0)
				if err := con.QueueNotify(1); err != nil {
					b.Fatal(err)
				}
				if n, _ := unix.Poll(pfd, 0); n > 0 {
					if err := con.HandleEvent(); err != nil {
						b.Fatal(err)
					}
				}
			}
			if irq.n == 0 {
				b.Fatal("no interrupts")
			}
		})
	}
}

// TestConsoleInputBeforeBuffersArrives: stdin given at launch (a file or a
// pipe that already hit EOF) is read before the guest's driver posts receive
// buffers; every byte must reach the guest once it does.
func TestConsoleInputBeforeBuffersArrives(t *testing.T) {
	g := bootWith(t, strings.NewReader("line given at launch\n"))
	time.Sleep(50 * time.Millisecond) // the host side reads stdin and reaches EOF
	assert.Equal(t, uint16(0), g.rx.UsedIdx())
	g.rx.Chain(g.rx.DescAddr, 0, []queuetest.Buf{{Addr: 0x200000, Len: 4096, Write: true}})
	g.rx.Publish(0)
	require.NoError(t, g.Kick(0))
	waitUsed(t, g.rx, 1)
	_, n, _ := g.rx.NextUsed()
	assert.Equal(t, "line given at launch\n", string(g.Mem[0x200000:0x200000+n]))
}

// countingReader is stdin that records how much the console has read.
type countingReader struct {
	r    io.Reader
	read atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// TestConsoleInputBackpressure: with no receive buffers the console stops
// reading stdin after one bounded chunk instead of draining it into memory
// or dropping it; as the guest posts buffers, every byte arrives in order,
// and the end of stdin delivers what was still queued.
func TestConsoleInputBackpressure(t *testing.T) {
	want := make([]byte, 64<<10)
	for i := range want {
		want[i] = byte(i * 13)
	}
	src := &countingReader{r: bytes.NewReader(want)}
	g := bootWith(t, src)
	time.Sleep(50 * time.Millisecond)
	assert.LessOrEqual(t, src.read.Load(), int64(4096), "bytes read from stdin with nowhere to put them")
	assert.Positive(t, src.read.Load(), "input is read ahead of the driver")

	var got []byte
	const bufLen = 1000 // not a divisor of the chunk: chains straddle chunks
	used := uint16(0)
	for head := uint16(0); len(got) < len(want); head = (head + 1) % 64 {
		addr := 0x200000 + uint64(head)*bufLen
		g.rx.Chain(g.rx.DescAddr, head, []queuetest.Buf{{Addr: addr, Len: bufLen, Write: true}})
		g.rx.Publish(head)
		require.NoError(t, g.Kick(0))
		used++
		require.Eventually(t, func() bool { return g.rx.UsedIdx() == used }, 2*time.Second, time.Millisecond,
			"buffer %d not used after %d of %d bytes", head, len(got), len(want))
		_, n, ok := g.rx.NextUsed()
		require.True(t, ok)
		got = append(got, g.Mem[addr:addr+uint64(n)]...)
		assert.LessOrEqual(t, src.read.Load()-int64(len(got)), int64(4096), "read ahead of the guest")
	}
	assert.Equal(t, want, got)
}

// pollingGuest is hpcvmm's stdout in TestConsoleTransmitBeforeWrite: at
// each write it checks which transmit chains the device has returned and,
// when poll is set, takes them as Linux's hvc console does while it spins
// (virtqueue_get_buf, which moves used_event to its last seen used index).
type pollingGuest struct {
	tx       *queuetest.Driver
	poll     bool
	out      bytes.Buffer
	usedSeen []uint16 // the used index at each write
}

func (p *pollingGuest) Write(b []byte) (int, error) {
	p.usedSeen = append(p.usedSeen, p.tx.UsedIdx())
	if p.poll {
		for {
			if _, _, ok := p.tx.NextUsed(); !ok {
				break
			}
		}
		p.tx.SetUsedEvent(p.tx.UsedIdx())
	}
	return p.out.Write(b)
}

// TestConsoleTransmitBeforeWrite: a transmit chain that fits the staging
// buffer is returned before its bytes go to the host, and the interrupt is
// decided after the write, so a guest that polls for its buffer (Linux's
// hvc console) has taken it by then and gets no interrupt; a guest that
// did not take it gets one per batch, after the deferral (txIRQDelay). A chain larger than the staging
// buffer is written from guest memory first, in order with the others.
func TestConsoleTransmitBeforeWrite(t *testing.T) {
	for _, poll := range []bool{true, false} {
		mem := make(queuetest.Memory, 1<<20)
		rx := queuetest.NewDriver(mem, 64, 0x1000)
		tx := queuetest.NewDriver(mem, 64, 0x4000)
		feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx
		rq, err := queue.New(mem, rx.Config(), feat)
		require.NoError(t, err)
		tq, err := queue.New(mem, tx.Config(), feat)
		require.NoError(t, err)
		pg := &pollingGuest{tx: tx, poll: poll}
		con, err := console.New(nil, pg, console.Options{QueueSize: 64})
		require.NoError(t, err)
		defer con.Close()
		irq := &nopIRQ{}
		require.NoError(t, con.Activate(feat, []*queue.Queue{rq, tq, nil, nil}, irq))

		// wake waits for the device's eventfd, as the transport's
		// goroutine does, and runs HandleEvent.
		pfd := []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
		wake := func(timeout time.Duration) bool {
			n, err := unix.Poll(pfd, int(timeout/time.Millisecond))
			for errors.Is(err, unix.EINTR) { // Go's preemption signal, under load
				n, err = unix.Poll(pfd, int(timeout/time.Millisecond))
			}
			if err != nil || n == 0 {
				return false
			}
			require.NoError(t, con.HandleEvent())
			return true
		}
		var want []byte
		const chunks = 20
		for i := range chunks {
			// 2 KiB, as Linux's tty layer hands hvc its writes.
			chunk := bytes.Repeat([]byte{byte('a' + i%26)}, 2048)
			copy(mem[0x10000:], chunk)
			want = append(want, chunk...)
			tx.SetUsedEvent(tx.UsedIdx()) // Linux after its last get_buf
			tx.Chain(tx.DescAddr, uint16(i%64), []queuetest.Buf{{Addr: 0x10000, Len: 2048}})
			tx.Publish(uint16(i % 64))
			start := time.Now()
			require.NoError(t, con.QueueNotify(1))
			require.Equal(t, uint16(i+1), pg.usedSeen[i], "chain %d returned before its write", i)
			if poll {
				continue
			}
			// The interrupt the driver still wants comes once the
			// deferral ends, not before.
			assert.Equal(t, i, irq.n, "interrupt deferred")
			for irq.n == i && wake(time.Second) {
			}
			assert.Equal(t, i+1, irq.n, "interrupt raised after the deferral")
			assert.GreaterOrEqual(t, time.Since(start), time.Millisecond)
		}
		assert.Equal(t, want, pg.out.Bytes(), "poll %v", poll)
		if poll {
			assert.False(t, wake(20*time.Millisecond), "no deferral armed")
			assert.Zero(t, irq.n, "interrupts to a guest that took every buffer during the write")
		}
	}

	// A driver that takes its buffer during the deferral gets no
	// interrupt, and the decision covers it.
	{
		mem := make(queuetest.Memory, 1<<20)
		tx := queuetest.NewDriver(mem, 8, 0x1000)
		feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx
		tq, err := queue.New(mem, tx.Config(), feat)
		require.NoError(t, err)
		con, err := console.New(nil, io.Discard, console.Options{QueueSize: 8})
		require.NoError(t, err)
		defer con.Close()
		irq := &nopIRQ{}
		require.NoError(t, con.Activate(feat, []*queue.Queue{nil, tq, nil, nil}, irq))
		tx.Chain(tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 10}})
		tx.Publish(0)
		require.NoError(t, con.QueueNotify(1))
		_, _, ok := tx.NextUsed()
		require.True(t, ok)
		tx.SetUsedEvent(1)
		pfd := []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 1000)
		for errors.Is(err, unix.EINTR) {
			n, err = unix.Poll(pfd, 1000)
		}
		require.NoError(t, err)
		require.Equal(t, 1, n, "the deferral's timer wakes the device")
		require.NoError(t, con.HandleEvent())
		assert.Zero(t, irq.n)
	}

	// Order across the two paths: small, large (120 KiB > the staging
	// buffer, in three segments), small, in one batch.
	mem := make(queuetest.Memory, 1<<20)
	tx := queuetest.NewDriver(mem, 8, 0x1000)
	feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx
	tq, err := queue.New(mem, tx.Config(), feat)
	require.NoError(t, err)
	pg := &pollingGuest{tx: tx}
	con, err := console.New(nil, pg, console.Options{QueueSize: 8})
	require.NoError(t, err)
	defer con.Close()
	require.NoError(t, con.Activate(feat, []*queue.Queue{nil, tq, nil, nil}, &nopIRQ{}))
	var want []byte
	for i, r := range []struct {
		addr uint64
		n    int
	}{{0x10000, 100}, {0x20000, 40 << 10}, {0x30000, 40 << 10}, {0x40000, 40 << 10}, {0x50000, 300}} {
		for k := range r.n {
			mem[r.addr+uint64(k)] = byte(i*7 + k)
		}
		want = append(want, mem[r.addr:r.addr+uint64(r.n)]...)
	}
	tx.Chain(tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x10000, Len: 100}})
	tx.Chain(tx.DescAddr, 1, []queuetest.Buf{{Addr: 0x20000, Len: 40 << 10}, {Addr: 0x30000, Len: 40 << 10}, {Addr: 0x40000, Len: 40 << 10}})
	tx.Chain(tx.DescAddr, 4, []queuetest.Buf{{Addr: 0x50000, Len: 300}})
	tx.Publish(0)
	tx.Publish(1)
	tx.Publish(4)
	require.NoError(t, con.QueueNotify(1))
	assert.Equal(t, want, pg.out.Bytes())
	// The staged 100 bytes (chain 0 returned), then the large chain's
	// three segments before it is returned, then the last 300 staged.
	assert.Equal(t, []uint16{1, 1, 1, 1, 3}, pg.usedSeen)
	assert.Equal(t, uint16(3), tx.UsedIdx())
}
