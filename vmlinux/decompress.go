// Package vmlinux unpacks the kernel a bzImage carries on the host, once,
// and keeps it in an on-disk cache, so a guest can be entered at the
// kernel's own 64-bit entry point (boot.Vmlinux) instead of running the
// bzImage's decompressor at every launch.
//
// Decompress reads the compressed payload the bzImage's setup header locates
// (payload_offset/payload_length) and picks the decoder by the payload's
// magic. The decoders, and why each:
//
//   - xz: github.com/therootcompany/xz, a Go port of XZ Embedded, the
//     decoder the kernel's own decompressor is built from. The kernel
//     compresses with the x86 BCJ filter in front of LZMA2
//     (scripts/xz_wrap.sh: --x86 --lzma2); github.com/ulikunitz/xz
//     (v0.5.17) rejects any chain of more than one filter ("unsupported
//     filter count"), so it cannot read a kernel. u-root's bzimage package
//     made the same choice for the same reason.
//   - zstd: github.com/klauspost/compress/zstd, the maintained pure-Go
//     zstd decoder (the standard library has none).
//   - lz4: github.com/pierrec/lz4/v4, which reads the legacy LZ4 frame the
//     kernel's "lz4 -l" writes (already in the module graph through u-root).
//     That frame has no checksum: a corrupt lz4 kernel is caught only when
//     the result is not an ELF of the declared size, as in the guest's own
//     decompressor. xz (CRC32), zstd, gzip and bzip2 check their data.
//   - gzip and bzip2: the standard library's compress/gzip and
//     compress/bzip2; a kernel is decompressed once per cache miss, so a
//     faster third-party gzip would not pay for the dependency.
//
// LZMA and LZO kernels (rare) are refused with a pointer to
// --kernel-decompress=guest.
//
// The cache (Cache) is a root-owned directory of files named by the
// SHA-256 of the bzImage, each holding the vmlinux behind a header that
// records the vmlinux's own SHA-256, checked on every read; see cache.go.
package vmlinux

import (
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/klauspost/compress/zstd"
	"github.com/pierrec/lz4/v4"
	"github.com/therootcompany/xz"

	"github.com/hpcvmm/hpcvmm/boot"
)

// MaxSize is the largest vmlinux Decompress produces. Distribution kernels
// unpack to 40-80 MiB; the bound keeps a corrupt or hostile size field from
// making hpcvmm allocate gigabytes.
const MaxSize = 512 << 20

// Format is a kernel payload compression format.
type Format string

// The formats Decompress recognizes. Only the first five decode.
const (
	FormatGzip  Format = "gzip"
	FormatXZ    Format = "xz"
	FormatZstd  Format = "zstd"
	FormatLZ4   Format = "lz4"
	FormatBzip2 Format = "bzip2"
	FormatLZMA  Format = "lzma"
	FormatLZO   Format = "lzo"
)

// magics are the payload signatures, as arch/x86/boot/compressed's
// Makefile writes them (and as the kernel's decompress_method() reads them).
var magics = []struct {
	magic  []byte
	format Format
}{
	{[]byte{0x1f, 0x8b}, FormatGzip},
	{[]byte{0xfd, '7', 'z', 'X', 'Z', 0x00}, FormatXZ},
	{[]byte{0x28, 0xb5, 0x2f, 0xfd}, FormatZstd},
	{[]byte{0x02, 0x21, 0x4c, 0x18}, FormatLZ4}, // legacy frame
	{[]byte("BZh"), FormatBzip2},
	{[]byte{0x5d, 0x00, 0x00}, FormatLZMA},
	{[]byte{0x89, 'L', 'Z', 'O'}, FormatLZO},
}

// DetectFormat names the compression of a kernel payload by its magic.
func DetectFormat(payload []byte) (Format, bool) {
	for _, m := range magics {
		if bytes.HasPrefix(payload, m.magic) {
			return m.format, true
		}
	}
	return "", false
}

// Decompress unpacks the vmlinux from a parsed bzImage and checks that the
// result is an ELF file of the size the image declares. Every format but
// gzip has the uncompressed size appended as 4 little-endian bytes (the
// kernel Makefile's size_append); gzip's own trailer ends with the same
// field. Malformed input yields an error, never a panic.
func Decompress(k *boot.Kernel) ([]byte, Format, error) {
	if k == nil || len(k.Compressed) == 0 {
		return nil, "", errors.New("vmlinux: the bzImage's header does not locate a compressed payload (boot protocol before 2.08, or payload_length 0): boot it with --kernel-decompress=guest")
	}
	c := k.Compressed
	format, ok := DetectFormat(c)
	if !ok {
		n := min(len(c), 6)
		return nil, "", fmt.Errorf("vmlinux: unknown compression of the bzImage's payload (starts % x): boot it with --kernel-decompress=guest", c[:n])
	}
	switch format {
	case FormatLZMA, FormatLZO:
		return nil, format, fmt.Errorf("vmlinux: the bzImage's payload is %s-compressed, which hpcvmm does not decompress: boot it with --kernel-decompress=guest", format)
	}
	if len(c) < 8 {
		return nil, format, fmt.Errorf("vmlinux: %s payload of %d bytes is too short: the bzImage is corrupt", format, len(c))
	}
	size := uint64(binary.LittleEndian.Uint32(c[len(c)-4:]))
	if size == 0 || size > MaxSize {
		return nil, format, fmt.Errorf("vmlinux: %s payload declares an uncompressed size of %d bytes, outside (0, %d]: the bzImage is corrupt, or boot it with --kernel-decompress=guest", format, size, MaxSize)
	}
	var r io.Reader
	var closeFn func()
	stream := bytes.NewReader(c[:len(c)-4])
	switch format {
	case FormatGzip:
		// gzip's trailer (CRC32, ISIZE) is part of the stream.
		zr, err := gzip.NewReader(bytes.NewReader(c))
		if err != nil {
			return nil, format, fmt.Errorf("vmlinux: gzip payload: %w", err)
		}
		zr.Multistream(false)
		r = zr
	case FormatXZ:
		zr, err := xz.NewReader(stream, 0)
		if err != nil {
			return nil, format, fmt.Errorf("vmlinux: xz payload: %w", err)
		}
		r = zr
	case FormatZstd:
		zr, err := zstd.NewReader(stream, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(MaxSize),
			zstd.WithDecoderMaxWindow(MaxSize))
		if err != nil {
			return nil, format, fmt.Errorf("vmlinux: zstd payload: %w", err)
		}
		r, closeFn = zr, zr.Close
	case FormatLZ4:
		r = lz4.NewReader(stream)
	case FormatBzip2:
		r = bzip2.NewReader(stream)
	default:
		return nil, format, fmt.Errorf("vmlinux: the bzImage's payload is %s-compressed, which hpcvmm does not decompress: boot it with --kernel-decompress=guest", format)
	}
	if closeFn != nil {
		defer closeFn()
	}
	// The buffer grows with what the stream yields rather than trusting the
	// size field for a up-front allocation: a corrupt field costs no more
	// memory than the data behind it (kernels compress about 8:1).
	buf := bytes.NewBuffer(make([]byte, 0, min(size, uint64(len(c))*16)))
	// One byte past the declared size tells a stream longer than declared.
	if _, err := buf.ReadFrom(io.LimitReader(r, int64(size)+1)); err != nil {
		return nil, format, fmt.Errorf("vmlinux: %s payload: %w: the bzImage is corrupt", format, err)
	}
	out := buf.Bytes()
	if uint64(len(out)) != size {
		return nil, format, fmt.Errorf("vmlinux: %s payload decompressed to %s bytes, its size field says %d: the bzImage is corrupt", format, lenString(len(out), size), size)
	}
	if !boot.IsELF(out) {
		return nil, format, fmt.Errorf("vmlinux: the %s payload decompressed to %d bytes that are not an ELF file: boot it with --kernel-decompress=guest", format, size)
	}
	return out, format, nil
}

func lenString(n int, size uint64) string {
	if uint64(n) > size {
		return fmt.Sprintf("more than %d", size)
	}
	return fmt.Sprint(n)
}
