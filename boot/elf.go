package boot

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
	"slices"
)

// Limits on an uncompressed kernel (vmlinux). A vmlinux has a handful of
// PT_LOAD segments (Debian's 6.1 has four); the cap keeps a hostile file
// from making the loader iterate over millions of them.
const (
	maxELFLoadSegments = 64
	// elfAddrLimit is the end of the identity map the boot page tables
	// give the 64-bit entry: the kernel's image and entry must lie below.
	elfAddrLimit = numPDs << 30

	vmlinuxProtocol      = 0x020f     // the protocol version a synthesized header claims (2.15)
	vmlinuxCmdlineSize   = 2047       // x86 COMMAND_LINE_SIZE (2048) less the NUL
	vmlinuxInitrdAddrMax = 0x7fffffff // what Linux's own header says since 2.6.31
	jmpShortOpcode       = 0xeb
	bootFlagMagic        = 0xaa55
)

// LoadSegment is one PT_LOAD segment of a vmlinux: FileSize bytes of Data
// at guest-physical PAddr, followed by zeros up to MemSize.
type LoadSegment struct {
	PAddr   uint64
	Data    []byte // aliases the image given to ParseVmlinux
	MemSize uint64
}

// Vmlinux is an uncompressed x86-64 Linux kernel (an ELF executable) to be
// entered directly: its PT_LOAD segments go to their physical addresses and
// the bootstrap processor starts at the ELF entry point in 64-bit mode with
// RSI at the zero page, the state the bzImage's decompressor leaves when it
// jumps into the kernel it unpacked (and the way Firecracker and Cloud
// Hypervisor boot a vmlinux). A kernel entered this way is not relocated by a
// decompressor, so in-guest KASLR does not happen.
//
// Debian's vmlinux also carries a PVH entry note (XEN_ELFNOTE_PHYS32_ENTRY,
// CONFIG_PVH=y), the 32-bit entry Cloud Hypervisor prefers. The 64-bit
// entry is used instead because it takes the very zero page the bzImage
// path already builds (setup header, e820, initrd, command line, RSDP) and
// works for kernels built without CONFIG_PVH.
type Vmlinux struct {
	// Entry is the physical address of startup_64 (e_entry).
	Entry uint64
	// Segments are the PT_LOAD segments, ascending by PAddr, not
	// overlapping.
	Segments []LoadSegment
	// Start and End bound the memory the segments occupy: [Start, End).
	Start, End uint64
}

// ParseVmlinux parses an uncompressed x86-64 kernel ELF and checks that
// Load can place it: little-endian ELF64 executable for x86-64, at most 64
// PT_LOAD segments that lie inside the file, do not overlap, start at or
// above 1 MiB and end below 4 GiB, with the entry point inside a segment's
// file contents. Segment data aliases image. Trailing bytes after the ELF
// (the relocation table a KASLR kernel's payload carries) are ignored.
// Malformed input yields an error, never a panic.
func ParseVmlinux(image []byte) (*Vmlinux, error) {
	if !bytes.HasPrefix(image, []byte(elf.ELFMAG)) {
		return nil, fmt.Errorf("boot: parse vmlinux: not an ELF file (no \\x7fELF magic): pass a bzImage or an uncompressed vmlinux")
	}
	f, err := elf.NewFile(bytes.NewReader(image))
	if err != nil {
		return nil, fmt.Errorf("boot: parse vmlinux: %w: the file is not a valid ELF kernel", err)
	}
	if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
		return nil, fmt.Errorf("boot: parse vmlinux: ELF is %v %v %v %v, want a 64-bit little-endian x86-64 executable (ET_EXEC): pass an x86-64 Linux vmlinux", f.Class, f.Data, f.Machine, f.Type)
	}
	v := &Vmlinux{Entry: f.Entry}
	for _, p := range f.Progs {
		if p.Type != elf.PT_LOAD || p.Memsz == 0 {
			continue
		}
		if len(v.Segments) == maxELFLoadSegments {
			return nil, fmt.Errorf("boot: parse vmlinux: more than %d PT_LOAD segments: not a Linux kernel", maxELFLoadSegments)
		}
		fileEnd, ok := add(p.Off, p.Filesz)
		if !ok || fileEnd > uint64(len(image)) || p.Filesz > p.Memsz {
			return nil, fmt.Errorf("boot: parse vmlinux: PT_LOAD at file offset 0x%x with file size 0x%x and memory size 0x%x does not fit the %d-byte file: the vmlinux is truncated or corrupt", p.Off, p.Filesz, p.Memsz, len(image))
		}
		end, ok := add(p.Paddr, p.Memsz)
		if !ok || p.Paddr < HighMemStart || end > elfAddrLimit {
			return nil, fmt.Errorf("boot: parse vmlinux: PT_LOAD at physical [0x%x, +0x%x) is outside [1 MiB, 4 GiB), where the boot layout puts the kernel: use a kernel linked at a physical address in that range", p.Paddr, p.Memsz)
		}
		v.Segments = append(v.Segments, LoadSegment{PAddr: p.Paddr, Data: image[p.Off:fileEnd:fileEnd], MemSize: p.Memsz})
	}
	if len(v.Segments) == 0 {
		return nil, fmt.Errorf("boot: parse vmlinux: no PT_LOAD segment: nothing to load")
	}
	slices.SortFunc(v.Segments, func(a, b LoadSegment) int {
		switch {
		case a.PAddr < b.PAddr:
			return -1
		case a.PAddr > b.PAddr:
			return 1
		}
		return 0
	})
	v.Start = v.Segments[0].PAddr
	entryOK := false
	for i, s := range v.Segments {
		end := s.PAddr + s.MemSize // checked above
		if i > 0 && s.PAddr < v.End {
			return nil, fmt.Errorf("boot: parse vmlinux: PT_LOAD segments overlap at physical 0x%x: the vmlinux is corrupt", s.PAddr)
		}
		v.End = end
		if v.Entry >= s.PAddr && v.Entry-s.PAddr < uint64(len(s.Data)) {
			entryOK = true
		}
	}
	if !entryOK {
		return nil, fmt.Errorf("boot: parse vmlinux: entry point 0x%x is not inside a loaded segment: pass a vmlinux whose e_entry is the physical address of startup_64", v.Entry)
	}
	return v, nil
}

// KernelFromVmlinux wraps a vmlinux that came without a bzImage (the user
// passed the ELF itself) in a Kernel with a synthesized setup header: boot
// protocol 2.15, LOADED_HIGH, a 2047-byte command line and initrd_addr_max
// 0x7fffffff, the values Linux's own header carries. The kernel reads only
// the fields a boot loader fills in from the zero page (command line,
// initrd, e820, the RSDP), which Load writes.
func KernelFromVmlinux(v *Vmlinux) *Kernel {
	le := binary.LittleEndian
	hdr := make([]byte, hdrFullEnd-bpHdr)
	at := func(off int) []byte { return hdr[off-bpHdr:] }
	le.PutUint16(at(hdrBootFlag), bootFlagMagic)
	at(hdrJump)[0] = jmpShortOpcode
	at(hdrJump)[1] = byte(hdrFullEnd - 0x202)
	copy(at(hdrHeader), hdrSMagic)
	le.PutUint16(at(hdrVersion), vmlinuxProtocol)
	at(hdrLoadFlags)[0] = loadedHigh
	le.PutUint32(at(hdrInitrdAddrMax), vmlinuxInitrdAddrMax)
	le.PutUint32(at(hdrKernelAlignment), defaultAlign)
	le.PutUint16(at(hdrXLoadFlags), xlfKernel64)
	le.PutUint32(at(hdrCmdlineSize), vmlinuxCmdlineSize)
	le.PutUint64(at(hdrPrefAddress), v.Start)
	return &Kernel{
		Protocol:        vmlinuxProtocol,
		Header:          hdr,
		InitrdAddrMax:   vmlinuxInitrdAddrMax,
		CmdlineSize:     vmlinuxCmdlineSize,
		KernelAlignment: defaultAlign,
		PrefAddress:     v.Start,
		XLoadFlags:      xlfKernel64,
		ELF:             v,
	}
}

// IsELF reports whether image starts with the ELF magic, i.e. is an
// uncompressed vmlinux rather than a bzImage.
func IsELF(image []byte) bool { return bytes.HasPrefix(image, []byte(elf.ELFMAG)) }

// writeVmlinux copies the segments to their physical addresses and zeroes
// the rest of each segment's memory (.bss, when the file does not carry it).
func writeVmlinux(mem Memory, v *Vmlinux) error {
	for _, s := range v.Segments {
		dst, err := mem.Slice(s.PAddr, s.MemSize)
		if err != nil {
			return fmt.Errorf("boot: write kernel segment (%d bytes) at 0x%x: %w", s.MemSize, s.PAddr, err)
		}
		if uint64(len(dst)) != s.MemSize {
			return fmt.Errorf("boot: write kernel segment at 0x%x: guest memory returned %d bytes for %d", s.PAddr, len(dst), s.MemSize)
		}
		n := copy(dst, s.Data)
		clear(dst[n:])
	}
	return nil
}
