package boot

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// elfSeg describes one program header of a synthetic ELF.
type elfSeg struct {
	typ            uint32
	paddr          uint64
	data           []byte
	memsz          uint64 // 0: len(data)
	offOverride    uint64 // non-zero: p_offset as given
	fileszOverride uint64 // non-zero: p_filesz as given
}

// synthELF writes a minimal little-endian ELF64 x86-64 executable: header,
// program headers, then each segment's bytes. Field offsets are literals
// from the ELF specification so a wrong constant in the code under test
// cannot hide itself.
func synthELF(entry uint64, segs []elfSeg, mod func(img []byte)) []byte {
	le := binary.LittleEndian
	const ehsize, phentsize = 64, 56
	off := uint64(ehsize + phentsize*len(segs))
	img := make([]byte, off)
	copy(img, "\x7fELF")
	img[4], img[5], img[6] = 2, 1, 1 // ELFCLASS64, ELFDATA2LSB, EV_CURRENT
	le.PutUint16(img[16:], 2)        // ET_EXEC
	le.PutUint16(img[18:], 62)       // EM_X86_64
	le.PutUint32(img[20:], 1)
	le.PutUint64(img[24:], entry)
	le.PutUint64(img[32:], ehsize) // e_phoff
	le.PutUint16(img[52:], ehsize)
	le.PutUint16(img[54:], phentsize)
	le.PutUint16(img[56:], uint16(len(segs)))
	for i, s := range segs {
		ph := img[ehsize+i*phentsize:]
		le.PutUint32(ph[0:], s.typ)
		le.PutUint32(ph[4:], 5) // R+X
		segOff, filesz, memsz := off, uint64(len(s.data)), s.memsz
		if s.offOverride != 0 {
			segOff = s.offOverride
		}
		if s.fileszOverride != 0 {
			filesz = s.fileszOverride
		}
		if memsz == 0 {
			memsz = uint64(len(s.data))
		}
		le.PutUint64(ph[8:], segOff)
		le.PutUint64(ph[16:], 0xffffffff80000000+s.paddr) // p_vaddr: the kernel map
		le.PutUint64(ph[24:], s.paddr)
		le.PutUint64(ph[32:], filesz)
		le.PutUint64(ph[40:], memsz)
		le.PutUint64(ph[48:], 0x200000)
		off += uint64(len(s.data))
	}
	for _, s := range segs {
		img = append(img, s.data...)
	}
	if mod != nil {
		mod(img)
	}
	return img
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13) + seed
	}
	return b
}

const ptLoad, ptNote = 1, 4

// stockLayout mimics Debian's vmlinux: text at 16 MiB, data, percpu, init
// with a .bss tail (memsz > filesz), a note, then trailing relocations.
func stockLayout() (uint64, []elfSeg) {
	return 0x1000000, []elfSeg{
		{typ: ptLoad, paddr: 0x1000000, data: pattern(0x3000, 1)},
		{typ: ptLoad, paddr: 0x1200000, data: pattern(0x2000, 2)},
		{typ: ptNote, paddr: 0x1100000, data: pattern(0x40, 3)},
		{typ: ptLoad, paddr: 0x1400000, data: pattern(0x1000, 4), memsz: 0x5000},
	}
}

func TestParseVmlinux(t *testing.T) {
	entry, segs := stockLayout()
	img := append(synthELF(entry, segs, nil), "relocations after the ELF"...)
	v, err := ParseVmlinux(img)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x1000000), v.Entry)
	require.Len(t, v.Segments, 3, "PT_NOTE is not loaded")
	assert.Equal(t, uint64(0x1000000), v.Start)
	assert.Equal(t, uint64(0x1405000), v.End)
	assert.Equal(t, pattern(0x2000, 2), v.Segments[1].Data)
	assert.Equal(t, uint64(0x5000), v.Segments[2].MemSize)
	assert.True(t, IsELF(img))
}

func TestParseVmlinuxRejects(t *testing.T) {
	le := binary.LittleEndian
	entry, segs := stockLayout()
	withSeg := func(i int, f func(*elfSeg)) []elfSeg {
		s := append([]elfSeg(nil), segs...)
		f(&s[i])
		return s
	}
	many := make([]elfSeg, 65)
	for i := range many {
		many[i] = elfSeg{typ: ptLoad, paddr: 0x1000000 + uint64(i)*0x1000, data: []byte{byte(i)}}
	}
	for _, c := range []struct {
		name, want string
		img        []byte
	}{
		{"bzImage", "not an ELF file", synthImage(nil)},
		{"empty", "not an ELF file", nil},
		{"header only", "not a valid ELF", []byte("\x7fELF\x02\x01\x01")},
		{"32-bit", "not a valid ELF", synthELF(entry, segs, func(b []byte) { b[4] = 1 })},
		{"big-endian", "parse vmlinux", synthELF(entry, segs, func(b []byte) { b[5] = 2; b[16], b[17] = 0, 2; b[18], b[19] = 0, 62; b[20], b[23] = 0, 1 })},
		{"aarch64", "want a 64-bit little-endian x86-64", synthELF(entry, segs, func(b []byte) { le.PutUint16(b[18:], 183) })},
		{"shared object", "want a 64-bit little-endian x86-64", synthELF(entry, segs, func(b []byte) { le.PutUint16(b[16:], 3) })},
		{"no PT_LOAD", "no PT_LOAD", synthELF(entry, segs[2:3], nil)},
		{"too many", "more than 64 PT_LOAD", synthELF(0x1000000, many, nil)},
		{"past the file", "does not fit", synthELF(entry, withSeg(1, func(s *elfSeg) { s.fileszOverride = 1 << 40 }), nil)},
		{"offset overflow", "not a valid ELF", synthELF(entry, withSeg(1, func(s *elfSeg) { s.offOverride = ^uint64(0) - 4 }), nil)},
		{"filesz above memsz", "does not fit", synthELF(entry, withSeg(1, func(s *elfSeg) { s.memsz = 0x10 }), nil)},
		{"below 1 MiB", "outside [1 MiB, 4 GiB)", synthELF(entry, withSeg(1, func(s *elfSeg) { s.paddr = 0x7000 }), nil)},
		{"above 4 GiB", "outside [1 MiB, 4 GiB)", synthELF(entry, withSeg(1, func(s *elfSeg) { s.paddr = 0xfffff000 }), nil)},
		{"address overflow", "outside [1 MiB, 4 GiB)", synthELF(entry, withSeg(3, func(s *elfSeg) { s.paddr = ^uint64(0) - 0x100 }), nil)},
		{"overlap", "overlap", synthELF(entry, withSeg(1, func(s *elfSeg) { s.paddr = 0x1002000 }), nil)},
		{"entry outside", "entry point 0x2000000", synthELF(0x2000000, segs, nil)},
		{"entry in .bss", "entry point 0x1402000", synthELF(0x1402000, segs, nil)},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := ParseVmlinux(c.img)
			require.Error(t, err)
			assert.Nil(t, v)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

// TestLoadVmlinux: the segments land at their physical addresses with
// their .bss zeroed (over RAM that held something else), the BSP starts at
// e_entry, the bzImage's setup header goes to the zero page as before, and
// the initrd sits above the vmlinux rather than above the bzImage's
// init_size.
func TestLoadVmlinux(t *testing.T) {
	entry, segs := stockLayout()
	v, err := ParseVmlinux(synthELF(entry, segs, nil))
	require.NoError(t, err)
	k := synthKernel(t, nil)
	k.ELF = v
	mem := newFakeMem(testRAM)
	for i := range mem.ram {
		mem.ram[i] = 0xa5
	}
	initrd := initrdOf(1 << 20)
	st, err := Load(mem, Params{Kernel: k, Initrd: initrd, Cmdline: "console=ttyS0", RAM: []RAMRange{{0, testRAM}}, CPUs: 1})
	require.NoError(t, err)
	assert.Equal(t, uint64(0x1000000), st.RIP, "entered at e_entry, not load address + 0x200")
	assert.Equal(t, uint64(ZeroPageAddr), st.RSI)
	assert.Equal(t, pattern(0x3000, 1), mem.ram[0x1000000:0x1003000])
	assert.Equal(t, pattern(0x2000, 2), mem.ram[0x1200000:0x1202000])
	assert.Equal(t, pattern(0x1000, 4), mem.ram[0x1400000:0x1401000])
	assert.Equal(t, make([]byte, 0x4000), mem.ram[0x1401000:0x1405000], ".bss zeroed")
	assert.Equal(t, byte(0xa5), mem.ram[0x1003000], "between segments untouched")
	assert.Equal(t, byte(0xa5), mem.ram[0x1100000], "PT_NOTE not loaded")
	assert.Equal(t, uint32(0x53726448), mem.u32(ZeroPageAddr+0x202), "setup header in the zero page")
	assert.Equal(t, uint8(0xff), mem.u8(ZeroPageAddr+0x210), "type_of_loader")
	assert.Zero(t, mem.u8(ZeroPageAddr+0x211)&0x02, "KASLR_FLAG stays clear: no decompressor randomized")
	initrdAt := uint64(mem.u32(ZeroPageAddr + 0x218))
	assert.GreaterOrEqual(t, initrdAt, v.End)
	assert.Equal(t, initrd, mem.ram[initrdAt:initrdAt+uint64(len(initrd))])

	// The same kernel in too little RAM: a clear error before any write.
	small := newFakeMem(0x1404000)
	_, err = Load(small, Params{Kernel: k, Cmdline: "x", RAM: []RAMRange{{0, 0x1404000}}, CPUs: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "give the VM more --memory")
	assert.Equal(t, make([]byte, len(small.ram)), small.ram, "nothing written")
	assert.Error(t, Check(Params{Kernel: k, Cmdline: "x", RAM: []RAMRange{{0, 0x1404000}}, CPUs: 1}, 0))
}

// TestKernelFromVmlinux: a bare vmlinux gets a setup header the kernel
// accepts (boot flag, "HdrS", protocol 2.15, LOADED_HIGH) and the command
// line limit of x86's COMMAND_LINE_SIZE.
func TestKernelFromVmlinux(t *testing.T) {
	entry, segs := stockLayout()
	v, err := ParseVmlinux(synthELF(entry, segs, nil))
	require.NoError(t, err)
	k := KernelFromVmlinux(v)
	mem, st := loadSynth(t, Params{Kernel: k, Cmdline: "console=ttyS0"})
	assert.Equal(t, entry, st.RIP)
	assert.Equal(t, uint16(0xaa55), mem.u16(ZeroPageAddr+0x1fe))
	assert.Equal(t, uint32(0x53726448), mem.u32(ZeroPageAddr+0x202))
	assert.Equal(t, uint16(0x020f), mem.u16(ZeroPageAddr+0x206))
	assert.Equal(t, uint8(0x01), mem.u8(ZeroPageAddr+0x211))
	assert.Equal(t, uint32(2047), mem.u32(ZeroPageAddr+0x238))
	assert.Equal(t, uint32(CmdlineAddr), mem.u32(ZeroPageAddr+0x228))
	assert.Equal(t, "console=ttyS0\x00", string(mem.ram[CmdlineAddr:CmdlineAddr+14]))

	_, err = Load(newFakeMem(testRAM), Params{Kernel: k, Cmdline: string(bytes.Repeat([]byte("a"), 2048)), RAM: []RAMRange{{0, testRAM}}, CPUs: 1})
	assert.ErrorContains(t, err, "at most 2047")
}

// TestParseBzImageLocatesPayload: payload_offset/payload_length (protocol
// 2.08+) give the compressed kernel inside the protected-mode code.
func TestParseBzImageLocatesPayload(t *testing.T) {
	le := binary.LittleEndian
	k := synthKernel(t, func(img []byte) { le.PutUint32(img[0x248:], 0x100); le.PutUint32(img[0x24c:], 0x200) })
	require.Len(t, k.Compressed, 0x200)
	assert.Equal(t, k.Payload[0x100:0x300], k.Compressed)
	k = synthKernel(t, func(img []byte) { le.PutUint32(img[0x248:], 0x100); le.PutUint32(img[0x24c:], synthPayloadLen) })
	assert.Nil(t, k.Compressed, "a payload past the image is not located")

	paths, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(paths) == 0 {
		t.Log("no /boot/vmlinuz-*: the real-kernel half of this test did not run")
		return
	}
	img, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	k, err = ParseBzImage(img)
	require.NoError(t, err)
	require.NotNil(t, k.Compressed, "%s", paths[0])
	assert.Greater(t, binary.LittleEndian.Uint32(k.Compressed[len(k.Compressed)-4:]), uint32(len(k.Compressed)),
		"the size appended to the payload is the larger, uncompressed size")
}

// FuzzLoadVmlinux feeds arbitrary ELF images through ParseVmlinux and, when
// one parses, Load with guest RAM [0, 24 MiB) inside a 32 MiB buffer: no
// panic, and no byte of the buffer beyond the RAM Load was given changes.
func FuzzLoadVmlinux(f *testing.F) {
	entry, segs := stockLayout()
	f.Add(synthELF(entry, segs, nil))
	f.Add(synthELF(0x1000000, []elfSeg{{typ: ptLoad, paddr: 0x1000000, data: []byte{0x90}, memsz: 0x800000}}, nil))
	f.Add(synthELF(0x17ff000, []elfSeg{{typ: ptLoad, paddr: 0x17ff000, data: pattern(0x2000, 9)}}, nil))
	f.Add(synthELF(entry, segs[:1], func(b []byte) { b[56] = 0xff }))
	const ramSize, bufSize = 24 << 20, 32 << 20
	mem := newFakeMem(bufSize)
	canary := bytes.Repeat([]byte{0x5a}, bufSize-ramSize)
	copy(mem.ram[ramSize:], canary)
	f.Fuzz(func(t *testing.T, image []byte) {
		v, err := ParseVmlinux(image)
		if err != nil {
			if v != nil {
				t.Fatalf("error %v with a non-nil vmlinux", err)
			}
			return
		}
		if len(v.Segments) == 0 || v.Start < HighMemStart || v.End > 4<<30 {
			t.Fatalf("accepted a vmlinux that breaks the invariants: %+v", v)
		}
		_, _ = Load(mem, Params{
			Kernel:  KernelFromVmlinux(v),
			Initrd:  image[:len(image)%(64<<10)],
			Cmdline: "console=ttyS0",
			RAM:     []RAMRange{{0, ramSize}},
			CPUs:    1,
		})
		if !bytes.Equal(mem.ram[ramSize:], canary) {
			i := ramSize + bytes.IndexFunc(mem.ram[ramSize:], func(r rune) bool { return r != 0x5a })
			t.Fatalf("Load wrote near 0x%x, outside the guest RAM [0, 0x%x) it was given", i, ramSize)
		}
	})
}
