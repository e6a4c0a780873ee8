package vfio

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// FuzzPassthroughConfigWrite drives the passthrough model over the H100
// fixture with arbitrary guest accesses: configuration writes through the
// root complex (BARs, command register, MSI and MSI-X capabilities, any
// other register), direct config accesses of any width, MSI-X table and
// trapped BAR accesses, and decode changes. It asserts: nothing panics;
// after every access BAR0 keeps its type bits and 16 MiB alignment, the ROM
// BAR reads 0, the MSI-X table size, capability pointer and clique
// capability header are unchanged; after the input the identity registers
// are unchanged, the MSI-X table reads back with reserved bits clear, and
// every irqfd KVM would fire is routed into the x86 MSI window. The H100
// capture and BAR0's memory are loaded once per process (fuzzH100).
func FuzzPassthroughConfigWrite(f *testing.F) {
	seed := func(ops ...[8]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o[:]...)
		}
		return b
	}
	f.Add(seed([8]byte{0, 0x10, 0, 2, 0xff, 0xff, 0xff, 0xff}, [8]byte{0, 0x14, 0, 2, 0xff, 0xff, 0xff, 0xff}))
	f.Add(seed([8]byte{0, 0xb2, 0, 1, 0, 0x80, 0, 0}, [8]byte{2, 0x10, 0, 2, 0, 0, 0xe0, 0xfe}, [8]byte{2, 0x1c, 0, 2, 0, 0, 0, 0}))
	f.Add(seed([8]byte{0, 0x4a, 0, 1, 0x71, 0x01, 0, 0}, [8]byte{0, 0x4c, 0, 2, 0, 0, 0xe0, 0xfe}, [8]byte{0, 0x04, 0, 1, 0x06, 0, 0, 0}))
	f.Add(seed([8]byte{4, 2, 0, 0, 0, 0, 0, 1}, [8]byte{1, 0xd4, 0, 3, 1, 2, 3, 4}, [8]byte{3, 0x08, 0, 3, 0, 0, 0, 0}))
	f.Fuzz(func(t *testing.T, in []byte) {
		fuzzPassthroughConfigWrite(t, in)
	})
}

// fuzzFixture is the H100 configuration capture and BAR0's 16 MiB of device
// memory, read and allocated once per fuzzing process: allocating and
// zeroing BAR0 for every input was most of the old harness's time.
var fuzzFixture struct {
	once sync.Once
	cfg  []byte
	bar0 []byte
	maps mmapPool
}

// fuzzH100 is h100(t, true) over the shared fixture: a fresh copy of the
// configuration bytes (the model writes them through) and BAR0's memory
// with the only page a fuzz input can write (the rest of the MSI-X table
// page; the table itself is emulated) cleared.
func fuzzH100(t testing.TB) *fakeDev {
	fuzzFixture.once.Do(func() {
		fuzzFixture.cfg = h100(t, true).cfg
		fuzzFixture.bar0 = make([]byte, 16<<20)
	})
	f := newFakeDev(append([]byte(nil), fuzzFixture.cfg...))
	f.pool = &fuzzFixture.maps
	r0 := &f.regions[0]
	r0.Size, r0.MSIXMappable = 16<<20, true
	r0.Flags = uapi.VFIORegionInfoFlagRead | uapi.VFIORegionInfoFlagWrite | uapi.VFIORegionInfoFlagMmap
	clear(fuzzFixture.bar0[0xb90000:0xb91000])
	f.bars[0] = fuzzFixture.bar0
	f.addBAR(2, 128<<30, true, false)
	f.addBAR(4, 32<<20, true, false)
	f.irqs = [5]uint32{1, 16, 9, 1, 1}
	return f
}

func fuzzPassthroughConfigWrite(t testing.TB, in []byte) {
	{
		fd := fuzzH100(t)
		r := newRig(t, fd, func(c *Config) { c.HasClique, c.Clique = true, 5 })
		defer r.dev.Close()
		r.assign(t)
		var ids [0x30]byte
		r.dev.ConfigRead(0, ids[:])
		widths := [4]int{1, 2, 4, 8}
		var buf [8]byte
		for len(in) >= 8 {
			op := in[0] % 6
			off := uint32(binary.LittleEndian.Uint16(in[1:]))
			w := widths[in[3]%4]
			copy(buf[:4], in[4:8])
			copy(buf[4:], in[4:8])
			in = in[8:]
			switch op {
			case 0: // guest config write through mechanism #1
				if w > 4 {
					w = 4
				}
				r.conf.Write(testSlot, 0, int(off&0xfff), w, binary.LittleEndian.Uint32(buf[:]))
			case 1: // config access straight into the model, any width/offset
				r.dev.ConfigWrite(off, buf[:w])
				r.dev.ConfigRead(off, buf[:w])
			case 2: // MSI-X table (and the rest of its page)
				if h := r.dev.BARHandler(0); h != nil {
					h.Write(0xb90000+uint64(off&0xfff), buf[:w])
				}
			case 3: // trapped reads anywhere in BAR0, including past its end
				if h := r.dev.BARHandler(0); h != nil {
					h.Read(uint64(off)<<9, buf[:w])
				}
			case 4: // decode changes the root would report
				r.dev.BARMapped(int(off%8), uint64(binary.LittleEndian.Uint32(buf[:]))<<12, buf[7]&1 != 0)
			case 5:
				r.conf.Read(testSlot, 0, int(off&0xfff), 4)
			}
			var v [4]byte
			r.dev.ConfigRead(pci.RegBAR0, v[:])
			if b := binary.LittleEndian.Uint32(v[:]); b&0xf != 0xc || b&0x00fffff0 != 0 {
				t.Fatalf("BAR0 register %#x: type bits or alignment to 16 MiB lost", b)
			}
			r.dev.ConfigRead(pci.RegROM, v[:])
			if b := binary.LittleEndian.Uint32(v[:]); b != 0 {
				t.Fatalf("ROM BAR reads %#x", b)
			}
			r.dev.ConfigRead(0xb2, v[:2])
			if binary.LittleEndian.Uint16(v[:])&0x7ff != 8 {
				t.Fatalf("MSI-X table size changed: ctrl %#x", binary.LittleEndian.Uint16(v[:]))
			}
			r.dev.ConfigRead(pci.RegCapPtr, v[:1])
			if v[0] != 0x40 {
				t.Fatalf("capability pointer %#x", v[0])
			}
			r.dev.ConfigRead(0xd4, v[:])
			if v != [4]byte{0x09, 0, 8, 'P'} {
				t.Fatalf("clique capability header %x", v)
			}
		}
		// Identity (vendor, device, revision, class, header type,
		// subsystem) is read-only whatever the guest wrote.
		var got [0x30]byte
		r.dev.ConfigRead(0, got[:])
		for _, f := range [][2]int{{0, 4}, {8, 12}, {0x0e, 0x0f}, {0x2c, 0x30}} {
			if string(got[f[0]:f[1]]) != string(ids[f[0]:f[1]]) {
				t.Fatalf("read-only config bytes %#x-%#x changed: %x, were %x", f[0], f[1], got[f[0]:f[1]], ids[f[0]:f[1]])
			}
		}
		// The MSI-X table reads back only valid values, and KVM only ever
		// gets routes to the x86 MSI window for vectors it can fire.
		if h := r.dev.BARHandler(0); h != nil {
			for v := 0; v < 9; v++ {
				h.Read(0xb90000+16*uint64(v), buf[:])
				h.Read(0xb90000+16*uint64(v)+12, buf[4:])
				if buf[0]&3 != 0 || binary.LittleEndian.Uint32(buf[4:])&^1 != 0 {
					t.Fatalf("MSI-X entry %d reads address %#x control %#x: reserved bits set", v, binary.LittleEndian.Uint32(buf[:]), binary.LittleEndian.Uint32(buf[4:]))
				}
			}
		}
		for fd, gsi := range r.router.IRQFDs {
			if rt := r.router.Routes[gsi]; rt.AddrLo>>20 != 0xfee || rt.AddrHi != 0 {
				t.Fatalf("irqfd %d fires GSI %d routed to MSI address %#x:%#x outside 0xfee00000-0xfeefffff", fd, gsi, rt.AddrHi, rt.AddrLo)
			}
		}
	}
}
