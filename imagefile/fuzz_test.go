package imagefile

import (
	"bytes"
	"encoding/binary"
	"os/exec"
	"testing"
)

// FuzzDetect: whatever the file holds, Detect never panics, and an image
// it accepts lies inside the file, starts on a page and covers at least
// what its superblock says it uses.
func FuzzDetect(f *testing.F) {
	// Real images when the tools are there (seeds only: the fuzz target
	// itself needs no tool), and hand-made superblocks either way.
	if _, err := exec.LookPath("mksquashfs"); err == nil {
		fs := squashfs(f)
		f.Add(fs)
		f.Add(makeSIF(f, fs, sifOpts{signed: true}))
		f.Add(makeSIF(f, fs, sifOpts{misalign: true}))
	}
	if _, err := exec.LookPath("mkfs.erofs"); err == nil {
		f.Add(erofs(f))
	}
	f.Add(minimalSquashFS())
	f.Add(minimalEROFS())
	f.Add([]byte("#!/usr/bin/env run-singularity\n\x00SIF_MAGIC\x0001"))
	f.Fuzz(func(t *testing.T, b []byte) {
		im, err := Detect("fuzz", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		n := int64(len(b))
		if im.Offset < 0 || im.Size <= 0 || im.Offset > n || im.Size > n-im.Offset {
			t.Fatalf("range [%d, +%d) outside the %d-byte file", im.Offset, im.Size, n)
		}
		if im.Offset%PageSize != 0 {
			t.Fatalf("offset %d not page-aligned", im.Offset)
		}
		if im.Used <= 0 || im.Used > im.Size {
			t.Fatalf("used %d outside (0, %d]", im.Used, im.Size)
		}
		if im.FileSize != n || (im.FSType != SquashFS && im.FSType != EROFS) {
			t.Fatalf("image %+v of a %d-byte file", im, n)
		}
	})
}

// minimalSquashFS is a superblock Detect accepts, for the fuzzer to
// mutate without mksquashfs.
func minimalSquashFS() []byte {
	b := make([]byte, 4096)
	le := binary.LittleEndian
	le.PutUint32(b, squashMagic)
	le.PutUint32(b[squashBlockSize:], 128<<10)
	le.PutUint16(b[squashBlockLog:], 17)
	le.PutUint16(b[squashCompression:], 1)
	le.PutUint16(b[squashMajor:], 4)
	le.PutUint64(b[squashBytesUsed:], 4096)
	for _, at := range []int{squashInodeTable, squashDirTable, squashIDTable} {
		le.PutUint64(b[at:], 200)
	}
	return b
}

// minimalEROFS is an EROFS superblock Detect accepts.
func minimalEROFS() []byte {
	b := make([]byte, 8192)
	le := binary.LittleEndian
	sb := b[erofsSuperOffset:]
	le.PutUint32(sb, erofsMagic)
	sb[erofsBlkSzBits] = 12
	le.PutUint32(sb[erofsBlocks:], 2)
	return b
}

func TestMinimalSuperblocksAccepted(t *testing.T) {
	for _, b := range [][]byte{minimalSquashFS(), minimalEROFS()} {
		if _, err := detect(b); err != nil {
			t.Fatal(err)
		}
	}
}
