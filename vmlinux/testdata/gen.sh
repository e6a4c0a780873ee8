#!/bin/sh
# Regenerates the decompression fixtures: a small x86-64 ELF executable
# (vmlinux.elf, one PT_LOAD at 16 MiB whose bytes look like x86 code with
# call rel32 instructions, so xz's x86 BCJ filter has work) compressed the
# way arch/x86/boot/compressed/Makefile compresses a kernel: each payload
# followed by the uncompressed size as 4 little-endian bytes (size_append),
# except gzip, whose own trailer ends with it. Needs python3, xz, zstd,
# lz4, gzip and bzip2 (Debian: xz-utils zstd lz4 gzip bzip2).
set -eu
cd "$(dirname "$0")"
# gen NAME PREFIX CODE_KIB: the ELF NAME and its payloads PREFIX.*.
gen() {
python3 - "$1" "$3" <<'PY'
import struct, sys
name, kib = sys.argv[1], int(sys.argv[2])
code = bytearray()
i = 0
while len(code) < kib * 1024:
    # push rbp; mov rbp,rsp; call rel32; mov eax,imm32; pop rbp; ret
    code += b"\x55\x48\x89\xe5\xe8" + struct.pack("<i", -(len(code) + 9) + (i * 97) % 4096)
    code += b"\xb8" + struct.pack("<I", (i * 2654435761) & 0xffff) + b"\x5d\xc3"
    i += 1
ehsize, phentsize, paddr = 64, 56, 0x1000000
off = 0x1000
hdr = bytearray(b"\x7fELF\x02\x01\x01" + b"\x00" * 9)
hdr += struct.pack("<HHIQQQIHHHHHH", 2, 62, 1, paddr, ehsize, 0, 0, ehsize, phentsize, 1, 64, 0, 0)
ph = struct.pack("<IIQQQQQQ", 1, 5, off, 0xffffffff80000000 + paddr, paddr, len(code), len(code) + 0x2000, 0x200000)
img = hdr + ph
img += b"\x00" * (off - len(img)) + code
open(name, "wb").write(img)
PY
size() { python3 -c 'import os,struct,sys; sys.stdout.buffer.write(struct.pack("<I", os.path.getsize(sys.argv[1])))' "$1"; }
{ xz --check=crc32 --x86 --lzma2=dict=1MiB -c "$1"; size "$1"; } > "$2.xz"
{ zstd -q -19 -c "$1"; size "$1"; } > "$2.zst"
{ lz4 -q -l -9 -c "$1"; size "$1"; } > "$2.lz4"
{ bzip2 -9 -c "$1"; size "$1"; } > "$2.bz2"
gzip -n -9 -c "$1" > "$2.gz"
}
# The fixtures of the format tests (48 KiB of code) and FuzzDecompress's
# seeds (2 KiB of code: every valid seed decodes in a fraction of the time,
# so the fuzzer runs fast).
gen vmlinux.elf payload 48
gen seed.elf seed 2
