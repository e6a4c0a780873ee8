// Package kmodtest builds kernel-module-like ELF objects for tests: an
// ELF64 x86-64 relocatable object whose .modinfo section holds the given
// "key=value" records, NUL-terminated, as the kernel's MODULE_FIRMWARE,
// MODULE_VERSION and MODULE_LICENSE macros lay them out. debug/elf,
// modinfo(8) and package kmodules read it as they read a real .ko; no guest
// kernel would load it (it has no code, no symbols, no this_module).
// Written by hand because debug/elf only reads.
package kmodtest

import "encoding/binary"

// Object returns the ELF bytes of a module whose .modinfo holds records.
func Object(records ...string) []byte {
	var modinfo []byte
	for _, r := range records {
		modinfo = append(append(modinfo, r...), 0)
	}
	return ObjectWithModinfo(modinfo)
}

// ObjectWithModinfo returns the ELF bytes of a module whose .modinfo
// section is exactly modinfo (for malformed sections).
func ObjectWithModinfo(modinfo []byte) []byte {
	const (
		ehdrSize = 64
		shdrSize = 64
	)
	shstrtab := []byte("\x00.modinfo\x00.shstrtab\x00")
	infoOff := uint64(ehdrSize)
	strOff := infoOff + uint64(len(modinfo))
	shOff := (strOff + uint64(len(shstrtab)) + 7) &^ 7
	b := make([]byte, shOff+3*shdrSize)
	le := binary.LittleEndian
	copy(b, []byte{0x7f, 'E', 'L', 'F', 2 /* 64-bit */, 1 /* little-endian */, 1 /* version */})
	le.PutUint16(b[16:], 1)  // ET_REL, as every .ko
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)  // EV_CURRENT
	le.PutUint64(b[40:], shOff)
	le.PutUint16(b[52:], ehdrSize)
	le.PutUint16(b[58:], shdrSize)
	le.PutUint16(b[60:], 3) // sections: null, .modinfo, .shstrtab
	le.PutUint16(b[62:], 2) // .shstrtab's index
	copy(b[infoOff:], modinfo)
	copy(b[strOff:], shstrtab)
	section := func(i int, name, typ uint32, flags, off, size, align uint64) {
		s := b[shOff+uint64(i)*shdrSize:]
		le.PutUint32(s[0:], name)
		le.PutUint32(s[4:], typ)
		le.PutUint64(s[8:], flags)
		le.PutUint64(s[24:], off)
		le.PutUint64(s[32:], size)
		le.PutUint64(s[48:], align)
	}
	section(1, 1, 1 /* SHT_PROGBITS */, 2 /* SHF_ALLOC */, infoOff, uint64(len(modinfo)), 1)
	section(2, 10, 3 /* SHT_STRTAB */, 0, strOff, uint64(len(shstrtab)), 1)
	return b
}
