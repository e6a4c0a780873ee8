package queue_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
)

// The fuzz rig's guest: 64 KiB of RAM, allocated once per process with its
// snapshot and the chain, and reset per input.
const fuzzRAM = 1 << 16

var fuzzRig struct {
	mem, before queuetest.Memory
	chain       *queue.Chain
}

// FuzzDescriptorChain feeds arbitrary descriptor tables, indirect tables and
// avail rings (raw: addresses anywhere, so buffers may overlap the rings) to
// Pop, and returns each chain with Push, as a device does. It asserts:
// nothing panics; every segment Pop returns aliases guest RAM at its address
// (so a device writing it stays inside the buffer the guest named), lies
// inside RAM, and readable segments come before writable ones, with
// ReadableLen/WritableLen their sums; a chain has at most MaxSize segments;
// each Push publishes exactly the head and length given, in order; and the
// queue writes nothing but the used ring (its entries, index, flags and
// avail_event): every other byte of guest memory is unchanged.
func FuzzDescriptorChain(f *testing.F) {
	seed := make([]byte, 16*8+2*8+4)
	binary.LittleEndian.PutUint64(seed[0:], 0x8000)
	binary.LittleEndian.PutUint32(seed[8:], 16)
	binary.LittleEndian.PutUint16(seed[12:], queue.DescFlagNext)
	binary.LittleEndian.PutUint16(seed[14:], 1)
	binary.LittleEndian.PutUint64(seed[16:], 0x9000)
	binary.LittleEndian.PutUint32(seed[24:], 32)
	binary.LittleEndian.PutUint16(seed[28:], queue.DescFlagIndirect)
	f.Add(seed, uint16(1), uint8(3))
	f.Add(make([]byte, 200), uint16(8), uint8(0))
	fuzzRig.mem, fuzzRig.before = make(queuetest.Memory, fuzzRAM), make(queuetest.Memory, fuzzRAM)
	fuzzRig.chain = queue.NewChain(queue.MaxSize)
	f.Fuzz(func(t *testing.T, data []byte, availIdx uint16, features uint8) {
		mem, c := fuzzRig.mem, fuzzRig.chain
		clear(mem)
		d := queuetest.NewDriver(mem, 8, 0x1000)
		// The fuzzer controls the descriptor table, the avail ring and an
		// indirect-table area at 0x9000.
		n := copy(mem[d.DescAddr:d.DescAddr+16*8], data)
		n += copy(mem[d.Avail+4:d.Avail+4+2*8], data[n:])
		copy(mem[0x9000:0xa000], data[n:])
		d.SetAvailIdx(availIdx)
		var feat uint64
		if features&1 != 0 {
			feat |= queue.FeatureIndirectDesc
		}
		if features&2 != 0 {
			feat |= queue.FeatureEventIdx
		}
		q, err := queue.New(mem, d.Config(), feat)
		if err != nil {
			t.Fatal(err)
		}
		copy(fuzzRig.before, mem)
		for i := 0; i < 10; i++ {
			if features&4 != 0 {
				q.DisableNotify()
			}
			ok, err := q.Pop(c)
			if err != nil || !ok {
				break
			}
			if len(c.Segments) > queue.MaxSize {
				t.Fatalf("chain of %d segments", len(c.Segments))
			}
			var rd, wr uint64
			for k, s := range c.Segments {
				end := s.Addr + uint64(len(s.Buf))
				if end > fuzzRAM || end < s.Addr {
					t.Fatalf("segment %d [%#x+%#x) outside RAM", k, s.Addr, len(s.Buf))
				}
				if len(s.Buf) > 0 && !aliases(mem, s) {
					t.Fatalf("segment %d at %#x+%#x does not alias guest RAM there", k, s.Addr, len(s.Buf))
				}
				if cap(s.Buf) != len(s.Buf) {
					t.Fatalf("segment %d: capacity %d beyond its length %d lets a device append past the buffer", k, cap(s.Buf), len(s.Buf))
				}
				if s.Writable {
					wr += uint64(len(s.Buf))
				} else {
					if wr > 0 || k > 0 && c.Segments[k-1].Writable {
						t.Fatalf("readable segment %d after a writable one", k)
					}
					rd += uint64(len(s.Buf))
				}
			}
			if rd != c.ReadableLen || wr != c.WritableLen {
				t.Fatalf("ReadableLen/WritableLen %d/%d, segments sum to %d/%d", c.ReadableLen, c.WritableLen, rd, wr)
			}
			written := uint32(c.WritableLen) ^ uint32(i)
			if err := q.Push(c.Head, written); err != nil {
				t.Fatal(err)
			}
			// The entry Push published, read back where the driver reads it.
			u := d.UsedAt + 4 + 8*uint64((q.UsedIndex()-1)%8)
			if id, l := binary.LittleEndian.Uint32(mem[u:]), binary.LittleEndian.Uint32(mem[u+4:]); id != uint32(c.Head) || l != written {
				t.Fatalf("used entry (%d, %d), pushed (%d, %d)", id, l, c.Head, written)
			}
			if got := binary.LittleEndian.Uint16(mem[d.UsedAt+2:]); got != q.UsedIndex() {
				t.Fatalf("used.idx %d, device pushed %d", got, q.UsedIndex())
			}
			q.NeedInterrupt()
			q.EnableNotify()
		}
		// Only the used ring [flags, idx, ring[8], avail_event] changed.
		used, usedEnd := d.UsedAt, d.UsedAt+6+8*8
		if !bytes.Equal(mem[:used], fuzzRig.before[:used]) || !bytes.Equal(mem[usedEnd:], fuzzRig.before[usedEnd:]) {
			for a := range mem {
				if mem[a] != fuzzRig.before[a] && (uint64(a) < used || uint64(a) >= usedEnd) {
					t.Fatalf("queue wrote guest memory at %#x (%#x -> %#x), outside the used ring [%#x, %#x)", a, fuzzRig.before[a], mem[a], used, usedEnd)
				}
			}
		}
	})
}

// aliases reports whether s.Buf is guest memory at s.Addr: a byte flipped
// through the segment at each end shows up in mem there.
func aliases(mem []byte, s queue.Segment) bool {
	for _, k := range []int{0, len(s.Buf) - 1} {
		old := s.Buf[k]
		s.Buf[k] ^= 0xff
		ok := mem[s.Addr+uint64(k)] == old^0xff
		s.Buf[k] = old
		if !ok {
			return false
		}
	}
	return true
}
