// Package jobruntest has what tests of a job's pipeline share without
// building a real agent (a static Go program takes seconds to link):
// Agent, a static stand-in that answers jobrun's probe.
package jobruntest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// loadAddr is where the stand-in's one segment is mapped: above
// vm.mmap_min_addr (64 KiB), where static x86-64 executables load.
const loadAddr = 0x400000

// Agent writes a minimal static x86-64 ELF executable and returns its
// path: one PT_LOAD segment whose code writes answer to stdout and exits
// 0, whatever its arguments. Given jobrun.ProbeAnswer(), it is the
// smallest program jobrun.CheckAgent accepts (and initramfs.CheckAgent
// with it). It cannot serve a job: tests pack it, never boot it.
func Agent(t testing.TB, answer string) string {
	t.Helper()
	const hdrs = 64 + 56 // the ELF header and the one program header
	// write(1, msg, len); exit(0). msg follows the code.
	code := []byte{
		0xb8, 1, 0, 0, 0, // mov eax, 1 (write)
		0xbf, 1, 0, 0, 0, // mov edi, 1
		0x48, 0x8d, 0x35, 16, 0, 0, 0, // lea rsi, [rip+16]: msg, 16 bytes past this instruction
		0xba, 0, 0, 0, 0, // mov edx, len(answer)
		0x0f, 0x05, // syscall
		0xb8, 60, 0, 0, 0, // mov eax, 60 (exit)
		0x31, 0xff, // xor edi, edi
		0x0f, 0x05, // syscall
	}
	binary.LittleEndian.PutUint32(code[18:], uint32(len(answer)))
	size := uint64(hdrs + len(code) + len(answer))
	var b bytes.Buffer
	le := binary.LittleEndian
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: 1, Entry: loadAddr + hdrs,
		Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1, Shentsize: 64}
	copy(h.Ident[:], []byte{0x7f, 'E', 'L', 'F', byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)})
	p := elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X), Vaddr: loadAddr, Paddr: loadAddr,
		Filesz: size, Memsz: size, Align: 0x1000}
	for _, v := range []any{h, p} {
		if err := binary.Write(&b, le, v); err != nil {
			t.Fatal(err)
		}
	}
	b.Write(code)
	b.WriteString(answer)
	path := filepath.Join(t.TempDir(), "hpcvmm")
	if err := os.WriteFile(path, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
