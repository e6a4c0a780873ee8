package queuetest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
)

// SplitMemory is guest RAM for fuzzing devices against a hostile driver:
// Low at guest-physical 0 holds the rings and indirect tables, High at
// HighBase the buffers, with a hole between (as RAM sits around the PCI
// hole), so no buffer can overlap a ring or a descriptor table. That keeps
// what the device read from the rings equal to what the harness wrote,
// whatever the device writes into buffers, and lets a check tell exactly
// which bytes the device was allowed to write.
type SplitMemory struct {
	Low, High []byte
	HighBase  uint64
}

// NewSplitMemory returns low and high regions of the given sizes; high
// starts at 4 GiB.
func NewSplitMemory(low, high int) *SplitMemory {
	return &SplitMemory{Low: make([]byte, low), High: make([]byte, high), HighBase: 1 << 32}
}

// Slice implements queue.GuestMemory: [gpa, gpa+n) must lie in one region.
func (m *SplitMemory) Slice(gpa, n uint64) ([]byte, error) {
	if gpa <= uint64(len(m.Low)) && n <= uint64(len(m.Low))-gpa {
		return m.Low[gpa : gpa+n : gpa+n], nil
	}
	if gpa >= m.HighBase {
		rel := gpa - m.HighBase
		if rel <= uint64(len(m.High)) && n <= uint64(len(m.High))-rel {
			return m.High[rel : rel+n : rel+n], nil
		}
	}
	return nil, fmt.Errorf("guest memory: %#x+%#x outside RAM", gpa, n)
}

// Ring is one split virtqueue laid out in SplitMemory.Low.
type Ring struct {
	Size                       uint16
	Desc, Avail, Used, UsedEnd uint64 // UsedEnd is the first byte after the used ring
}

// NewRing places a ring of size entries at base (16-byte aligned) in Low.
func NewRing(base uint64, size uint16) Ring {
	r := Ring{Size: size, Desc: base}
	r.Avail = base + 16*uint64(size)
	r.Used = (r.Avail + 6 + 2*uint64(size) + 3) &^ 3
	r.UsedEnd = r.Used + 6 + 8*uint64(size)
	return r
}

// Config is the layout to give queue.New.
func (r Ring) Config() queue.Config {
	return queue.Config{Size: r.Size, Desc: r.Desc, Driver: r.Avail, Device: r.Used}
}

// Hostile encodes fuzz bytes as descriptors for a SplitMemory: the flags,
// next index and length are the fuzzer's, the address is steered so that a
// buffer lies in High (or, when the fuzz address has bit 63 set, wherever
// the fuzzer says, which is outside RAM) and an indirect table in the
// indirect area [Indirect, end of Low) (or, bit 63, outside RAM). Lengths
// with bit 31 clear are reduced modulo twice High's size, so both buffers
// that fit and buffers that overrun RAM are common.
type Hostile struct {
	Mem      *SplitMemory
	Indirect uint64 // start of the indirect-table area in Low, after every ring
}

// desc writes one descriptor at dst from 16 fuzz bytes.
func (h Hostile) desc(dst, src []byte) {
	le := binary.LittleEndian
	addr, length, flags := le.Uint64(src), le.Uint32(src[8:]), le.Uint16(src[12:])
	if addr>>63 == 0 {
		if flags&queue.DescFlagIndirect != 0 {
			n := (uint64(len(h.Mem.Low)) - h.Indirect) / 16
			addr = h.Indirect + addr%n*16
		} else {
			addr = h.Mem.HighBase + addr%uint64(len(h.Mem.High))
		}
	}
	if length>>31 == 0 {
		length %= 2 * uint32(len(h.Mem.High))
	}
	le.PutUint64(dst, addr)
	le.PutUint32(dst[8:], length)
	le.PutUint16(dst[12:], flags)
	copy(dst[14:16], src[14:16])
}

// FillRing writes r's descriptor table and available ring (flags, idx, the
// entries, used_event) from data, zeroes its used ring, and returns the
// bytes consumed. Missing data reads as zeros.
func (h Hostile) FillRing(r Ring, data []byte) int {
	var d [16]byte
	n := 0
	take := func(b []byte) {
		clear(b)
		n += copy(b, data[min(n, len(data)):])
	}
	for i := uint64(0); i < uint64(r.Size); i++ {
		take(d[:])
		h.desc(h.Mem.Low[r.Desc+16*i:], d[:])
	}
	take(h.Mem.Low[r.Avail : r.Avail+6+2*uint64(r.Size)])
	clear(h.Mem.Low[r.Used:r.UsedEnd])
	return n
}

// FillIndirect writes the indirect area from data, 16 bytes per descriptor.
func (h Hostile) FillIndirect(data []byte) {
	var d [16]byte
	for off := h.Indirect; off+16 <= uint64(len(h.Mem.Low)); off += 16 {
		clear(d[:])
		k := copy(d[:], data)
		data = data[k:]
		h.desc(h.Mem.Low[off:], d[:])
	}
}

// Range is a guest-physical range [Addr, Addr+Len).
type Range struct{ Addr, Len uint64 }

// Segments appends the buffers of the chain from head as a driver wrote
// them in Low: every descriptor reachable by following next and one level
// of indirection, at most as many steps as the tables have entries, without
// the queue's validation. Whatever chain the device was given from head is
// among them, so it is the set of ranges the device may read (readable) or
// write (writable) for that head.
func (h Hostile) Segments(r Ring, head uint16, readable, writable []Range) ([]Range, []Range) {
	le := binary.LittleEndian
	table, entries := h.Mem.Low[r.Desc:r.Desc+16*uint64(r.Size)], uint64(r.Size)
	i, indirect := uint64(head), false
	for steps := 0; steps < int(r.Size)+len(h.Mem.Low)/16 && i < entries; steps++ {
		d := table[16*i:]
		addr, length, flags := le.Uint64(d), uint64(le.Uint32(d[8:])), le.Uint16(d[12:])
		if flags&queue.DescFlagIndirect != 0 && !indirect {
			t, err := h.Mem.Slice(addr, length&^15)
			if err != nil || addr >= h.Mem.HighBase {
				return readable, writable
			}
			table, entries, i, indirect = t, length/16, 0, true
			continue
		}
		if flags&queue.DescFlagWrite != 0 {
			writable = append(writable, Range{addr, length})
		} else {
			readable = append(readable, Range{addr, length})
		}
		if flags&queue.DescFlagNext == 0 {
			break
		}
		i = uint64(le.Uint16(d[14:]))
	}
	return readable, writable
}

// Used returns used-ring entry i (id, len) of r as the device wrote it.
func (h Hostile) Used(r Ring, i uint16) (id, length uint32) {
	e := h.Mem.Low[r.Used+4+8*uint64(i%r.Size):]
	return binary.LittleEndian.Uint32(e), binary.LittleEndian.Uint32(e[4:])
}

// UsedIdx returns r's used index as the device wrote it.
func (h Hostile) UsedIdx(r Ring) uint16 { return binary.LittleEndian.Uint16(h.Mem.Low[r.Used+2:]) }

// In reports whether [addr, addr+1) lies in one of rs.
func In(rs []Range, addr uint64) bool {
	for _, r := range rs {
		if addr >= r.Addr && addr-r.Addr < r.Len {
			return true
		}
	}
	return false
}

// Overlap reports whether any two of rs share a byte.
func Overlap(rs []Range) bool {
	for i := range rs {
		for j := range i {
			a, b := rs[i], rs[j]
			if a.Len > 0 && b.Len > 0 && a.Addr < b.Addr+b.Len && b.Addr < a.Addr+a.Len {
				return true
			}
		}
	}
	return false
}

// UsedChain is one chain a device returned in a used ring: the entry's
// descriptor id and length, and the chain's buffers as the driver wrote
// them (Segments).
type UsedChain struct {
	ID, Len            uint32
	Readable, Writable []Range
}

// CheckUsed reads r's used ring as the device left it and fails tb unless
// it holds what any device must keep to: no more entries than 4 rounds of
// the ring (the harness makes far fewer chains available), each naming a
// descriptor of the ring, with a length no larger than the chain's
// writable bytes (so 0 for a chain with none, such as a transmit chain).
// what names the ring in the failure ("receive", "transmit"). It returns
// the chains in used-ring order.
func (h Hostile) CheckUsed(tb testing.TB, r Ring, what string) []UsedChain {
	tb.Helper()
	var out []UsedChain
	for i := uint16(0); i != h.UsedIdx(r); i++ {
		if i > 4*r.Size {
			tb.Fatalf("%s used index %d: more chains used than the driver made available", what, h.UsedIdx(r))
		}
		id, l := h.Used(r, i)
		if id >= uint32(r.Size) {
			tb.Fatalf("%s used entry %d names descriptor %d of %d", what, i, id, r.Size)
		}
		rd, wr := h.Segments(r, uint16(id), nil, nil)
		total := uint64(0)
		for _, s := range wr {
			total += s.Len
		}
		if uint64(l) > total {
			tb.Fatalf("%s chain %d returned with %d bytes written, it has %d writable", what, id, l, total)
		}
		out = append(out, UsedChain{ID: id, Len: l, Readable: rd, Writable: wr})
	}
	return out
}

// CheckWrites fails tb unless the device, since low and high were copied
// from Mem, changed ring memory only inside the used rings of rings and
// buffer memory only inside writable: the driver's rings, descriptors and
// every buffer it did not give the device to write are as it left them.
func (h Hostile) CheckWrites(tb testing.TB, low, high []byte, rings []Ring, writable []Range) {
	tb.Helper()
	if !bytes.Equal(low, h.Mem.Low) { // the common case skips the byte loop
		for a := range low {
			if low[a] == h.Mem.Low[a] {
				continue
			}
			inUsed := false
			for _, r := range rings {
				inUsed = inUsed || (uint64(a) >= r.Used && uint64(a) < r.UsedEnd)
			}
			if !inUsed {
				tb.Fatalf("device wrote ring memory at %#x outside the used rings", a)
			}
		}
	}
	if !bytes.Equal(high, h.Mem.High) {
		for a := range high {
			if high[a] != h.Mem.High[a] && !In(writable, h.Mem.HighBase+uint64(a)) {
				tb.Fatalf("device wrote guest memory at %#x, in no writable buffer of a chain it returned", h.Mem.HighBase+uint64(a))
			}
		}
	}
}

// Desc encodes one split-ring descriptor, for fuzz seeds written as a
// driver would lay out its rings.
func Desc(addr uint64, n uint32, flags, next uint16) []byte {
	b := make([]byte, 16)
	binary.LittleEndian.PutUint64(b, addr)
	binary.LittleEndian.PutUint32(b[8:], n)
	binary.LittleEndian.PutUint16(b[12:], flags)
	binary.LittleEndian.PutUint16(b[14:], next)
	return b
}

// Avail encodes the available ring of a queue of size entries, with index
// idx and the given heads, for fuzz seeds.
func Avail(size, idx uint16, heads ...uint16) []byte {
	b := make([]byte, 6+2*int(size))
	binary.LittleEndian.PutUint16(b[2:], idx)
	for i, h := range heads {
		binary.LittleEndian.PutUint16(b[4+2*i:], h)
	}
	return b
}

// Queues lays data out as a hostile driver's rings (each ring of rings in
// turn, then the indirect tables, from whatever data is left), refills
// High with pattern, and returns a queue over each ring with features: the
// per-input set-up of a device fuzz target.
func (h Hostile) Queues(tb testing.TB, data, pattern []byte, features uint64, rings ...Ring) []*queue.Queue {
	tb.Helper()
	n := 0
	for _, r := range rings {
		n += h.FillRing(r, data[min(n, len(data)):])
	}
	h.FillIndirect(data[min(n, len(data)):])
	copy(h.Mem.High, pattern)
	qs := make([]*queue.Queue, len(rings))
	for i, r := range rings {
		q, err := queue.New(h.Mem, r.Config(), features)
		if err != nil {
			tb.Fatal(err)
		}
		qs[i] = q
	}
	return qs
}

// Written reads back what the device reported writing to chains, in order:
// the first Len bytes of each chain's writable buffers.
func (h Hostile) Written(chains []UsedChain) []byte {
	var got []byte
	for _, c := range chains {
		left := uint64(c.Len)
		for _, s := range c.Writable {
			b, _ := h.Mem.Slice(s.Addr, min(s.Len, left))
			got = append(got, b...)
			left -= uint64(len(b))
		}
	}
	return got
}
