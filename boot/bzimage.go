// Package boot implements the Linux x86-64 boot protocol for direct kernel
// boot, without firmware, as pure data manipulation.
//
// It parses a bzImage's setup header (ParseBzImage) or a decompressed
// kernel's ELF program headers (ParseVmlinux), lays the kernel, initrd,
// command line, zero page (struct boot_params with the e820 table), identity
// page tables, GDT and Intel MP table out in guest memory (Load), and returns
// the bootstrap processor's initial register state as plain values
// (CPUState) for the caller to hand to KVM. Nothing here talks to KVM, so the
// whole boot path is unit-testable against a byte slice.
//
// The guest physical layout follows docs/architecture.md; the zero-page and
// setup-header offsets come from the kernel's uapi asm/bootparam.h and are
// checked against it by a gcc-compiled test.
package boot

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strings"
)

// Setup-header and boot_params offsets. The setup header sits at 0x1f1 both
// in the bzImage file and in struct boot_params, so one set of offsets
// serves for reading the image and for writing the zero page. Values are from
// /usr/include/x86_64-linux-gnu/asm/bootparam.h (verified by
// TestOffsetsMatchBootparamH).
const (
	bpExtRamdiskImage = 0x0c0 // boot_params.ext_ramdisk_image: high 32 bits of ramdisk_image
	bpExtRamdiskSize  = 0x0c4 // boot_params.ext_ramdisk_size
	bpACPIRSDPAddr    = 0x070 // boot_params.acpi_rsdp_addr (u64, protocol 2.14)
	bpExtCmdLinePtr   = 0x0c8 // boot_params.ext_cmd_line_ptr
	bpE820Entries     = 0x1e8 // boot_params.e820_entries (u8)
	bpSentinel        = 0x1ef // boot_params.sentinel: must stay 0 or the kernel distrusts the zero page
	bpHdr             = 0x1f1 // boot_params.hdr (struct setup_header)
	bpHdrAreaEnd      = 0x290 // boot_params.edd_mbr_sig_buffer: the header may grow up to here
	bpE820Table       = 0x2d0 // boot_params.e820_table[128]
	zeroPageSize      = 0x1000

	hdrSetupSects        = 0x1f1 // u8; 0 means 4
	hdrBootFlag          = 0x1fe // u16 0xaa55
	hdrJump              = 0x200 // u16; its second byte gives the header length
	hdrHeader            = 0x202 // u32 "HdrS"
	hdrVersion           = 0x206 // u16 protocol version
	hdrKernelVersion     = 0x20e // u16 pointer to the version string, minus 0x200
	hdrTypeOfLoader      = 0x210 // u8
	hdrLoadFlags         = 0x211 // u8
	hdrRamdiskImage      = 0x218 // u32
	hdrRamdiskSize       = 0x21c // u32
	hdrCmdLinePtr        = 0x228 // u32
	hdrInitrdAddrMax     = 0x22c // u32, 2.03+
	hdrKernelAlignment   = 0x230 // u32, 2.05+
	hdrRelocatableKernel = 0x234 // u8, 2.05+
	hdrXLoadFlags        = 0x236 // u16, 2.12+
	hdrCmdlineSize       = 0x238 // u32, 2.06+
	hdrPayloadOffset     = 0x248 // u32, 2.08+: compressed payload, from the protected-mode code's start
	hdrPayloadLength     = 0x24c // u32, 2.08+
	hdrPrefAddress       = 0x258 // u64, 2.10+
	hdrInitSize          = 0x260 // u32, 2.10+
	hdrHandoverOffset    = 0x264 // u32, 2.11+ (first field past what we read)
	hdrFullEnd           = 0x26c // end of struct setup_header as of protocol 2.15

	e820EntrySize           = 20 // struct boot_e820_entry is packed
	e820MaxEntriesZeroPage  = 128
	setupSectorSize         = 512
	defaultSetupSects       = 4 // a setup_sects of 0 means 4 (boot.rst)
	minProtocol             = 0x0206
	loadedHigh              = 1 << 0 // loadflags LOADED_HIGH
	xlfKernel64             = 1 << 0 // xloadflags XLF_KERNEL_64
	xlfCanBeLoadedAbove4G   = 1 << 1
	typeOfLoaderUndefined   = 0xff // "undefined" boot loader ID: we are not a registered loader
	kernelVersionStringBase = 0x200
	maxVersionLen           = 256
)

// hdrSMagic is the setup header signature at 0x202 ("HdrS", little endian).
var hdrSMagic = []byte("HdrS")

// Kernel is a parsed bzImage: the setup-header fields the loader needs plus
// the protected-mode payload.
type Kernel struct {
	// Protocol is the boot protocol version, e.g. 0x020f for 2.15.
	Protocol uint16
	// SetupSects is the number of 512-byte setup sectors after the boot
	// sector (a header value of 0 is reported as 4, as the protocol says).
	SetupSects int
	// Payload is the protected-mode kernel: everything after the setup
	// sectors. It aliases the image passed to ParseBzImage.
	Payload []byte
	// Header is a copy of the setup header, image bytes 0x1f1 up to
	// 0x202+image[0x201], to be copied into the zero page at the same offset.
	Header []byte
	// InitrdAddrMax is the highest address the initrd may occupy (inclusive).
	InitrdAddrMax uint32
	// CmdlineSize is the longest command line the kernel accepts, excluding
	// the terminating NUL.
	CmdlineSize uint32
	// Relocatable reports whether the kernel may run at an address other than
	// PrefAddress (relocatable_kernel).
	Relocatable bool
	// KernelAlignment is the physical alignment a relocatable kernel needs.
	KernelAlignment uint32
	// PrefAddress is the preferred (and, for non-relocatable kernels, the
	// actual) run address of the decompressed kernel.
	PrefAddress uint64
	// InitSize is the amount of linear memory, counted from the kernel's run
	// address, that the kernel needs before it can examine the memory map.
	InitSize uint32
	// XLoadFlags holds the XLF_* bits (zero before protocol 2.12).
	XLoadFlags uint16
	// Version is the kernel version string (uname -r first, then the build
	// banner), empty when the image carries none.
	Version string
	// Compressed is the compressed vmlinux inside Payload (payload_offset
	// and payload_length, protocol 2.08+): what the bzImage's decompressor
	// unpacks. Nil when the header does not locate it. It aliases the image.
	Compressed []byte
	// ELF, when set, is the decompressed kernel: Load then places its
	// segments at their physical addresses and enters it at its ELF entry
	// point, skipping the bzImage's own decompressor (and with it in-guest
	// KASLR); Payload is not loaded. Set it to a ParseVmlinux result of the
	// kernel decompressed on the host, or use KernelFromVmlinux.
	ELF *Vmlinux
}

// ParseBzImage parses a Linux bzImage and checks that it can be booted
// through the 64-bit boot protocol. Payload aliases image; everything else is
// copied. Malformed input yields an error, never a panic.
func ParseBzImage(image []byte) (*Kernel, error) {
	if len(image) < hdrFullEnd {
		return nil, fmt.Errorf("boot: parse bzImage: image is %d bytes, too short to hold a Linux setup header (need at least %d): pass a bzImage such as /boot/vmlinuz-*", len(image), hdrFullEnd)
	}
	if !bytes.Equal(image[hdrHeader:hdrHeader+4], hdrSMagic) {
		what := "no \"HdrS\" magic at offset 0x202"
		if IsELF(image) {
			what += "; this is an ELF file, probably an uncompressed vmlinux: parse it with ParseVmlinux"
		}
		return nil, fmt.Errorf("boot: parse bzImage: not a bzImage (%s): pass a Linux bzImage such as /boot/vmlinuz-*", what)
	}
	le := binary.LittleEndian
	k := &Kernel{Protocol: le.Uint16(image[hdrVersion:])}
	if k.Protocol < minProtocol {
		return nil, fmt.Errorf("boot: parse bzImage: boot protocol %s is too old: need >= 2.06 (Linux 2.6.22 or later)", protocolString(k.Protocol))
	}
	loadFlags := image[hdrLoadFlags]
	if loadFlags&loadedHigh == 0 {
		return nil, fmt.Errorf("boot: parse bzImage: kernel is not loadable high (LOADED_HIGH clear in loadflags 0x%02x): zImage kernels are not supported, use a bzImage", loadFlags)
	}
	if k.Protocol >= 0x020c {
		k.XLoadFlags = le.Uint16(image[hdrXLoadFlags:])
	}
	if k.XLoadFlags&xlfKernel64 == 0 {
		return nil, fmt.Errorf("boot: parse bzImage: kernel has no 64-bit entry point (XLF_KERNEL_64 clear, protocol %s, xloadflags 0x%04x): use an x86-64 kernel with boot protocol >= 2.12", protocolString(k.Protocol), k.XLoadFlags)
	}

	// The header's length is encoded in the short jump at 0x200: its target,
	// 0x202 + the jump's displacement byte, is the first byte after the
	// header (boot.rst, "64-bit boot protocol").
	hdrEnd := 0x202 + int(image[hdrJump+1])
	if hdrEnd < hdrHandoverOffset || hdrEnd > bpHdrAreaEnd {
		return nil, fmt.Errorf("boot: parse bzImage: setup header claims to end at 0x%x (jump byte 0x%02x at 0x201), outside [0x%x, 0x%x] for a protocol %s header: the image is corrupt", hdrEnd, image[hdrJump+1], hdrHandoverOffset, bpHdrAreaEnd, protocolString(k.Protocol))
	}
	k.Header = append([]byte(nil), image[bpHdr:hdrEnd]...)

	k.SetupSects = int(image[hdrSetupSects])
	if k.SetupSects == 0 {
		k.SetupSects = defaultSetupSects
	}
	payloadOff := (k.SetupSects + 1) * setupSectorSize
	if payloadOff >= len(image) {
		return nil, fmt.Errorf("boot: parse bzImage: image is truncated: %d setup sectors end at byte %d but the file has only %d bytes, so no protected-mode kernel follows", k.SetupSects, payloadOff, len(image))
	}
	k.Payload = image[payloadOff:]

	k.InitrdAddrMax = le.Uint32(image[hdrInitrdAddrMax:])
	k.CmdlineSize = le.Uint32(image[hdrCmdlineSize:])
	k.Relocatable = image[hdrRelocatableKernel] != 0
	k.KernelAlignment = le.Uint32(image[hdrKernelAlignment:])
	k.PrefAddress = le.Uint64(image[hdrPrefAddress:])
	k.InitSize = le.Uint32(image[hdrInitSize:])
	if k.Relocatable && bits.OnesCount32(k.KernelAlignment) != 1 {
		return nil, fmt.Errorf("boot: parse bzImage: relocatable kernel has kernel_alignment 0x%x, which is not a power of two: the image is corrupt", k.KernelAlignment)
	}
	k.Version = versionString(image, payloadOff)
	if k.Protocol >= 0x0208 {
		off, n := uint64(le.Uint32(image[hdrPayloadOffset:])), uint64(le.Uint32(image[hdrPayloadLength:]))
		if n > 0 && off+n <= uint64(len(k.Payload)) {
			k.Compressed = k.Payload[off : off+n : off+n]
		}
	}
	return k, nil
}

// Release is the kernel's release, as `uname -r` prints it in the guest:
// the first word of Version (e.g. "6.1.0-56-amd64"), which names the
// guest's /lib/modules directory. Empty when the image carries no version.
func (k *Kernel) Release() string {
	release, _, _ := strings.Cut(strings.TrimSpace(k.Version), " ")
	return release
}

// ReleaseOfVmlinux returns the release of an uncompressed kernel (a
// vmlinux ELF, which has no setup header): the word after "Linux version "
// in its linux_banner, a string literal the build bakes in. Empty when the
// image holds no such banner.
func ReleaseOfVmlinux(image []byte) string {
	const banner = "Linux version "
	for off := 0; ; {
		i := bytes.Index(image[off:], []byte(banner))
		if i < 0 {
			return ""
		}
		start := off + i + len(banner)
		end := start
		for end < len(image) && end-start < maxVersionLen && image[end] > ' ' && image[end] < 0x7f {
			end++
		}
		// The banner goes on " (builder@host) ...": a bare "Linux version "
		// elsewhere (a format string, "%s") is not it.
		if end > start && end+1 < len(image) && image[end] == ' ' && image[end+1] == '(' && image[start] != '%' {
			return string(image[start:end])
		}
		off = start
	}
}

// versionString reads the NUL-terminated version string that kernel_version
// points at (offset + 0x200), confined to the setup area.
func versionString(image []byte, setupEnd int) string {
	ptr := int(binary.LittleEndian.Uint16(image[hdrKernelVersion:]))
	if ptr == 0 {
		return ""
	}
	start := ptr + kernelVersionStringBase
	if start >= setupEnd {
		return ""
	}
	s := image[start:min(setupEnd, start+maxVersionLen)]
	if i := bytes.IndexByte(s, 0); i >= 0 {
		s = s[:i]
	}
	return string(s)
}

// protocolString renders a boot protocol version the way boot.rst writes it.
func protocolString(v uint16) string { return fmt.Sprintf("%d.%02x", v>>8, v&0xff) }
