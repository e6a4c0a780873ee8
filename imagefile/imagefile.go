// Package imagefile recognises and checks a job's IMAGE file when it is a
// read-only file system image the guest mounts itself (issue 31): a bare
// SquashFS or EROFS image, or an Apptainer/Singularity SIF whose primary
// system partition is SquashFS. It finds where the file system's bytes lie
// in the file (Image.Offset, Image.Size), which hpcvmm maps read-only into
// the guest as persistent memory (vmm.Config.PMEM), and checks, before
// anything on the host changes, what the guest kernel would otherwise find
// out at mount time: the superblock's magic, version and block size, and
// that the sizes the superblock claims lie inside the file (a truncated
// copy is the common case).
//
// Everything it reads is the user's file and so untrusted: every offset and
// size is checked against the file's size before it is used, nothing is
// allocated from a size the file gives, and FuzzDetect holds it to that.
// The SIF descriptors are read with github.com/apptainer/sif/v2 after
// hpcvmm checked the header's descriptor table lies inside the file (the
// library allocates the table from the header's count).
//
// A SIF's signatures are not verified: hpcvmm boots what the user could
// run with `apptainer exec` from the same file, with the user's rights, so
// a signature would prove nothing to hpcvmm that the user's read access
// does not. Image.Signed says one was there; verify with `apptainer verify`
// where a site's policy needs it. An encrypted partition cannot be
// mounted without the key Apptainer's runtime brings, and an EXT3
// partition (an old writable SIF) is no read-only file system: both are
// refused.
package imagefile

import (
	"errors"
	"fmt"
	"io"
)

// FSType is the guest file system an image holds: the type the guest's
// agent mounts.
type FSType string

// The file systems hpcvmm maps as persistent memory.
const (
	SquashFS FSType = "squashfs"
	EROFS    FSType = "erofs"
)

// Container is how the file system is packed in IMAGE.
type Container string

// The containers Detect recognises.
const (
	// Bare is a file that is the file system image itself.
	Bare Container = "bare"
	// SIF is an Apptainer/Singularity image with the file system as its
	// primary system partition.
	SIF Container = "sif"
)

// PageSize is the alignment the file system must start at inside IMAGE:
// the guest's pmem range maps the file by host pages, so its first byte
// must be a page's.
const PageSize = 4096

// Image is a file system image found in an IMAGE file.
type Image struct {
	// FSType is the file system (the guest's mount type).
	FSType FSType
	// Container says whether the file is the image or a SIF around it.
	Container Container
	// Offset and Size are where the file system lies in the file:
	// Offset is a multiple of PageSize and Offset+Size is at most
	// FileSize. Size covers at least what the superblock says the file
	// system uses.
	Offset, Size int64
	// Used is what the superblock says the file system uses (SquashFS's
	// bytes_used, EROFS's blocks × block size), at most Size.
	Used int64
	// FileSize is the size of the file Detect read.
	FileSize int64
	// Signed is true for a SIF with signature objects; they are not
	// verified (see the package doc).
	Signed bool
}

// ErrNotImage is wrapped by Detect's error when the file is none of the
// formats: the caller then tries its other IMAGE formats (a tar archive,
// ...). A file that is one of them but is corrupt, truncated or of a kind
// hpcvmm refuses gives another error.
var ErrNotImage = errors.New("not a SquashFS, EROFS or SIF image")

// Detect recognises the image in r, a file of size bytes named name (the
// IMAGE the user gave, for the errors), and checks it. Its errors are one
// line naming name and saying what to do; one wrapping ErrNotImage means
// the file is none of the formats.
func Detect(name string, r io.ReaderAt, size int64) (Image, error) {
	if size < 0 {
		return Image{}, fmt.Errorf("IMAGE %s: negative size %d", name, size)
	}
	head := make([]byte, headLen)
	n, err := r.ReadAt(head, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Image{}, fmt.Errorf("IMAGE %s: reading its first bytes: %w", name, err)
	}
	head = head[:min(int64(n), size)]
	switch {
	case isSquashFS(head):
		im, err := checkSquashFS(r, 0, size)
		if err != nil {
			return Image{}, fmt.Errorf("IMAGE %s: %w", name, err)
		}
		im.FileSize = size
		return im, nil
	case isSIF(head):
		im, err := checkSIF(r, size)
		if err != nil {
			return Image{}, fmt.Errorf("IMAGE %s: %w", name, err)
		}
		im.FileSize = size
		return im, nil
	case isEROFS(head):
		im, err := checkEROFS(head, size)
		if err != nil {
			return Image{}, fmt.Errorf("IMAGE %s: %w", name, err)
		}
		im.FileSize = size
		return im, nil
	}
	return Image{}, fmt.Errorf("IMAGE %s: %w", name, ErrNotImage)
}

// headLen is how much of the file Detect reads to recognise it: up to the
// end of EROFS's superblock (at 1024).
const headLen = erofsSuperOffset + erofsSuperLen

// corrupt is the error of a recognised image whose sizes or fields do not
// hold, with what to do about it.
func corrupt(format string, args ...any) error {
	return fmt.Errorf(format+": the file is truncated or corrupt; copy or build it again", args...)
}
