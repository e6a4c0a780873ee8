package net

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

const (
	// rxBudget bounds the packets one pass moves in each direction before
	// the worker looks at the other one (and at its stop eventfd).
	rxBudget = 64
	txBudget = 64
	// rxBufSize holds the largest packet a TAP hands out: header plus a
	// 64 KiB GSO frame.
	rxBufSize = HeaderSize + maxFrame
	// maxIOV is IOV_MAX: a transmit chain with more segments is dropped.
	maxIOV = 1024
)

type pairStats struct {
	txPackets, txBytes, txDropped atomic.Uint64
	rxPackets, rxBytes, rxDropped atomic.Uint64
}

func (s *pairStats) addTo(t *Stats) {
	t.TxPackets += s.txPackets.Load()
	t.TxBytes += s.txBytes.Load()
	t.TxDropped += s.txDropped.Load()
	t.RxPackets += s.rxPackets.Load()
	t.RxBytes += s.rxBytes.Load()
	t.RxDropped += s.rxDropped.Load()
}

type usedEntry struct {
	head uint16
	len  uint32
}

// pair is the userspace data path of one queue pair: receive queue 2i,
// transmit queue 2i+1, backend fd i. One goroutine runs it; everything
// below is allocated once in newPair.
type pair struct {
	idx              int
	rxIdx, txIdx     int // queue indices, for interrupts
	rxq, txq         *queue.Queue
	rxKick, txKick   int
	tap              int
	wakeFD           int
	features         uint64
	mergeable        bool
	irq              virtio.Interrupter
	active           *atomic.Int32
	fail             func(error)
	report           func(error)
	stopping         atomic.Bool
	done             chan struct{}
	broken           bool
	waitRx           bool // no receive buffers: wait for the driver's kick
	tapDead          bool // the TAP queue reported an error on poll
	stats            pairStats
	txChain          *queue.Chain
	iov              []unix.Iovec
	hdr              [HeaderSize]byte
	rxFirst, rxChain *queue.Chain
	buf              []byte
	pendLen, copied  int // packet in buf waiting for receive buffers
	used             []usedEntry
	pfds             [4]unix.PollFd
	drain            [8]byte
}

func newPair(idx int, rxq, txq *queue.Queue, rxKick, txKick, tap int, features uint64, intr virtio.Interrupter) (*pair, error) {
	wake, err := irq.NewEventFD()
	if err != nil {
		return nil, fmt.Errorf("virtio-net pair %d: %w", idx, err)
	}
	p := &pair{
		idx: idx, rxIdx: 2 * idx, txIdx: 2*idx + 1, rxq: rxq, txq: txq,
		rxKick: rxKick, txKick: txKick, tap: tap, wakeFD: wake,
		features: features, mergeable: features&FeatureMrgRxbuf != 0, irq: intr,
		done:    make(chan struct{}),
		txChain: queue.NewChain(queue.MaxSize),
		iov:     make([]unix.Iovec, 0, maxIOV),
		rxFirst: queue.NewChain(queue.MaxSize),
		rxChain: queue.NewChain(queue.MaxSize),
		buf:     make([]byte, rxBufSize),
		used:    make([]usedEntry, queue.MaxSize),
	}
	return p, nil
}

func (p *pair) wake() {
	if err := irq.SignalEventFD(p.wakeFD); err != nil && p.report != nil {
		p.report(fmt.Errorf("virtio-net pair %d: wake worker: %w", p.idx, err))
	}
}

// stop ends the worker and waits for it.
func (p *pair) stop() {
	p.stopping.Store(true)
	p.wake()
	<-p.done
	unix.Close(p.wakeFD)
	p.wakeFD = -1
}

// startWorkers starts one goroutine per pair with both queues enabled.
func (d *Device) startWorkers(features uint64, queues []*queue.Queue) {
	var ws []*pair
	for i := 0; i < d.pairs; i++ {
		rxq, txq := queues[2*i], queues[2*i+1]
		if rxq == nil && txq == nil {
			continue
		}
		p, err := newPair(i, rxq, txq, d.fds[2*i].Kick, d.fds[2*i+1].Kick, d.backend.QueueFDs()[i], features, d.irq)
		if err != nil {
			d.report(err)
			continue
		}
		p.active, p.fail, p.report = &d.active, d.fail, d.report
		ws = append(ws, p)
	}
	d.statsMu.Lock()
	d.workers = ws
	d.statsMu.Unlock()
	for _, p := range ws {
		go p.run()
	}
}

// run is the worker loop: move what can be moved, then sleep in poll on
// the two doorbells, the TAP (only when there is somewhere to put a packet)
// and the wake eventfd.
func (p *pair) run() {
	defer close(p.done)
	for !p.stopping.Load() {
		more := false
		if !p.broken {
			m, err := p.process()
			if err != nil {
				p.broken = true
				if p.fail != nil {
					p.fail(err)
				}
			}
			more = m
		}
		timeout := -1
		if more {
			timeout = 0
		}
		if err := p.wait(timeout); err != nil {
			if p.report != nil {
				p.report(err)
			}
			return
		}
	}
}

// process runs one transmit and one receive pass; more reports that a
// budget ran out and the worker should come back without sleeping.
func (p *pair) process() (more bool, err error) {
	if p.txq != nil {
		m, err := p.transmit()
		if err != nil {
			return false, err
		}
		more = more || m
	}
	if p.rxq != nil && p.idx < int(p.active.Load()) && !p.waitRx {
		m, err := p.receive()
		if err != nil {
			return false, err
		}
		more = more || m
	}
	return more, nil
}

func (p *pair) wait(timeout int) error {
	f := &p.pfds
	f[0] = unix.PollFd{Fd: int32(p.txKick), Events: unix.POLLIN}
	f[1] = unix.PollFd{Fd: int32(p.rxKick), Events: unix.POLLIN}
	f[2] = unix.PollFd{Fd: -1}
	if !p.broken && !p.waitRx && !p.tapDead && p.rxq != nil && p.idx < int(p.active.Load()) {
		f[2] = unix.PollFd{Fd: int32(p.tap), Events: unix.POLLIN}
	}
	f[3] = unix.PollFd{Fd: int32(p.wakeFD), Events: unix.POLLIN}
	for {
		_, err := unix.Poll(f[:], timeout)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("virtio-net pair %d: poll: %w", p.idx, err)
		}
	}
	if f[0].Revents&unix.POLLIN != 0 {
		irq.DrainEventFD(p.txKick, p.drain[:])
	}
	if f[2].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
		// The interface went away under us: stop polling it rather than
		// spin; transmit keeps dropping and counting.
		p.tapDead = true
		if p.report != nil {
			p.report(fmt.Errorf("virtio-net pair %d: TAP queue fd %d reports an error (interface deleted?); receive stopped", p.idx, p.tap))
		}
	}
	if f[1].Revents&unix.POLLIN != 0 {
		irq.DrainEventFD(p.rxKick, p.drain[:])
		p.waitRx = false
	}
	if f[3].Revents&unix.POLLIN != 0 {
		irq.DrainEventFD(p.wakeFD, p.drain[:])
		p.waitRx = false // the set of active pairs may have changed
	}
	return nil
}

// transmit sends up to txBudget chains from the transmit queue, with
// notifications off meanwhile, and interrupts once for the batch.
func (p *pair) transmit() (more bool, err error) {
	q := p.txq
	n := 0
	defer func() {
		if n > 0 && q.NeedInterrupt() {
			p.irq.SignalQueue(p.txIdx)
		}
	}()
	for {
		q.DisableNotify()
		for n < txBudget {
			ok, err := q.Pop(p.txChain)
			if err != nil {
				return false, fmt.Errorf("virtio-net pair %d transmit: %w", p.idx, err)
			}
			if !ok {
				break
			}
			p.send(p.txChain)
			if err := q.Push(p.txChain.Head, 0); err != nil {
				return false, err
			}
			n++
		}
		if n == txBudget {
			return true, nil
		}
		if !q.EnableNotify() {
			return false, nil
		}
	}
}

// send writes one transmit chain to the TAP: a validated copy of the
// header, then the frame straight from guest memory. A packet the guest got
// wrong, or the host refused, is dropped and counted, as a NIC would.
func (p *pair) send(c *queue.Chain) {
	n := gather(c, p.hdr[:])
	frameLen := int(c.ReadableLen) - HeaderSize
	h, ok := ParseHeader(p.hdr[:n])
	if !ok || ValidateTx(h, frameLen, p.features) != nil {
		p.stats.txDropped.Add(1)
		return
	}
	h.NumBuffers = 0
	h.Put(p.hdr[:])
	iov := append(p.iov[:0], unix.Iovec{Base: &p.hdr[0]})
	iov[0].SetLen(HeaderSize)
	skip := HeaderSize
	for _, s := range c.Segments {
		if s.Writable {
			break
		}
		b := s.Buf
		if skip > 0 {
			k := min(skip, len(b))
			b, skip = b[k:], skip-k
		}
		if len(b) == 0 {
			continue
		}
		if len(iov) == cap(iov) {
			p.stats.txDropped.Add(1)
			return
		}
		v := unix.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	if _, err := uapi.Writev(p.tap, iov); err != nil {
		// EAGAIN (socket buffer full), EIO (interface down), EBADFD
		// (queue detached): the packet is lost, like on a wire.
		p.stats.txDropped.Add(1)
		return
	}
	p.stats.txPackets.Add(1)
	p.stats.txBytes.Add(uint64(frameLen))
}

// receive moves up to rxBudget packets from the TAP into receive buffers
// and interrupts once for the batch.
func (p *pair) receive() (more bool, err error) {
	q := p.rxq
	delivered := 0
	defer func() {
		if delivered > 0 && q.NeedInterrupt() {
			p.irq.SignalQueue(p.rxIdx)
		}
	}()
	for delivered < rxBudget {
		if p.pendLen == 0 {
			// Read only when there is a buffer to put the packet in, so
			// the kernel's queue (not ours) absorbs a slow guest.
			if !q.HasAvailable() {
				if q.EnableNotify() {
					continue
				}
				p.waitRx = true
				return false, nil
			}
			n, err := unix.Read(p.tap, p.buf)
			if err != nil {
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					return false, nil
				}
				p.stats.rxDropped.Add(1)
				if p.report != nil {
					p.report(fmt.Errorf("virtio-net pair %d: read TAP: %w", p.idx, err))
				}
				return false, nil
			}
			if n < HeaderSize+minFrame {
				p.stats.rxDropped.Add(1)
				continue
			}
			p.pendLen, p.copied = n, 0
			p.used = p.used[:0]
		}
		done, err := p.deliver()
		if err != nil {
			return false, fmt.Errorf("virtio-net pair %d receive: %w", p.idx, err)
		}
		if !done {
			// Out of buffers part-way: keep the packet and the buffers
			// taken so far, and wait for the driver to add more.
			if q.EnableNotify() {
				continue
			}
			p.waitRx = true
			return false, nil
		}
		delivered++
	}
	return true, nil
}

// deliver copies the pending packet into receive buffers; done is false
// when the queue ran dry first. With mergeable buffers a packet spans as
// many chains as it needs, all published together; without, it must fit
// one chain or it is dropped (the chain goes back empty).
func (p *pair) deliver() (done bool, err error) {
	q := p.rxq
	for p.copied < p.pendLen {
		c := p.rxChain
		if len(p.used) == 0 {
			c = p.rxFirst
		}
		if len(p.used) == int(q.Size()) {
			return false, fmt.Errorf("packet of %d bytes does not fit the whole receive queue", p.pendLen)
		}
		ok, err := q.Pop(c)
		if err != nil {
			return false, err
		}
		if !ok {
			return false, nil
		}
		if c.WritableLen == 0 {
			return false, errNoRxBuffer
		}
		if len(p.used) == 0 && c.WritableLen < HeaderSize {
			return false, errRxHeaderSplit
		}
		rest := p.pendLen - p.copied
		if !p.mergeable && c.WritableLen < uint64(rest) {
			p.stats.rxDropped.Add(1)
			p.pendLen = 0
			return true, q.Push(c.Head, 0)
		}
		n := scatter(c, 0, p.buf[p.copied:p.pendLen])
		p.used = append(p.used, usedEntry{head: c.Head, len: uint32(n)})
		p.copied += n
	}
	var nb [2]byte
	binary.LittleEndian.PutUint16(nb[:], uint16(len(p.used)))
	scatter(p.rxFirst, 10, nb[:])
	for i, u := range p.used {
		if err := q.Fill(uint16(i), u.head, u.len); err != nil {
			return false, err
		}
	}
	q.Flush(uint16(len(p.used)))
	p.stats.rxPackets.Add(1)
	p.stats.rxBytes.Add(uint64(p.pendLen - HeaderSize))
	p.pendLen = 0
	return true, nil
}

// scatter copies src into the chain's writable buffers starting at byte
// off of them and returns the bytes copied.
func scatter(c *queue.Chain, off int, src []byte) int {
	n := 0
	for _, s := range c.Segments {
		if !s.Writable {
			continue
		}
		b := s.Buf
		if off >= len(b) {
			off -= len(b)
			continue
		}
		b, off = b[off:], 0
		k := copy(b, src[n:])
		n += k
		if n == len(src) {
			break
		}
	}
	return n
}
