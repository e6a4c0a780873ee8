// Package jobruntest has what tests of a job's pipeline share without a
// real hpcvmm binary: Agent, a static stand-in for the agent.
package jobruntest

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// Agent writes a minimal static x86-64 ELF executable (one PT_LOAD) and
// returns its path: what initramfs.CheckAgent accepts as the agent. It
// cannot serve a job; tests pack it, never boot it.
func Agent(t testing.TB) string {
	t.Helper()
	var b bytes.Buffer
	le := binary.LittleEndian
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(elf.EM_X86_64), Version: 1, Entry: 0x78,
		Phoff: 64, Ehsize: 64, Phentsize: 56, Phnum: 1, Shentsize: 64}
	copy(h.Ident[:], []byte{0x7f, 'E', 'L', 'F', 2, 1, 1})
	if err := binary.Write(&b, le, h); err != nil {
		t.Fatal(err)
	}
	if err := binary.Write(&b, le, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: 5, Filesz: 120, Memsz: 120, Align: 1}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "hpcvmm")
	if err := os.WriteFile(p, b.Bytes(), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}
