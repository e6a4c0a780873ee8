package boot

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Guest physical layout of the boot structures (docs/architecture.md).
// Everything below 1 MiB except the legacy hole is ordinary RAM in the e820
// map: the kernel copies what it needs out of the zero page and command line
// early and then reuses the memory.
const (
	// GDTAddr is where the boot GDT (4 descriptors) is written.
	GDTAddr = 0x500
	// IDTAddr is where the (empty) boot IDT is written.
	IDTAddr = 0x520
	// ZeroPageAddr is the address of struct boot_params; RSI points here.
	ZeroPageAddr = 0x7000
	// BootStackTop is the initial RSP: the top of the otherwise unused page
	// between the zero page and the PML4. The kernel's 64-bit entry switches
	// to its own stack almost at once, but a valid one costs nothing.
	BootStackTop = 0x8ff0
	// PML4Addr is the top-level page table; CR3 points here.
	PML4Addr = 0x9000
	// PDPTAddr is the page-directory-pointer table.
	PDPTAddr = 0xa000
	// PDAddr is the first of the four page directories mapping 0-4 GiB with
	// 2 MiB pages (PDAddr .. PDAddr+4*4096).
	PDAddr = 0xb000
	// CmdlineAddr is where the NUL-terminated kernel command line is written.
	CmdlineAddr = 0x20000
	// EBDAStart is the start of the legacy hole [EBDAStart, HighMemStart),
	// reserved in the e820 map.
	EBDAStart = 0x9fc00
	// MPTableAddr is where the MP floating pointer and table go: the last
	// KiB of base memory, one of the places Linux scans.
	MPTableAddr = EBDAStart
	// HighMemStart is the first address above the legacy hole (1 MiB).
	HighMemStart = 0x100000
	// KernelAddr is the classic protected-mode kernel load address, used
	// when the kernel cannot be loaded at its pref_address.
	KernelAddr = HighMemStart
	// IOAPICAddr is the IOAPIC's MMIO base.
	IOAPICAddr = 0xfec00000
	// LAPICAddr is the local APIC's MMIO base.
	LAPICAddr = 0xfee00000
	// Entry64Offset is the offset of startup_64 from the load address
	// (boot.rst: the 64-bit entry is at load address + 0x200).
	Entry64Offset = 0x200
	// BootCSSelector is __BOOT_CS, the code selector the 64-bit boot
	// protocol requires.
	BootCSSelector = 0x10
	// BootDSSelector is __BOOT_DS, the data selector for DS, ES, SS.
	BootDSSelector = 0x18

	pageSize     = 0x1000
	numPDs       = 4       // 4 page directories x 1 GiB
	pageSize2M   = 1 << 21 // a PD entry with PS maps 2 MiB
	ptePresent   = 1 << 0
	pteWritable  = 1 << 1
	ptePageSize  = 1 << 7
	gdtEntries   = 4
	idtSize      = 16 // one (zero, not-present) 64-bit gate
	ptEntries    = 512
	mib          = 1 << 20
	rflagsFixed  = 1 << 1 // bit 1 of RFLAGS is reserved and always 1
	defaultAlign = 2 * mib
)

// Control-register and EFER bits for the 64-bit entry state.
const (
	CR0PE   = 1 << 0  // protected mode
	CR0ET   = 1 << 4  // extension type (hardwired to 1 on modern CPUs)
	CR0NE   = 1 << 5  // native FPU error reporting
	CR0PG   = 1 << 31 // paging
	CR4PAE  = 1 << 5  // physical address extension, required for long mode
	EFERLME = 1 << 8  // long mode enable
	EFERLMA = 1 << 10 // long mode active
)

// Memory is bounds-checked guest-physical access: Slice returns the n bytes
// at gpa, or an error when any of them is not guest RAM.
// guestmem.Memory implements it.
type Memory interface {
	Slice(gpa, n uint64) ([]byte, error)
}

// Params is what Load needs to boot one kernel.
type Params struct {
	// Kernel is the parsed bzImage.
	Kernel *Kernel
	// Initrd is the initial ramdisk; nil or empty for none.
	Initrd []byte
	// Cmdline is the kernel command line, without the terminating NUL.
	Cmdline string
	// RAM lists the guest RAM ranges, ascending; the first (low) range starts
	// at GPA 0 and holds everything Load writes.
	RAM []RAMRange
	// CPUs is the number of vCPUs; their APIC IDs are 0..CPUs-1 (in the
	// MP table; with ACPI the MADT says).
	CPUs int
	// MP extends the MP table (e.g. a PCI bus and its interrupts).
	MP MPOptions
	// ACPI, when set, replaces the MP table: Load writes the tables and
	// gives the kernel the RSDP's address (boot_params.acpi_rsdp_addr).
	ACPI *ACPI
	// Reserved are guest-physical ranges outside RAM that the memory map
	// reports as reserved (the ECAM window: Linux uses MMCONFIG only where
	// the firmware reserved it).
	Reserved []E820Entry
	// PMEM are guest-physical ranges outside RAM that the memory map
	// reports as legacy persistent memory (E820PRAM): a read-only image
	// the guest mounts from /dev/pmemN. Each is PMEMAlign-aligned in base
	// and size. Load writes nothing there: the VMM maps the image.
	PMEM []RAMRange
}

// Segment is a segment register's visible selector and hidden descriptor
// state, in the form KVM's struct kvm_segment takes: Limit is the
// byte-granular limit (0xffffffff for a flat segment with G=1), not the raw
// 20-bit descriptor field.
type Segment struct {
	Base                            uint64
	Limit                           uint32
	Selector                        uint16
	Type, Present, DPL, DB, S, L, G uint8
}

// CPUState is the bootstrap processor's register state for the 64-bit boot
// protocol entry (startup_64 at load address + 0x200): long mode with paging
// on, flat __BOOT_CS/__BOOT_DS segments, interrupts off, RSI pointing at the
// zero page. Registers not listed (RAX, RBX, RBP, RDI, ...) must be zero.
// The other vCPUs stay in their reset state and are started by the kernel
// with INIT/SIPI.
type CPUState struct {
	RIP, RSP, RSI, RFLAGS           uint64
	CR0, CR3, CR4, EFER             uint64
	CS, DS, ES, FS, GS, SS, TR, LDT Segment
	GDTBase                         uint64
	GDTLimit                        uint16
	IDTBase                         uint64
	IDTLimit                        uint16
}

// Boot segments: flat 4 GiB, ring 0, accessed bit set in the type so the CPU
// never needs to write the descriptor back and VMX's "accessed" entry check
// holds.
var (
	code64Segment = Segment{Limit: 0xffffffff, Selector: BootCSSelector, Type: 0xb, Present: 1, S: 1, L: 1, G: 1}
	data32Segment = Segment{Limit: 0xffffffff, Selector: BootDSSelector, Type: 0x3, Present: 1, S: 1, DB: 1, G: 1}
	// tssSegment gives TR a valid busy 64-bit TSS (type 11), which VMX
	// requires on entry. The GDT at 0x500 has room for only four 8-byte
	// descriptors before the IDT at 0x520, and a 64-bit TSS descriptor needs
	// 16, so TR is set through its hidden state only (selector 0, which VMX
	// permits). Nothing reads it: the kernel loads its own GDT and TR before
	// it can take an interrupt.
	tssSegment = Segment{Limit: 0x67, Type: 0xb, Present: 1}
	// ldtSegment is the unusable null LDT.
	ldtSegment = Segment{Type: 0x2}
)

// Load lays out a bootable guest in mem: the kernel payload (at its
// pref_address when relocatable and it fits, else at 1 MiB), the initrd at
// the highest page-aligned address below min(initrd_addr_max+1, end of low
// RAM) that stays clear of the kernel's init_size, the command line, the
// zero page (setup header copied in, type_of_loader 0xff, e820 table,
// initrd and command-line pointers), identity page tables for 0-4 GiB, the
// GDT/IDT and the MP table. Everything is validated before the first byte is
// written. It returns the BSP's register state for the 64-bit entry.
func Load(mem Memory, p Params) (CPUState, error) {
	k := p.Kernel
	if mem == nil {
		return CPUState{}, fmt.Errorf("boot: load: no guest memory")
	}
	if k == nil {
		return CPUState{}, fmt.Errorf("boot: load: no kernel: parse one with ParseBzImage")
	}
	if len(k.Payload) == 0 && k.ELF == nil {
		return CPUState{}, fmt.Errorf("boot: load: kernel payload is empty")
	}
	if len(k.Header) < hdrHandoverOffset-bpHdr || bpHdr+len(k.Header) > bpHdrAreaEnd {
		return CPUState{}, fmt.Errorf("boot: load: kernel setup header is %d bytes, outside [%d, %d]: parse the kernel with ParseBzImage", len(k.Header), hdrHandoverOffset-bpHdr, bpHdrAreaEnd-bpHdr)
	}
	if err := validateFirmwareTables(p); err != nil {
		return CPUState{}, err
	}
	lowEnd, err := validateRAM(p.RAM)
	if err != nil {
		return CPUState{}, err
	}
	loadAddr, kernelEnd, err := placeKernel(k, lowEnd)
	if err != nil {
		return CPUState{}, err
	}
	if err := checkCmdline(p.Cmdline, k.CmdlineSize); err != nil {
		return CPUState{}, err
	}
	var initrdAddr uint64
	if len(p.Initrd) > 0 {
		if initrdAddr, err = placeInitrd(uint64(len(p.Initrd)), k.InitrdAddrMax, lowEnd, kernelEnd); err != nil {
			return CPUState{}, err
		}
	}
	if err := validatePMEM(p.PMEM, p.RAM, p.Reserved); err != nil {
		return CPUState{}, err
	}
	e820 := withReserved(E820Map(p.RAM), p.Reserved, p.PMEM)
	if len(e820) > e820MaxEntriesZeroPage {
		return CPUState{}, fmt.Errorf("boot: load: memory map has %d entries, the zero page holds %d", len(e820), e820MaxEntriesZeroPage)
	}

	// All checks passed: write.
	if k.ELF != nil {
		if err := writeVmlinux(mem, k.ELF); err != nil {
			return CPUState{}, err
		}
	} else if err := writeGuest(mem, loadAddr, k.Payload, "kernel"); err != nil {
		return CPUState{}, err
	}
	if len(p.Initrd) > 0 {
		if err := writeGuest(mem, initrdAddr, p.Initrd, "initrd"); err != nil {
			return CPUState{}, err
		}
	}
	cmdline := append([]byte(p.Cmdline), 0)
	if err := writeGuest(mem, CmdlineAddr, cmdline, "command line"); err != nil {
		return CPUState{}, err
	}
	zp := zeroPage(k, CmdlineAddr, initrdAddr, uint64(len(p.Initrd)), e820)
	if p.ACPI != nil {
		binary.LittleEndian.PutUint64(zp[bpACPIRSDPAddr:], p.ACPI.RSDPAddr)
	}
	if err := writeGuest(mem, ZeroPageAddr, zp, "zero page"); err != nil {
		return CPUState{}, err
	}
	if err := writePageTables(mem); err != nil {
		return CPUState{}, err
	}
	if err := writeGuest(mem, GDTAddr, gdt(), "GDT"); err != nil {
		return CPUState{}, err
	}
	if err := writeGuest(mem, IDTAddr, make([]byte, idtSize), "IDT"); err != nil {
		return CPUState{}, err
	}
	if p.ACPI != nil {
		for _, t := range p.ACPI.Regions {
			if err := writeGuest(mem, t.GPA, t.Data, "ACPI tables"); err != nil {
				return CPUState{}, err
			}
		}
	} else if err := WriteMPTableWithOptions(mem, MPTableAddr, p.CPUs, p.MP); err != nil {
		return CPUState{}, err
	}
	st := cpuState(loadAddr)
	if k.ELF != nil {
		st.RIP = k.ELF.Entry
	}
	return st, nil
}

// Check runs Load's placement checks (kernel, initrd, command line, memory
// map) for a guest with the given RAM without touching guest memory, so a
// VMM can reject an initrd that cannot fit before it reserves any RAM. Its
// error is a *CheckError naming the input that does not fit.
func Check(p Params, initrdSize uint64) error {
	if p.Kernel == nil {
		return &CheckError{Input: InputKernel, Err: fmt.Errorf("boot: check: no kernel: parse one with ParseBzImage")}
	}
	lowEnd, err := validateRAM(p.RAM)
	if err != nil {
		return &CheckError{Input: InputRAM, Err: err}
	}
	_, kernelEnd, err := placeKernel(p.Kernel, lowEnd)
	if err != nil {
		return &CheckError{Input: InputKernel, Err: err}
	}
	if err := checkCmdline(p.Cmdline, p.Kernel.CmdlineSize); err != nil {
		return &CheckError{Input: InputCmdline, Err: err}
	}
	if initrdSize > 0 {
		if _, err := placeInitrd(initrdSize, p.Kernel.InitrdAddrMax, lowEnd, kernelEnd); err != nil {
			return &CheckError{Input: InputInitrd, Err: err}
		}
	}
	if err := validateFirmwareTables(p); err != nil {
		return &CheckError{Input: InputFirmwareTables, Err: err}
	}
	if err := validatePMEM(p.PMEM, p.RAM, p.Reserved); err != nil {
		return &CheckError{Input: InputPMEM, Err: err}
	}
	return nil
}

// Input names what Check found not to fit, so a caller can point its user
// at its own setting for it without reading the message.
type Input int

// The inputs Check checks.
const (
	// InputKernel: Params.Kernel is missing or does not fit in low RAM.
	InputKernel Input = iota + 1
	// InputInitrd: the initrd does not fit between the kernel and
	// initrd_addr_max or the end of low RAM.
	InputInitrd
	// InputCmdline: Params.Cmdline is too long or has a NUL byte.
	InputCmdline
	// InputRAM: Params.RAM is not a usable layout.
	InputRAM
	// InputFirmwareTables: Params.ACPI or the MP table do not fit.
	InputFirmwareTables
	// InputPMEM: a Params.PMEM range is misaligned or overlaps another.
	InputPMEM
)

// String names the input as Params does.
func (i Input) String() string {
	switch i {
	case InputKernel:
		return "kernel"
	case InputInitrd:
		return "initrd"
	case InputCmdline:
		return "command line"
	case InputRAM:
		return "RAM"
	case InputFirmwareTables:
		return "firmware tables"
	case InputPMEM:
		return "persistent memory"
	}
	return fmt.Sprintf("boot.Input(%d)", int(i))
}

// CheckError is Check's error: Input says what does not fit, Err says why
// (its message is the error's).
type CheckError struct {
	Input Input
	Err   error
}

func (e *CheckError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *CheckError) Unwrap() error { return e.Err }

// placeKernel picks the load address and returns it with the end of the
// memory the kernel may touch before it reads the e820 map. A vmlinux
// (k.ELF) goes where it was linked: no decompressor runs, so its own
// segments are all it occupies.
func placeKernel(k *Kernel, lowEnd uint64) (load, end uint64, err error) {
	if v := k.ELF; v != nil {
		if v.Start < HighMemStart || v.End > lowEnd || v.Start > v.End {
			return 0, 0, fmt.Errorf("boot: load: vmlinux occupies [0x%x, 0x%x) (%d MiB) but low RAM is [0x%x, 0x%x) (%d MiB): give the VM more --memory",
				v.Start, v.End, (v.End+mib-1)/mib, uint64(HighMemStart), lowEnd, lowEnd/mib)
		}
		return v.Start, v.End, nil
	}
	align := uint64(k.KernelAlignment)
	if align == 0 {
		align = defaultAlign
	}
	if align&(align-1) != 0 {
		return 0, 0, fmt.Errorf("boot: load: kernel_alignment 0x%x is not a power of two: parse the kernel with ParseBzImage", align)
	}
	if k.Relocatable && k.PrefAddress >= KernelAddr && k.PrefAddress%align == 0 {
		// Loading at pref_address spares a relocating kernel the copy, and
		// keeps the layout the one it was linked for.
		if end, ok := kernelFootprint(k, k.PrefAddress, align); ok && end <= lowEnd {
			return k.PrefAddress, end, nil
		}
	}
	end, ok := kernelFootprint(k, KernelAddr, align)
	if !ok || end > lowEnd {
		return 0, 0, fmt.Errorf("boot: load: kernel does not fit in low RAM: loaded at 0x%x with a %d-byte payload, pref_address 0x%x and init_size 0x%x it needs memory up to %s but low RAM ends at 0x%x (%d MiB): give the VM more --memory",
			uint64(KernelAddr), len(k.Payload), k.PrefAddress, k.InitSize, footprintString(end, ok), lowEnd, lowEnd/mib)
	}
	return KernelAddr, end, nil
}

func footprintString(end uint64, ok bool) string {
	if !ok {
		return "beyond the end of the address space"
	}
	return fmt.Sprintf("0x%x (%d MiB)", end, (end+mib-1)/mib)
}

// kernelFootprint returns the end of the memory a kernel loaded at load may
// use: its image, and init_size bytes from its runtime start address, which
// boot.rst ("Details of header fields", init_size) defines as
// align_up(max(load, pref_address), kernel_alignment) for a relocatable
// kernel and pref_address otherwise (a non-relocatable kernel moves itself
// there). ok is false on overflow.
func kernelFootprint(k *Kernel, load, align uint64) (end uint64, ok bool) {
	payload := uint64(len(k.Payload))
	imageEnd, ok := add(load, payload)
	if !ok {
		return 0, false
	}
	run := k.PrefAddress
	if k.Relocatable || run == 0 {
		up, ok := add(max(load, k.PrefAddress), align-1)
		if !ok {
			return 0, false
		}
		run = up &^ (align - 1)
	}
	runEnd, ok := add(run, max(uint64(k.InitSize), payload))
	if !ok {
		return 0, false
	}
	return max(imageEnd, runEnd), true
}

// placeInitrd returns the highest page-aligned address for an initrd of
// size bytes that ends at or below min(initrd_addr_max+1, lowEnd) and starts
// at or above kernelEnd.
func placeInitrd(size uint64, initrdAddrMax uint32, lowEnd, kernelEnd uint64) (uint64, error) {
	limit := min(uint64(initrdAddrMax)+1, lowEnd)
	kernelTop := (kernelEnd + pageSize - 1) &^ (pageSize - 1)
	if size > limit || (limit-size)&^(pageSize-1) < kernelTop {
		return 0, fmt.Errorf("boot: load: initrd of %d MiB does not fit below 0x%x (min of initrd_addr_max 0x%x + 1 and end of low RAM 0x%x) above the kernel, which needs memory up to 0x%x: give the VM more --memory or use a smaller initrd",
			(size+mib-1)/mib, limit, initrdAddrMax, lowEnd, kernelTop)
	}
	return (limit - size) &^ (pageSize - 1), nil
}

func checkCmdline(cmdline string, limit uint32) error {
	if uint64(len(cmdline)) > uint64(limit) {
		return fmt.Errorf("boot: load: command line is %d bytes, the kernel accepts at most %d (cmdline_size): shorten the kernel command line", len(cmdline), limit)
	}
	if CmdlineAddr+uint64(len(cmdline))+1 > EBDAStart {
		return fmt.Errorf("boot: load: command line is %d bytes, more than the %d bytes between 0x%x and the MP table: shorten the kernel command line", len(cmdline), EBDAStart-CmdlineAddr-1, CmdlineAddr)
	}
	if i := strings.IndexByte(cmdline, 0); i >= 0 {
		return fmt.Errorf("boot: load: command line has a NUL byte at offset %d, which would cut it short: remove it", i)
	}
	return nil
}

// zeroPage builds struct boot_params: all zero (which keeps the sentinel at
// 0x1ef clear) except the setup header copied from the image and the fields
// a boot loader fills in.
func zeroPage(k *Kernel, cmdlineAddr, initrdAddr, initrdSize uint64, e820 []E820Entry) []byte {
	le := binary.LittleEndian
	zp := make([]byte, zeroPageSize)
	copy(zp[bpHdr:], k.Header)
	zp[hdrTypeOfLoader] = typeOfLoaderUndefined
	le.PutUint32(zp[hdrCmdLinePtr:], uint32(cmdlineAddr))
	le.PutUint32(zp[bpExtCmdLinePtr:], uint32(cmdlineAddr>>32))
	le.PutUint32(zp[hdrRamdiskImage:], uint32(initrdAddr))
	le.PutUint32(zp[bpExtRamdiskImage:], uint32(initrdAddr>>32))
	le.PutUint32(zp[hdrRamdiskSize:], uint32(initrdSize))
	le.PutUint32(zp[bpExtRamdiskSize:], uint32(initrdSize>>32))
	zp[bpE820Entries] = byte(len(e820))
	for i, e := range e820 {
		b := zp[bpE820Table+i*e820EntrySize:]
		le.PutUint64(b[0:], e.Addr)
		le.PutUint64(b[8:], e.Size)
		le.PutUint32(b[16:], e.Type)
	}
	return zp
}

// writePageTables identity-maps [0, 4 GiB) with 2 MiB pages: one PML4 entry,
// four PDPT entries, 4 x 512 PD entries. The 64-bit protocol needs the
// kernel, zero page and command line mapped; mapping all of the low 4 GiB
// also covers the initrd and the IOAPIC/LAPIC MMIO.
func writePageTables(mem Memory) error {
	le := binary.LittleEndian
	pml4 := make([]byte, pageSize)
	le.PutUint64(pml4, PDPTAddr|ptePresent|pteWritable)
	pdpt := make([]byte, pageSize)
	for i := range numPDs {
		le.PutUint64(pdpt[i*8:], uint64(PDAddr+i*pageSize)|ptePresent|pteWritable)
	}
	pd := make([]byte, numPDs*pageSize)
	for i := range numPDs * ptEntries {
		le.PutUint64(pd[i*8:], uint64(i)*pageSize2M|ptePresent|pteWritable|ptePageSize)
	}
	if err := writeGuest(mem, PML4Addr, pml4, "PML4"); err != nil {
		return err
	}
	if err := writeGuest(mem, PDPTAddr, pdpt, "PDPT"); err != nil {
		return err
	}
	return writeGuest(mem, PDAddr, pd, "page directories")
}

// gdt returns the boot GDT: null, a spare 64-bit code descriptor at 0x08,
// __BOOT_CS (64-bit code) at 0x10 and __BOOT_DS (flat data) at 0x18.
func gdt() []byte {
	b := make([]byte, gdtEntries*8)
	le := binary.LittleEndian
	le.PutUint64(b[0x08:], gdtEntry(code64Segment))
	le.PutUint64(b[BootCSSelector:], gdtEntry(code64Segment))
	le.PutUint64(b[BootDSSelector:], gdtEntry(data32Segment))
	return b
}

// gdtEntry encodes a code/data segment descriptor (Intel SDM vol. 3 3.4.5).
func gdtEntry(s Segment) uint64 {
	limit := uint64(s.Limit)
	if s.G != 0 {
		limit >>= 12
	}
	access := uint64(s.Type&0xf) | uint64(s.S&1)<<4 | uint64(s.DPL&3)<<5 | uint64(s.Present&1)<<7
	flags := uint64(s.L&1)<<1 | uint64(s.DB&1)<<2 | uint64(s.G&1)<<3
	return limit&0xffff | (s.Base&0xffffff)<<16 | access<<40 | (limit>>16&0xf)<<48 |
		flags<<52 | (s.Base>>24&0xff)<<56
}

func cpuState(loadAddr uint64) CPUState {
	return CPUState{
		RIP:      loadAddr + Entry64Offset,
		RSP:      BootStackTop,
		RSI:      ZeroPageAddr,
		RFLAGS:   rflagsFixed,
		CR0:      CR0PE | CR0ET | CR0NE | CR0PG,
		CR3:      PML4Addr,
		CR4:      CR4PAE,
		EFER:     EFERLME | EFERLMA,
		CS:       code64Segment,
		DS:       data32Segment,
		ES:       data32Segment,
		FS:       data32Segment,
		GS:       data32Segment,
		SS:       data32Segment,
		TR:       tssSegment,
		LDT:      ldtSegment,
		GDTBase:  GDTAddr,
		GDTLimit: gdtEntries*8 - 1,
		IDTBase:  IDTAddr,
		IDTLimit: idtSize - 1,
	}
}

// writeGuest copies data into guest memory at gpa.
func writeGuest(mem Memory, gpa uint64, data []byte, what string) error {
	dst, err := mem.Slice(gpa, uint64(len(data)))
	if err != nil {
		return fmt.Errorf("boot: write %s (%d bytes) at 0x%x: %w", what, len(data), gpa, err)
	}
	if len(dst) != len(data) {
		return fmt.Errorf("boot: write %s at 0x%x: guest memory returned %d bytes for %d", what, gpa, len(dst), len(data))
	}
	copy(dst, data)
	return nil
}

// add returns a+b and whether it did not overflow.
func add(a, b uint64) (uint64, bool) {
	s := a + b
	return s, s >= a
}
