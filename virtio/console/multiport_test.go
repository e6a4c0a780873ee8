package console_test

import (
	"encoding/binary"
	"io"
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

// Control events and ids as virtio 1.x 5.3.6.2 numbers them, written out
// here rather than taken from the package so the tests check the wire.
const (
	evDeviceReady = 0
	evPortAdd     = 1
	evPortReady   = 3
	evConsolePort = 4
	evResize      = 5
	evPortOpen    = 6
	badID         = 0xffffffff // VIRTIO_CONSOLE_BAD_ID, Linux's id for DEVICE_READY

	featMultiport = uint64(1) << 1

	cinVec  = 3
	coutVec = 4

	rxBufs  = 0x200000 // port 0 receive buffers, 4 KiB apart
	cinBufs = 0x300000 // control receive buffers, 0x100 apart
	outBufs = 0x380000 // control messages the driver sends, 0x100 apart
)

// ctl encodes struct virtio_console_control (le32 id, le16 event, le16
// value), followed by extra.
func ctl(id uint32, event, value uint16, extra ...uint16) []byte {
	b := binary.LittleEndian.AppendUint32(nil, id)
	b = binary.LittleEndian.AppendUint16(b, event)
	b = binary.LittleEndian.AppendUint16(b, value)
	for _, e := range extra {
		b = binary.LittleEndian.AppendUint16(b, e)
	}
	return b
}

// errLog collects what the console reports through Options.OnError.
type errLog struct {
	mu   sync.Mutex
	errs []string
}

func (l *errLog) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err.Error())
}

func (l *errLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.errs...)
}

// mpGuest is a guest whose driver accepted MULTIPORT: port 0's queues and
// the control queues, laid out by queuetest drivers.
type mpGuest struct {
	*transporttest.Rig
	con               *console.Console
	rx, tx, cin, cout *queuetest.Driver
	out               *testenv.LockedBuffer
	errs              *errLog
	nextRx, nextCin   uint16
	nextOut           uint16
}

// newRig builds the console over a transport rig without starting a driver.
func newRig(t *testing.T, in io.Reader) (*transporttest.Rig, *console.Console, *testenv.LockedBuffer, *errLog) {
	t.Helper()
	if raceEnabled {
		t.Skip("guest memory is shared with the device goroutine without Go synchronization, as with a real guest")
	}
	out := &testenv.LockedBuffer{}
	errs := &errLog{}
	con, err := console.New(in, out, console.Options{Rows: 24, Cols: 80, QueueSize: 64, OnError: errs.add})
	require.NoError(t, err)
	rig, err := transporttest.NewRig(con, make(queuetest.Memory, 4<<20))
	require.NoError(t, err)
	t.Cleanup(func() {
		rig.T.Close()
		con.Close()
	})
	return rig, con, out, errs
}

// bootMultiport brings the device up as Linux's virtio_console does with
// MULTIPORT, up to DRIVER_OK: vectors for config and all four queues, the
// queues in the multiport layout (port 0 rx, port 0 tx, control rx,
// control tx). No buffers are posted yet.
func bootMultiport(t *testing.T, in io.Reader) *mpGuest {
	rig, con, out, errs := newRig(t, in)
	g := &mpGuest{Rig: rig, con: con, out: out, errs: errs}
	g.EnableMSIX(5)
	_, st := g.Negotiate(virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureSize | featMultiport)
	require.NotZero(t, st&virtio.StatusFeaturesOK, "MULTIPORT accepted")
	require.Equal(t, uint16(cfgVec), g.SetConfigVector(cfgVec))
	g.rx = queuetest.NewDriver(g.Mem, 64, 0x1000)
	g.tx = queuetest.NewDriver(g.Mem, 64, 0x10000)
	g.cin = queuetest.NewDriver(g.Mem, 16, 0x20000)
	g.cout = queuetest.NewDriver(g.Mem, 16, 0x28000)
	require.Equal(t, uint16(rxVec), g.SetupQueue(0, g.rx, rxVec))
	require.Equal(t, uint16(txVec), g.SetupQueue(1, g.tx, txVec))
	require.Equal(t, uint16(cinVec), g.SetupQueue(2, g.cin, cinVec))
	require.Equal(t, uint16(coutVec), g.SetupQueue(3, g.cout, coutVec))
	g.DriverOK()
	require.Equal(t, uint8(0xf), g.Status())
	return g
}

// postCtl adds n 64-byte control receive buffers (Linux's fill_queue on
// c_ivq) and kicks.
func (g *mpGuest) postCtl(t *testing.T, n int, size uint32) {
	t.Helper()
	for range n {
		h := g.nextCin % g.cin.Size
		g.cin.Chain(g.cin.DescAddr, h, []queuetest.Buf{{Addr: cinBufs + 0x100*uint64(h), Len: size, Write: true}})
		g.cin.Publish(h)
		g.nextCin++
	}
	require.NoError(t, g.Kick(2))
}

// postRx adds n 4 KiB receive buffers for port 0 (add_port's fill_queue)
// and kicks.
func (g *mpGuest) postRx(t *testing.T, n int) {
	t.Helper()
	for range n {
		h := g.nextRx % g.rx.Size
		g.rx.Chain(g.rx.DescAddr, h, []queuetest.Buf{{Addr: rxBufs + 0x1000*uint64(h), Len: 4096, Write: true}})
		g.rx.Publish(h)
		g.nextRx++
	}
	require.NoError(t, g.Kick(0))
}

// send puts msg on the control transmitq and waits until the device used
// it, as Linux's __send_control_msg busy-waits.
func (g *mpGuest) send(t *testing.T, msg []byte) {
	t.Helper()
	h := g.nextOut % g.cout.Size
	addr := outBufs + 0x100*uint64(h)
	copy(g.Mem[addr:], msg)
	g.cout.Chain(g.cout.DescAddr, h, []queuetest.Buf{{Addr: addr, Len: uint32(len(msg))}})
	g.cout.Publish(h)
	g.nextOut++
	require.NoError(t, g.Kick(3))
	waitUsed(t, g.cout, g.nextOut)
	id, n, ok := g.cout.NextUsed()
	require.True(t, ok)
	require.Equal(t, uint32(h), id, "the used entry names another chain than the message's (Linux marks the queue broken)")
	assert.Zero(t, n, "the device writes nothing into a control message it reads")
}

// ctlMsgs waits until the device has used at least want control receive
// buffers in all and returns the messages of the ones not read yet.
func (g *mpGuest) ctlMsgs(t *testing.T, want uint16) [][]byte {
	t.Helper()
	require.Eventually(t, func() bool { return int16(g.cin.UsedIdx()-want) >= 0 }, 2*time.Second, time.Millisecond,
		"control messages: %d, want %d", g.cin.UsedIdx(), want)
	return g.drainCtl()
}

// drainCtl returns the control messages the device sent since the last
// call.
func (g *mpGuest) drainCtl() [][]byte {
	var msgs [][]byte
	for {
		id, n, ok := g.cin.NextUsed()
		if !ok {
			return msgs
		}
		addr := cinBufs + 0x100*uint64(id)
		msgs = append(msgs, append([]byte(nil), g.Mem[addr:addr+uint64(n)]...))
	}
}

// handshake runs the Linux sequence up to and including the driver's
// PORT_OPEN(0, 1), checking the device's messages byte for byte.
func (g *mpGuest) handshake(t *testing.T) {
	t.Helper()
	g.postCtl(t, 8, 64)
	g.send(t, ctl(badID, evDeviceReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evPortAdd, 1)}, g.ctlMsgs(t, 1), "DEVICE_READY is answered with PORT_ADD for port 0")
	g.postRx(t, 4)
	g.send(t, ctl(0, evPortReady, 1))
	assert.Equal(t, [][]byte{
		ctl(0, evConsolePort, 1),
		ctl(0, evPortOpen, 1),
		ctl(0, evResize, 0, 80, 24), // columns, then rows
	}, g.ctlMsgs(t, 4), "PORT_READY is answered with CONSOLE_PORT, PORT_OPEN and the size")
	g.send(t, ctl(0, evPortOpen, 1))
}

func TestMultiportOffered(t *testing.T) {
	rig, _, _, _ := newRig(t, nil)
	offered, _ := rig.Negotiate(virtio.FeatureVersion1)
	assert.Equal(t, console.FeatureSize|featMultiport, offered&0xffffff, "device features")
	assert.Equal(t, uint64(4), rig.Read(rig.Common+18, 2), "num_queues: port 0 pair and control pair")
	assert.Equal(t, uint64(1), rig.Read(rig.DevCfg+4, 4), "max_nr_ports")
}

// TestMultiportHoldsLaunchInputUntilPortOpen plays Linux's probe with
// MULTIPORT while input given at launch waits: port 0's receive buffers are
// posted before the driver has listed the port (add_port fills the queue
// first) and before it keeps data for it (init_port_console, on
// CONSOLE_PORT), so nothing may arrive in them until the driver's
// PORT_OPEN(0, 1); then the line arrives whole.
func TestMultiportHoldsLaunchInputUntilPortOpen(t *testing.T) {
	const line = "line given at launch\n"
	g := bootMultiport(t, strings.NewReader(line))
	time.Sleep(50 * time.Millisecond) // hpcvmm reads stdin to EOF

	g.postCtl(t, 8, 64)
	g.send(t, ctl(badID, evDeviceReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evPortAdd, 1)}, g.ctlMsgs(t, 1))
	require.NoError(t, g.WaitInterrupt(cinVec, 2*time.Second), "control receiveq interrupt")

	g.postRx(t, 2) // add_port: buffers before the port is listed
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, uint16(0), g.rx.UsedIdx(), "input delivered before PORT_READY")

	g.send(t, ctl(0, evPortReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evConsolePort, 1), ctl(0, evPortOpen, 1), ctl(0, evResize, 0, 80, 24)}, g.ctlMsgs(t, 4))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, uint16(0), g.rx.UsedIdx(), "input delivered before the driver opened port 0")

	g.send(t, ctl(0, evPortOpen, 1)) // init_port_console: guest_connected
	waitUsed(t, g.rx, 1)
	require.NoError(t, g.WaitInterrupt(rxVec, 2*time.Second))
	id, n, ok := g.rx.NextUsed()
	require.True(t, ok)
	assert.Equal(t, line, string(g.Mem[rxBufs+0x1000*uint64(id):][:n]))
	assert.Empty(t, g.errs.all())
	assert.Zero(t, g.Status()&virtio.StatusNeedsReset)
}

func TestMultiportTransmitAndLaterInput(t *testing.T) {
	pr, pw := io.Pipe()
	t.Cleanup(func() { pw.Close() })
	g := bootMultiport(t, pr)
	g.handshake(t)

	copy(g.Mem[0x100000:], "from the guest\n")
	g.tx.Chain(g.tx.DescAddr, 0, []queuetest.Buf{{Addr: 0x100000, Len: 15}})
	g.tx.Publish(0)
	require.NoError(t, g.Kick(1))
	waitUsed(t, g.tx, 1)
	assert.Equal(t, "from the guest\n", g.out.String())

	_, err := pw.Write([]byte("typed later"))
	require.NoError(t, err)
	waitUsed(t, g.rx, 1)
	id, n, _ := g.rx.NextUsed()
	assert.Equal(t, "typed later", string(g.Mem[rxBufs+0x1000*uint64(id):][:n]))

	// The driver closing port 0 holds input back again.
	g.send(t, ctl(0, evPortOpen, 0))
	go pw.Write([]byte("held"))
	time.Sleep(50 * time.Millisecond)
	assert.Equal(t, uint16(1), g.rx.UsedIdx(), "input delivered to a closed port")
	g.send(t, ctl(0, evPortOpen, 1))
	waitUsed(t, g.rx, 2)
	id, n, _ = g.rx.NextUsed()
	assert.Equal(t, "held", string(g.Mem[rxBufs+0x1000*uint64(id):][:n]))
}

// TestMultiportResize: with MULTIPORT Linux takes the size only from
// RESIZE control messages, so SetSize sends one instead of a
// configuration-change interrupt.
func TestMultiportResize(t *testing.T) {
	g := bootMultiport(t, nil)
	g.handshake(t)
	g.con.SetSize(50, 132)
	assert.Equal(t, [][]byte{ctl(0, evResize, 0, 132, 50)}, g.ctlMsgs(t, 5))
	assert.False(t, g.Interrupted(cfgVec), "no configuration-change interrupt under MULTIPORT")
	g.con.SetSize(50, 132)
	time.Sleep(20 * time.Millisecond)
	assert.Equal(t, uint16(5), g.cin.UsedIdx(), "no RESIZE when nothing changed")
	assert.Equal(t, uint64(132), g.Read(g.DevCfg, 2), "config space still has the size")
}

// TestMultiportResizeBeforeConsole: a size set before the port is a
// console goes out right after CONSOLE_PORT, not before (Linux would drop
// it).
func TestMultiportResizeBeforeConsole(t *testing.T) {
	g := bootMultiport(t, nil)
	g.con.SetSize(30, 100)
	g.postCtl(t, 8, 64)
	g.send(t, ctl(badID, evDeviceReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evPortAdd, 1)}, g.ctlMsgs(t, 1))
	g.send(t, ctl(0, evPortReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evConsolePort, 1), ctl(0, evPortOpen, 1), ctl(0, evResize, 0, 100, 30)}, g.ctlMsgs(t, 4))
}

// TestMultiportBadControlMessages: malformed or out-of-place driver
// messages are ignored (no reply, no input, the device keeps running) and
// reported, at most ctlErrBurst (10) in a burst.
func TestMultiportBadControlMessages(t *testing.T) {
	g := bootMultiport(t, strings.NewReader("secret\n"))
	g.postCtl(t, 8, 64)
	g.postRx(t, 2)
	bad := []struct {
		msg  []byte
		want string
	}{
		{ctl(0, evPortReady, 1)[:4], "short control message: 4 bytes"},
		{ctl(0, evPortReady, 1), "PORT_READY for port 0 before the device added it"},
		{ctl(0, evPortOpen, 1), "PORT_OPEN for port 0 before PORT_READY"},
		{ctl(0, 42, 1), "unexpected control event 42"},
		{ctl(0, evConsolePort, 1), "unexpected control event 4"},
		{ctl(badID, evDeviceReady, 0), "DEVICE_READY 0"},
		{ctl(badID, evDeviceReady, 7), "value 7"},
	}
	for _, b := range bad {
		g.send(t, b.msg)
	}
	time.Sleep(30 * time.Millisecond)
	assert.Equal(t, uint16(0), g.cin.UsedIdx(), "a bad message got a reply")
	errs := g.errs.all()
	require.Len(t, errs, len(bad))
	for i, b := range bad {
		assert.Contains(t, errs[i], b.want)
	}

	// Now a proper DEVICE_READY, then wrong ports and values.
	g.send(t, ctl(badID, evDeviceReady, 1))
	assert.Equal(t, [][]byte{ctl(0, evPortAdd, 1)}, g.ctlMsgs(t, 1))
	g.send(t, ctl(1, evPortReady, 1)) // wrong port: report 8
	g.send(t, ctl(0, evPortReady, 0)) // driver failed: 9
	g.send(t, ctl(7, evPortOpen, 1))  // 10, the last of the burst
	g.send(t, ctl(0, evPortOpen, 1))  // before PORT_READY: suppressed
	g.send(t, ctl(0, evPortReady, 2)) // suppressed
	for range 50 {
		g.send(t, ctl(0, 99, 0)) // a flood: suppressed
	}
	time.Sleep(30 * time.Millisecond)
	assert.Equal(t, uint16(1), g.cin.UsedIdx(), "a bad message got a reply")
	assert.Equal(t, uint16(0), g.rx.UsedIdx(), "input delivered without the handshake")
	errs = g.errs.all()
	require.Len(t, errs, 10, "reports past the burst: %q", errs)
	assert.Contains(t, errs[7], "control event 3 for port 1: only port 0 exists")
	assert.Contains(t, errs[8], "PORT_READY 0")
	assert.Contains(t, errs[9], "control event 6 for port 7")
	assert.Zero(t, g.Status()&virtio.StatusNeedsReset, "bad messages do not break the device")

	// The handshake still works afterwards.
	g.send(t, ctl(0, evPortReady, 1))
	assert.Len(t, g.ctlMsgs(t, 4), 3)
	g.send(t, ctl(0, evPortOpen, 1))
	waitUsed(t, g.rx, 1)
	id, n, _ := g.rx.NextUsed()
	assert.Equal(t, "secret\n", string(g.Mem[rxBufs+0x1000*uint64(id):][:n]))
}

// TestMultiportShortControlBuffer: a control receive buffer too small for
// the message is returned with nothing written (a partial message would be
// read as a whole one), reported, and the device goes on.
func TestMultiportShortControlBuffer(t *testing.T) {
	g := bootMultiport(t, nil)
	for i := range 0x100 {
		g.Mem[cinBufs+i] = 0xee
	}
	g.postCtl(t, 1, 4)
	g.send(t, ctl(badID, evDeviceReady, 1))
	waitUsed(t, g.cin, 1)
	_, n, _ := g.cin.NextUsed()
	assert.Zero(t, n)
	assert.Equal(t, []byte{0xee, 0xee, 0xee, 0xee, 0xee}, []byte(g.Mem[cinBufs:cinBufs+5]), "bytes written into a short buffer")
	errs := g.errs.all()
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "control receive buffer of 4 bytes for a 8-byte message")
	assert.Zero(t, g.Status()&virtio.StatusNeedsReset)
}

// TestMultiportRingViolations: buffers of the wrong direction in the
// control queues break the protocol like in port 0's queues: the device
// asks for a reset.
func TestMultiportRingViolations(t *testing.T) {
	t.Run("writable buffer in control transmitq", func(t *testing.T) {
		g := bootMultiport(t, nil)
		g.cout.Chain(g.cout.DescAddr, 0, []queuetest.Buf{{Addr: outBufs, Len: 8, Write: true}})
		g.cout.Publish(0)
		require.NoError(t, g.Kick(3))
		require.Eventually(t, func() bool { return g.Status()&virtio.StatusNeedsReset != 0 }, 2*time.Second, time.Millisecond)
	})
	t.Run("readable buffer in control receiveq", func(t *testing.T) {
		g := bootMultiport(t, nil)
		g.cin.Chain(g.cin.DescAddr, 0, []queuetest.Buf{{Addr: cinBufs, Len: 64}})
		g.cin.Publish(0)
		require.NoError(t, g.Kick(2))
		g.send(t, ctl(badID, evDeviceReady, 1))
		require.Eventually(t, func() bool { return g.Status()&virtio.StatusNeedsReset != 0 }, 2*time.Second, time.Millisecond)
	})
	t.Run("MULTIPORT without control queues", func(t *testing.T) {
		rig, _, _, _ := newRig(t, nil)
		rig.EnableMSIX(3)
		_, st := rig.Negotiate(virtio.FeatureVersion1 | featMultiport)
		require.NotZero(t, st&virtio.StatusFeaturesOK)
		rig.SetupQueue(0, queuetest.NewDriver(rig.Mem, 64, 0x1000), 1)
		rig.SetupQueue(1, queuetest.NewDriver(rig.Mem, 64, 0x10000), 2)
		rig.DriverOK()
		assert.NotZero(t, rig.Status()&virtio.StatusNeedsReset, "activation refused")
	})
}

// linuxPort is what Linux's virtio_console knows of port 0 in the model
// below.
type linuxPort struct {
	listed    bool // on portdev->ports: in_intr finds it
	connected bool // guest_connected: in_intr keeps its data
	kept      []byte
	discarded int
}

// takeRx plays in_intr for every used receive buffer: data for a port that
// is not listed is flushed (flush_bufs), data for a port not connected is
// discarded (discard_port_data), anything else is kept.
func (p *linuxPort) takeRx(mem queuetest.Memory, rx *queuetest.Driver) {
	for {
		id, n, ok := rx.NextUsed()
		if !ok {
			return
		}
		if p.listed && p.connected {
			p.kept = append(p.kept, mem[rxBufs+0x1000*uint64(id):][:n]...)
		} else {
			p.discarded += int(n)
		}
	}
}

// TestConsoleLinuxProbeKeepsLaunchInput models Linux 6.1's virtio_console
// probe against whatever the device offers (it accepts F_SIZE and
// F_MULTIPORT when offered), with the worst case of its race: the device's
// interrupt for data put in port 0's first buffers is handled before the
// driver lists the port (no MULTIPORT: add_port fills the queue, then lists
// the port) or before it connects it (MULTIPORT: init_port_console runs on
// CONSOLE_PORT, after the port was listed). Input given at launch must all
// be kept. Without MULTIPORT (hpcvmm before issue 19) the line is lost.
func TestConsoleLinuxProbeKeepsLaunchInput(t *testing.T) {
	const line = "given at launch, before the driver probed\n"
	rig, _, _, _ := newRig(t, strings.NewReader(line))
	time.Sleep(50 * time.Millisecond)                       // hpcvmm reads stdin to EOF
	settle := func() { time.Sleep(100 * time.Millisecond) } // the device's chance to race the driver

	offered, _ := rig.Negotiate(virtio.FeatureVersion1)
	feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx | offered&(console.FeatureSize|featMultiport)
	g := &mpGuest{Rig: rig}
	var port linuxPort
	if feat&featMultiport == 0 {
		g.EnableMSIX(3)
		_, st := g.Negotiate(feat)
		require.NotZero(t, st&virtio.StatusFeaturesOK)
		g.rx = queuetest.NewDriver(g.Mem, 64, 0x1000)
		g.tx = queuetest.NewDriver(g.Mem, 64, 0x10000)
		g.SetupQueue(0, g.rx, rxVec)
		g.SetupQueue(1, g.tx, txVec)
		g.DriverOK()
		// add_port(0): fill_queue, init_port_console (connected), then list.
		g.postRx(t, 4)
		port.connected = true
		settle()
		port.takeRx(g.Mem, g.rx)
		port.listed = true
	} else {
		g.EnableMSIX(5)
		_, st := g.Negotiate(feat)
		require.NotZero(t, st&virtio.StatusFeaturesOK)
		g.rx = queuetest.NewDriver(g.Mem, 64, 0x1000)
		g.tx = queuetest.NewDriver(g.Mem, 64, 0x10000)
		g.cin = queuetest.NewDriver(g.Mem, 16, 0x20000)
		g.cout = queuetest.NewDriver(g.Mem, 16, 0x28000)
		g.SetupQueue(0, g.rx, rxVec)
		g.SetupQueue(1, g.tx, txVec)
		g.SetupQueue(2, g.cin, cinVec)
		g.SetupQueue(3, g.cout, coutVec)
		g.DriverOK()
		g.postCtl(t, 8, 4096)
		g.send(t, ctl(badID, evDeviceReady, 1))
		// control_work_handler: handle messages until the port is connected.
		deadline := time.Now().Add(5 * time.Second)
		for !port.connected {
			require.True(t, time.Now().Before(deadline), "handshake stalled")
			msgs := g.drainCtl()
			if len(msgs) == 0 {
				time.Sleep(time.Millisecond)
				continue
			}
			for _, m := range msgs {
				require.GreaterOrEqual(t, len(m), 8)
				id := binary.LittleEndian.Uint32(m)
				ev := binary.LittleEndian.Uint16(m[4:])
				require.Zero(t, id, "message for a port that does not exist")
				switch ev {
				case evPortAdd: // add_port: fill_queue, list, PORT_READY
					g.postRx(t, 4)
					settle()
					port.takeRx(g.Mem, g.rx)
					port.listed = true
					g.send(t, ctl(0, evPortReady, 1))
				case evConsolePort: // init_port_console: connect, PORT_OPEN
					settle()
					port.takeRx(g.Mem, g.rx)
					port.connected = true
					g.send(t, ctl(0, evPortOpen, 1))
				}
			}
		}
	}
	require.Eventually(t, func() bool {
		port.takeRx(g.Mem, g.rx)
		return len(port.kept)+port.discarded >= len(line)
	}, 2*time.Second, time.Millisecond, "input never arrived")
	assert.Zero(t, port.discarded, "bytes the driver discarded (features %#x)", feat&0xffffff)
	assert.Equal(t, line, string(port.kept))
}
