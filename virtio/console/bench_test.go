package console_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// endlessInput is stdin that always has 64 bytes ready.
type endlessInput struct{}

func (endlessInput) Read(p []byte) (int, error) {
	n := min(len(p), 64)
	for i := range n {
		p[i] = 'x'
	}
	return n, nil
}

// mpBench is a MULTIPORT console driven directly, as the device goroutine
// would, after the driver's handshake (port 0 open).
type mpBench struct {
	mem               queuetest.Memory
	rx, tx, cin, cout *queuetest.Driver
	con               *console.Console
	irq               *nopIRQ
}

func newMPBench(b *testing.B) *mpBench {
	m := &mpBench{mem: make(queuetest.Memory, 1<<20), irq: &nopIRQ{}}
	m.rx = queuetest.NewDriver(m.mem, 256, 0x1000)
	m.tx = queuetest.NewDriver(m.mem, 256, 0x10000)
	m.cin = queuetest.NewDriver(m.mem, 32, 0x20000)
	m.cout = queuetest.NewDriver(m.mem, 32, 0x28000)
	feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureMultiport
	qs := make([]*queue.Queue, 4)
	for i, d := range []*queuetest.Driver{m.rx, m.tx, m.cin, m.cout} {
		var err error
		qs[i], err = queue.New(m.mem, d.Config(), feat)
		require.NoError(b, err)
	}
	con, err := console.New(endlessInput{}, nil, console.Options{})
	require.NoError(b, err)
	b.Cleanup(func() { con.Close() })
	m.con = con
	require.NoError(b, con.Activate(feat, qs, m.irq))
	for h := range uint16(8) {
		m.cin.Chain(m.cin.DescAddr, h, []queuetest.Buf{{Addr: 0x80000 + 0x100*uint64(h), Len: 64, Write: true}})
		m.cin.Publish(h)
	}
	m.cout.Chain(m.cout.DescAddr, 0, []queuetest.Buf{{Addr: 0x90000, Len: 8}})
	for _, msg := range [][]byte{ctl(badID, evDeviceReady, 1), ctl(0, evPortReady, 1), ctl(0, evPortOpen, 1)} {
		copy(m.mem[0x90000:], msg)
		m.cout.Publish(0)
		require.NoError(b, con.QueueNotify(3))
	}
	require.Equal(b, uint16(3), m.cin.UsedIdx(), "PORT_ADD, CONSOLE_PORT, PORT_OPEN")
	return m
}

// BenchmarkConsoleReceive measures host-to-guest input per 64-byte chunk
// with MULTIPORT, port 0 open: the reader goroutine's hand-off, the
// device goroutine's wakeup on the eventfd, and filling one receive
// buffer. allocs/op must be 0.
func BenchmarkConsoleReceive(b *testing.B) {
	m := newMPBench(b)
	m.rx.Chain(m.rx.DescAddr, 0, []queuetest.Buf{{Addr: 0xa0000, Len: 4096, Write: true}})
	pfd := []unix.PollFd{{Fd: int32(m.con.EventFD()), Events: unix.POLLIN}}
	b.SetBytes(64)
	b.ReportAllocs()
	for b.Loop() {
		used := m.rx.UsedIdx()
		m.rx.Publish(0)
		if err := m.con.QueueNotify(0); err != nil {
			b.Fatal(err)
		}
		for m.rx.UsedIdx() == used {
			if _, err := unix.Poll(pfd, -1); err != nil && err != unix.EINTR {
				b.Fatal(err)
			}
			if err := m.con.HandleEvent(); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkConsoleControl measures one driver control message (PORT_OPEN,
// as Linux sends it on open and close) through the control transmitq.
// allocs/op must be 0.
func BenchmarkConsoleControl(b *testing.B) {
	m := newMPBench(b)
	copy(m.mem[0x90000:], ctl(0, evPortOpen, 1))
	b.ReportAllocs()
	for b.Loop() {
		m.cout.Publish(0)
		if err := m.con.QueueNotify(3); err != nil {
			b.Fatal(err)
		}
	}
}
