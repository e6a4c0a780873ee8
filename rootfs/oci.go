package rootfs

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
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
		return checkedImage(idx, images[0].Digest)
	}
	for _, d := range images {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
			return checkedImage(idx, d.Digest)
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

// checkedImage returns the image of manifest digest h after checking that
// the manifest and config blobs hash to the digests that name them: the
// layout package reads blobs by name without checking them, and the
// manifest digest is the image's cache key.
func checkedImage(idx v1.ImageIndex, h v1.Hash) (v1.Image, error) {
	img, err := idx.Image(h)
	if err != nil {
		return nil, err
	}
	if got, err := img.Digest(); err != nil || got != h {
		return nil, fmt.Errorf("manifest blob %s does not hash to its name (%v %v): the layout is corrupt", h, got, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if got, err := img.ConfigName(); err != nil || got != m.Config.Digest {
		return nil, fmt.Errorf("config blob %s does not hash to its name (%v %v): the layout is corrupt", m.Config.Digest, got, err)
	}
	return img, nil
}

// verifiedImage is an image whose layers check their uncompressed content
// against the config's diff_ids as they are read: neither layout nor
// tarball checks a layer blob, and mutate.Extract reads each layer to its
// end, so a layer that does not match fails the walk.
type verifiedImage struct {
	v1.Image
	layers []v1.Layer
}

func (v *verifiedImage) Layers() ([]v1.Layer, error) { return v.layers, nil }

// configDigest reads img's config once and returns its SHA-256: the
// image's content key (the config's diff_ids name every layer's content).
func configDigest(img v1.Image) (v1.Hash, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("config: %w", err)
	}
	sum := sha256.Sum256(raw)
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}, nil
}

// verifyLayers returns img with each layer checked, as it is read, against
// the diff_id of the config whose digest is want (read once here and
// checked, so the layers are bound to the key Open computed).
func verifyLayers(img v1.Image, want v1.Hash) (v1.Image, error) {
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if sum := sha256.Sum256(raw); want.Algorithm != "sha256" || hex.EncodeToString(sum[:]) != want.Hex {
		return nil, fmt.Errorf("the config changed since the image was opened (%s, now sha256:%x): launch again once it is written", want, sum)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) != len(cf.RootFS.DiffIDs) {
		return nil, fmt.Errorf("the manifest has %d layers, the config %d diff_ids", len(layers), len(cf.RootFS.DiffIDs))
	}
	v := &verifiedImage{Image: img}
	for i, l := range layers {
		v.layers = append(v.layers, &verifiedLayer{Layer: l, diffID: cf.RootFS.DiffIDs[i]})
	}
	return v, nil
}

type verifiedLayer struct {
	v1.Layer
	diffID v1.Hash
}

func (l *verifiedLayer) Uncompressed() (io.ReadCloser, error) {
	if l.diffID.Algorithm != "sha256" {
		return nil, fmt.Errorf("layer diff_id %s: only sha256 is supported", l.diffID)
	}
	rc, err := l.Layer.Uncompressed()
	if err != nil {
		return nil, err
	}
	return &hashCheck{rc: rc, h: sha256.New(), want: l.diffID}, nil
}

// hashCheck turns the end of a layer's stream into an error when the
// stream's SHA-256 is not the one wanted.
type hashCheck struct {
	rc   io.ReadCloser
	h    hash.Hash
	want v1.Hash
}

func (c *hashCheck) Read(p []byte) (int, error) {
	n, err := c.rc.Read(p)
	c.h.Write(p[:n])
	if errors.Is(err, io.EOF) {
		if got := hex.EncodeToString(c.h.Sum(nil)); got != c.want.Hex {
			return n, fmt.Errorf("layer content has sha256:%s, the config's diff_id is %s: the layer is corrupt or was replaced", got, c.want)
		}
	}
	return n, err
}

func (c *hashCheck) Close() error { return c.rc.Close() }

// openDockerArchive returns the image a `docker save`/`podman save` archive
// holds (its manifest.json must list exactly one).
func openDockerArchive(path string) (v1.Image, error) {
	return tarball.ImageFromPath(path, nil)
}

// walkImage flattens img's layers (in order, whiteouts applied, by
// mutate.Extract) and yields the result.
func walkImage(img v1.Image, cfg v1.Hash, image string, fn func(*Entry, io.Reader) error) error {
	img, err := verifyLayers(img, cfg)
	if err != nil {
		return fmt.Errorf("rootfs: image %s: %w: pull or save the image again", image, err)
	}
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
	_, err = io.Copy(io.Discard, rc)
	return err
}
