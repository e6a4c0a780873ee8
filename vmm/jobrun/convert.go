package jobrun

import (
	"context"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/cachedir"
	"github.com/hpcvmm/hpcvmm/imagepack"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// ImageMode says how a directory, tar archive or container IMAGE reaches
// the guest (a SquashFS, EROFS or SIF file is always mapped as persistent
// memory).
type ImageMode int

const (
	// ImageAuto packs IMAGE into the initramfs up to AutoConvertBytes of
	// unpacked files and converts a larger one (or one converted before)
	// to SquashFS.
	ImageAuto ImageMode = iota
	// ImageInitramfs always packs IMAGE's tree into the initramfs.
	ImageInitramfs
	// ImageSquashFS always converts IMAGE once to a cached SquashFS file
	// (package imagepack) that the guest mounts from persistent memory.
	ImageSquashFS
)

// ImageModes are the modes' names, as --rootfs-mode takes them.
var ImageModes = map[string]ImageMode{"auto": ImageAuto, "initramfs": ImageInitramfs, "squashfs": ImageSquashFS}

// AutoConvertBytes is where ImageAuto switches to the converted image: an
// initramfs costs every launch (the kernel unpacks the whole tree into
// guest RAM, where it stays) and the first launch its build (about 3 s
// for 313 MiB as issue 31 measured it), while a converted image costs one
// conversion (imagepack's measured 57-94 MB/s here) and then only the
// pages the job reads, through the host's shared page cache. Below this
// size the initramfs's cost is small and it needs no squashfs-tools.
const AutoConvertBytes = 256 << 20

// autoConvertBytes is AutoConvertBytes, lowered by tests.
var autoConvertBytes int64 = AutoConvertBytes

// squashFSPlan decides, for a directory, tar or container IMAGE im
// whose initramfs is not cached (or in ImageSquashFS), whether the job
// takes the converted SquashFS path: always or never as the mode says, and
// in ImageAuto when the converted-image cache holds im's conversion
// already (a warm launch reads nothing of im) or im's files exceed
// AutoConvertBytes. It returns the cache (nil when the path is not taken)
// and the cached conversion, if any. ImageAuto creates no cache directory
// for an image that stays on the initramfs path.
func (r *runner) squashFSPlan(im *rootfs.Image) (*imagepack.Cache, *imagepack.Result, error) {
	lookup := func(c *imagepack.Cache) *imagepack.Result {
		hit, err := imagepack.Lookup(im, c)
		if err != nil {
			r.log.Debug("job: converted image cache lookup", "err", err)
		}
		return hit
	}
	if r.req.ImageMode == ImageSquashFS {
		c, err := r.openImageCache()
		if err != nil {
			return nil, nil, err
		}
		return c, lookup(c), nil
	}
	if dir, err := r.imageCacheDir(); err == nil {
		if _, err := os.Stat(dir); err == nil {
			c, err := r.openImageCache()
			if err != nil {
				return nil, nil, err
			}
			if hit := lookup(c); hit != nil {
				return c, hit, nil
			}
		}
	}
	u, err := im.Usage()
	if err != nil {
		return nil, nil, errorf(Input, "--rootfs %s: %s", r.req.Image, imageError(r.req.Image, err))
	}
	if u.Bytes <= autoConvertBytes {
		return nil, nil, nil
	}
	r.log.Info("job: IMAGE is converted to SquashFS (its files exceed --rootfs-mode auto's bound)", "image", r.req.Image,
		"files_mib", u.Bytes>>20, "bound_mib", autoConvertBytes>>20)
	c, err := r.openImageCache()
	return c, nil, err
}

// imageCacheDir is the converted-image cache's directory.
func (r *runner) imageCacheDir() (string, error) {
	if r.req.ImageCache != "" {
		return r.req.ImageCache, nil
	}
	return cachedir.Default(cachedir.Images)
}

// prepareConverted converts IMAGE's tree once to SquashFS (or takes the
// cached conversion, hit) and sets the job up to map it as persistent
// memory (preparePMEM). COMMAND was looked up in the tree before.
func (r *runner) prepareConverted(ctx context.Context, im *rootfs.Image, cache *imagepack.Cache, hit *imagepack.Result) (string, error) {
	res := hit
	if res == nil {
		var err error
		if res, err = imagepack.Convert(ctx, im, cache, r.log); err != nil {
			return "", errorf(VMFailed, "--rootfs %s: converting it to SquashFS: %v", r.req.Image, err)
		}
	} else {
		r.log.Info("job: converted image cache hit", "image", r.req.Image, "squashfs", res.Path)
	}
	f, err := os.OpenFile(res.Path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", errorf(VMFailed, "--rootfs %s: its converted image: %v", r.req.Image, err)
	}
	// The file is checked as any pmem IMAGE is: the cache verified it,
	// and this descriptor is the one the VM maps.
	fi, err := f.Stat()
	if err != nil || fi.Size() != res.Size {
		f.Close()
		return "", errorf(VMFailed, "--rootfs %s: its converted image %s changed under hpcvmm (size %d, want %d): run again", r.req.Image, res.Path, sizeOf(fi), res.Size)
	}
	r.pmemPath = res.Path
	return r.preparePMEM(f, &res.Image)
}

// openImageCache opens the converted-image cache (Request.ImageCache).
func (r *runner) openImageCache() (*imagepack.Cache, error) {
	c, err := imagepack.OpenCache(r.req.ImageCache, 0)
	if err != nil {
		return nil, &Error{Kind: Host, Err: fmt.Errorf("--rootfs %s: the converted-image cache: %w", r.req.Image, err)}
	}
	return c, nil
}

func sizeOf(fi os.FileInfo) int64 {
	if fi == nil {
		return -1
	}
	return fi.Size()
}
