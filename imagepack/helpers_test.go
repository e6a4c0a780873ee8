package imagepack

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

func init() {
	settle, grace = 0, 0
}

// tool returns the path of a squashfs-tools program; a missing one skips,
// or fails where HPCVMM_REQUIRE_INTEGRATION=1 (CI):
// tests/testbed-packages.sh installs them.
func tool(t testing.TB, name string) string {
	t.Helper()
	for _, d := range toolDirs {
		if p := filepath.Join(d, name); isExecutable(p) {
			return p
		}
	}
	testenv.SkipOrFail(t, "%s not found: install Debian's squashfs-tools (tests/testbed-packages.sh does)", name)
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// ent is one entry of a test archive.
type ent struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
}

func file(name, body string, mode int64) ent {
	return ent{name: name, body: body, typ: tar.TypeReg, mode: mode}
}
func dir(name string, mode int64) ent { return ent{name: name, typ: tar.TypeDir, mode: mode} }
func symlink(name, target string) ent {
	return ent{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}

func tarBytes(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.body)),
			Uid: e.uid, Gid: e.gid, Devmajor: e.major, Devminor: e.minor, Format: tar.FormatPAX}
		if e.typ != tar.TypeReg {
			hdr.Size = 0
		}
		require.NoError(t, tw.WriteHeader(hdr))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func layer(t testing.TB, ents ...ent) v1.Layer {
	b := tarBytes(t, ents...)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	require.NoError(t, err)
	return l
}

// ociLayout writes an OCI image layout of the image whose layers hold
// ents, one layer per slice, and returns its directory.
func ociLayout(t testing.TB, layers ...[]ent) string {
	t.Helper()
	var ls []v1.Layer
	for _, l := range layers {
		ls = append(ls, layer(t, l...))
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, p.AppendImage(img))
	return dir
}

func writeFile(t testing.TB, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "image.tar")
	require.NoError(t, os.WriteFile(p, b, 0o644))
	return p
}

func openImage(t testing.TB, p string) *rootfs.Image {
	t.Helper()
	im, err := rootfs.Open(p)
	require.NoError(t, err)
	return im
}

func openCache(t testing.TB) *Cache {
	t.Helper()
	c, err := OpenCache(filepath.Join(t.TempDir(), "cache"), 0)
	require.NoError(t, err)
	return c
}

func convertPath(t testing.TB, p string, c *Cache) *Result {
	t.Helper()
	res, err := Convert(context.Background(), openImage(t, p), c, nil)
	require.NoError(t, err)
	return res
}

// listing is unsquashfs -lln's view of a SquashFS: path (without the
// "squashfs-root" prefix) → "mode uid/gid [-> target | major,minor]".
func listing(t testing.TB, sqfs string) map[string]string {
	t.Helper()
	out, err := exec.Command(tool(t, "unsquashfs"), "-lln", sqfs).CombinedOutput()
	require.NoError(t, err, "unsquashfs: %s", out)
	re := regexp.MustCompile(`^(\S+) (\d+/\d+)\s+(\d+,\s*\d+|\d+) \S+ \S+ squashfs-root(\S*)(?: -> (.*))?$`)
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		m := re.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		v := m[1] + " " + m[2]
		switch {
		case m[5] != "":
			v += " -> " + m[5]
		case strings.Contains(m[3], ","):
			v += " " + strings.ReplaceAll(m[3], " ", "")
		}
		got[m[4]] = v
	}
	require.NotEmpty(t, got, "unsquashfs listed nothing: %s", out)
	return got
}

// cat is a file's content in the SquashFS, read with sqfscat.
func cat(t testing.TB, sqfs, name string) string {
	t.Helper()
	out, err := exec.Command(tool(t, "sqfscat"), sqfs, name).Output()
	require.NoError(t, err, "sqfscat %s", name)
	return string(out)
}

// cacheFiles lists the cache directory's file names.
func cacheFiles(t testing.TB, c *Cache) []string {
	t.Helper()
	des, err := os.ReadDir(c.Dir())
	require.NoError(t, err)
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}
