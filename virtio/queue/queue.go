// Package queue implements the device side of a virtio 1.x split virtqueue
// (descriptor table, available ring, used ring) over guest memory, treating
// the guest as hostile: every descriptor's address and length is checked
// against guest RAM, chains are bounded (a loop ends as an error), and
// indirect tables are validated. A bad chain is an error the device turns
// into DEVICE_NEEDS_RESET; nothing the guest writes can panic this code.
//
// Processing a request allocates nothing: Pop iterates a chain into a
// caller-owned Chain whose segment array is allocated once.
//
// Ordering with the guest (another CPU writing the rings) follows the virtio
// spec's barriers, and comes from the accesses themselves: every 16-bit
// ring field (the indices, flags, used_event, avail_event and the avail
// ring's entries) is read and written with one sync/atomic operation
// (uapi.AtomicLoadUint16/AtomicStoreUint16), which the Go memory model makes
// atomic and sequentially consistent. So the avail index is read before the
// entries it publishes, used entries are written before the used index, and
// publishing used entries or re-arming notifications is ordered before
// reading the driver's suppression fields, without separate fences. The
// ring addresses are checked for the alignment virtio requires (avail 2,
// used 4 bytes), so no field straddles a word.
package queue

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// MaxSize is the largest queue size a device offers.
const MaxSize = 1024

// Descriptor flags, ring flags and the ring feature bits (virtio 1.x 2.7).
const (
	DescFlagNext     = 1
	DescFlagWrite    = 2
	DescFlagIndirect = 4

	AvailFlagNoInterrupt = 1
	UsedFlagNoNotify     = 1

	// FeatureIndirectDesc is VIRTIO_F_INDIRECT_DESC (bit 28).
	FeatureIndirectDesc = uint64(1) << 28
	// FeatureEventIdx is VIRTIO_F_EVENT_IDX (bit 29).
	FeatureEventIdx = uint64(1) << 29

	descSize = 16
)

// GuestMemory is guest RAM as the queue needs it: Slice returns the n bytes
// at guest-physical gpa, aliasing guest memory, or an error when any of them
// is outside RAM. guestmem.Memory implements it.
type GuestMemory interface {
	Slice(gpa, n uint64) ([]byte, error)
}

// Segment is one descriptor's buffer.
type Segment struct {
	Addr     uint64 // guest-physical address
	Buf      []byte // guest memory, len = descriptor length
	Writable bool   // device-writable (VIRTQ_DESC_F_WRITE)
}

// Chain is one request: the head index to return in the used ring and its
// buffers, device-readable ones first.
type Chain struct {
	Head     uint16
	Segments []Segment
	// ReadableLen and WritableLen sum the segment lengths of each kind.
	ReadableLen, WritableLen uint64
}

// NewChain returns a Chain with room for max segments; Pop never grows it.
// MaxSize segments hold any legal chain (the spec bounds a chain, indirect
// or not, by the queue size).
func NewChain(max int) *Chain {
	return &Chain{Segments: make([]Segment, 0, max)}
}

// Config is a queue's driver-programmed layout.
type Config struct {
	Size   uint16 // power of two, 1..MaxSize
	Desc   uint64 // descriptor table, 16-byte aligned
	Driver uint64 // available ring, 2-byte aligned
	Device uint64 // used ring, 4-byte aligned
}

// Queue is the device side of one split virtqueue. It is used by one
// goroutine at a time (the device's worker).
type Queue struct {
	mem      GuestMemory
	size     uint16
	desc     []byte
	avail    ring16 // flags, idx, ring[size], used_event
	used     ring16 // flags, idx, ring[size]{id, len}, avail_event
	usedRing []byte // the used ring's entries, written before used.idx
	eventIdx bool
	indirect bool

	lastAvail uint16 // next avail ring slot to consume
	usedIdx   uint16 // next used ring slot to fill (shadow of used.idx)
	signalled uint16 // used index when the interrupt decision was last made
}

// ring16 is a ring's 16-bit fields as atomic accesses. sync/atomic's
// narrowest operations are 32-bit, so words is the ring widened to whole
// aligned 32-bit words of guest RAM (at most 2 bytes each side, in the same
// page, hence in RAM whenever the ring is) and base is the ring's offset in
// it.
type ring16 struct {
	words []byte
	base  uint64
}

// newRing16 looks up the n-byte ring at gpa (2-byte aligned) widened to
// whole aligned words.
func newRing16(mem GuestMemory, gpa, n uint64) (ring16, error) {
	lo := gpa &^ 3
	hi := (gpa + n + 3) &^ 3
	if hi < gpa {
		return ring16{}, fmt.Errorf("%#x+%d wraps the address space", gpa, n)
	}
	w, err := mem.Slice(lo, hi-lo)
	if err != nil {
		return ring16{}, err
	}
	if uint64(len(w)) != hi-lo || !uapi.Aligned4(w) {
		return ring16{}, fmt.Errorf("guest memory at %#x is not 4-byte aligned on the host or came back short", lo)
	}
	return ring16{words: w, base: gpa - lo}, nil
}

func (r ring16) load(off uint64) uint16     { return uapi.AtomicLoadUint16(r.words, r.base+off) }
func (r ring16) store(off uint64, v uint16) { uapi.AtomicStoreUint16(r.words, r.base+off, v) }

// New validates cfg against guest memory and the negotiated features and
// returns the queue. The rings are looked up once here: guest RAM never moves.
func New(mem GuestMemory, cfg Config, features uint64) (*Queue, error) {
	n := uint64(cfg.Size)
	if n == 0 || n > MaxSize || n&(n-1) != 0 {
		return nil, fmt.Errorf("virtqueue: size %d is not a power of two in 1-%d", cfg.Size, MaxSize)
	}
	if cfg.Desc%16 != 0 || cfg.Driver%2 != 0 || cfg.Device%4 != 0 {
		return nil, fmt.Errorf("virtqueue: misaligned rings desc %#x (16) driver %#x (2) device %#x (4)", cfg.Desc, cfg.Driver, cfg.Device)
	}
	q := &Queue{
		mem: mem, size: cfg.Size,
		eventIdx: features&FeatureEventIdx != 0,
		indirect: features&FeatureIndirectDesc != 0,
	}
	var err error
	if q.desc, err = mem.Slice(cfg.Desc, descSize*n); err != nil {
		return nil, fmt.Errorf("virtqueue: descriptor table at %#x (%d entries): %w", cfg.Desc, n, err)
	}
	// flags, idx, ring[n], used_event
	if q.avail, err = newRing16(mem, cfg.Driver, 6+2*n); err != nil {
		return nil, fmt.Errorf("virtqueue: available ring at %#x (%d entries): %w", cfg.Driver, n, err)
	}
	// flags, idx, ring[n]{id, len}, avail_event
	if q.used, err = newRing16(mem, cfg.Device, 6+8*n); err != nil {
		return nil, fmt.Errorf("virtqueue: used ring at %#x (%d entries): %w", cfg.Device, n, err)
	}
	q.usedRing = q.used.words[q.used.base+4 : q.used.base+4+8*n]
	if len(q.desc) < int(descSize*n) {
		return nil, fmt.Errorf("virtqueue: guest memory returned short ring slices")
	}
	// The driver initializes the used ring to zero before enabling; taking
	// its index from memory keeps us consistent if it did not.
	q.usedIdx = q.used.load(2)
	q.lastAvail = q.usedIdx
	q.signalled = q.usedIdx
	return q, nil
}

// Size returns the queue size.
func (q *Queue) Size() uint16 { return q.size }

// LastAvail returns the index of the next available entry Pop will consume.
func (q *Queue) LastAvail() uint16 { return q.lastAvail }

// UsedIndex returns the device's used index.
func (q *Queue) UsedIndex() uint16 { return q.usedIdx }

// availIdx is the driver's avail.idx: an atomic load, so the ring entries
// and descriptors read after it are the ones it publishes.
func (q *Queue) availIdx() uint16 { return q.avail.load(2) }

// Pop fills c with the next available chain. It returns false with no error
// when the ring is empty. On error the queue is unusable until reset: the
// caller marks the device DEVICE_NEEDS_RESET.
func (q *Queue) Pop(c *Chain) (bool, error) {
	c.Segments = c.Segments[:0]
	c.ReadableLen, c.WritableLen = 0, 0
	idx := q.availIdx()
	if idx == q.lastAvail {
		return false, nil
	}
	if uint16(idx-q.lastAvail) > q.size {
		return false, fmt.Errorf("virtqueue: available index %d is %d entries ahead of %d, queue size %d", idx, uint16(idx-q.lastAvail), q.lastAvail, q.size)
	}
	slot := uint64(q.lastAvail & (q.size - 1))
	head := q.avail.load(4 + 2*slot)
	if head >= q.size {
		return false, fmt.Errorf("virtqueue: available entry %d names descriptor %d, queue size %d", q.lastAvail, head, q.size)
	}
	if err := q.walk(head, c); err != nil {
		return false, err
	}
	c.Head = head
	q.lastAvail++
	return true, nil
}

// walk follows the chain from head, switching to an indirect table when it
// meets one. Each table bounds its own walk by its entry count, so a loop in
// either ends as an error.
func (q *Queue) walk(head uint16, c *Chain) error {
	table := q.desc
	entries := uint64(q.size)
	budget := entries
	i := uint64(head)
	inIndirect := false
	sawWritable := false
	for {
		if i >= entries {
			return fmt.Errorf("virtqueue: chain from head %d: next index %d outside table of %d", head, i, entries)
		}
		if budget == 0 {
			return fmt.Errorf("virtqueue: chain from head %d: longer than its table of %d descriptors (loop)", head, entries)
		}
		budget--
		d := table[descSize*i : descSize*i+descSize]
		addr := binary.LittleEndian.Uint64(d[0:])
		length := binary.LittleEndian.Uint32(d[8:])
		flags := binary.LittleEndian.Uint16(d[12:])
		next := binary.LittleEndian.Uint16(d[14:])

		if flags&DescFlagIndirect != 0 {
			switch {
			case !q.indirect:
				return fmt.Errorf("virtqueue: chain from head %d: indirect descriptor without VIRTIO_F_INDIRECT_DESC", head)
			case inIndirect:
				return fmt.Errorf("virtqueue: chain from head %d: nested indirect descriptor", head)
			case flags&DescFlagNext != 0:
				return fmt.Errorf("virtqueue: chain from head %d: indirect descriptor with NEXT set", head)
			case length == 0 || length%descSize != 0:
				return fmt.Errorf("virtqueue: chain from head %d: indirect table length %d is not a non-zero multiple of 16", head, length)
			}
			t, err := q.mem.Slice(addr, uint64(length))
			if err != nil {
				return fmt.Errorf("virtqueue: chain from head %d: indirect table %#x+%d: %w", head, addr, length, err)
			}
			if len(t) != int(length) {
				return fmt.Errorf("virtqueue: chain from head %d: indirect table %#x+%d: guest memory returned %d bytes", head, addr, length, len(t))
			}
			table = t
			entries = uint64(length / descSize)
			budget = entries
			i = 0
			inIndirect = true
			continue
		}

		writable := flags&DescFlagWrite != 0
		if !writable && sawWritable {
			return fmt.Errorf("virtqueue: chain from head %d: device-readable descriptor after a device-writable one", head)
		}
		if len(c.Segments) == cap(c.Segments) {
			return fmt.Errorf("virtqueue: chain from head %d: more than %d descriptors", head, cap(c.Segments))
		}
		buf, err := q.mem.Slice(addr, uint64(length))
		if err != nil {
			return fmt.Errorf("virtqueue: chain from head %d: buffer %#x+%d: %w", head, addr, length, err)
		}
		if len(buf) != int(length) {
			return fmt.Errorf("virtqueue: chain from head %d: buffer %#x+%d: guest memory returned %d bytes", head, addr, length, len(buf))
		}
		sawWritable = sawWritable || writable
		c.Segments = append(c.Segments, Segment{Addr: addr, Buf: buf, Writable: writable})
		if writable {
			c.WritableLen += uint64(length)
		} else {
			c.ReadableLen += uint64(length)
		}
		if flags&DescFlagNext == 0 {
			return nil
		}
		i = uint64(next)
	}
}

// Push returns chain head to the driver with written bytes of device-written
// data, publishing it immediately.
func (q *Queue) Push(head uint16, written uint32) error {
	if head >= q.size {
		return fmt.Errorf("virtqueue: push head %d outside queue of %d", head, q.size)
	}
	e := q.usedRing[8*uint64(q.usedIdx&(q.size-1)):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	// Entry before index: the index store is atomic, so the entry's
	// plain stores are visible before it.
	q.usedIdx++
	q.used.store(2, q.usedIdx)
	return nil
}

// Fill writes the used entry offset places past the used index (head, with
// written bytes) without publishing it; Flush publishes filled entries. A
// device that returns several chains for one request (virtio-net's
// mergeable receive buffers) fills them all and flushes once, so the driver
// never sees part of the request.
func (q *Queue) Fill(offset, head uint16, written uint32) error {
	if head >= q.size || offset >= q.size {
		return fmt.Errorf("virtqueue: fill head %d at offset %d outside queue of %d", head, offset, q.size)
	}
	e := q.usedRing[8*uint64((q.usedIdx+offset)&(q.size-1)):]
	binary.LittleEndian.PutUint32(e[0:], uint32(head))
	binary.LittleEndian.PutUint32(e[4:], written)
	return nil
}

// Flush publishes the n entries written by Fill at offsets 0..n-1 with one
// used-index store (entries before index, as in Push).
func (q *Queue) Flush(n uint16) {
	q.usedIdx += n
	q.used.store(2, q.usedIdx)
}

// NeedInterrupt reports whether the driver wants an interrupt for the
// entries pushed since the last call (used_event with EVENT_IDX, else the
// NO_INTERRUPT flag). Call it once after pushing a batch.
func (q *Queue) NeedInterrupt() bool {
	due := q.InterruptDue()
	q.signalled = q.usedIdx
	return due
}

// InterruptDue reports what NeedInterrupt would, without recording the
// decision: entries pushed since the last NeedInterrupt stay undecided. A
// device that defers an interrupt asks this first and NeedInterrupt when
// the deferral ends; the driver may have taken the entries and moved
// used_event past them meanwhile, and then needs none.
func (q *Queue) InterruptDue() bool {
	// The used index was published by an atomic store and the driver's
	// fields below are atomic loads: sequentially consistent, so the
	// driver either sees the new index or we see its new used_event.
	old, cur := q.signalled, q.usedIdx
	if old == cur {
		return false
	}
	if q.eventIdx {
		ev := q.avail.load(4 + 2*uint64(q.size))
		// vring_need_event: did cur step past ev since old?
		return uint16(cur-ev-1) < uint16(cur-old)
	}
	return q.avail.load(0)&AvailFlagNoInterrupt == 0
}

// DisableNotify asks the driver not to kick while the device is processing.
// With EVENT_IDX the stale avail_event already does that, so it is a no-op.
func (q *Queue) DisableNotify() {
	if !q.eventIdx {
		q.used.store(0, q.used.load(0)|UsedFlagNoNotify)
	}
}

// EnableNotify asks the driver to kick for the next available entry and
// reports whether entries arrived meanwhile (then the caller must keep
// processing, since the driver may not kick for them).
func (q *Queue) EnableNotify() bool {
	// Atomic store, then atomic load: the driver either sees the re-armed
	// notification or we see its new entries.
	if q.eventIdx {
		q.used.store(4+8*uint64(q.size), q.lastAvail)
	} else {
		q.used.store(0, q.used.load(0)&^UsedFlagNoNotify)
	}
	return q.availIdx() != q.lastAvail
}

// HasAvailable reports whether Pop would find an entry.
func (q *Queue) HasAvailable() bool { return q.availIdx() != q.lastAvail }
