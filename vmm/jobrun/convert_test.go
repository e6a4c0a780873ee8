package jobrun

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/imagepack"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// TestSquashFSPlan: which path a directory IMAGE takes. auto keeps a small
// one on the initramfs path without creating the converted-image cache,
// converts one past the bound, and takes a cached conversion whatever the
// size (a warm launch); squashfs always converts.
func TestSquashFSPlan(t *testing.T) {
	if _, err := os.Stat("/usr/bin/mksquashfs"); err != nil {
		if _, err := os.Stat("/usr/local/bin/mksquashfs"); err != nil {
			t.Fatal("mksquashfs is not installed: run tests/testbed-packages.sh (squashfs-tools)")
		}
	}
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "hello"), bytes.Repeat([]byte("hello\n"), 1000), 0o644))
	im, err := rootfs.Open(dir)
	require.NoError(t, err)
	defer im.Close()
	var logged bytes.Buffer
	cacheDir := filepath.Join(t.TempDir(), "images")
	r := &runner{req: Request{Image: dir, ImageCache: cacheDir}, log: slog.New(slog.NewTextHandler(&logged, nil))}

	c, hit, err := r.squashFSPlan(im)
	require.NoError(t, err)
	assert.Nil(t, c, "a small IMAGE stays on the initramfs path")
	assert.Nil(t, hit)
	assert.NoDirExists(t, cacheDir, "auto creates no cache for it")

	defer func(v int64) { autoConvertBytes = v }(autoConvertBytes)
	autoConvertBytes = 1000
	c, hit, err = r.squashFSPlan(im)
	require.NoError(t, err)
	require.NotNil(t, c, "past the bound, IMAGE is converted")
	assert.Nil(t, hit)
	assert.Contains(t, logged.String(), "converted to SquashFS")
	res, err := imagepack.Convert(context.Background(), im, c, r.log)
	require.NoError(t, err)

	autoConvertBytes = AutoConvertBytes
	im2, err := rootfs.Open(dir)
	require.NoError(t, err)
	defer im2.Close()
	c, hit, err = r.squashFSPlan(im2)
	require.NoError(t, err)
	require.NotNil(t, hit, "a cached conversion is taken whatever the size")
	assert.NotNil(t, c)
	assert.Equal(t, res.Path, hit.Path)

	r.req.ImageMode = ImageSquashFS
	r.req.ImageCache = filepath.Join(t.TempDir(), "other")
	c, hit, err = r.squashFSPlan(im2)
	require.NoError(t, err)
	assert.NotNil(t, c, "squashfs always converts")
	assert.Nil(t, hit)
}
