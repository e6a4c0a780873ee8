package rootfs

import (
	"fmt"
	"io"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// openLayout returns the image an OCI image layout directory holds: its
// index's one image, or, in a multi-platform index (possibly nested), the
// one for linux on this machine's architecture.
func openLayout(dir string) (v1.Image, error) {
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, err
	}
	return pickImage(idx, 0)
}

func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("image indexes nested more than 4 deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var images, indexes []v1.Descriptor
	for _, d := range im.Manifests {
		switch {
		case d.MediaType.IsImage():
			images = append(images, d)
		case d.MediaType.IsIndex():
			indexes = append(indexes, d)
		}
	}
	if len(images) == 1 && len(indexes) == 0 {
		return idx.Image(images[0].Digest)
	}
	for _, d := range images {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			return idx.Image(d.Digest)
		}
	}
	if len(images) == 0 && len(indexes) == 1 {
		child, err := idx.ImageIndex(indexes[0].Digest)
		if err != nil {
			return nil, err
		}
		return pickImage(child, depth+1)
	}
	return nil, fmt.Errorf("the index lists %d images and %d indexes, none of them the only one or one for linux/%s: keep one image in the layout", len(images), len(indexes), runtime.GOARCH)
}

// openDockerArchive returns the image a `docker save`/`podman save` archive
// holds (its manifest.json must list exactly one).
func openDockerArchive(path string) (v1.Image, error) {
	return tarball.ImageFromPath(path, nil)
}

// walkImage flattens img's layers (in order, whiteouts applied, by
// mutate.Extract) and yields the result.
func walkImage(img v1.Image, image string, fn func(*Entry, io.Reader) error) error {
	rc := mutate.Extract(img)
	// Closing stops the extracting goroutine when the walk ends early: it
	// blocks on its pipe otherwise.
	defer rc.Close()
	if err := walkTar(rc, image, fn); err != nil {
		return err
	}
	// Extract's tar writer writes the end-of-archive blocks even when a
	// layer failed (a deferred Close), and the error comes only after them:
	// read on to the pipe's end, or a corrupt or unsafe layer would pass as
	// a shorter image.
	_, err := io.Copy(io.Discard, rc)
	return err
}
