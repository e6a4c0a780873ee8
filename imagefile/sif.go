package imagefile

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"

	"github.com/apptainer/sif/v2/pkg/sif"
)

// The SIF global header (the sif library's unexported header struct, read
// packed and little-endian): the launch script (32 bytes), the magic at
// 32, the version at 42, the architecture at 45, the ID at 48, then
// int64s. TestSIFHeaderOffsets checks these against images the library
// writes.
const (
	sifMagicOffset     = 32
	sifDescTotalOffset = 88
	sifDescOffOffset   = 96
	sifDescSizeOffset  = 104
	sifHeaderLen       = 128
	// sifDescriptorLen is one rawDescriptor as the library reads it.
	sifDescriptorLen = 585
	// sifMaxDescriptors bounds the descriptor table before the library
	// allocates it: Apptainer writes 48 (its default capacity).
	sifMaxDescriptors = 1 << 12
)

var sifMagic = []byte("SIF_MAGIC\x00")

func isSIF(head []byte) bool {
	return len(head) >= sifMagicOffset+len(sifMagic) && bytes.Equal(head[sifMagicOffset:sifMagicOffset+len(sifMagic)], sifMagic)
}

// checkSIF finds the SIF's primary system partition and checks the
// SquashFS in it.
func checkSIF(r io.ReaderAt, size int64) (Image, error) {
	if err := checkSIFHeader(r, size); err != nil {
		return Image{}, err
	}
	f, err := sif.LoadContainer(readOnly{r}, sif.OptLoadWithCloseOnUnload(false))
	if err != nil {
		return Image{}, corrupt("reading the SIF header: %v", err)
	}
	parts, err := f.GetDescriptors(sif.WithPartitionType(sif.PartPrimSys))
	if err != nil && !errors.Is(err, sif.ErrNoObjects) {
		return Image{}, corrupt("reading the SIF descriptors: %v", err)
	}
	if len(parts) == 0 {
		return Image{}, fmt.Errorf("SIF has no primary system partition: build the image with apptainer build")
	}
	if len(parts) > 1 {
		return Image{}, corrupt("SIF has %d primary system partitions", len(parts))
	}
	d := parts[0]
	fs, _, arch, err := d.PartitionMetadata()
	if err != nil {
		return Image{}, corrupt("reading the SIF partition's metadata: %v", err)
	}
	switch fs {
	case sif.FsSquash:
	case sif.FsEncryptedSquashfs, sif.FsGocryptfsSquashfs:
		return Image{}, fmt.Errorf("SIF's system partition is encrypted (%v): hpcvmm cannot decrypt it; build an unencrypted SIF (apptainer build without --encrypt)", fs)
	case sif.FsExt3:
		return Image{}, fmt.Errorf("SIF's system partition is EXT3, a writable image hpcvmm cannot map read-only; convert it to SquashFS (apptainer build new.sif old.sif)")
	default:
		return Image{}, fmt.Errorf("SIF's system partition is %v, not SquashFS: build the image with apptainer build", fs)
	}
	if arch != "unknown" && arch != runtime.GOARCH {
		return Image{}, fmt.Errorf("SIF is for %s, this host runs %s guests: use an image built for %s", arch, runtime.GOARCH, runtime.GOARCH)
	}
	off, n := d.Offset(), d.Size()
	if off < 0 || n <= 0 || off > size || n > size-off {
		return Image{}, corrupt("SIF partition [%d, +%d) lies outside the file's %d bytes", off, n, size)
	}
	if off%PageSize != 0 {
		return Image{}, fmt.Errorf("SIF partition starts at byte %d, not at a multiple of %d, so it cannot be mapped into the guest: rebuild it with apptainer build (which aligns partitions)", off, PageSize)
	}
	im, err := checkSquashFS(r, off, n)
	if err != nil {
		return Image{}, fmt.Errorf("SIF partition at byte %d: %w", off, err)
	}
	im.Container = SIF
	sigs, err := f.GetDescriptors(sif.WithDataType(sif.DataSignature))
	im.Signed = err == nil && len(sigs) > 0
	return im, nil
}

// checkSIFHeader checks that the header's descriptor table lies inside the
// file before the sif library allocates and reads it: the library makes a
// slice of the header's count, which a corrupt file could make any size.
func checkSIFHeader(r io.ReaderAt, size int64) error {
	if size < sifHeaderLen {
		return corrupt("SIF header cut short (%d of %d bytes)", size, sifHeaderLen)
	}
	h := make([]byte, sifHeaderLen)
	if _, err := r.ReadAt(h, 0); err != nil {
		return corrupt("reading the SIF header: %v", err)
	}
	le := binary.LittleEndian
	total := int64(le.Uint64(h[sifDescTotalOffset:]))
	off := int64(le.Uint64(h[sifDescOffOffset:]))
	n := int64(le.Uint64(h[sifDescSizeOffset:]))
	if total <= 0 || total > sifMaxDescriptors {
		return corrupt("SIF header lists %d descriptors", total)
	}
	if off < sifHeaderLen || n < total*sifDescriptorLen || off > size || n > size-off {
		return corrupt("SIF descriptor table [%d, +%d) for %d descriptors lies outside the file's %d bytes", off, n, total, size)
	}
	return nil
}

// readOnly gives the sif library, which wants a file it could write, a
// reader that refuses every write: Detect never changes IMAGE.
type readOnly struct{ io.ReaderAt }

var errReadOnly = errors.New("imagefile: IMAGE is opened read-only")

func (readOnly) Write([]byte) (int, error)      { return 0, errReadOnly }
func (readOnly) Seek(int64, int) (int64, error) { return 0, errReadOnly }
func (readOnly) Truncate(int64) error           { return errReadOnly }
