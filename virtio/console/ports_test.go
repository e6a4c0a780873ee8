package console_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport/transporttest"
)

const (
	evPortName = 7

	portQSize = 64
	// Named port i's buffers: receive 4 KiB apart, transmit 16 KiB apart.
	portRxBufs = 0x400000
	portTxBufs = 0x800000
	portMem    = 0x1000000
)

func portRxBuf(i int, h uint32) uint64 { return portRxBufs + 0x40000*uint64(i-1) + 0x1000*uint64(h) }
func portTxBuf(i int, h uint16) uint64 { return portTxBufs + 0x100000*uint64(i-1) + 0x4000*uint64(h) }

// sink is a ToHost that keeps what it gets and notes when it is closed.
type sink struct {
	mu     sync.Mutex
	b      bytes.Buffer
	closed bool
	// afterClose counts writes after Close (must stay 0).
	afterClose int
}

func (s *sink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.afterClose++
		return 0, errors.New("write after close")
	}
	return s.b.Write(p)
}

func (s *sink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

func (s *sink) state() ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b.Bytes()...), s.closed
}

// portsGuest is a MULTIPORT guest with named ports, playing Linux's
// virtio_console for them: prx/ptx are port i's queues at index i-1.
type portsGuest struct {
	*mpGuest
	prx, ptx []*queuetest.Driver
	txFree   [][]uint16 // port i's free transmit heads
	ctlSeen  [][]byte   // every control message the device sent
}

// bootPorts is bootMultiport with named ports (their queues at 4, 5, ...).
func bootPorts(t *testing.T, in io.Reader, ports []console.Port) *portsGuest {
	t.Helper()
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	out := &testenv.LockedBuffer{}
	errs := &errLog{}
	con, err := console.New(in, out, console.Options{Rows: 24, Cols: 80, QueueSize: portQSize, OnError: errs.add, Ports: ports})
	require.NoError(t, err)
	rig, err := transporttest.NewRig(con, make(queuetest.Memory, portMem))
	require.NoError(t, err)
	t.Cleanup(func() {
		rig.T.Close()
		con.Close()
	})
	g := &portsGuest{mpGuest: &mpGuest{Rig: rig, con: con, out: out, errs: errs}}
	nq := 4 + 2*len(ports)
	g.EnableMSIX(1 + nq)
	_, st := g.Negotiate(virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureSize | featMultiport)
	require.NotZero(t, st&virtio.StatusFeaturesOK)
	require.Equal(t, uint16(cfgVec), g.SetConfigVector(cfgVec))
	g.rx = queuetest.NewDriver(g.Mem, 64, 0x1000)
	g.tx = queuetest.NewDriver(g.Mem, 64, 0x10000)
	g.cin = queuetest.NewDriver(g.Mem, 16, 0x20000)
	g.cout = queuetest.NewDriver(g.Mem, 16, 0x28000)
	for q, d := range []*queuetest.Driver{g.rx, g.tx, g.cin, g.cout} {
		require.Equal(t, uint16(q+1), g.SetupQueue(q, d, uint16(q+1)))
	}
	for i := 1; i <= len(ports); i++ {
		rx := queuetest.NewDriver(g.Mem, portQSize, 0x40000+0x8000*uint64(i-1))
		tx := queuetest.NewDriver(g.Mem, portQSize, 0x40000+0x8000*uint64(i-1)+0x4000)
		g.prx = append(g.prx, rx)
		g.ptx = append(g.ptx, tx)
		require.Equal(t, uint16(2+2*i+1), g.SetupQueue(2+2*i, rx, uint16(2+2*i+1)))
		require.Equal(t, uint16(3+2*i+1), g.SetupQueue(3+2*i, tx, uint16(3+2*i+1)))
		var free []uint16
		for h := range uint16(portQSize / 3) {
			free = append(free, h)
		}
		g.txFree = append(g.txFree, free)
	}
	g.DriverOK()
	require.Equal(t, uint8(0xf), g.Status())
	return g
}

// portsHandshake runs Linux's probe for port 0 and every named port: the
// device adds them all after DEVICE_READY; add_port fills each receiveq and
// answers PORT_READY; the device answers a named port's PORT_READY with
// PORT_OPEN (host connected unless its input already ended) before
// PORT_NAME.
func (g *portsGuest) handshake(t *testing.T, names []string) {
	t.Helper()
	g.postCtl(t, 15, 0x100)
	g.send(t, ctl(badID, evDeviceReady, 1))
	var adds [][]byte
	for i := range 1 + len(names) {
		adds = append(adds, ctl(uint32(i), evPortAdd, 1))
	}
	assert.Equal(t, adds, g.msgs(t, uint16(len(adds))), "PORT_ADD for every port, in id order")
	g.send(t, ctl(0, evPortReady, 1))
	g.msgs(t, uint16(len(adds)+3))
	g.send(t, ctl(0, evPortOpen, 1))
	want := uint16(len(adds) + 3)
	for i, name := range names {
		id := uint32(i + 1)
		g.postPortRx(t, i+1, portQSize)
		g.send(t, ctl(id, evPortReady, 1))
		want += 2
		msgs := g.msgs(t, want)
		require.Len(t, msgs, 2)
		assert.Equal(t, ctl(id, evPortOpen, 1)[:6], msgs[0][:6], "PORT_OPEN first")
		assert.Equal(t, append(ctl(id, evPortName, 1), name...), msgs[1], "then PORT_NAME with the name")
	}
}

// msgs returns the control messages sent since the last call once the
// device has used want control buffers in all.
func (g *portsGuest) msgs(t *testing.T, want uint16) [][]byte {
	t.Helper()
	m := g.ctlMsgs(t, want)
	g.ctlSeen = append(g.ctlSeen, m...)
	return m
}

// postPortRx posts n 4 KiB receive buffers on port i (heads 0..n-1).
func (g *portsGuest) postPortRx(t *testing.T, i, n int) {
	t.Helper()
	rx := g.prx[i-1]
	for h := range uint32(n) {
		rx.Chain(rx.DescAddr, uint16(h), []queuetest.Buf{{Addr: portRxBuf(i, h), Len: 4096, Write: true}})
		rx.Publish(uint16(h))
	}
	require.NoError(t, g.Kick(2+2*i))
}

// takePortRx consumes port i's used receive buffers, reposts them, and
// returns their bytes.
func (g *portsGuest) takePortRx(t *testing.T, i int) []byte {
	t.Helper()
	rx := g.prx[i-1]
	var got []byte
	for {
		id, n, ok := rx.NextUsed()
		if !ok {
			break
		}
		require.LessOrEqual(t, n, uint32(4096))
		got = append(got, g.Mem[portRxBuf(i, id):][:n]...)
		rx.Publish(uint16(id))
	}
	if got != nil {
		require.NoError(t, g.Kick(2+2*i))
	}
	return got
}

// writePort queues data on port i's transmitq as one chain of up to three
// buffers (at most 16 KiB in all) and returns how much it queued (0 when
// the ring is full).
func (g *portsGuest) writePort(t *testing.T, i int, data []byte) int {
	t.Helper()
	tx := g.ptx[i-1]
	g.reclaimTx(i)
	free := g.txFree[i-1]
	if len(free) < 3 {
		return 0
	}
	n := min(len(data), 0x4000)
	// Three buffers (some may be empty) split at a third and two
	// thirds: chain h uses descriptors 3h..3h+2.
	h := free[0]
	g.txFree[i-1] = free[1:]
	base := portTxBuf(i, h)
	copy(g.Mem[base:], data[:n])
	a, b := n/3, 2*n/3
	bufs := []queuetest.Buf{{Addr: base, Len: uint32(a)}, {Addr: base + uint64(a), Len: uint32(b - a)}, {Addr: base + uint64(b), Len: uint32(n - b)}}
	d := 3 * h
	tx.Chain(tx.DescAddr, d, bufs)
	tx.Publish(d)
	require.NoError(t, g.Kick(3+2*i))
	return n
}

// reclaimTx returns port i's used transmit chains to its free list.
func (g *portsGuest) reclaimTx(i int) {
	tx := g.ptx[i-1]
	for {
		id, _, ok := tx.NextUsed()
		if !ok {
			return
		}
		g.txFree[i-1] = append(g.txFree[i-1], uint16(id)/3)
	}
}

// txIdle reports whether the device returned every chain of port i.
func (g *portsGuest) txIdle(i int) bool {
	g.reclaimTx(i)
	return len(g.txFree[i-1]) == portQSize/3
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

func TestPortsConfigAndHandshake(t *testing.T) {
	g := bootPorts(t, nil, []console.Port{{Name: "org.hpcvmm.control"}, {Name: "b"}})
	assert.Equal(t, uint64(8), g.Read(g.Common+18, 2), "num_queues: port 0, control, two named ports")
	assert.Equal(t, uint64(3), g.Read(g.DevCfg+4, 4), "max_nr_ports")
	g.handshake(t, []string{"org.hpcvmm.control", "b"})
	assert.Empty(t, g.errs.all())
}

// TestPortsRoundTrip plays `cat /dev/vport0p1 > /dev/vport0p2` in the
// guest: 4 MiB of random host input on port 1 come back on port 2 whole and
// in order; the end of port 1's input reaches the guest only after its last
// byte (the guest stops reading when it sees PORT_OPEN(1, 0) and finds
// nothing buffered), and the guest's close of port 2 closes its ToHost
// after every byte.
func TestPortsRoundTrip(t *testing.T) {
	data := randomBytes(t, 4<<20)
	out := &sink{}
	g := bootPorts(t, nil, []console.Port{{Name: "in", FromHost: bytes.NewReader(data)}, {Name: "out", ToHost: out}})
	g.handshake(t, []string{"in", "out"})
	time.Sleep(20 * time.Millisecond)
	assert.Zero(t, g.prx[0].UsedIdx(), "input delivered before the guest opened the port")

	g.send(t, ctl(1, evPortOpen, 1))
	g.send(t, ctl(2, evPortOpen, 1))
	var pending []byte
	received, hostClosed := 0, false
	r := mrand.New(mrand.NewPCG(1, 2))
	deadline := time.Now().Add(60 * time.Second)
	for {
		require.True(t, time.Now().Before(deadline), "stalled: %d of %d bytes received", received, len(data))
		for _, m := range g.drainCtl() {
			g.ctlSeen = append(g.ctlSeen, m)
			if bytes.Equal(m, ctl(1, evPortOpen, 0)) {
				hostClosed = true
			}
		}
		got := g.takePortRx(t, 1)
		received += len(got)
		pending = append(pending, got...)
		for len(pending) > 0 {
			n := g.writePort(t, 2, pending[:min(len(pending), 1+r.IntN(0x4000))])
			if n == 0 {
				break
			}
			pending = pending[n:]
		}
		if hostClosed && len(got) == 0 && len(pending) == 0 && g.txIdle(2) {
			// port_fops_read: the host gone (seen before looking) and
			// nothing buffered: end of file.
			break
		}
		if len(got) == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	assert.Equal(t, len(data), received, "bytes the guest read before end of file")
	g.send(t, ctl(2, evPortOpen, 0)) // cat exits: close(2)
	require.Eventually(t, func() bool { _, c := out.state(); return c }, 10*time.Second, time.Millisecond, "ToHost never closed")
	b, _ := out.state()
	assert.Equal(t, sha256.Sum256(data), sha256.Sum256(b), "port 2's bytes (%d of %d)", len(b), len(data))
	assert.Zero(t, out.afterClose)
	assert.Empty(t, g.errs.all())
	assert.Zero(t, g.Status()&virtio.StatusNeedsReset)
}

// blockingSink is a ToHost whose writes block until released.
type blockingSink struct {
	sink
	gate chan struct{}
}

func (s *blockingSink) Write(p []byte) (int, error) {
	<-s.gate
	return s.sink.Write(p)
}

// TestPortsBackpressureIsolated: a ToHost that blocks holds its own port's
// transmit chains only: another port's output and the console's keep
// flowing; the guest closing the blocked port ends its stream only after
// everything it wrote before arrived, in order.
func TestPortsBackpressureIsolated(t *testing.T) {
	slow := &blockingSink{gate: make(chan struct{})}
	fast := &sink{}
	g := bootPorts(t, nil, []console.Port{{Name: "slow", ToHost: slow}, {Name: "fast", ToHost: fast}})
	g.handshake(t, []string{"slow", "fast"})
	g.send(t, ctl(1, evPortOpen, 1))
	g.send(t, ctl(2, evPortOpen, 1))

	slowData := randomBytes(t, 1<<20)
	fastData := randomBytes(t, 1<<20)
	sent := 0
	for stuck := time.Now(); sent < len(slowData) && time.Since(stuck) < 200*time.Millisecond; {
		n := g.writePort(t, 1, slowData[sent:])
		if n == 0 {
			time.Sleep(time.Millisecond)
			continue
		}
		sent += n
		stuck = time.Now()
	}
	// The slow port's ring and queue fill up: the guest's writer would
	// now sleep on the transmitq interrupt.
	assert.Less(t, sent, len(slowData), "a blocked ToHost took everything: nothing held back")
	held := sent

	// Meanwhile the fast port and the console go on.
	fsent := 0
	deadline := time.Now().Add(20 * time.Second)
	for fsent < len(fastData) {
		require.True(t, time.Now().Before(deadline), "fast port stalled at %d bytes", fsent)
		n := g.writePort(t, 2, fastData[fsent:])
		if n == 0 {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		fsent += n
	}
	require.Eventually(t, func() bool { b, _ := fast.state(); return len(b) == len(fastData) }, 10*time.Second, time.Millisecond)
	b, _ := fast.state()
	assert.True(t, bytes.Equal(fastData, b), "fast port's bytes")
	copy(g.Mem[0x100000:], "console line\n")
	g.tx.Chain(g.tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x100000, Len: 13}})
	g.tx.Publish(0)
	require.NoError(t, g.Kick(1))
	waitUsed(t, g.tx, 1)
	assert.Equal(t, "console line\n", g.out.String())

	// The guest closes the slow port while its chains are held: once the
	// writer is released, everything written before the close arrives, in
	// order, and then the stream ends.
	g.send(t, ctl(1, evPortOpen, 0))
	_, closed := slow.state()
	assert.False(t, closed, "ToHost closed before its held output was written")
	close(slow.gate)
	require.Eventually(t, func() bool { _, c := slow.state(); return c }, 10*time.Second, time.Millisecond)
	assert.True(t, g.txIdle(1), "held chains not returned")
	b, _ = slow.state()
	assert.True(t, bytes.Equal(slowData[:held], b), "slow port's bytes: %d of %d", len(b), held)
	assert.Zero(t, slow.afterClose)
	assert.Empty(t, g.errs.all())
}

// TestPortsEmptyInput: a FromHost that ends before the guest is up gives
// PORT_OPEN(id, 0) at PORT_READY, before the name: the guest's first read
// returns end of file.
func TestPortsEmptyInput(t *testing.T) {
	g := bootPorts(t, nil, []console.Port{{Name: "empty", FromHost: strings.NewReader("")}})
	time.Sleep(20 * time.Millisecond) // the reader sees EOF
	g.postCtl(t, 15, 0x100)
	g.send(t, ctl(badID, evDeviceReady, 1))
	g.msgs(t, 2)
	g.postPortRx(t, 1, 4)
	g.send(t, ctl(1, evPortReady, 1))
	assert.Equal(t, [][]byte{ctl(1, evPortOpen, 0), append(ctl(1, evPortName, 1), "empty"...)}, g.msgs(t, 4))
	g.send(t, ctl(1, evPortOpen, 1))
	time.Sleep(20 * time.Millisecond)
	assert.Zero(t, g.prx[0].UsedIdx())
	assert.Empty(t, g.errs.all())
}

// TestPortsInputWaitsForGuestOpen: data is held while the guest has the
// port closed (Linux discards what arrives then), resumes when it reopens,
// and the end of input follows the last byte.
func TestPortsInputWaitsForGuestOpen(t *testing.T) {
	pr, pw := io.Pipe()
	g := bootPorts(t, nil, []console.Port{{Name: "in", FromHost: pr}})
	g.handshake(t, []string{"in"})
	_, err := pw.Write([]byte("first"))
	require.NoError(t, err)
	time.Sleep(20 * time.Millisecond)
	assert.Zero(t, g.prx[0].UsedIdx(), "delivered to a port the guest has not opened")
	g.send(t, ctl(1, evPortOpen, 1))
	require.Eventually(t, func() bool { return g.prx[0].UsedIdx() == 1 }, 2*time.Second, time.Millisecond)
	assert.Equal(t, "first", string(g.takePortRx(t, 1)))
	g.send(t, ctl(1, evPortOpen, 0))
	go func() {
		pw.Write([]byte("second"))
		pw.Close()
	}()
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, uint16(1), g.prx[0].UsedIdx(), "delivered to a port the guest closed")
	assert.Empty(t, g.drainCtl(), "end of input before its last byte")
	g.send(t, ctl(1, evPortOpen, 1))
	require.Eventually(t, func() bool { return g.prx[0].UsedIdx() == 2 }, 2*time.Second, time.Millisecond)
	assert.Equal(t, "second", string(g.takePortRx(t, 1)))
	require.Eventually(t, func() bool { return g.cin.UsedIdx() == 8 }, 2*time.Second, time.Millisecond)
	assert.Equal(t, [][]byte{ctl(1, evPortOpen, 0)}, g.drainCtl())
}

// TestPortsBadControl: messages for ports that do not exist or out of
// order, and output on a port not set up, are refused through OnError;
// the device keeps running.
func TestPortsBadControl(t *testing.T) {
	out := &sink{}
	g := bootPorts(t, strings.NewReader(""), []console.Port{{Name: "a", ToHost: out}, {Name: "b"}})
	g.postCtl(t, 15, 0x100)
	g.send(t, ctl(1, evPortReady, 1)) // before DEVICE_READY: not added
	g.send(t, ctl(badID, evDeviceReady, 1))
	g.msgs(t, 3)
	g.send(t, ctl(3, evPortReady, 1))
	g.send(t, ctl(1000000, evPortOpen, 1))
	g.send(t, ctl(2, evPortOpen, 1)) // before PORT_READY
	g.send(t, ctl(2, evPortName, 1)) // a device's event
	g.writePort(t, 1, []byte("too early"))
	require.Eventually(t, func() bool { return g.txIdle(1) }, 2*time.Second, time.Millisecond, "chain not returned")
	errs := g.errs.all()
	require.Len(t, errs, 6, "%q", errs)
	assert.Contains(t, errs[0], "control event 3 for port 1 before the device added it")
	assert.Contains(t, errs[1], "control event 3 for port 3: only ports 0 to 2 exist")
	assert.Contains(t, errs[2], "control event 6 for port 1000000: only ports 0 to 2 exist")
	assert.Contains(t, errs[3], "PORT_OPEN for port 2 before PORT_READY")
	assert.Contains(t, errs[4], "unexpected control event 7")
	assert.Contains(t, errs[5], "port 1: transmit chain before the port was set up")
	b, _ := out.state()
	assert.Empty(t, b)
	// PORT_OPEN storms are harmless: then the port works.
	g.send(t, ctl(1, evPortReady, 1))
	g.msgs(t, 5)
	for range 100 {
		g.send(t, ctl(1, evPortOpen, 1))
		g.send(t, ctl(1, evPortOpen, 0))
	}
	assert.Zero(t, g.Status()&virtio.StatusNeedsReset)
}

func TestPortsOptionsValidation(t *testing.T) {
	for _, tc := range []struct {
		ports []console.Port
		want  string
	}{
		{[]console.Port{{Name: ""}}, "ports[0]: name \"\" must be 1 to 255 bytes"},
		{[]console.Port{{Name: "a"}, {Name: "a"}}, "ports[1]: name \"a\" used twice"},
		{[]console.Port{{Name: "a b"}}, "printable ASCII"},
		{[]console.Port{{Name: "a/b"}}, "printable ASCII"},
		{[]console.Port{{Name: strings.Repeat("x", 256)}}, "must be 1 to 255 bytes"},
		{make([]console.Port, 17), "17 ports, at most 16"},
	} {
		_, err := console.New(nil, nil, console.Options{Ports: tc.ports})
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
	}
}
