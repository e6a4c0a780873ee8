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

// span is a guest-physical range the device may write.
type span struct{ lo, hi uint64 }

// fuzzConMemSize is the fuzzed guest's RAM: four rings of 8 entries at
// 0x100 apart, then buffers from 0x1000 (a buffer is at most 64 bytes).
// Every device entry point is followed by a compare of all of it.
const fuzzConMemSize = 0x4000

// fuzzCon is the console and guest memory shared by the fuzz inputs (one
// at a time per process): building a console per input started a reader
// goroutine and waited for it each time, most of an input's cost, and a
// wait that a loaded machine sometimes stretched past its limit. Each
// input resets the device the way a guest does, so it starts from the
// reset state.
var fuzzCon struct {
	once, waitInput sync.Once
	con             *console.Console
	err             error
	mem, fill       queuetest.Memory
	before          []byte
}

func fuzzConsole(t *testing.T) *console.Console {
	fuzzCon.once.Do(func() {
		// Input that never runs out: whatever earlier inputs consumed,
		// more is waiting.
		fuzzCon.con, fuzzCon.err = console.New(endlessInput{}, io.Discard, console.Options{Rows: 24, Cols: 80, OnError: func(error) {}})
		fuzzCon.mem = make(queuetest.Memory, fuzzConMemSize)
		fuzzCon.fill = make(queuetest.Memory, fuzzConMemSize)
		for i := range fuzzCon.fill {
			fuzzCon.fill[i] = 0xaa
		}
		fuzzCon.before = make([]byte, fuzzConMemSize)
	})
	if fuzzCon.err != nil {
		t.Fatal(fuzzCon.err)
	}
	return fuzzCon.con
}

// FuzzConsoleControl drives a MULTIPORT console directly (the device
// goroutine's calls, in the fuzzer's order) with a guest that posts port 0
// and control receive buffers of any size, sends arbitrary and well-formed
// control messages, resizes and breaks the rings. Properties: no panic; the
// device writes guest memory only inside used rings and the device-writable
// buffers the guest posted; every message it sends is a whole message for
// port 0 with an event a device sends; and no host input reaches port 0
// before the guest sent PORT_READY(0, 1) and then PORT_OPEN(0, 1).
func FuzzConsoleControl(f *testing.F) {
	// Linux's sequence: control buffers, DEVICE_READY, port 0 buffers,
	// PORT_READY, PORT_OPEN. Ops are described at the switch below.
	f.Add([]byte{1, 15, 1, 15, 1, 15, 1, 15, 3, 0, 200, 1, 0, 63, 3, 3, 0, 1, 3, 6, 0, 1})
	f.Add([]byte{3, 3, 0, 1, 3, 6, 0, 1, 0, 10, 1, 3, 1, 3, 3, 0, 200, 1, 4, 5, 9, 6})
	f.Add([]byte{2, 4, 1, 2, 3, 4, 2, 8, 0, 0, 0, 0, 3, 0, 1, 0, 7, 0})
	f.Add([]byte{1, 7, 3, 0, 255, 1, 1, 2, 1, 0, 3, 3, 0, 1, 5, 2, 7, 1})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const memSize = fuzzConMemSize
		con := fuzzConsole(t)
		mem := fuzzCon.mem
		copy(mem, fuzzCon.fill)
		drv := [4]*queuetest.Driver{}
		allowed := []span{}
		for q := range drv {
			drv[q] = queuetest.NewDriver(mem, 8, 0x100*uint64(q))
			allowed = append(allowed, span{drv[q].UsedAt, drv[q].End()})
		}
		feat := virtio.FeatureVersion1 | virtio.FeatureEventIdx | console.FeatureSize | console.FeatureMultiport
		qs := make([]*queue.Queue, 4)
		for q := range qs {
			var err error
			qs[q], err = queue.New(mem, drv[q].Config(), feat)
			if err != nil {
				t.Fatal(err)
			}
		}
		// The guest's reset between two inputs (what the transport calls
		// when the driver writes status 0), then a fresh activation: the
		// device starts from its reset state, with host input waiting.
		con.Reset()
		con.SetSize(24, 80)
		if err := con.Activate(feat, qs, &nopIRQ{}); err != nil {
			t.Fatal(err)
		}
		fuzzCon.waitInput.Do(func() {
			// The first activation starts the reader; wait until the host
			// input is read and waiting, so a device that delivers it too
			// early does so within the run. The reader never runs dry,
			// so input is waiting at the start of every later input too.
			pfd := []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
			for deadline := time.Now().Add(time.Minute); ; {
				n, err := unix.Poll(pfd, int(time.Until(deadline)/time.Millisecond)+1)
				if n == 1 {
					break
				}
				if err != unix.EINTR || time.Now().After(deadline) {
					t.Fatalf("host input never became ready: %v", err)
				}
			}
		})

		next := uint64(0x1000) // bump allocator for buffers
		heads := [4]uint16{}
		alloc := func(n uint64) (uint64, bool) {
			if next+n > memSize {
				return 0, false
			}
			a := next
			next += n
			return a, true
		}
		post := func(q int, addr uint64, n uint32, write bool) {
			h := heads[q] % drv[q].Size
			heads[q]++
			drv[q].Chain(drv[q].DescAddr, h, []queuetest.Buf{{Addr: addr, Len: n, Write: write}})
			drv[q].Publish(h)
			if write {
				allowed = append(allowed, span{addr, addr + uint64(n)})
			}
		}
		sentReady, sentOpen := false, false
		observe := func(msg []byte) {
			if len(msg) < 8 || binary.LittleEndian.Uint32(msg) != 0 {
				return
			}
			ev, val := binary.LittleEndian.Uint16(msg[4:]), binary.LittleEndian.Uint16(msg[6:])
			if ev == 3 && val == 1 {
				sentReady = true
			}
			if ev == 6 && val == 1 && sentReady {
				sentOpen = true
			}
		}
		before := fuzzCon.before
		var cinSeen uint16
		// call runs one device entry point and checks the properties; it
		// reports false once the device asked for a reset (the transport
		// stops calling it then).
		call := func(fn func() error) bool {
			copy(before, mem)
			err := fn()
			for i := 0; i < memSize; i++ {
				if i%64 == 0 && bytes.Equal(mem[i:i+64], before[i:i+64]) {
					i += 63 // an unchanged block (memSize is a multiple of 64)
					continue
				}
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
			if drv[0].UsedIdx() != 0 && !sentOpen {
				t.Fatal("host input delivered before the guest sent PORT_READY(0, 1) and PORT_OPEN(0, 1)")
			}
			for ; cinSeen != drv[2].UsedIdx(); cinSeen++ {
				e := mem[drv[2].UsedAt+4+8*uint64(cinSeen%drv[2].Size):]
				id, n := binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])
				if n == 0 {
					continue // a buffer too short for the message
				}
				d := mem[drv[2].DescAddr+16*uint64(id%uint32(drv[2].Size)):]
				addr := binary.LittleEndian.Uint64(d)
				m := mem[addr : addr+uint64(n)]
				ev := binary.LittleEndian.Uint16(m[4:])
				if (n != 8 && n != 12) || binary.LittleEndian.Uint32(m) != 0 || (n == 12) != (ev == 5) ||
					(ev != 1 && ev != 4 && ev != 5 && ev != 6) {
					t.Fatalf("device sent control message % x", m)
				}
			}
			return err == nil
		}

		arg := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			b := ops[*i]
			*i++
			return b
		}
		for i := 0; i < len(ops); {
			op := ops[i] % 8
			i++
			a := arg(&i)
			ok := true
			switch op {
			case 0: // port 0 receive buffer, 1..64 bytes
				n := uint32(a%64) + 1
				addr, fit := alloc(uint64(n))
				if !fit {
					return
				}
				post(0, addr, n, true)
				ok = call(func() error { return con.QueueNotify(0) })
			case 1: // control receive buffer, 1..16 bytes
				n := uint32(a%16) + 1
				addr, fit := alloc(uint64(n))
				if !fit {
					return
				}
				post(2, addr, n, true)
				ok = call(func() error { return con.QueueNotify(2) })
			case 2: // raw control message of a%16 bytes from the input
				n := int(a % 16)
				msg := make([]byte, n)
				for k := range msg {
					msg[k] = arg(&i)
				}
				if n == 0 {
					n = 1 // a zero-length descriptor is legal too; keep one byte
					msg = []byte{0}
				}
				addr, fit := alloc(uint64(n))
				if !fit {
					return
				}
				copy(mem[addr:], msg)
				post(3, addr, uint32(n), false)
				observe(msg)
				ok = call(func() error { return con.QueueNotify(3) })
			case 3: // well-formed header: event a%8, port 0 or junk, value 0..2
				b := arg(&i)
				id := uint32(0)
				if b >= 128 {
					id = 0xffffff00 | uint32(b)
				}
				msg := ctl(id, uint16(a%8), uint16(arg(&i)%3))
				addr, fit := alloc(8)
				if !fit {
					return
				}
				copy(mem[addr:], msg)
				post(3, addr, 8, false)
				observe(msg)
				ok = call(func() error { return con.QueueNotify(3) })
			case 4: // terminal resize
				con.SetSize(uint16(a), uint16(arg(&i)))
				ok = call(con.HandleEvent)
			case 5: // spurious notification
				ok = call(func() error { return con.QueueNotify(int(a % 4)) })
			case 6:
				ok = call(con.HandleEvent)
			case 7: // wrong-direction buffer in a control queue
				addr, fit := alloc(16)
				if !fit {
					return
				}
				if a&1 == 0 {
					post(3, addr, 16, true)
					ok = call(func() error { return con.QueueNotify(3) })
				} else {
					post(2, addr, 16, false)
					ok = call(func() error { return con.QueueNotify(2) })
				}
			}
			if !ok {
				return
			}
		}
	})
}
