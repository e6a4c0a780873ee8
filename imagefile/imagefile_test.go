package imagefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/apptainer/sif/v2/pkg/sif"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func detect(b []byte) (Image, error) {
	return Detect("/img", bytes.NewReader(b), int64(len(b)))
}

// requireOneLine checks an error is one line naming IMAGE and containing
// want.
func requireOneLine(t *testing.T, err error, want string) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	assert.NotContains(t, msg, "\n")
	assert.True(t, strings.HasPrefix(msg, "IMAGE /img: "), msg)
	assert.Contains(t, msg, want)
}

func TestDetectSquashFS(t *testing.T) {
	img := squashfs(t)
	im, err := detect(img)
	require.NoError(t, err)
	assert.Equal(t, SquashFS, im.FSType)
	assert.Equal(t, Bare, im.Container)
	assert.Equal(t, int64(0), im.Offset)
	assert.Equal(t, int64(len(img)), im.Size)
	assert.Equal(t, int64(len(img)), im.FileSize)
	assert.Equal(t, int64(binary.LittleEndian.Uint64(img[squashBytesUsed:])), im.Used)
	assert.LessOrEqual(t, im.Used, im.Size)
}

func TestDetectEROFS(t *testing.T) {
	img := erofs(t)
	im, err := detect(img)
	require.NoError(t, err)
	assert.Equal(t, EROFS, im.FSType)
	assert.Equal(t, int64(0), im.Offset)
	assert.Equal(t, int64(len(img)), im.Size)
	assert.LessOrEqual(t, im.Used, im.Size)
	assert.Positive(t, im.Used)
}

func TestDetectSIF(t *testing.T) {
	fs := squashfs(t)
	for _, signed := range []bool{false, true} {
		img := makeSIF(t, fs, sifOpts{signed: signed})
		im, err := detect(img)
		require.NoError(t, err)
		assert.Equal(t, SquashFS, im.FSType)
		assert.Equal(t, SIF, im.Container)
		assert.Equal(t, signed, im.Signed)
		assert.Zero(t, im.Offset%PageSize)
		assert.Equal(t, int64(len(fs)), im.Size)
		assert.Equal(t, fs, img[im.Offset:im.Offset+im.Size], "the range is the partition's bytes")
	}
}

func TestSIFRefusals(t *testing.T) {
	fs := squashfs(t)
	cases := []struct {
		name string
		o    sifOpts
		want string
	}{
		{"encrypted", sifOpts{fs: sif.FsEncryptedSquashfs}, "encrypted"},
		{"gocryptfs", sifOpts{fs: sif.FsGocryptfsSquashfs}, "encrypted"},
		{"ext3", sifOpts{fs: sif.FsExt3}, "EXT3"},
		{"raw", sifOpts{fs: sif.FsRaw}, "not SquashFS"},
		{"no primary partition", sifOpts{noPrimary: true}, "no primary system partition"},
		{"other architecture", sifOpts{arch: "arm64"}, "SIF is for arm64"},
		{"unaligned partition", sifOpts{misalign: true}, "not at a multiple of 4096"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := detect(makeSIF(t, fs, tc.o))
			requireOneLine(t, err, tc.want)
			assert.False(t, errors.Is(err, ErrNotImage))
		})
	}
}

// TestSIFHeaderOffsets checks the header fields checkSIFHeader reads
// against what the sif library writes and reports.
func TestSIFHeaderOffsets(t *testing.T) {
	img := makeSIF(t, squashfs(t), sifOpts{signed: true})
	f, err := sif.LoadContainer(readOnly{bytes.NewReader(img)})
	require.NoError(t, err)
	le := binary.LittleEndian
	assert.Equal(t, f.DescriptorsTotal(), int64(le.Uint64(img[sifDescTotalOffset:])))
	assert.Equal(t, f.DescriptorsOffset(), int64(le.Uint64(img[sifDescOffOffset:])))
	assert.Equal(t, f.DescriptorsSize(), int64(le.Uint64(img[sifDescSizeOffset:])))
	assert.Equal(t, f.DescriptorsTotal()*sifDescriptorLen, f.DescriptorsSize())
	assert.LessOrEqual(t, int64(sifHeaderLen), f.DescriptorsOffset())
}

func TestDetectCorrupt(t *testing.T) {
	fs := squashfs(t)
	set16 := func(b []byte, at int, v uint16) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint16(b[at:], v)
		return b
	}
	set32 := func(b []byte, at int, v uint32) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint32(b[at:], v)
		return b
	}
	set64 := func(b []byte, at int, v uint64) []byte {
		b = bytes.Clone(b)
		binary.LittleEndian.PutUint64(b[at:], v)
		return b
	}
	used := binary.LittleEndian.Uint64(fs[squashBytesUsed:])
	sifImg := makeSIF(t, fs, sifOpts{})
	sifIm, err := detect(sifImg)
	require.NoError(t, err)
	ero := erofs(t)
	cases := []struct {
		name string
		img  []byte
		want string
	}{
		{"squashfs cut", fs[:used-1], "truncated or corrupt"},
		{"squashfs superblock cut", fs[:40], "cut short"},
		{"squashfs 3.1", set16(set16(fs, squashMajor, 3), squashMinor, 1), "version 3.1"},
		{"squashfs block size", set32(fs, squashBlockSize, 3000), "block size 3000"},
		{"squashfs block log", set16(fs, squashBlockLog, 5), "block size"},
		{"squashfs compressor", set16(fs, squashCompression, 9), "compressor 9"},
		{"squashfs bytes_used past the end", set64(fs, squashBytesUsed, uint64(len(fs))+1), "the file has"},
		{"squashfs inode table past bytes_used", set64(fs, squashInodeTable, used), "inode table"},
		{"sif cut inside the partition", sifImg[:sifIm.Offset+sifIm.Size/2], "outside the file"},
		{"sif cut inside the header", sifImg[:100], "cut short"},
		{"sif huge descriptor count", set64(sifImg, sifDescTotalOffset, 1<<40), "descriptors"},
		{"sif descriptor table past the end", set64(sifImg, sifDescOffOffset, uint64(len(sifImg))), "outside the file"},
		{"sif partition not squashfs", set32(sifImg, int(sifIm.Offset), 0), "no SquashFS magic"},
		{"erofs cut", ero[:len(ero)-4096], "truncated or corrupt"},
		{"erofs block size", func() []byte { b := bytes.Clone(ero); b[erofsSuperOffset+erofsBlkSzBits] = 16; return b }(), "2^16"},
		{"erofs no blocks", set32(ero, erofsSuperOffset+erofsBlocks, 0), "0 blocks"},
		{"erofs superblock cut", ero[:erofsSuperOffset+64], "cut short"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := detect(tc.img)
			requireOneLine(t, err, tc.want)
			assert.False(t, errors.Is(err, ErrNotImage), "a recognised image is not 'not an image'")
		})
	}
}

func TestDetectNotImage(t *testing.T) {
	for name, b := range map[string][]byte{
		"empty":  nil,
		"text":   []byte("hello world\n"),
		"gzip":   {0x1f, 0x8b, 8, 0, 0, 0, 0, 0},
		"zeroes": make([]byte, 8192),
	} {
		_, err := detect(b)
		require.ErrorIs(t, err, ErrNotImage, name)
		requireOneLine(t, err, "not a SquashFS, EROFS or SIF image")
	}
}

// BenchmarkDetectSIF is the host's check of a SIF IMAGE before boot: the
// header, the descriptors and the partition's SquashFS superblock.
func BenchmarkDetectSIF(b *testing.B) {
	img := makeSIF(b, squashfs(b), sifOpts{signed: true})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Detect("/img", bytes.NewReader(img), int64(len(img))); err != nil {
			b.Fatal(err)
		}
	}
}
