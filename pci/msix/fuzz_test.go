package msix_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
)

// The fuzz rig: one BAR of 64 KiB with the table at 0 and the PBA at
// fuzzPBA, room for MaxVectors entries either way.
const (
	fuzzBARSize = 1 << 16
	fuzzPBA     = 0x8000
)

// model is the MSI-X state the spec gives the guest: what it wrote into the
// table (reserved bits dropped), the pending bits, enable and function mask.
type model struct {
	n       int
	entries [][4]uint32 // addr lo, addr hi, data, vector control
	pending []uint64
	enabled bool
	fmask   bool
}

func (m *model) effective(v int) irq.MSIMessage {
	e := m.entries[v]
	return irq.MSIMessage{Addr: uint64(e[1])<<32 | uint64(e[0]), Data: e[2], Masked: e[3]&1 != 0 || m.fmask || !m.enabled}
}

// checkTarget is the Target under test: it checks every call against the
// model as the calls arrive, so an interrupt for a masked vector or a
// message the guest did not program fails at the call that made it.
type checkTarget struct {
	t        *testing.T
	m        *model
	reported []irq.MSIMessage // what the target was last told, per vector
	signals  []int            // expected deliveries, consumed by Signal
	failed   string
}

func (c *checkTarget) fail(format string, args ...any) {
	if c.failed == "" {
		c.failed = fmt.Sprintf(format, args...)
	}
}

func (c *checkTarget) VectorChanged(v int, msg irq.MSIMessage) {
	if v < 0 || v >= c.m.n {
		c.fail("VectorChanged(%d) outside the %d-entry table", v, c.m.n)
		return
	}
	if want := c.m.effective(v); msg != want {
		c.fail("VectorChanged(%d, %+v), the guest programmed %+v", v, msg, want)
	}
	if msg == c.reported[v] {
		c.fail("VectorChanged(%d) reports no change (%+v)", v, msg)
	}
	c.reported[v] = msg
}

func (c *checkTarget) ControlChanged(en, fm bool) {
	if en != c.m.enabled || fm != c.m.fmask {
		c.fail("ControlChanged(%v, %v), guest wrote enable %v mask %v", en, fm, c.m.enabled, c.m.fmask)
	}
}

func (c *checkTarget) Signal(v int) {
	switch {
	case v < 0 || v >= c.m.n:
		c.fail("Signal(%d) outside the %d-entry table", v, c.m.n)
	case c.m.effective(v).Masked:
		c.fail("Signal(%d) while the vector is masked (%+v)", v, c.m.effective(v))
	case c.reported[v].Masked:
		c.fail("Signal(%d) before the target was told the vector is unmasked", v)
	case len(c.signals) == 0 || c.signals[0] != v:
		c.fail("Signal(%d), expected deliveries %v", v, c.signals)
	default:
		c.signals = c.signals[1:]
	}
}

// FuzzTable drives one MSI-X capability (1-2048 vectors, chosen by the
// fuzzer) with arbitrary guest table and PBA accesses of every width and
// offset in the BAR, message-control writes through configuration space
// and device triggers, against a model of the spec. It asserts: table reads
// return exactly what the guest wrote with the reserved bits (address 1:0,
// vector control 31:1) masked and nothing outside aligned dword/qword
// accesses of the table and PBA; the PBA is read-only and only has bits of
// real vectors, set by a trigger of a masked vector and cleared by its
// single delivery on unmask; the Target is told every effective message
// change (and only changes) and is signalled only for enabled, unmasked
// vectors, in trigger order; the capability's read-only fields (table size,
// BIR and offsets) never change.
func FuzzTable(f *testing.F) {
	op := func(kind byte, off uint16, width byte, v uint32) []byte {
		b := []byte{kind, byte(off), byte(off >> 8), width, 0, 0, 0, 0}
		binary.LittleEndian.PutUint32(b[4:], v)
		return b
	}
	cat := func(ops ...[]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o...)
		}
		return b
	}
	// Program vector 1, enable, trigger while masked, unmask (delivers), read the PBA.
	f.Add(uint16(4), cat(op(0, 16, 2, 0xfee00000), op(0, 24, 2, 0x41), op(3, 0, 0, 0x8000),
		op(2, 1, 0, 0), op(1, fuzzPBA, 2, 0), op(0, 28, 2, 0), op(1, fuzzPBA, 3, 0), op(1, 24, 3, 0)))
	// Function mask, qword writes, trigger, unmask by control write.
	f.Add(uint16(70), cat(op(3, 0, 0, 0xc000), op(0, 64*16+8, 3, 0x30), op(2, 64, 0, 0), op(2, 69, 0, 0),
		op(1, fuzzPBA+8, 3, 0), op(3, 0, 0, 0x8000), op(4, 64, 0, 0)))
	f.Add(uint16(2047), cat(op(0, 0xfff0, 2, 1), op(1, 0x7ff0, 1, 0), op(0, fuzzPBA, 2, 0xffffffff), op(1, fuzzPBA+0xf8, 3, 0)))
	f.Fuzz(func(t *testing.T, nv uint16, ops []byte) {
		n := int(nv)%msix.MaxVectors + 1
		cs := pci.NewConfigSpace(pci.Header{VendorID: 0x1234, DeviceID: 0x5678})
		if err := cs.SetBAR(0, pci.BARSpec{Size: fuzzBARSize, Kind: pci.BARMem32}); err != nil {
			t.Fatal(err)
		}
		m := &model{n: n, entries: make([][4]uint32, n), pending: make([]uint64, (n+63)/64)}
		for v := range m.entries {
			m.entries[v][3] = 1
		}
		tg := &checkTarget{t: t, m: m, reported: make([]irq.MSIMessage, n)}
		for v := range tg.reported {
			tg.reported[v].Masked = true
		}
		c, err := msix.New(cs, n, 0, 0, fuzzPBA, tg)
		if err != nil {
			t.Fatal(err)
		}
		capOff := uint32(c.Offset())
		var capWant [12]byte
		cs.ConfigRead(capOff, capWant[:])
		widths := [...]int{1, 2, 4, 8, 0, 3, 16, 4}
		var buf, got [16]byte
		for len(ops) >= 8 {
			kind, off, w := ops[0]%5, uint64(binary.LittleEndian.Uint16(ops[1:])), widths[ops[3]%8]
			v := binary.LittleEndian.Uint32(ops[4:])
			ops = ops[8:]
			binary.LittleEndian.PutUint32(buf[:], v)
			binary.LittleEndian.PutUint32(buf[4:], ^v)
			copy(buf[8:], buf[:8])
			switch kind {
			case 0: // table/PBA/anything write; the model first, so the target checks against it
				if (w == 4 || w == 8) && off%uint64(w) == 0 && off < uint64(16*n) {
					e := &m.entries[off/16]
					for i := 0; i < w/4; i++ {
						d := binary.LittleEndian.Uint32(buf[4*i:])
						switch f := (off%16)/4 + uint64(i); f {
						case 0:
							e[0] = d &^ 3
						case 3:
							e[3] = d & 1
						default:
							e[f] = d
						}
					}
					reconcile(m, tg, int(off/16))
				}
				c.Write(off, buf[:w])
			case 1: // read: only the table and PBA, aligned dword/qword
				for i := range got[:w] {
					got[i] = 0xa5
				}
				c.Read(off, got[:w])
				var want [16]byte
				if (w == 4 || w == 8) && off%uint64(w) == 0 {
					switch {
					case off < uint64(16*n):
						for i := 0; i < w/4; i++ {
							binary.LittleEndian.PutUint32(want[4*i:], m.entries[off/16][(off%16)/4+uint64(i)])
						}
					case off >= fuzzPBA && off-fuzzPBA < msix.PBASize(n):
						q := m.pending[(off-fuzzPBA)/8]
						binary.LittleEndian.PutUint64(want[:], q>>(8*(off%8)))
					}
				}
				if !bytes.Equal(got[:w], want[:w]) {
					t.Fatalf("read %d bytes at %#x: %x, want %x", w, off, got[:w], want[:w])
				}
			case 2: // device trigger, vectors around the table's ends too
				vec := int(off) - 2
				if off&0x8000 != 0 {
					vec = n - int(off&0xf)
				}
				wantSignal := false
				if vec >= 0 && vec < n && m.enabled {
					if m.effective(vec).Masked {
						m.pending[vec/64] |= 1 << (vec % 64)
					} else {
						wantSignal = true
						tg.signals = append(tg.signals, vec)
					}
				}
				c.Trigger(vec)
				if wantSignal && len(tg.signals) != 0 {
					t.Fatalf("Trigger(%d) of an unmasked enabled vector did not deliver", vec)
				}
			case 3: // message control write through configuration space, any width
				o, data := uint32(off%2), buf[:min(w, 2)]
				hi := cs.Uint8(int(capOff) + 3)
				if len(data) > int(1-o) {
					hi = hi&^0xc0 | data[1-o]&0xc0
				}
				en, fm := hi&0x80 != 0, hi&0x40 != 0
				if en != m.enabled || fm != m.fmask {
					m.enabled, m.fmask = en, fm
					for vec := range n {
						reconcile(m, tg, vec)
					}
				}
				cs.ConfigWrite(capOff+2+o, data)
			case 4: // pending bit query
				vec := int(off) - 1
				want := vec >= 0 && vec < n && m.pending[vec/64]&(1<<(vec%64)) != 0
				if c.Pending(vec) != want {
					t.Fatalf("Pending(%d) = %v, want %v", vec, !want, want)
				}
			}
			if tg.failed != "" {
				t.Fatal(tg.failed)
			}
			if len(tg.signals) != 0 {
				t.Fatalf("expected deliveries %v did not happen", tg.signals)
			}
		}
		var capGot [12]byte
		cs.ConfigRead(capOff, capGot[:])
		capGot[3] &^= 0xc0 // enable and function mask are the guest's
		if capGot != capWant {
			t.Fatalf("MSI-X capability %x, read-only fields were %x", capGot, capWant)
		}
		for v := range n {
			if tg.reported[v] != m.effective(v) {
				t.Fatalf("target believes vector %d is %+v, it is %+v", v, tg.reported[v], m.effective(v))
			}
		}
		// The whole PBA, including bits beyond the table, is what the model says.
		for q := range m.pending {
			var b [8]byte
			c.Read(fuzzPBA+8*uint64(q), b[:])
			if got := binary.LittleEndian.Uint64(b[:]); got != m.pending[q] {
				t.Fatalf("PBA qword %d = %#x, want %#x", q, got, m.pending[q])
			}
		}
	})
}

// reconcile applies the spec's rule for vector v after a change: the target
// hears the new effective message, and a pending bit is delivered (once) as
// soon as the vector is deliverable.
func reconcile(m *model, tg *checkTarget, v int) {
	if !m.effective(v).Masked && m.pending[v/64]&(1<<(v%64)) != 0 {
		m.pending[v/64] &^= 1 << (v % 64)
		tg.signals = append(tg.signals, v)
	}
}
