package initramfs

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// zeros yields n zero bytes without holding them.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), z.n)]
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

// noLeftovers fails when dir holds a temporary file or an archive.
func noLeftovers(t *testing.T, dir string) {
	t.Helper()
	des, _ := os.ReadDir(dir)
	for _, de := range des {
		require.False(t, strings.HasPrefix(de.Name(), tempPrefix) || strings.HasSuffix(de.Name(), archiveExt), "a refused build left %s", de.Name())
	}
}

// Issue 30 item 4: a build was bounded only by the guest's memory, and the
// cache's bound applied after an entry was written, never to the entry
// being written: an 8 KiB tar.zst became a 256 MiB entry. Before the fix
// this build succeeded and wrote 256 MiB; now it stops at the cache's
// bound, removes its temporary file and says which IMAGE and which bound.
func TestCacheBombRefusedAtTheCacheBound(t *testing.T) {
	var zst bytes.Buffer
	zw, err := zstd.NewWriter(&zst, zstd.WithEncoderLevel(zstd.SpeedBestCompression))
	require.NoError(t, err)
	tw := tar.NewWriter(zw)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "zeros", Mode: 0o644, Size: 256 << 20, Typeflag: tar.TypeReg}))
	_, err = io.Copy(tw, &zeros{n: 256 << 20})
	require.NoError(t, err)
	require.NoError(t, tw.Close())
	require.NoError(t, zw.Close())
	require.Less(t, zst.Len(), 12<<10, "an ~8 KiB tar.zst")
	t.Logf("the tar.zst: %d bytes", zst.Len())
	img := filepath.Join(t.TempDir(), "bomb.tar.zst")
	require.NoError(t, os.WriteFile(img, zst.Bytes(), 0o644))

	cfg := config(t, img)
	cfg.CacheMax = 32 << 20
	start := time.Now()
	_, err = Build(cfg)
	require.Error(t, err, "an 8 KiB image built a 256 MiB entry into a 32 MiB cache")
	t.Log(err)
	require.ErrorContains(t, err, img)
	require.ErrorContains(t, err, "32 MiB")
	require.ErrorContains(t, err, "bound")
	require.NotContains(t, err.Error(), "\n")
	require.Less(t, time.Since(start), 10*time.Second)
	noLeftovers(t, cfg.CacheDir)

	// The pre-build estimate (rootfs.Usage) sees the same size.
	im, err := rootfs.Open(img)
	require.NoError(t, err)
	u, err := im.Usage()
	require.NoError(t, err)
	require.Greater(t, u.Archive, int64(256<<20))
}

// Issue 30 item 4: a 10 KiB tar holding one name 4,000 levels deep became
// a 16 MB entry (the synthesized parents grow with the square of the
// depth; 20,000 levels took 21 s for 402 MB). Before the fix it built; now
// the name is refused at once, naming IMAGE and the limit.
func TestDeepNameRefused(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	name := strings.Repeat("a/", 3999) + "f"
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX}))
	require.NoError(t, tw.Close())
	require.Less(t, b.Len(), 12<<10, "a ~10 KiB tar")
	img := filepath.Join(t.TempDir(), "deep.tar")
	require.NoError(t, os.WriteFile(img, b.Bytes(), 0o644))

	cfg := config(t, img)
	start := time.Now()
	_, err := Build(cfg)
	require.Error(t, err, "a name 4,000 levels deep was built")
	t.Log(err)
	require.ErrorContains(t, err, img)
	require.ErrorContains(t, err, "PATH_MAX")
	require.NotContains(t, err.Error(), "\n")
	require.Less(t, time.Since(start), 2*time.Second)
	noLeftovers(t, cfg.CacheDir)

	// Within PATH_MAX but deeper than the limit: refused too.
	b.Reset()
	tw = tar.NewWriter(&b)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: strings.Repeat("a/", rootfs.MaxDepth) + "f", Mode: 0o644, Typeflag: tar.TypeReg, Format: tar.FormatPAX}))
	require.NoError(t, tw.Close())
	require.NoError(t, os.WriteFile(img, b.Bytes(), 0o644))
	cfg.Image, err = rootfs.Open(img)
	require.NoError(t, err)
	_, err = Build(cfg)
	require.ErrorContains(t, err, "257 directories deep, more than hpcvmm's limit of 256")
	require.ErrorContains(t, err, img)
}
