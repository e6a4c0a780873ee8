package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const testRAM = 64 << 20

func synthKernel(t *testing.T, mod func(img []byte)) *Kernel {
	t.Helper()
	k, err := ParseBzImage(synthImage(mod))
	require.NoError(t, err)
	return k
}

// initrdOf returns n bytes of a non-zero pattern (period 251, so page-sized
// misplacements show), filled by doubling copies to stay fast for tens of MiB.
func initrdOf(n int) []byte {
	b := make([]byte, n)
	for i := range min(n, 251) {
		b[i] = byte(i + 1)
	}
	for filled := min(n, 251); filled < n; filled *= 2 {
		copy(b[filled:], b[:filled])
	}
	return b
}

func loadSynth(t *testing.T, p Params) (*fakeMem, CPUState) {
	t.Helper()
	mem := newFakeMem(testRAM)
	if p.Kernel == nil {
		p.Kernel = synthKernel(t, nil)
	}
	if p.RAM == nil {
		p.RAM = []RAMRange{{0, testRAM}}
	}
	if p.CPUs == 0 {
		p.CPUs = 1
	}
	st, err := Load(mem, p)
	require.NoError(t, err)
	return mem, st
}

func TestLoadZeroPage(t *testing.T) {
	k := synthKernel(t, nil)
	initrd := initrdOf(3<<20 + 123)
	cmdline := "console=ttyS0 root=/dev/ram0 panic=-1"
	mem, st := loadSynth(t, Params{Kernel: k, Initrd: initrd, Cmdline: cmdline, CPUs: 2})

	zp := uint64(0x7000)
	assert.Equal(t, zp, st.RSI)

	// Header copied verbatim except the fields the loader owns.
	hdr := mem.ram[zp+0x1f1 : zp+0x26c]
	want := append([]byte(nil), k.Header...)
	want[0x210-0x1f1] = 0xff
	for _, off := range []int{0x218, 0x21c, 0x228} {
		copy(want[off-0x1f1:off-0x1f1+4], hdr[off-0x1f1:off-0x1f1+4])
	}
	assert.Equal(t, want, hdr)
	assert.Equal(t, "HdrS", string(mem.ram[zp+0x202:zp+0x206]))
	assert.Equal(t, uint16(0xaa55), mem.u16(zp+0x1fe))
	assert.Equal(t, uint8(0xff), mem.u8(zp+0x210), "type_of_loader")
	assert.Zero(t, mem.u8(zp+0x1ef), "sentinel stays 0")

	// Command line.
	assert.Equal(t, uint32(0x20000), mem.u32(zp+0x228), "cmd_line_ptr")
	assert.Zero(t, mem.u32(zp+0xc8), "ext_cmd_line_ptr")
	assert.Equal(t, cmdline+"\x00", string(mem.ram[0x20000:0x20000+len(cmdline)+1]))

	// Initrd pointers and contents.
	addr := uint64(mem.u32(zp+0x218)) | uint64(mem.u32(zp+0xc0))<<32
	size := uint64(mem.u32(zp+0x21c)) | uint64(mem.u32(zp+0xc4))<<32
	assert.Equal(t, uint64(len(initrd)), size)
	assert.True(t, bytes.Equal(initrd, mem.ram[addr:addr+size]), "initrd contents")

	// e820.
	n := int(mem.u8(zp + 0x1e8))
	require.Equal(t, 3, n)
	var got []E820Entry
	for i := range n {
		e := zp + 0x2d0 + uint64(i)*20
		got = append(got, E820Entry{Addr: mem.u64(e), Size: mem.u64(e + 8), Type: mem.u32(e + 16)})
	}
	assert.Equal(t, E820Map([]RAMRange{{0, testRAM}}), got)
	assert.Zero(t, mem.u64(zp+0x2d0+uint64(n)*20), "no entry after the last")

	// Kernel payload at pref_address (relocatable, fits), entry at +0x200.
	assert.Equal(t, uint64(synthPref+0x200), st.RIP)
	assert.True(t, bytes.Equal(k.Payload, mem.ram[synthPref:synthPref+len(k.Payload)]), "kernel payload")
}

func TestLoadInitrdPlacement(t *testing.T) {
	cases := []struct {
		name      string
		addrMax   uint32
		ram       []RAMRange
		size      int
		wantLimit uint64
	}{
		{"top of low RAM", 0x7fffffff, []RAMRange{{0, testRAM}}, 5<<20 + 17, testRAM},
		{"below initrd_addr_max", 0x2ffffff, []RAMRange{{0, testRAM}}, 1<<20 + 1, 0x3000000},
		{"unaligned initrd_addr_max", 0x2ffff7f, []RAMRange{{0, testRAM}}, 4096, 0x2ffff80},
		{"two regions", 0x7fffffff, []RAMRange{{0, testRAM}, {4 << 30, 4 << 30}}, 4 << 20, testRAM},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			k := synthKernel(t, func(img []byte) { binary.LittleEndian.PutUint32(img[0x22c:], tc.addrMax) })
			mem, st := loadSynth(t, Params{Kernel: k, Initrd: initrdOf(tc.size), RAM: tc.ram})
			addr := uint64(mem.u32(0x7000 + 0x218))
			size := uint64(mem.u32(0x7000 + 0x21c))
			require.Equal(t, uint64(tc.size), size)
			assert.Zero(t, addr%4096, "page aligned")
			assert.LessOrEqual(t, addr+size, tc.wantLimit, "ends at or below min(initrd_addr_max+1, low RAM end)")
			assert.LessOrEqual(t, addr+size-1, uint64(tc.addrMax), "last byte at or below initrd_addr_max")
			assert.Greater(t, addr+size+4096, tc.wantLimit, "the highest such page")
			kernel := st.RIP - 0x200
			assert.GreaterOrEqual(t, addr, kernel+synthInitSize, "clear of the kernel's init_size")
		})
	}
}

func TestLoadNoInitrd(t *testing.T) {
	mem, _ := loadSynth(t, Params{})
	assert.Zero(t, mem.u32(0x7000+0x218))
	assert.Zero(t, mem.u32(0x7000+0x21c))
}

func TestLoadKernelPlacement(t *testing.T) {
	le := binary.LittleEndian
	// Not relocatable: loaded at 1 MiB; it moves itself to pref_address.
	k := synthKernel(t, func(img []byte) { img[0x234] = 0 })
	mem, st := loadSynth(t, Params{Kernel: k})
	assert.Equal(t, uint64(0x100200), st.RIP)
	assert.True(t, bytes.Equal(k.Payload, mem.ram[0x100000:0x100000+len(k.Payload)]))
	// ... so the initrd must clear pref_address + init_size, not 1 MiB + init_size.
	mem, _ = loadSynth(t, Params{Kernel: k, Initrd: initrdOf(testRAM - synthPref - synthInitSize)})
	assert.Equal(t, uint32(synthPref+synthInitSize), mem.u32(0x7000+0x218))
	_, err := Load(newFakeMem(testRAM), Params{Kernel: k, Initrd: initrdOf(testRAM - synthPref - synthInitSize + 1), RAM: []RAMRange{{0, testRAM}}, CPUs: 1})
	require.Error(t, err)

	// pref_address not aligned to kernel_alignment: fall back to 1 MiB.
	k = synthKernel(t, func(img []byte) { le.PutUint64(img[0x258:], 0x1100000) })
	_, st = loadSynth(t, Params{Kernel: k})
	assert.Equal(t, uint64(0x100200), st.RIP)

	// The initrd stays clear of the kernel's runtime area per boot.rst:
	// align_up(max(load, pref_address), kernel_alignment) + init_size, here
	// align_up(0x1100000, 2 MiB) = 0x1200000.
	const runEnd = 0x1200000 + synthInitSize
	mem, st = loadSynth(t, Params{Kernel: k, Initrd: initrdOf(testRAM - runEnd)})
	assert.Equal(t, uint64(0x100200), st.RIP)
	assert.Equal(t, uint32(runEnd), mem.u32(0x7000+0x218), "initrd right above init_size")
	_, err = Load(newFakeMem(testRAM), Params{Kernel: k, Initrd: initrdOf(testRAM - runEnd + 1), RAM: []RAMRange{{0, testRAM}}, CPUs: 1})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "above the kernel, which needs memory up to 0x1600000")

	// Relocatable at pref_address: the initrd may start right at
	// pref_address + init_size, but not a page lower.
	k = synthKernel(t, nil)
	mem, _ = loadSynth(t, Params{Kernel: k, Initrd: initrdOf(testRAM - synthPref - synthInitSize)})
	assert.Equal(t, uint32(synthPref+synthInitSize), mem.u32(0x7000+0x218))
	_, err = Load(newFakeMem(testRAM), Params{Kernel: k, Initrd: initrdOf(testRAM - synthPref - synthInitSize + 1), RAM: []RAMRange{{0, testRAM}}, CPUs: 1})
	require.Error(t, err)
}

func TestLoadPageTablesIdentityMap4G(t *testing.T) {
	mem, st := loadSynth(t, Params{})
	require.Equal(t, uint64(0x9000), st.CR3)
	walk := func(va uint64) (uint64, bool) {
		pml4e := mem.u64(st.CR3&^0xfff + (va>>39&0x1ff)*8)
		if pml4e&1 == 0 || pml4e&2 == 0 {
			return 0, false
		}
		pdpte := mem.u64(pml4e&0x000ffffffffff000 + (va>>30&0x1ff)*8)
		if pdpte&1 == 0 || pdpte&2 == 0 {
			return 0, false
		}
		if pdpte&0x80 != 0 { // 1 GiB page
			return pdpte&0x000fffffc0000000 | va&(1<<30-1), true
		}
		pde := mem.u64(pdpte&0x000ffffffffff000 + (va>>21&0x1ff)*8)
		if pde&1 == 0 || pde&2 == 0 {
			return 0, false
		}
		require.NotZero(t, pde&0x80, "2 MiB page expected at va 0x%x", va)
		return pde&0x000fffffffe00000 | va&(1<<21-1), true
	}
	for va := uint64(0); va < 4<<30; va += 2 << 20 {
		for _, off := range []uint64{0, 0x1234, 2<<20 - 1} {
			pa, ok := walk(va + off)
			require.True(t, ok, "va 0x%x unmapped", va+off)
			require.Equal(t, va+off, pa)
		}
	}
	_, ok := walk(4 << 30)
	assert.False(t, ok, "nothing above 4 GiB is mapped")
}

// decodeGDT decodes an 8-byte code/data descriptor into KVM's segment form.
func decodeGDT(d uint64, sel uint16) Segment {
	limit := uint32(d&0xffff | (d>>48&0xf)<<16)
	s := Segment{
		Base:     d>>16&0xffffff | (d>>56&0xff)<<24,
		Selector: sel,
		Type:     uint8(d >> 40 & 0xf),
		S:        uint8(d >> 44 & 1),
		DPL:      uint8(d >> 45 & 3),
		Present:  uint8(d >> 47 & 1),
		L:        uint8(d >> 53 & 1),
		DB:       uint8(d >> 54 & 1),
		G:        uint8(d >> 55 & 1),
	}
	if s.G != 0 {
		limit = limit<<12 | 0xfff
	}
	s.Limit = limit
	return s
}

func TestLoadGDTAndCPUState(t *testing.T) {
	mem, st := loadSynth(t, Params{})
	require.Equal(t, uint64(0x500), st.GDTBase)
	require.Equal(t, uint16(31), st.GDTLimit)
	gdtAt := func(sel uint16) uint64 {
		require.LessOrEqual(t, uint64(sel)+7, uint64(st.GDTLimit), "selector 0x%x inside the GDT", sel)
		return mem.u64(st.GDTBase + uint64(sel&^7))
	}
	assert.Zero(t, gdtAt(0), "null descriptor")
	assert.Equal(t, uint16(0x10), st.CS.Selector, "__BOOT_CS")
	assert.Equal(t, st.CS, decodeGDT(gdtAt(0x10), 0x10))
	assert.Equal(t, decodeGDT(gdtAt(0x10), 0x08), decodeGDT(gdtAt(0x08), 0x08), "0x08 is a 64-bit code segment too")
	for name, s := range map[string]Segment{"DS": st.DS, "ES": st.ES, "SS": st.SS, "FS": st.FS, "GS": st.GS} {
		assert.Equal(t, uint16(0x18), s.Selector, "%s is __BOOT_DS", name)
		assert.Equal(t, s, decodeGDT(gdtAt(0x18), 0x18), name)
	}
	// Flat 4 GiB, ring 0; CS is 64-bit code (L=1, D=0), execute/read.
	assert.Equal(t, Segment{Limit: 0xffffffff, Selector: 0x10, Type: 0xb, Present: 1, S: 1, L: 1, G: 1}, st.CS)
	assert.Equal(t, Segment{Limit: 0xffffffff, Selector: 0x18, Type: 0x3, Present: 1, S: 1, DB: 1, G: 1}, st.DS)
	// The encoding matches the well-known constants (e.g. Linux's boot GDT).
	assert.Equal(t, uint64(0x00af9b000000ffff), gdtAt(0x10))
	assert.Equal(t, uint64(0x00cf93000000ffff), gdtAt(0x18))
	// TR: busy 64-bit TSS, present, system segment (VMX entry checks).
	assert.Equal(t, uint8(11), st.TR.Type)
	assert.Equal(t, uint8(1), st.TR.Present)
	assert.Zero(t, st.TR.S)
	assert.Zero(t, st.LDT.Present)

	assert.Equal(t, uint64(0x520), st.IDTBase)
	assert.Equal(t, make([]byte, int(st.IDTLimit)+1), mem.ram[0x520:0x520+int(st.IDTLimit)+1])

	assert.Equal(t, uint64(synthPref+0x200), st.RIP)
	assert.Equal(t, uint64(0x7000), st.RSI)
	assert.Equal(t, uint64(1<<0|1<<31), st.CR0&(1<<0|1<<31), "CR0.PE|PG")
	assert.NotZero(t, st.CR4&(1<<5), "CR4.PAE")
	assert.Equal(t, uint64(1<<8|1<<10), st.EFER&(1<<8|1<<10), "EFER.LME|LMA")
	assert.Equal(t, uint64(2), st.RFLAGS, "interrupts off, reserved bit 1 set")
	assert.Zero(t, st.RSP%16, "stack aligned")
	assert.True(t, st.RSP > 0x7000+0x1000 && st.RSP <= 0x9000, "stack between zero page and PML4")
}

func TestLoadMPTable(t *testing.T) {
	for _, cpus := range []int{1, 4} {
		mem, _ := loadSynth(t, Params{CPUs: cpus})
		tab := parseMPTable(t, mem, 0x9fc00)
		assert.Len(t, tab.CPUs, cpus)
		// The table sits in the reserved legacy hole of the e820 map.
		assert.GreaterOrEqual(t, tab.CfgAddr, uint32(0x9fc00))
	}
}

func TestLoadTwoRegionsAroundHole(t *testing.T) {
	// 8 GiB guest: Load only writes low RAM, so the fake needs no high part.
	ram := []RAMRange{{0, testRAM}, {4 << 30, 8 << 30}}
	mem, _ := loadSynth(t, Params{RAM: ram})
	require.Equal(t, uint8(4), mem.u8(0x7000+0x1e8))
	e := uint64(0x7000 + 0x2d0 + 3*20)
	assert.Equal(t, E820Entry{Addr: 4 << 30, Size: 8 << 30, Type: E820RAM}, E820Entry{Addr: mem.u64(e), Size: mem.u64(e + 8), Type: mem.u32(e + 16)})
}

func TestLoadErrors(t *testing.T) {
	k := synthKernel(t, nil)
	ram := []RAMRange{{0, testRAM}}
	cases := []struct {
		name string
		p    Params
		want []string
	}{
		{"initrd too large", Params{Kernel: k, Initrd: make([]byte, 50<<20), RAM: ram, CPUs: 1},
			[]string{"initrd of 50 MiB does not fit below 0x4000000", "give the VM more --memory or use a smaller initrd"}},
		{"initrd larger than limit", Params{Kernel: k, Initrd: make([]byte, 65<<20), RAM: ram, CPUs: 1},
			[]string{"initrd of 65 MiB does not fit"}},
		{"cmdline too long", Params{Kernel: k, Cmdline: strings.Repeat("x", 0x800), RAM: ram, CPUs: 1},
			[]string{"command line is 2048 bytes", "at most 2047"}},
		{"cmdline NUL", Params{Kernel: k, Cmdline: "a\x00b", RAM: ram, CPUs: 1}, []string{"NUL byte at offset 1"}},
		{"kernel does not fit", Params{Kernel: k, RAM: []RAMRange{{0, 16 << 20}}, CPUs: 1},
			[]string{"kernel does not fit", "give the VM more --memory"}},
		{"no kernel", Params{RAM: ram, CPUs: 1}, []string{"no kernel"}},
		{"zero cpus", Params{Kernel: k, RAM: ram}, []string{"0 vCPUs"}},
		{"bad ram", Params{Kernel: k, RAM: []RAMRange{{1 << 20, 1 << 30}}, CPUs: 1}, []string{"must start at guest-physical 0"}},
		{"ram beyond fake", Params{Kernel: k, Initrd: initrdOf(4096), RAM: []RAMRange{{0, 128 << 20}}, CPUs: 1}, []string{"boot: write initrd (4096 bytes) at 0x7fff000", "outside RAM"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mem := newFakeMem(testRAM)
			_, err := Load(mem, tc.p)
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			if tc.name != "ram beyond fake" {
				// Validation happens before any write.
				assert.True(t, allZero(mem.ram), "guest memory was written")
			}
		})
	}
	// Exactly cmdline_size bytes is allowed.
	_, err := Load(newFakeMem(testRAM), Params{Kernel: k, Cmdline: strings.Repeat("x", 0x7ff), RAM: ram, CPUs: 1})
	require.NoError(t, err)
}

func TestLoadHostKernel(t *testing.T) {
	for _, path := range hostKernels(t) {
		image, err := os.ReadFile(path)
		if err != nil {
			t.Skipf("cannot read %s: %v", path, err)
		}
		k, err := ParseBzImage(image)
		require.NoError(t, err)
		const ram = 128 << 20
		mem := newFakeMem(ram)
		initrd := initrdOf(8 << 20)
		st, err := Load(mem, Params{Kernel: k, Initrd: initrd, Cmdline: "console=ttyS0", RAM: []RAMRange{{0, ram}}, CPUs: 4})
		require.NoError(t, err)
		load := st.RIP - 0x200
		if k.Relocatable {
			assert.Equal(t, k.PrefAddress, load)
		}
		assert.True(t, bytes.Equal(k.Payload, mem.ram[load:load+uint64(len(k.Payload))]))
		initrdAddr := uint64(mem.u32(0x7000 + 0x218))
		assert.GreaterOrEqual(t, initrdAddr, k.PrefAddress+uint64(k.InitSize))
		assert.Equal(t, uint64(ram-8<<20), initrdAddr)
		// The header is copied verbatim apart from the loader-owned fields.
		end := 0x202 + int(image[0x201])
		for off := 0x1f1; off < end; off++ {
			switch {
			case off == 0x210, off >= 0x218 && off < 0x220, off >= 0x228 && off < 0x22c:
				continue
			}
			require.Equal(t, image[off], mem.u8(0x7000+uint64(off)), "zero page byte 0x%x", off)
		}
		assert.Equal(t, k.Protocol, mem.u16(0x7000+0x206))
		assert.Equal(t, uint8(0xff), mem.u8(0x7000+0x210))
	}
}

func allZero(b []byte) bool {
	zero := make([]byte, 64<<10)
	for len(b) > 0 {
		n := min(len(b), len(zero))
		if !bytes.Equal(b[:n], zero[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// TestCheckAgreesWithLoad shows Check rejects exactly what Load rejects for
// placement, without needing guest memory.
func TestCheckAgreesWithLoad(t *testing.T) {
	k := synthKernel(t, nil)
	ram := []RAMRange{{0, testRAM}}
	for _, size := range []int{0, 4096, 50 << 20, 65 << 20} {
		p := Params{Kernel: k, Initrd: initrdOf(size), RAM: ram, CPUs: 1}
		_, loadErr := Load(newFakeMem(testRAM), p)
		checkErr := Check(Params{Kernel: k, RAM: ram, CPUs: 1}, uint64(size))
		assert.Equal(t, loadErr == nil, checkErr == nil, "initrd of %d bytes: Load %v, Check %v", size, loadErr, checkErr)
	}
	assert.ErrorContains(t, Check(Params{Kernel: k, RAM: []RAMRange{{0, 16 << 20}}, CPUs: 1}, 0), "kernel does not fit")
	assert.ErrorContains(t, Check(Params{RAM: ram, CPUs: 1}, 0), "no kernel")
}

// TestCheckErrorNamesTheInput shows each of Check's refusals carries the
// input that does not fit, so callers map it to their own setting without
// reading the message.
func TestCheckErrorNamesTheInput(t *testing.T) {
	k := synthKernel(t, nil)
	ram := []RAMRange{{0, testRAM}}
	for _, tc := range []struct {
		name       string
		p          Params
		initrdSize uint64
		want       Input
		wantMsg    string
	}{
		{"no kernel", Params{RAM: ram, CPUs: 1}, 0, InputKernel, "no kernel"},
		{"kernel too big", Params{Kernel: k, RAM: []RAMRange{{0, 16 << 20}}, CPUs: 1}, 0, InputKernel, "kernel does not fit"},
		{"empty RAM", Params{Kernel: k, CPUs: 1}, 0, InputRAM, "RAM layout is empty"},
		{"long command line", Params{Kernel: k, RAM: ram, CPUs: 1, Cmdline: strings.Repeat("x", int(k.CmdlineSize)+1)}, 0, InputCmdline, "command line is"},
		{"initrd too big", Params{Kernel: k, RAM: ram, CPUs: 1}, 65 << 20, InputInitrd, "initrd of"},
		{"misplaced RSDP", Params{Kernel: k, RAM: ram, CPUs: 1, ACPI: &ACPI{RSDPAddr: ACPIAreaStart + 1}}, 0, InputFirmwareTables, "RSDP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.p, tc.initrdSize)
			var ce *CheckError
			require.True(t, errors.As(err, &ce), "Check: %v (%T), want a *CheckError", err, err)
			assert.Equal(t, tc.want, ce.Input, "input of %q", err)
			assert.ErrorContains(t, err, tc.wantMsg)
			assert.Equal(t, ce.Err.Error(), err.Error(), "the message is the cause's")
		})
	}
	assert.NoError(t, Check(Params{Kernel: k, RAM: ram, CPUs: 1}, 4096))
}
