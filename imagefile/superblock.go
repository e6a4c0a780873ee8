package imagefile

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
)

// SquashFS 4.0 superblock (squashfs-tools' squashfs_fs.h, the kernel's
// fs/squashfs/squashfs_fs.h): 96 bytes, little-endian, at offset 0.
const (
	squashMagic       = 0x73717368 // "hsqs"
	squashSuperLen    = 96
	squashBlockSize   = 12 // u32
	squashCompression = 20 // u16
	squashBlockLog    = 22 // u16
	squashMajor       = 28 // u16
	squashMinor       = 30 // u16
	squashBytesUsed   = 40 // u64
	squashIDTable     = 48 // u64
	squashInodeTable  = 64 // u64
	squashDirTable    = 72 // u64
	// The kernel's block size bounds (SQUASHFS_FILE_MAX_SIZE is 1 MiB;
	// mksquashfs refuses below 4 KiB).
	squashMinBlock = 4 << 10
	squashMaxBlock = 1 << 20
	// Compressors: zlib 1, lzma 2, lzo 3, xz 4, lz4 5, zstd 6.
	squashMaxCompressor = 6
)

// EROFS superblock (the kernel's fs/erofs/erofs_fs.h): at byte 1024,
// little-endian.
const (
	erofsMagic       = 0xE0F5E1E2
	erofsSuperOffset = 1024
	erofsSuperLen    = 128
	erofsBlkSzBits   = 12 // u8
	erofsBlocks      = 36 // u32
	erofsMetaBlkAddr = 40 // u32
	// The guest kernel's limits on x86: blocks of 512 bytes to a page
	// (4 KiB); older kernels take only 4 KiB.
	erofsMinBlkSzBits = 9
	erofsMaxBlkSzBits = 12
)

func isSquashFS(head []byte) bool {
	return len(head) >= 4 && binary.LittleEndian.Uint32(head) == squashMagic
}

func isEROFS(head []byte) bool {
	return len(head) >= erofsSuperOffset+4 && binary.LittleEndian.Uint32(head[erofsSuperOffset:]) == erofsMagic
}

// checkSquashFS checks the SquashFS superblock at offset off of r, whose
// file system may take at most limit bytes from there (the rest of the
// file, or its SIF partition), and returns the image it describes.
func checkSquashFS(r io.ReaderAt, off, limit int64) (Image, error) {
	sb := make([]byte, squashSuperLen)
	if limit < squashSuperLen {
		return Image{}, corrupt("SquashFS superblock cut short (%d of %d bytes)", limit, squashSuperLen)
	}
	if _, err := r.ReadAt(sb, off); err != nil {
		return Image{}, corrupt("reading the SquashFS superblock: %v", err)
	}
	le := binary.LittleEndian
	if got := le.Uint32(sb); got != squashMagic {
		return Image{}, corrupt("no SquashFS magic at offset %d (%#x)", off, got)
	}
	major, minor := le.Uint16(sb[squashMajor:]), le.Uint16(sb[squashMinor:])
	if major != 4 || minor != 0 {
		return Image{}, fmt.Errorf("SquashFS version %d.%d: the guest kernel reads only 4.0; rebuild it with mksquashfs 4.x", major, minor)
	}
	block := le.Uint32(sb[squashBlockSize:])
	blockLog := le.Uint16(sb[squashBlockLog:])
	if block < squashMinBlock || block > squashMaxBlock || block&(block-1) != 0 || uint(blockLog) != uint(bits.TrailingZeros32(block)) {
		return Image{}, corrupt("SquashFS block size %d (log %d) is not a power of two from 4 KiB to 1 MiB", block, blockLog)
	}
	if c := le.Uint16(sb[squashCompression:]); c == 0 || c > squashMaxCompressor {
		return Image{}, corrupt("SquashFS compressor %d is unknown", c)
	}
	used := le.Uint64(sb[squashBytesUsed:])
	if used < squashSuperLen || used > uint64(limit) {
		return Image{}, corrupt("SquashFS says it uses %d bytes, the file has %d from its superblock", used, limit)
	}
	for _, t := range []struct {
		name string
		at   int
	}{{"inode table", squashInodeTable}, {"directory table", squashDirTable}, {"id table", squashIDTable}} {
		if start := le.Uint64(sb[t.at:]); start < squashSuperLen || start >= used {
			return Image{}, corrupt("SquashFS %s starts at %d, outside the %d bytes used", t.name, start, used)
		}
	}
	return Image{FSType: SquashFS, Container: Bare, Offset: off, Size: limit, Used: int64(used)}, nil
}

// checkEROFS checks the EROFS superblock in head (the file's first bytes)
// of a file of size bytes.
func checkEROFS(head []byte, size int64) (Image, error) {
	if len(head) < erofsSuperOffset+erofsSuperLen {
		return Image{}, corrupt("EROFS superblock cut short (%d of %d bytes)", max(len(head)-erofsSuperOffset, 0), erofsSuperLen)
	}
	sb := head[erofsSuperOffset:]
	le := binary.LittleEndian
	blkbits := sb[erofsBlkSzBits]
	if blkbits < erofsMinBlkSzBits || blkbits > erofsMaxBlkSzBits {
		return Image{}, fmt.Errorf("EROFS block size 2^%d: an x86 guest kernel mounts 512 bytes to 4 KiB blocks; rebuild it with 4 KiB blocks (mkfs.erofs's default on x86)", blkbits)
	}
	blocks := uint64(le.Uint32(sb[erofsBlocks:]))
	used := blocks << blkbits
	if blocks == 0 || used > uint64(size) {
		return Image{}, corrupt("EROFS says it uses %d blocks of %d bytes (%d bytes), the file has %d", blocks, 1<<blkbits, used, size)
	}
	if meta := uint64(le.Uint32(sb[erofsMetaBlkAddr:])); meta >= blocks {
		return Image{}, corrupt("EROFS metadata starts at block %d, past its %d blocks", meta, blocks)
	}
	return Image{FSType: EROFS, Container: Bare, Offset: 0, Size: size, Used: int64(used)}, nil
}
