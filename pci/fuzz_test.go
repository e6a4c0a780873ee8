package pci_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/pci"
)

// fuzzState is what a rig looks like right after newRig: the device's and
// the host bridge's configuration space, and which bits of each byte a guest
// may change (everything else is read-only and must keep its value).
type fuzzState struct {
	dev, hostBridge         [pci.ConfigSize]byte
	devMutable, hostMutable [pci.ConfigSize]byte
}

// readAll reads a function's configuration space: the device's straight
// from its model (one call: fast), the host bridge's through ECAM (its
// extended space is all read-only zeros, like the device's is but for its
// capabilities, and the same code serves it, so the first 256 bytes do).
func readAll(r *rig, slot int, out *[pci.ConfigSize]byte) {
	if slot == 3 {
		r.dev.ConfigRead(0, out[:])
		return
	}
	clear(out[pci.LegacyConfigSize:])
	for off := 0; off < pci.LegacyConfigSize; off += 4 {
		r.mmio.Read(addrspace.ECAMBase+uint64(slot)<<15+uint64(off), out[off:off+4])
	}
}

// newFuzzState snapshots r and declares, from the PCI spec and newTestDev's
// layout (not from the implementation's masks), the guest-writable bits.
func newFuzzState(r *rig) *fuzzState {
	s := &fuzzState{}
	readAll(r, 3, &s.dev)
	readAll(r, 0, &s.hostBridge)
	le := binary.LittleEndian
	for _, m := range []*[pci.ConfigSize]byte{&s.devMutable, &s.hostMutable} {
		le.PutUint16(m[pci.RegCommand:], 0x0547) // I/O, memory, bus master, parity, SERR, INTx disable
		m[pci.RegCacheLine], m[pci.RegLatency], m[pci.RegInterruptLine] = 0xff, 0xff, 0xff
	}
	m := &s.devMutable
	le.PutUint32(m[pci.RegBAR0:], ^uint32(4096-1))    // BAR0 mem32 4 KiB
	le.PutUint32(m[pci.RegBAR0+4:], ^uint32(32-1))    // BAR1 I/O 32 B
	le.PutUint64(m[pci.RegBAR0+8:], ^uint64(1<<20-1)) // BAR2/3 mem64 1 MiB
	le.PutUint64(m[pci.RegBAR0+16:], ^uint64(8192-1)) // BAR4/5 mem64 8 KiB
	m[r.dev.msix.Offset()+3] = 0xc0                   // MSI-X enable, function mask
	return s
}

// reset returns a rig that went through fuzzing to its newRig state, the
// way a guest and the device could, without rebuilding it: configuration
// restored, MSI-X pending bits delivered and every entry masked and
// cleared, decode off (which unregisters every BAR), fakes cleared.
func (s *fuzzState) reset(r *rig) {
	le := binary.LittleEndian
	for off := 0; off < pci.ConfigSize; off += 4 {
		r.dev.SetUint32(off, le.Uint32(s.dev[off:]))
	}
	ctrl := r.dev.msix.Offset() + 2
	var q [8]byte
	r.dev.ConfigWrite(uint32(ctrl), []byte{0, 0x80}) // enabled, not function-masked
	for v := 0; v < r.dev.msix.Vectors(); v++ {
		r.dev.msix.Write(uint64(16*v+8), q[:]) // unmask: delivers a pending bit
		r.dev.msix.Write(uint64(16*v), q[:])
		le.PutUint64(q[:], 1<<32) // data 0, masked
		r.dev.msix.Write(uint64(16*v+8), q[:])
		le.PutUint64(q[:], 0)
	}
	r.dev.ConfigWrite(uint32(ctrl), []byte{0, 0})
	r.cfg.Write(3, 0, pci.RegCommand, 2, 0) // through the Root: BARs unregistered
	r.cfg.Write(0, 0, pci.RegCommand, 2, 0)
	r.cfg.Write(0, 0, pci.RegCacheLine, 2, 0)
	r.cfg.Write(0, 0, pci.RegInterruptLine, 1, 0)
	r.pio.Write(pci.ConfigIOPort, q[:4])
	*r.dev.sink = msixSink{}
	*r.dev.mem32, *r.dev.io, *r.dev.mem64 = recorder{}, recorder{}, recorder{}
	r.errs = r.errs[:0]
}

// checkImage fails t when a byte of got differs from want outside mutable.
func checkImage(t testing.TB, what string, got, want, mutable *[pci.ConfigSize]byte) {
	for i := range got {
		if (got[i]^want[i])&^mutable[i] != 0 {
			t.Fatalf("%s: read-only bits of config byte %#x changed: %#02x, was %#02x (guest may change %#02x)", what, i, got[i], want[i], mutable[i])
		}
	}
}

// FuzzConfigWrite drives a root complex with an endpoint that has every BAR
// kind and MSI-X through arbitrary configuration accesses (conf1 at any port
// offset and width, ECAM at any offset, any device number), MSI-X table/PBA
// accesses, vector triggers and accesses wherever the guest put the BARs.
// One rig per fuzzing process, reset to its initial state per input.
//
// It asserts: nothing panics; after every access the BAR registers keep
// their type bits and alignment to their size, the ID registers are
// unchanged, every BAR the Root decodes is registered at the address its
// register holds, aligned to its size, with its space's decode enabled, and
// the device was told exactly that (BARMapped); CONFIG_ADDRESS reads back
// with its reserved bits clear; after the input, no read-only bit of the
// device's or the host bridge's 4 KiB configuration space (IDs, class,
// header type, capability lists and bodies, extended capabilities, BAR low
// bits, status) differs from its initial value, and the MSI-X table and PBA
// read back only valid values (address bits 1:0 and vector-control bits
// 31:1 zero, no pending bit beyond the 5 vectors).
func FuzzConfigWrite(f *testing.F) {
	op := func(kind byte, reg uint16, width byte, v uint32) []byte {
		b := make([]byte, 8)
		b[0], b[3] = kind, width
		binary.LittleEndian.PutUint16(b[1:], reg)
		binary.LittleEndian.PutUint32(b[4:], v)
		return b
	}
	var seed []byte
	seed = append(seed, op(0, pci.RegBAR0, 4, 0xffffffff)...)
	seed = append(seed, op(0, pci.RegCommand, 2, 7)...)
	seed = append(seed, op(0, 0x50+2, 2, 0xc000)...)
	seed = append(seed, op(2, 12, 4, 0)...)
	seed = append(seed, op(1, 0x100, 4, 0xffffffff)...)
	f.Add(seed)
	f.Add(op(5, 0, 4, 0x80001810))
	// Program BAR0 and BAR2/3, turn on decode, then touch the BARs.
	f.Add(append(append(append(op(0, pci.RegBAR0, 4, 0xc0000000), op(0, pci.RegBAR0+8, 4, 0)...),
		op(0, pci.RegBAR0+12, 4, 0x10)...), append(op(0, pci.RegCommand, 2, 3), op(6, 8, 4, 1)...)...))

	r := newRig(f)
	st := newFuzzState(r)
	f.Fuzz(func(t *testing.T, data []byte) { fuzzConfigWrite(t, r, st, data) })
}

var barSizes = [pci.NumBARs]uint64{4096, 32, 1 << 20, 0, 8192, 0}

func fuzzConfigWrite(t testing.TB, r *rig, st *fuzzState, data []byte) {
	{
		sizes := barSizes
		st.reset(r)
		var buf [8]byte
		for len(data) >= 8 {
			kind, reg, width, v := data[0], binary.LittleEndian.Uint16(data[1:]), int(data[3]%9), binary.LittleEndian.Uint32(data[4:])
			data = data[8:]
			binary.LittleEndian.PutUint32(buf[:], v)
			binary.LittleEndian.PutUint32(buf[4:], ^v)
			switch kind % 7 {
			case 0: // conf1 write to the test device, register from the fuzzer
				w := []int{1, 2, 4}[width%3]
				r.cfg.Write(3, 0, int(reg&0xfff), w, v)
			case 1: // ECAM write, any device/offset/width
				r.mmio.Write(addrspace.ECAMBase+uint64(reg)<<4+uint64(v>>28), buf[:width])
			case 2: // MSI-X table/PBA write, any offset/width
				r.dev.msix.Write(uint64(reg&0x1fff), buf[:width])
			case 3: // reads
				r.dev.msix.Read(uint64(reg&0x1fff), buf[:width])
				r.mmio.Read(addrspace.ECAMBase+uint64(reg)<<4, buf[:width])
			case 4:
				r.dev.msix.Trigger(int(reg % 8))
			case 5: // raw port accesses anywhere in 0xcf8-0xcff
				off := uint64(reg % 8)
				if off+uint64(width) <= 8 {
					r.pio.Write(pci.ConfigIOPort+off, buf[:width])
					r.pio.Read(pci.ConfigIOPort+off, buf[:width])
				}
			case 6: // BAR-space access wherever the guest put the BARs
				for bar := 0; bar < pci.NumBARs; bar++ {
					if a, ok := r.root.BARAddress(3, bar); ok {
						r.mmio.Write(a+uint64(reg), buf[:width])
						r.mmio.Read(a+uint64(reg), buf[:width])
						r.pio.Write(a+uint64(reg), buf[:width])
					}
				}
			}
			var a [4]byte
			r.pio.Read(pci.ConfigIOPort, a[:])
			if ca := binary.LittleEndian.Uint32(a[:]); ca&0x70000003 != 0 {
				t.Fatalf("CONFIG_ADDRESS %#x: reserved bits set", ca)
			}
			if id := r.cfg.Read(3, 0, 0, 4); id != 0x56781234 {
				t.Fatalf("vendor/device ID %#x", id)
			}
			cmd := r.cfg.Read(3, 0, pci.RegCommand, 2)
			var regs [pci.NumBARs]uint32
			for i := range regs {
				regs[i] = r.cfg.Read(3, 0, pci.RegBAR0+4*i, 4)
			}
			if regs[0]&0xfff != 0 || regs[1]&0x1f != 1 || regs[2]&0xfffff != 0xc || regs[4]&0x1fff != 4 {
				t.Fatalf("BAR registers %#x: type bits or alignment to size lost (want mem32 4 KiB, I/O 32 B, mem64 pf 1 MiB, mem64 8 KiB)", regs)
			}
			for bar, size := range sizes {
				base, on := r.root.BARAddress(3, bar)
				_, told := r.dev.mapped[bar]
				if size == 0 && on {
					t.Fatalf("BAR%d, the upper half of a 64-bit BAR, decodes", bar)
				}
				if !on {
					if told {
						t.Fatalf("BAR%d not decoded but the device was told it is", bar)
					}
					continue
				}
				prog := uint64(regs[bar] &^ 0xf)
				decode := cmd&pci.CommandMemory != 0
				switch bar {
				case 1:
					prog, decode = uint64(regs[bar]&^3), cmd&pci.CommandIO != 0
				case 2, 4:
					prog |= uint64(regs[bar+1]) << 32
				}
				switch {
				case !decode:
					t.Fatalf("BAR%d decoded at %#x with decode off (command %#x)", bar, base, cmd)
				case prog != base:
					t.Fatalf("BAR%d decoded at %#x, its register says %#x", bar, base, prog)
				case base%size != 0:
					t.Fatalf("BAR%d at %#x not aligned to its size %#x", bar, base, size)
				case r.dev.mapped[bar] != base:
					t.Fatalf("BAR%d decoded at %#x, the device was told %#x", bar, base, r.dev.mapped[bar])
				}
			}
		}
		var img [pci.ConfigSize]byte
		readAll(r, 3, &img)
		checkImage(t, "device", &img, &st.dev, &st.devMutable)
		readAll(r, 0, &img)
		checkImage(t, "host bridge", &img, &st.hostBridge, &st.hostMutable)
		for v := 0; v < r.dev.msix.Vectors(); v++ {
			r.dev.msix.Read(uint64(16*v), buf[:])
			if buf[0]&3 != 0 {
				t.Fatalf("MSI-X entry %d address %#x: bits 1:0 set", v, buf[:4])
			}
			r.dev.msix.Read(uint64(16*v+12), buf[:4])
			if c := binary.LittleEndian.Uint32(buf[:]); c&^1 != 0 {
				t.Fatalf("MSI-X entry %d vector control %#x: reserved bits set", v, c)
			}
		}
		r.dev.msix.Read(0x1000, buf[:])
		if p := binary.LittleEndian.Uint64(buf[:]); p>>r.dev.msix.Vectors() != 0 {
			t.Fatalf("PBA %#x has bits beyond the %d vectors", p, r.dev.msix.Vectors())
		}
	}
}

// TestFuzzRigReset checks that FuzzConfigWrite's reset really returns a rig
// to its initial state: after arbitrary use, the configuration images, the
// MSI-X table and PBA and the bus registrations equal a fresh rig's.
func TestFuzzRigReset(t *testing.T) {
	r := newRig(t)
	st := newFuzzState(r)
	r.cfg.Write(3, 0, pci.RegBAR0, 4, 0xc0000000)
	r.cfg.Write(3, 0, pci.RegCommand, 2, 7)
	r.cfg.Write(3, 0, r.dev.msix.Offset()+2, 2, 0xc000)
	r.dev.msix.Write(16, []byte{0, 0, 0xe0, 0xfe})
	r.dev.msix.Trigger(1)
	r.cfg.Write(0, 0, pci.RegCacheLine, 2, 0x4010)
	_, on := r.root.BARAddress(3, 0)
	require.True(t, on)
	st.reset(r)

	fresh := newRig(t)
	var got, want [pci.ConfigSize]byte
	for _, slot := range []int{0, 3} {
		readAll(r, slot, &got)
		readAll(fresh, slot, &want)
		require.Equal(t, want, got, "slot %d configuration", slot)
	}
	for off := uint64(0); off < 0x1008; off += 8 {
		var a, b [8]byte
		r.dev.msix.Read(off, a[:])
		fresh.dev.msix.Read(off, b[:])
		require.Equal(t, b, a, "MSI-X BAR offset %#x", off)
	}
	for bar := 0; bar < pci.NumBARs; bar++ {
		_, on := r.root.BARAddress(3, bar)
		require.False(t, on, "BAR%d still decoded", bar)
	}
	require.Empty(t, r.dev.mapped)
	require.Equal(t, msixSink{}, *r.dev.sink)
}

// FuzzBridgeConfig lets a guest write anything anywhere in a switch
// hierarchy (bus numbers, windows, command and bridge control registers of
// every port, endpoint BARs and commands; conf1 and ECAM, any bus), after
// AssignBuses and AssignBARs set it up as firmware would. Nothing may
// panic, the ports' read-only identity (header type, port type, link
// capabilities, ACS capabilities) must hold, and the property real
// hardware guarantees must too: an endpoint BAR decodes only if every
// bridge above it has the space enabled and the BAR inside one of its
// windows, as the guest reads those registers back.
func FuzzBridgeConfig(f *testing.F) {
	op := func(bus, dev byte, reg uint16, width byte, v uint32) []byte {
		b := make([]byte, 10)
		b[0], b[1], b[4] = bus, dev, width
		binary.LittleEndian.PutUint16(b[2:], reg)
		binary.LittleEndian.PutUint32(b[5:], v)
		b[9] = 0
		return b
	}
	var seed []byte
	seed = append(seed, op(0, 5, pci.RegPrimaryBus, 4, 0x00201000)...)
	seed = append(seed, op(0x10, 0, pci.RegMemBase, 4, 0x0000fff0)...)
	seed = append(seed, op(2, 0, pci.RegCommand, 2, 0)...)
	seed = append(seed, op(3, 0, pci.RegBAR0, 4, 0xffffffff)...)
	seed = append(seed, op(0, 6, pci.RegBridgeControl, 2, 0x44)...)
	f.Add(seed)
	f.Fuzz(bridgeFuzzBody)
}

func bridgeFuzzBody(t *testing.T, data []byte) {
	r := newSwitchRig(t)
	if err := r.root.AssignBuses(); err != nil {
		t.Fatal(err)
	}
	w, err := addrspace.NewWindows(addrspace.PCIHoleStart, 46)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.root.AssignBARs(w); err != nil {
		t.Fatal(err)
	}
	// The checks below run after every access, so they use plain
	// comparisons: testify's require calls t.Helper, whose stack walk
	// was most of each execution's time (profiled: 1,372 allocations and
	// 350 µs per seed input).
	bridges := [...]*pci.Bridge{r.rp, r.usp, r.dsp0, r.dsp1, r.rp2}
	type endpoint struct {
		dev   *testDev
		above []*pci.Bridge
	}
	endpoints := [...]endpoint{
		{r.a, []*pci.Bridge{r.dsp0, r.usp, r.rp}},
		{r.b, []*pci.Bridge{r.dsp1, r.usp, r.rp}},
		{r.c, []*pci.Bridge{r.rp2}},
	}
	bars := [...]struct {
		bar  int
		size uint64
	}{{0, 4096}, {1, 32}, {2, 1 << 20}, {4, 8192}}
	widths := [3]int{1, 2, 4}
	for len(data) >= 10 {
		busNum, dev, reg, width, v, kind := int(data[0]), int(data[1]%32), int(binary.LittleEndian.Uint16(data[2:])&0xfff), int(data[4]), binary.LittleEndian.Uint32(data[5:]), data[9]
		data = data[10:]
		var buf [4]byte
		binary.LittleEndian.PutUint32(buf[:], v)
		if kind%2 == 0 {
			r.cfg.WriteBus(busNum, dev, 0, reg, widths[width%3], v)
		} else {
			off := uint64(busNum)<<20 | uint64(dev)<<15 | uint64(reg)
			r.mmio.Write(addrspace.ECAMBase+off, buf[:width%5])
			r.mmio.Read(addrspace.ECAMBase+off, buf[:width%5])
		}
		r.cfg.ReadBus(busNum, dev, 0, reg, 4)
		for i, b := range bridges {
			if h := b.Uint8(pci.RegHeaderType); h != 1 {
				t.Fatalf("bridge %d: header type %#x, want 1", i, h)
			}
			p := b.PCIeCapOffset()
			if got, want := b.Uint16(p+pci.PCIeCapFlags)&0xf0, uint16(b.Type())<<4; got != want {
				t.Fatalf("bridge %d: port type bits %#x, want %#x", i, got, want)
			}
			if got := b.Uint32(p+pci.PCIeLinkCap) & 0x3ff; got != 0x104 {
				t.Fatalf("bridge %d: link capabilities %#x, want 0x104 (16 GT/s x16)", i, got)
			}
			if a := b.ACSCapOffset(); a != 0 {
				if got := b.Uint16(a + 4); got != 0x203d {
					t.Fatalf("bridge %d: ACS capabilities %#x, want 0x203d", i, got)
				}
			}
		}
		for _, e := range endpoints {
			cmd := e.dev.Uint16(pci.RegCommand)
			for _, bs := range bars {
				addr, mapped := r.root.DeviceBAR(e.dev, bs.bar)
				if !mapped {
					continue
				}
				io := bs.bar == 1
				if io && cmd&pci.CommandIO == 0 || !io && cmd&pci.CommandMemory == 0 {
					t.Fatalf("BAR%d decodes at %#x with the endpoint's command register %#x", bs.bar, addr, cmd)
				}
				for _, b := range e.above {
					bcmd := b.Uint16(pci.RegCommand)
					if io {
						if bcmd&pci.CommandIO == 0 {
							t.Fatalf("I/O BAR decodes below a bridge with I/O off")
						}
						lo, hi, ok := b.IOWindow()
						if !ok || addr < lo || addr+bs.size-1 > hi {
							t.Fatalf("I/O BAR %#x outside [%#x, %#x]", addr, lo, hi)
						}
						continue
					}
					if bcmd&pci.CommandMemory == 0 {
						t.Fatalf("memory BAR decodes below a bridge with memory off")
					}
					lo, hi, ok := b.MemWindow()
					plo, phi, pok := b.PrefWindow()
					if !(ok && addr >= lo && addr+bs.size-1 <= hi) && !(pok && addr >= plo && addr+bs.size-1 <= phi) {
						t.Fatalf("BAR%d at %#x outside [%#x, %#x] and [%#x, %#x]", bs.bar, addr, lo, hi, plo, phi)
					}
				}
			}
		}
	}
}
