package console_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// fuzzSink is a named port's ToHost in FuzzConsolePorts: it records what
// arrives, when it was closed, and can be made to block (a slow host
// reader).
type fuzzSink struct {
	mu       sync.Mutex
	b        []byte
	closed   bool
	closedAt int // len(b) at Close
	late     int // writes after Close
	gate     chan struct{}
	blocked  bool
}

func newFuzzSink() *fuzzSink { return &fuzzSink{gate: make(chan struct{})} }

func (s *fuzzSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	gate, blocked := s.gate, s.blocked
	s.mu.Unlock()
	if blocked {
		<-gate
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		s.late++
	}
	s.b = append(s.b, p...)
	return len(p), nil
}

func (s *fuzzSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.closedAt = len(s.b)
	return nil
}

// block makes later Writes wait; unblock releases them.
func (s *fuzzSink) block() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.blocked {
		s.blocked = true
		s.gate = make(chan struct{})
	}
}

func (s *fuzzSink) unblock() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocked {
		s.blocked = false
		close(s.gate)
	}
}

func (s *fuzzSink) state() (b []byte, closed bool, closedAt, late int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]byte(nil), s.b...), s.closed, s.closedAt, s.late
}

// portIRQ flags an interrupt for a queue the console does not have.
type portIRQ struct{ bad int }

func (c *portIRQ) SignalQueue(q int) {
	if q < 0 || q >= 8 {
		c.bad = q
	}
}
func (c *portIRQ) ConfigChanged() {}

// fuzzStream is named port i's host input in FuzzConsolePorts: n bytes,
// port 1's all below 0x80 and port 2's all from 0x80, so a byte delivered on
// the wrong port breaks the prefix check.
func fuzzStream(i, n int) []byte {
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(k*37+k/128)&0x7f | byte(i-1)<<7
	}
	return b
}

// FuzzConsolePorts drives a MULTIPORT console with two named ports (each
// with a finite host input and a host output) directly, as the device
// goroutine would, in the fuzzer's order: control and receive buffers of
// any size, well-formed and junk control messages for ports 0 to 3, guest
// output on either port split over descriptors, waits for the ports'
// goroutines, a host output that blocks and unblocks, wrong-direction
// buffers. The ports' input chunk and output ring are shrunk to 16 and 48
// bytes, so chunks and held chains are the common case. Properties: no
// panic; the device writes guest memory only in used rings and posted
// writable buffers; every control message is whole and one a device sends
// (PORT_NAME with the port's name); each port's received bytes are a prefix
// of its own host input, delivered only while the guest has the port open;
// PORT_OPEN(i, 0) (end of input) only after all of port i's input was put
// in its used ring; each port's ToHost receives exactly the bytes of the
// transmit chains returned for it, in order, once the writers are given
// time (nothing lost, nothing from another port); it is closed only after
// the guest closed the port, with every byte before it, and never written
// after.
func FuzzConsolePorts(f *testing.F) {
	// Linux's sequence: control buffers, DEVICE_READY, PORT_READY and
	// PORT_OPEN for ports 1 and 2, receive buffers, output, closes.
	f.Add([]byte{1, 31, 1, 31, 1, 31, 1, 31, 1, 31, 1, 31, 1, 31, 1, 31, 2, 0, 0, 1,
		2, 1, 3, 1, 2, 2, 3, 1, 2, 1, 6, 1, 2, 2, 6, 1, 0, 1, 63, 0, 2, 63, 5, 0,
		3, 1, 40, 3, 2, 50, 5, 0, 0, 1, 63, 5, 0, 3, 2, 20, 2, 2, 6, 0, 5, 0}, uint8(30), uint8(40))
	f.Add([]byte{1, 31, 1, 31, 1, 31, 2, 0, 0, 1, 2, 2, 3, 1, 2, 2, 6, 1, 8, 2, 3, 2, 63, 3, 2, 63,
		3, 2, 63, 5, 0, 9, 2, 5, 0, 2, 2, 6, 0, 5, 0}, uint8(0), uint8(0))
	f.Add([]byte{2, 3, 3, 1, 2, 0, 9, 1, 7, 1, 3, 1, 10, 6, 4, 0}, uint8(5), uint8(200))
	f.Fuzz(func(t *testing.T, ops []byte, len1, len2 uint8) {
		// The device is called on this goroutine, so guest memory is not
		// shared: under -race this checks the ports' goroutines' locking.
		restore := console.SetPortBuffers(16, 48)
		defer restore()
		const memSize = 0x8000
		mem := make(queuetest.Memory, memSize)
		streams := [3][]byte{nil, fuzzStream(1, int(len1)), fuzzStream(2, int(len2))}
		sinks := [3]*fuzzSink{nil, newFuzzSink(), newFuzzSink()}
		names := [3]string{"", "p1", "p2"}
		con, err := console.New(nil, io.Discard, console.Options{QueueSize: 8, OnError: func(error) {}, Ports: []console.Port{
			{Name: names[1], FromHost: bytes.NewReader(streams[1]), ToHost: sinks[1]},
			{Name: names[2], FromHost: bytes.NewReader(streams[2]), ToHost: sinks[2]},
		}})
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			sinks[1].unblock()
			sinks[2].unblock()
			con.Close()
		}()
		var drv [8]*queuetest.Driver
		allowed := []span{}
		qs := make([]*queue.Queue, 8)
		feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureMultiport
		for q := range drv {
			drv[q] = queuetest.NewDriver(mem, 8, 0x100*uint64(q))
			allowed = append(allowed, span{drv[q].UsedAt, drv[q].End()})
			qs[q], err = queue.New(mem, drv[q].Config(), feat)
			if err != nil {
				t.Fatal(err)
			}
		}
		irqs := &portIRQ{}
		if err := con.Activate(feat, qs, irqs); err != nil {
			t.Fatal(err)
		}
		pfd := []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}

		next := uint64(0x1000)
		alloc := func(n uint64) (uint64, bool) {
			if next+n > memSize {
				return 0, false
			}
			a := next
			next += n
			return a, true
		}
		// Descriptors are allocated in order around each ring and
		// returned in order (each queue is consumed first in, first out),
		// so a queue may take a chain while its descriptors in flight
		// leave room: a driver never reuses one the device may still read.
		var (
			heads    [8]uint16 // descriptors posted
			returned [8]uint16 // descriptors the device gave back
			ndesc    = map[uint32]uint16{}
			posted   [8][]uint32 // heads in the order they were made available
		)
		post := func(q int, bufs []queuetest.Buf) bool {
			if int(heads[q]-returned[q])+len(bufs) > 8 {
				return false
			}
			h := heads[q] % 8
			heads[q] += uint16(len(bufs))
			ndesc[uint32(q)<<16|uint32(h)] = uint16(len(bufs))
			posted[q] = append(posted[q], uint32(h))
			drv[q].Chain(drv[q].DescAddr, h, bufs)
			drv[q].Publish(h)
			for _, b := range bufs {
				if b.Write {
					allowed = append(allowed, span{b.Addr, b.Addr + uint64(b.Len)})
				}
			}
			return true
		}

		// The guest's view (what Linux would know).
		var (
			added, ready, open, closed [3]bool
			got                        [3][]byte // bytes received per port
			sent                       [3][]byte // bytes of transmit chains returned per port
			queued                     [3][]byte // bytes of transmit chains made available per port
			txBytes                    = map[uint32][]byte{}
			seq                        byte
			usedSeen                   [8]uint16
		)
		before := make([]byte, memSize)
		// used visits queue q's new used entries: head, length written,
		// and the head descriptor's buffer.
		used := func(q int, fn func(h uint32, n uint32, addr uint64, l uint32)) {
			for ; usedSeen[q] != drv[q].UsedIdx(); usedSeen[q]++ {
				e := mem[drv[q].UsedAt+4+8*uint64(usedSeen[q]%8):]
				h, n := binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])
				// Each queue is consumed in order: a used entry must
				// name the next chain made available (Linux marks a
				// queue broken when it names anything else).
				if k := int(usedSeen[q]); k >= len(posted[q]) || posted[q][k] != h {
					t.Fatalf("queue %d: used entry %d names descriptor %d, the chains made available were %v", q, k, h, posted[q])
				}
				returned[q] += ndesc[uint32(q)<<16|h]
				d := mem[drv[q].DescAddr+16*uint64(h):]
				fn(h, n, binary.LittleEndian.Uint64(d), binary.LittleEndian.Uint32(d[8:]))
			}
		}
		call := func(fn func() error) bool {
			copy(before, mem)
			err := fn()
			for i := range mem {
				if mem[i] == before[i] {
					continue
				}
				ok := false
				for _, s := range allowed {
					if uint64(i) >= s.lo && uint64(i) < s.hi {
						ok = true
						break
					}
				}
				if !ok {
					t.Fatalf("device wrote guest byte %#x outside used rings and posted buffers", i)
				}
			}
			used(0, func(uint32, uint32, uint64, uint32) { t.Fatal("port 0 got input; it has none") })
			used(1, func(uint32, uint32, uint64, uint32) {})
			used(3, func(uint32, uint32, uint64, uint32) {})
			for i := 1; i <= 2; i++ {
				// Receive: in order, its own port's bytes, only while open.
				used(2+2*i, func(_, n uint32, addr uint64, l uint32) {
					if n > l {
						t.Fatalf("port %d: %d bytes written into a %d-byte buffer", i, n, l)
					}
					if n > 0 && !open[i] {
						t.Fatalf("port %d: %d bytes delivered while the guest had it closed", i, n)
					}
					got[i] = append(got[i], mem[addr:addr+uint64(n)]...)
					if len(got[i]) > len(streams[i]) || !bytes.Equal(got[i], streams[i][:len(got[i])]) {
						t.Fatalf("port %d received % x, not a prefix of its input", i, got[i])
					}
				})
				q := 3 + 2*i
				used(q, func(h, n uint32, _ uint64, _ uint32) {
					if n != 0 {
						t.Fatalf("port %d transmit chain returned with %d bytes written", i, n)
					}
					sent[i] = append(sent[i], txBytes[uint32(q)<<16|h]...)
				})
			}
			// Control messages, checked after the receive queues: the
			// guest sees data in the used ring before it acts on a
			// PORT_OPEN(i, 0) (port_has_data reads the ring).
			used(2, func(_, n uint32, addr uint64, _ uint32) {
				if n == 0 {
					t.Fatal("control message dropped: the buffers are large enough")
				}
				m := mem[addr:][:n]
				port, ev, val := binary.LittleEndian.Uint32(m), binary.LittleEndian.Uint16(m[4:]), binary.LittleEndian.Uint16(m[6:])
				bad := n < 8 || port > 2
				switch {
				case bad:
				case ev == evPortAdd:
					bad = n != 8 || val != 1
					added[port] = true
				case ev == evConsolePort:
					bad = n != 8 || port != 0
				case ev == evResize:
					bad = n != 12 || port != 0
				case ev == evPortOpen:
					bad = n != 8 || val > 1
					if port > 0 && val == 0 && len(got[port]) != len(streams[port]) {
						t.Fatalf("port %d: end of input after %d of its %d bytes", port, len(got[port]), len(streams[port]))
					}
				case ev == evPortName:
					bad = port == 0 || string(m[8:]) != names[port]
				default:
					bad = true
				}
				if bad {
					t.Fatalf("device sent control message % x", m)
				}
			})
			if irqs.bad != 0 {
				t.Fatalf("interrupt for queue %d", irqs.bad)
			}
			return err == nil
		}
		// settle gives the ports' goroutines d to run, handling the
		// device's host-side events meanwhile.
		settle := func(d time.Duration) bool {
			for deadline := time.Now().Add(d); time.Now().Before(deadline); {
				if k, _ := unix.Poll(pfd, 1); k == 1 && !call(con.HandleEvent) {
					return false
				}
			}
			return true
		}
		arg := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			b := ops[*i]
			*i++
			return b
		}
		ok := true
		for i := 0; i < len(ops) && ok; {
			op := ops[i] % 11
			i++
			a := arg(&i)
			port := 1 + int(a%2)
			switch op {
			case 0: // receive buffer for port 0, 1 or 2 (a%3), 1..64 bytes
				q := [3]int{0, 4, 6}[a%3]
				n := uint32(arg(&i)%64) + 1
				addr, fit := alloc(uint64(n))
				if !fit {
					ok = false
					break
				}
				if post(q, []queuetest.Buf{{Addr: addr, Len: n, Write: true}}) {
					ok = call(func() error { return con.QueueNotify(q) })
				}
			case 1: // control receive buffer, 32..63 bytes (short ones are FuzzConsoleControl's)
				n := uint32(a%32) + 32
				addr, fit := alloc(uint64(n))
				if !fit {
					ok = false
					break
				}
				if post(2, []queuetest.Buf{{Addr: addr, Len: n, Write: true}}) {
					ok = call(func() error { return con.QueueNotify(2) })
				}
			case 2: // control message: id a%4 (3 does not exist) or junk, event, value 0..2
				id := uint32(a % 4)
				if a >= 0xf0 {
					id = 0xffffff00 | uint32(a)
				}
				ev, val := uint16(arg(&i)%8), uint16(arg(&i)%3)
				addr, fit := alloc(8)
				if !fit {
					ok = false
					break
				}
				copy(mem[addr:], ctl(id, ev, val))
				if !post(3, []queuetest.Buf{{Addr: addr, Len: 8}}) {
					break
				}
				// What Linux would now believe (the device refuses the rest).
				if id >= 1 && id <= 2 && val <= 1 {
					switch {
					case ev == evPortReady && added[id] && val == 1:
						ready[id] = true
					case ev == evPortOpen && ready[id]:
						if open[id] && val == 0 {
							closed[id] = true
						}
						open[id] = val == 1
					}
				}
				ok = call(func() error { return con.QueueNotify(3) })
			case 3: // guest output on port (a%2)+1, 1..64 bytes over 1 or 2 buffers
				n := int(arg(&i)%64) + 1
				if !ready[port] || closed[port] {
					// Linux cannot write then (not connected; a closed
					// port's later output is documented as discarded).
					break
				}
				addr, fit := alloc(uint64(n))
				if !fit {
					ok = false
					break
				}
				data := make([]byte, n)
				for k := range data {
					seq++
					data[k] = seq
				}
				copy(mem[addr:], data)
				q := 3 + 2*port
				bufs := []queuetest.Buf{{Addr: addr, Len: uint32(n)}}
				if split := int(a>>1) % n; split > 0 {
					bufs = []queuetest.Buf{{Addr: addr, Len: uint32(split)}, {Addr: addr + uint64(split), Len: uint32(n - split)}}
				}
				h := heads[q] % 8
				if post(q, bufs) {
					txBytes[uint32(q)<<16|uint32(h)] = data
					queued[port] = append(queued[port], data...)
					ok = call(func() error { return con.QueueNotify(q) })
				}
			case 4:
				ok = call(con.HandleEvent)
			case 5: // let the ports' goroutines run
				ok = settle(time.Duration(a%8) * time.Millisecond)
			case 6: // spurious notification
				ok = call(func() error { return con.QueueNotify(int(a % 8)) })
			case 7: // wrong-direction buffer in a named port's queue
				addr, fit := alloc(16)
				if !fit {
					ok = false
					break
				}
				q := 4 + int(a%4)
				if post(q, []queuetest.Buf{{Addr: addr, Len: 16, Write: q%2 == 1}}) {
					ok = call(func() error { return con.QueueNotify(q) })
					if q%2 == 0 {
						// The device reads receive chains only for input:
						// later calls may meet it (and must refuse it).
						continue
					}
				}
			case 8:
				sinks[port].block()
			case 9:
				sinks[port].unblock()
			case 10: // a host-side event while the guest does nothing
				ok = settle(time.Millisecond)
			}
		}
		// The end: release the host outputs and let everything drain. With
		// the device stopped (a ring error), nothing more moves, but what
		// it returned must still reach ToHost.
		sinks[1].unblock()
		sinks[2].unblock()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if ok {
				if k, _ := unix.Poll(pfd, 1); k == 1 {
					ok = call(con.HandleEvent)
				}
			} else {
				time.Sleep(time.Millisecond)
			}
			b1, c1, _, _ := sinks[1].state()
			b2, c2, _, _ := sinks[2].state()
			done := len(b1) >= len(sent[1]) && len(b2) >= len(sent[2])
			// A running device returns every chain in the end.
			for i, b := range [3][]byte{nil, b1, b2} {
				if i > 0 && ok && (heads[3+2*i] != returned[3+2*i] || len(b) != len(queued[i])) {
					done = false
				}
			}
			// A port the guest closed last, with every chain back, must
			// end its stream.
			for i, c := range [3]bool{true, c1, c2} {
				if ok && closed[i] && !open[i] && heads[3+2*i] == returned[3+2*i] && !c {
					done = false
				}
			}
			if done {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("guest output lost or stuck: ToHost got %d and %d bytes (closed %v %v), the device returned chains of %d and %d",
					len(b1), len(b2), c1, c2, len(sent[1]), len(sent[2]))
			}
		}
		for i := 1; i <= 2; i++ {
			// ToHost has every byte of the chains returned, and what it
			// has more (a chain copied in part and held) is the next
			// bytes the guest queued: in order, this port's only.
			b, isClosed, at, late := sinks[i].state()
			if len(b) < len(sent[i]) || !bytes.HasPrefix(queued[i], b) {
				t.Fatalf("port %d: ToHost got % x; the chains returned held % x, all queued % x", i, b, sent[i], queued[i])
			}
			if late != 0 {
				t.Fatalf("port %d: %d writes after Close", i, late)
			}
			if isClosed && !closed[i] {
				t.Fatalf("port %d: ToHost closed without the guest closing the port", i)
			}
			if isClosed && at != len(b) {
				t.Fatalf("port %d: ToHost closed after %d of its %d bytes", i, at, len(b))
			}
			if isClosed && ok && at != len(queued[i]) {
				t.Fatalf("port %d: ToHost closed after %d of the %d bytes queued before the guest closed the port", i, at, len(queued[i]))
			}
		}
	})
}
