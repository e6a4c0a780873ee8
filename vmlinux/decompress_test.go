package vmlinux

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot"
)

// fixture reads a file of testdata/ (made by testdata/gen.sh).
func fixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// bzImageWith builds a minimal bzImage (protocol 2.15, 64-bit entry) whose
// protected-mode code holds payload at payload_offset 0x80, the way
// arch/x86/boot/compressed lays out the decompressor and its piggy.
// Offsets are literals from the kernel's bootparam.h.
func bzImageWith(payload []byte) []byte {
	le := binary.LittleEndian
	const setupSects, payloadOff = 4, 0x80
	img := make([]byte, (setupSects+1)*512+payloadOff+len(payload)+0x40)
	img[0x1f1] = setupSects
	le.PutUint16(img[0x1fe:], 0xaa55)
	img[0x200], img[0x201] = 0xeb, 0x6a
	copy(img[0x202:], "HdrS")
	le.PutUint16(img[0x206:], 0x020f)
	img[0x211] = 0x01
	le.PutUint32(img[0x22c:], 0x7fffffff)
	le.PutUint32(img[0x230:], 0x200000)
	img[0x234] = 1
	le.PutUint16(img[0x236:], 0x3)
	le.PutUint32(img[0x238:], 0x7ff)
	le.PutUint32(img[0x248:], payloadOff)
	le.PutUint32(img[0x24c:], uint32(len(payload)))
	le.PutUint64(img[0x258:], 0x1000000)
	le.PutUint32(img[0x260:], 4<<20)
	copy(img[(setupSects+1)*512+payloadOff:], payload)
	return img
}

func parse(t testing.TB, img []byte) *boot.Kernel {
	t.Helper()
	k, err := boot.ParseBzImage(img)
	require.NoError(t, err)
	return k
}

// TestDecompressFormats: each format the kernel can be built with that
// hpcvmm decodes, compressed by the same tools and options the kernel's
// Makefile uses (xz with the x86 BCJ filter and CRC32, lz4's legacy frame,
// the appended size), unpacks to the original ELF.
func TestDecompressFormats(t *testing.T) {
	want := fixture(t, "vmlinux.elf")
	for _, c := range []struct {
		file   string
		format Format
	}{
		{"payload.xz", FormatXZ},
		{"payload.zst", FormatZstd},
		{"payload.lz4", FormatLZ4},
		{"payload.gz", FormatGzip},
		{"payload.bz2", FormatBzip2},
	} {
		t.Run(string(c.format), func(t *testing.T) {
			got, format, err := Decompress(parse(t, bzImageWith(fixture(t, c.file))))
			require.NoError(t, err)
			assert.Equal(t, c.format, format)
			assert.True(t, bytes.Equal(want, got), "decompressed %d bytes differ from vmlinux.elf (%d bytes)", len(got), len(want))
			v, err := boot.ParseVmlinux(got)
			require.NoError(t, err)
			assert.Equal(t, uint64(0x1000000), v.Entry)
		})
	}
}

// TestDecompressRejects: corrupt or unsupported payloads give an error
// that names the problem and the way out, never a panic or a wrong kernel.
func TestDecompressRejects(t *testing.T) {
	xzp := fixture(t, "payload.xz")
	withSize := func(p []byte, size uint32) []byte {
		p = append([]byte(nil), p...)
		binary.LittleEndian.PutUint32(p[len(p)-4:], size)
		return p
	}
	flip := func(p []byte, at int) []byte {
		p = append([]byte(nil), p...)
		p[at] ^= 0x40
		return p
	}
	notELF := append(bytes.Repeat([]byte{0}, 4), 0, 0, 0, 0)
	for _, c := range []struct {
		name, want string
		payload    []byte
	}{
		{"unknown", "unknown compression", []byte("plain bytes, no magic at all")},
		{"lzma", "lzma-compressed, which hpcvmm does not decompress", append([]byte{0x5d, 0, 0, 0x80, 0}, make([]byte, 32)...)},
		{"lzo", "lzo-compressed", append([]byte{0x89, 'L', 'Z', 'O', 0}, make([]byte, 32)...)},
		{"too short", "too short", []byte{0xfd, '7', 'z', 'X', 'Z', 0}},
		{"size zero", "outside (0,", withSize(xzp, 0)},
		{"size huge", "outside (0,", withSize(xzp, MaxSize+1)},
		{"size short", "its size field says 100", withSize(xzp, 100)},
		{"size long", "its size field says 60000", withSize(xzp, 60000)},
		{"corrupt xz", "corrupt", flip(xzp, len(xzp)/2)},
		{"truncated xz", "corrupt", append(append([]byte(nil), xzp[:len(xzp)/2]...), xzp[len(xzp)-4:]...)},
		{"corrupt gzip", "corrupt", flip(fixture(t, "payload.gz"), 5000)},
		{"corrupt zstd", "corrupt", flip(fixture(t, "payload.zst"), 5000)},
		// The legacy lz4 frame has no checksum: corruption shows only
		// when the result is no ELF (here: a byte of its header).
		{"corrupt lz4", "not an ELF", flip(fixture(t, "payload.lz4"), 10)},
		{"not an ELF", "not an ELF", gzipOf(t, notELF)},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _, err := Decompress(parse(t, bzImageWith(c.payload)))
			require.Error(t, err)
			assert.Nil(t, out)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	_, _, err := Decompress(nil)
	assert.ErrorContains(t, err, "--kernel-decompress=guest")
	k := parse(t, bzImageWith(xzp))
	k.Compressed = nil
	_, _, err = Decompress(k)
	assert.ErrorContains(t, err, "does not locate a compressed payload")
}

// TestDecompressStockKernel decompresses the distribution kernel of this
// machine, when there is one (Debian's is xz with the x86 BCJ filter), and
// checks that the result is a vmlinux Load accepts. The format tests above
// do not depend on it.
func TestDecompressStockKernel(t *testing.T) {
	paths, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(paths) == 0 {
		t.Skip("no /boot/vmlinuz-* on this machine: TestDecompressFormats covers the decoders")
	}
	img, err := os.ReadFile(paths[0])
	require.NoError(t, err)
	k := parse(t, img)
	out, format, err := Decompress(k)
	require.NoError(t, err, paths[0])
	v, err := boot.ParseVmlinux(out)
	require.NoError(t, err)
	t.Logf("%s: %s payload of %d bytes -> %d-byte vmlinux, entry %#x, [%#x, %#x) in %d segments",
		paths[0], format, len(k.Compressed), len(out), v.Entry, v.Start, v.End, len(v.Segments))
	assert.Equal(t, k.PrefAddress, v.Start, "the vmlinux is linked at the bzImage's pref_address")
	assert.LessOrEqual(t, v.End-v.Start, uint64(k.InitSize), "init_size covers the decompressed kernel")
}

// FuzzDecompress: arbitrary payloads behind a valid header never panic,
// and whatever decodes is an ELF of the declared size.
func FuzzDecompress(f *testing.F) {
	// Seeds from the small fixtures (gen.sh: 6 KiB ELF): a valid seed
	// decodes in a fraction of the large ones' time, so the fuzzer's
	// mutations of them run fast.
	for _, name := range []string{"seed.xz", "seed.zst", "seed.lz4", "seed.gz", "seed.bz2"} {
		p := fixture(f, name)
		f.Add(p[:len(p)/2])
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		k, err := boot.ParseBzImage(bzImageWith(payload))
		if err != nil {
			return
		}
		out, _, err := Decompress(k)
		if err != nil {
			return
		}
		size := binary.LittleEndian.Uint32(payload[len(payload)-4:])
		if !boot.IsELF(out) || uint32(len(out)) != size {
			t.Fatalf("accepted %d bytes (ELF %v) for a declared size of %d", len(out), boot.IsELF(out), size)
		}
	})
}

func gzipOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// BenchmarkStockKernel times, on this machine's distribution kernel, what
// a launch pays for its kernel: decompression on a cache miss, and on a
// hit the mapped read with its SHA-256 check.
func BenchmarkStockKernel(b *testing.B) {
	paths, _ := filepath.Glob("/boot/vmlinuz-*")
	if len(paths) == 0 {
		b.Skip("no /boot/vmlinuz-*")
	}
	img, err := os.ReadFile(paths[0])
	require.NoError(b, err)
	k := parse(b, img)
	out, _, err := Decompress(k)
	require.NoError(b, err)
	b.Run("miss-decompress", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			if _, _, err := Decompress(k); err != nil {
				b.Fatal(err)
			}
		}
	})
	c, err := OpenCache(filepath.Join(b.TempDir(), "kernels"), 0)
	require.NoError(b, err)
	key := KeyOf(img)
	require.NoError(b, c.Put(key, out))
	b.Run("hit-map-and-verify", func(b *testing.B) {
		b.SetBytes(int64(len(out)))
		for b.Loop() {
			e, err := c.Get(key)
			if err != nil {
				b.Fatal(err)
			}
			_ = e.Close()
		}
	})
	b.Run("key-sha256-of-bzimage", func(b *testing.B) {
		b.SetBytes(int64(len(img)))
		for b.Loop() {
			_ = KeyOf(img)
		}
	})
}
