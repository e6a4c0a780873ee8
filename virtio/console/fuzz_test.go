package console_test

import (
	"bytes"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// chanReader is the host's stdin: each chunk the harness sends is returned
// by Read (in as many reads as the console's buffer needs).
type chanReader struct {
	ch   chan []byte
	rest []byte
	// waiting is set while Read waits for the next chunk: the console has
	// handed on (and been told it consumed) everything sent so far.
	waiting atomic.Bool
}

func (r *chanReader) Read(p []byte) (int, error) {
	if len(r.rest) == 0 {
		r.waiting.Store(true)
		b, ok := <-r.ch
		r.waiting.Store(false)
		if !ok {
			return 0, io.EOF
		}
		r.rest = b
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// irqCheck is the transport side: it records queue interrupts and flags any
// for a queue the console does not have.
type irqCheck struct{ bad int }

func (c *irqCheck) SignalQueue(q int) {
	if q != 0 && q != 1 {
		c.bad = q
	}
}
func (c *irqCheck) ConfigChanged() {}

const (
	fuzzQueue    = 16
	fuzzMaxInput = 4096 // one chunk of host input per fuzz input
)

// consoleRig is FuzzConsole's device and guest memory, one per process.
type consoleRig struct {
	con       *console.Console
	in        *chanReader
	out       bytes.Buffer
	irq       irqCheck
	mem       *queuetest.SplitMemory
	h         queuetest.Hostile
	rx, tx    queuetest.Ring
	low, high []byte // snapshots before the device runs
	pattern   []byte // what High holds before the device runs
	priv      queuetest.Memory
	pollFD    []unix.PollFd
	wr        []queuetest.Range
}

func newConsoleRig(tb testing.TB) *consoleRig {
	r := &consoleRig{in: &chanReader{ch: make(chan []byte)}}
	con, err := console.New(r.in, &r.out, console.Options{Rows: 24, Cols: 80, QueueSize: fuzzQueue})
	if err != nil {
		tb.Fatal(err)
	}
	r.con = con
	r.mem = queuetest.NewSplitMemory(0x1000, 0x4000)
	r.rx, r.tx = queuetest.NewRing(0, fuzzQueue), queuetest.NewRing(0x400, fuzzQueue)
	r.h = queuetest.Hostile{Mem: r.mem, Indirect: 0x800}
	r.low, r.high = make([]byte, len(r.mem.Low)), make([]byte, len(r.mem.High))
	r.pattern = make([]byte, len(r.mem.High))
	for i := range r.pattern {
		r.pattern[i] = byte(i*7 + i>>8)
	}
	r.priv = make(queuetest.Memory, 1<<16)
	r.pollFD = []unix.PollFd{{Fd: int32(con.EventFD()), Events: unix.POLLIN}}
	return r
}

// flush hands whatever host input the console still holds to a private
// receive queue with room for all of it, until the console's reader waits
// for more, so the next input starts with none (what a guest driver reading
// all input would leave). One round is not always enough: the eventfd the
// harness waits on for host input also carries the deferred transmit
// interrupt's timer, so the ops may run, and a first flush round may come,
// before the reader has published the input.
func (r *consoleRig) flush(tb testing.TB) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.con.Reset()
		d := queuetest.NewDriver(r.priv, 8, 0)
		for k := uint16(0); k < 4; k++ {
			d.Chain(d.DescAddr, k, []queuetest.Buf{{Addr: 0x1000 * uint64(k+1), Len: fuzzMaxInput, Write: true}})
			d.Publish(k)
		}
		q, err := queue.New(r.priv, d.Config(), 0)
		if err != nil {
			tb.Fatal(err)
		}
		if err := r.con.Activate(virtio.FeatureVersion1, []*queue.Queue{q, nil, nil, nil}, &r.irq); err != nil {
			tb.Fatal(err)
		}
		if err := r.con.HandleEvent(); err != nil {
			tb.Fatal(err)
		}
		if err := r.con.QueueNotify(0); err != nil {
			tb.Fatal(err)
		}
		// The reader goes back to waiting as soon as it runs (usually
		// within a few yields); it signals the eventfd if it publishes
		// input instead.
		for i := 0; i < 1000 && !r.in.waiting.Load(); i++ {
			runtime.Gosched()
		}
		if r.in.waiting.Load() {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("the console still holds host input after 30 s of flushing into empty buffers")
		}
		_, _ = unix.Poll(r.pollFD, 1)
	}
	r.con.Reset()
}

// FuzzConsole is a hostile guest driving virtio-console's device side: the
// fuzzer writes both queues' descriptor tables, available rings (any index,
// so "too many entries" too) and an indirect-table area, picks the ring
// features and the host input, and orders the device's calls (receive and
// transmit notifications, host-input events, configuration reads). Buffers
// lie above a hole in guest RAM, so the rings cannot alias them. One console
// per process; each input's host bytes are flushed after it.
//
// It asserts: nothing panics; the device writes guest memory only in the two
// used rings and in the device-writable buffers of receive chains it
// returned; transmit chains come back with length 0 and the host output is
// exactly their readable bytes in order; receive chains come back with at
// most their writable length and, read in order, they hold exactly a prefix
// of the host input; used entries name descriptors of the queue; queue
// interrupts name the console's two queues; configuration reads return
// cols, rows, max_nr_ports = 1 and zeros elsewhere.
func FuzzConsole(f *testing.F) {
	// rx: one 64-byte writable buffer; tx: a 2-descriptor chain.
	rings := make([]byte, 0, 1024)
	desc := queuetest.Desc
	avail := func(idx uint16, heads ...uint16) []byte { return queuetest.Avail(fuzzQueue, idx, heads...) }
	rings = append(rings, desc(0x100, 64, queue.DescFlagWrite, 0)...)
	rings = append(rings, make([]byte, 16*(fuzzQueue-1))...)
	rings = append(rings, avail(1, 0)...)
	rings = append(rings, desc(0x200, 5, queue.DescFlagNext, 1)...)
	rings = append(rings, desc(0x300, 7, 0, 0)...)
	rings = append(rings, make([]byte, 16*(fuzzQueue-2))...)
	rings = append(rings, avail(1, 0)...)
	f.Add(rings, []byte("hello guest"), []byte{0, 1, 2, 3}, uint8(3))
	f.Add(rings, []byte{}, []byte{1, 0, 0}, uint8(0))

	r := newConsoleRig(f)
	f.Fuzz(func(t *testing.T, rings, input, ops []byte, features uint8) {
		input = input[:min(len(input), fuzzMaxInput)]
		var feat uint64 = virtio.FeatureVersion1 | console.FeatureSize
		if features&1 != 0 {
			feat |= queue.FeatureEventIdx
		}
		if features&2 != 0 {
			feat |= queue.FeatureIndirectDesc
		}
		qs := r.h.Queues(t, rings, r.pattern, feat, r.rx, r.tx)
		rxq, txq := qs[0], qs[1]
		r.out.Reset()
		r.irq = irqCheck{}
		defer r.flush(t)
		if err := r.con.Activate(feat, []*queue.Queue{rxq, txq, nil, nil}, &r.irq); err != nil {
			t.Fatal(err)
		}
		if len(input) > 0 {
			// Generous timeouts: the CI machine is shared and loaded; a
			// timeout here means the console kept earlier input or lost the
			// signal, not that it was slow.
			select {
			case r.in.ch <- append([]byte(nil), input...):
			case <-time.After(30 * time.Second):
				t.Fatal("the console's reader did not take host input within 30 s: it still holds earlier input")
			}
			// Poll again after EINTR: Go's preemption signal (SIGURG)
			// interrupts it now and then, which is no fault of the device.
			k, err := unix.Poll(r.pollFD, 30000)
			for err == unix.EINTR {
				k, err = unix.Poll(r.pollFD, 30000)
			}
			if k != 1 || err != nil {
				t.Fatalf("host input never signalled the console's eventfd (%d, %v)", k, err)
			}
		}
		copy(r.low, r.mem.Low)
		copy(r.high, r.mem.High)

		img := [12]byte{80, 0, 24, 0, 1}
		var cb [16]byte
		for i, op := range ops[:min(len(ops), 32)] {
			var err error
			switch op % 4 {
			case 0:
				err = r.con.QueueNotify(0)
			case 1:
				err = r.con.QueueNotify(1)
			case 2:
				err = r.con.HandleEvent()
			case 3:
				off, w := int(op>>2%16)-2, int(op>>6)*4+i%4
				for k := range cb {
					cb[k] = 0xa5
				}
				r.con.ReadConfig(off, cb[:w])
				for k := 0; k < w; k++ {
					want := byte(0)
					if off >= 0 && off+k < len(img) {
						want = img[off+k]
					}
					if cb[k] != want {
						t.Fatalf("ReadConfig(%d, %d bytes) = %x", off, w, cb[:w])
					}
				}
			}
			if err != nil {
				break // the transport would now set DEVICE_NEEDS_RESET and stop calling the device
			}
		}
		if r.irq.bad != 0 {
			t.Fatalf("interrupt for queue %d", r.irq.bad)
		}
		r.check(t, input)
	})
}

func (r *consoleRig) check(t *testing.T, input []byte) {
	// Used rings: entries name descriptors; collect the chains' buffers.
	r.wr = r.wr[:0]
	var txChains [][]queuetest.Range
	rx := r.h.CheckUsed(t, r.rx, "receive")
	for _, c := range rx {
		r.wr = append(r.wr, c.Writable...)
	}
	for _, c := range r.h.CheckUsed(t, r.tx, "transmit") {
		if c.Len != 0 {
			t.Fatalf("transmit chain %d returned with length %d: the device writes nothing to it", c.ID, c.Len)
		}
		txChains = append(txChains, c.Readable)
	}
	// Ring memory: only the used rings changed; buffer memory: only
	// writable buffers of returned receive chains.
	r.h.CheckWrites(t, r.low, r.high, []queuetest.Ring{r.rx, r.tx}, r.wr)
	// Host output: the transmit chains' readable bytes, in order, unless a
	// receive chain's buffer overlapped them (then the bytes changed under
	// the device, as they may).
	var want []byte
	check := true
	for _, rd := range txChains {
		for _, s := range rd {
			if _, err := r.mem.Slice(s.Addr, s.Len); err != nil || s.Addr < r.mem.HighBase {
				t.Fatalf("transmitted chain has buffer %#x+%#x outside the buffer memory", s.Addr, s.Len)
			}
			check = check && !queuetest.Overlap(append(r.wr[:len(r.wr):len(r.wr)], s))
			rel := s.Addr - r.mem.HighBase
			want = append(want, r.high[rel:rel+s.Len]...)
		}
	}
	if check && !bytes.Equal(r.out.Bytes(), want) {
		t.Fatalf("host output %q, the transmitted chains hold %q", r.out.Bytes(), want)
	}
	// Guest input: the receive chains, in order, hold a prefix of the host
	// input (unless their buffers overlap, so later data overwrote earlier).
	if queuetest.Overlap(r.wr) {
		return
	}
	got := r.h.Written(rx)
	if len(got) > len(input) || !bytes.Equal(got, input[:len(got)]) {
		t.Fatalf("receive buffers hold %q, host input was %q", got, input)
	}
}
