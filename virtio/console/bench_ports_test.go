package console_test

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// fullInput is a FromHost that always fills the whole buffer.
type fullInput struct{}

func (fullInput) Read(p []byte) (int, error) { return len(p), nil }

// discardCloser is a ToHost that takes everything.
type discardCloser struct{}

func (discardCloser) Write(p []byte) (int, error) { return len(p), nil }
func (discardCloser) Close() error                { return nil }

// portBench is a MULTIPORT console with one named port, driven directly as
// the device goroutine would, after the driver's handshake for port 1 and
// the guest's open of it.
type portBench struct {
	mem queuetest.Memory
	prx *queuetest.Driver
	ptx *queuetest.Driver
	con *console.Console
	pfd []unix.PollFd
}

func newPortBench(b *testing.B, port console.Port) *portBench {
	m := &portBench{mem: make(queuetest.Memory, 1<<20)}
	drv := make([]*queuetest.Driver, 6)
	for q := range drv {
		drv[q] = queuetest.NewDriver(m.mem, 256, 0x10000*uint64(q))
	}
	m.prx, m.ptx = drv[4], drv[5]
	cin, cout := drv[2], drv[3]
	feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureMultiport
	qs := make([]*queue.Queue, 6)
	for i, d := range drv {
		var err error
		qs[i], err = queue.New(m.mem, d.Config(), feat)
		require.NoError(b, err)
	}
	con, err := console.New(nil, nil, console.Options{Ports: []console.Port{port}})
	require.NoError(b, err)
	b.Cleanup(func() { con.Close() })
	m.con = con
	m.pfd = []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
	require.NoError(b, con.Activate(feat, qs, &nopIRQ{}))
	for h := range uint16(16) {
		cin.Chain(cin.DescAddr, h, []queuetest.Buf{{Addr: 0x80000 + 0x100*uint64(h), Len: 64, Write: true}})
		cin.Publish(h)
	}
	cout.Chain(cout.DescAddr, 0, []queuetest.Buf{{Addr: 0x90000, Len: 8}})
	for _, msg := range [][]byte{ctl(badID, evDeviceReady, 1), ctl(1, evPortReady, 1), ctl(1, evPortOpen, 1)} {
		copy(m.mem[0x90000:], msg)
		cout.Publish(0)
		require.NoError(b, con.QueueNotify(3))
	}
	// PORT_ADD 0 and 1, PORT_OPEN(1, 1), PORT_NAME(1).
	require.Equal(b, uint16(4), cin.UsedIdx())
	return m
}

// wait blocks until the console's eventfd fires, then runs its host-side
// work, as the device goroutine's poll loop does.
func (m *portBench) wait(b *testing.B) {
	if _, err := unix.Poll(m.pfd, -1); err != nil && err != unix.EINTR {
		b.Fatal(err)
	}
	if err := m.con.HandleEvent(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPortReceive measures host-to-guest bytes on a named port per
// 4 KiB receive buffer (Linux posts a page each): the reader goroutine's
// 32 KiB hand-offs and the device's copies. allocs/op must be 0.
func BenchmarkPortReceive(b *testing.B) {
	m := newPortBench(b, console.Port{Name: "in", FromHost: fullInput{}})
	m.prx.Chain(m.prx.DescAddr, 0, []queuetest.Buf{{Addr: 0xa0000, Len: 4096, Write: true}})
	b.SetBytes(4096)
	b.ReportAllocs()
	for b.Loop() {
		used := m.prx.UsedIdx()
		m.prx.Publish(0)
		if err := m.con.QueueNotify(4); err != nil {
			b.Fatal(err)
		}
		for m.prx.UsedIdx() == used {
			m.wait(b)
		}
	}
}

// BenchmarkPortTransmit measures guest-to-host bytes on a named port per
// 32 KiB transmit chain (Linux's largest port write): the copy into the
// port's ring, the writer goroutine's Write, and the device's wait for room
// when the ring is full. allocs/op must be 0.
func BenchmarkPortTransmit(b *testing.B) {
	m := newPortBench(b, console.Port{Name: "out", ToHost: discardCloser{}})
	m.ptx.Chain(m.ptx.DescAddr, 0, []queuetest.Buf{{Addr: 0xa0000, Len: 32 << 10}})
	b.SetBytes(32 << 10)
	b.ReportAllocs()
	for b.Loop() {
		used := m.ptx.UsedIdx()
		m.ptx.Publish(0)
		if err := m.con.QueueNotify(5); err != nil {
			b.Fatal(err)
		}
		for m.ptx.UsedIdx() == used {
			m.wait(b)
		}
	}
}

var _ io.WriteCloser = discardCloser{}
