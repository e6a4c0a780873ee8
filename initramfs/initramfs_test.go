package initramfs

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"
)

func init() { racyWindow = 0 }

// elfExe returns a minimal x86-64 ELF executable: one PT_LOAD, and a
// PT_INTERP when dynamic.
func elfExe(dynamic bool) []byte {
	var b bytes.Buffer
	nph := 1
	if dynamic {
		nph = 2
	}
	le := binary.LittleEndian
	b.Write([]byte{0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	binary.Write(&b, le, uint16(2))    // ET_EXEC
	binary.Write(&b, le, uint16(62))   // EM_X86_64
	binary.Write(&b, le, uint32(1))    // EV_CURRENT
	binary.Write(&b, le, uint64(0x78)) // entry
	binary.Write(&b, le, uint64(64))   // phoff
	binary.Write(&b, le, uint64(0))    // shoff
	binary.Write(&b, le, uint32(0))    // flags
	binary.Write(&b, le, uint16(64))   // ehsize
	binary.Write(&b, le, uint16(56))   // phentsize
	binary.Write(&b, le, uint16(nph))
	binary.Write(&b, le, uint16(64)) // shentsize
	binary.Write(&b, le, uint16(0))
	binary.Write(&b, le, uint16(0))
	interp := "/lib64/ld-linux-x86-64.so.2\x00"
	end := uint64(64 + 56*nph)
	ph := func(typ uint32, off, size uint64) {
		binary.Write(&b, le, typ)
		binary.Write(&b, le, uint32(5))
		binary.Write(&b, le, off)
		binary.Write(&b, le, off) // vaddr
		binary.Write(&b, le, off) // paddr
		binary.Write(&b, le, size)
		binary.Write(&b, le, size)
		binary.Write(&b, le, uint64(1))
	}
	if dynamic {
		ph(3, end, uint64(len(interp))) // PT_INTERP
	}
	ph(1, 0, end+uint64(len(interp))) // PT_LOAD
	b.WriteString(interp)
	return b.Bytes()
}

func writeAgent(t testing.TB, dynamic bool) string {
	p := filepath.Join(t.TempDir(), "hpcvmm")
	require.NoError(t, os.WriteFile(p, elfExe(dynamic), 0o755))
	return p
}

// imageDir makes a small directory rootfs: merged /usr, a shell, a hard
// link, a symlink out of the image.
func imageDir(t testing.TB) string {
	root := t.TempDir()
	must := func(err error) { t.Helper(); require.NoError(t, err) }
	must(os.MkdirAll(filepath.Join(root, "usr/bin"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "usr/lib"), 0o755))
	must(os.Symlink("usr/bin", filepath.Join(root, "bin")))
	must(os.Symlink("usr/lib", filepath.Join(root, "lib")))
	must(os.WriteFile(filepath.Join(root, "usr/bin/sh"), []byte("#!shell"), 0o755))
	must(os.Link(filepath.Join(root, "usr/bin/sh"), filepath.Join(root, "usr/bin/ash")))
	must(os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	must(os.Symlink("/etc/passwd", filepath.Join(root, "etc/pw")))
	must(os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("job\n"), 0o644))
	return root
}

func fixtureModules(t testing.TB) string {
	p, err := filepath.Abs("../kmodules/testdata/lib/modules")
	require.NoError(t, err)
	return p
}

func config(t testing.TB, image string) Config {
	im, err := rootfs.Open(image)
	require.NoError(t, err)
	return Config{Image: im, Agent: writeAgent(t, false), Release: "6.1.0-test", HostModules: fixtureModules(t),
		Modaliases: []string{"pci:v00001B36d00000010sv00001AF4sd00001100bc01sc08i02"}, CacheDir: filepath.Join(t.TempDir(), "cache")}
}

// readArchive returns the archive's records in order, with content.
func readArchive(t testing.TB, p string) ([]cpio.Record, map[string]string) {
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	recs, err := cpio.ReadAllRecords(cpio.Newc.Reader(f))
	require.NoError(t, err)
	content := map[string]string{}
	for _, r := range recs {
		if r.ReaderAt != nil {
			b, err := io.ReadAll(io.NewSectionReader(r.ReaderAt, 0, int64(r.FileSize)))
			require.NoError(t, err)
			content[r.Name] = string(b)
		}
	}
	return recs, content
}

func TestBuildFromDirectory(t *testing.T) {
	cfg := config(t, imageDir(t))
	res, err := Build(cfg)
	require.NoError(t, err)
	require.False(t, res.Hit)
	require.Equal(t, []string{"virtio_pci_legacy_dev", "virtio_pci_modern_dev", "virtio", "virtio_ring", "virtio_pci", "virtio_console", "failover", "net_failover", "virtio_net", "nvme_core", "nvme"}, res.Modules)
	recs, content := readArchive(t, res.Path)
	fi, err := os.Stat(res.Path)
	require.NoError(t, err)
	require.Equal(t, fi.Size(), res.Size)

	modes := map[string]uint64{}
	seen := map[string]bool{"": true}
	for _, r := range recs {
		dir := filepath.Dir(r.Name)
		if dir == "." {
			dir = ""
		}
		require.True(t, seen[dir], "%s before its parent", r.Name)
		seen[r.Name] = true
		modes[r.Name] = r.Mode
		require.Zero(t, r.MTime, r.Name)
	}
	require.Equal(t, "#!shell", content["usr/bin/sh"])
	require.Equal(t, "#!shell", content["usr/bin/ash"], "a hard link is a copy")
	require.Equal(t, "/etc/passwd", content["etc/pw"], "a symlink out of the image stays a link")
	require.Equal(t, uint64(cpio.S_IFLNK), modes["etc/pw"]&cpio.S_IFMT)
	require.Equal(t, string(elfExe(false)), content[".hpcvmm/hpcvmm-agent"])
	require.Equal(t, uint64(cpio.S_IFREG|0o755), modes[".hpcvmm/hpcvmm-agent"])
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run"} {
		require.Equal(t, uint64(cpio.S_IFDIR), modes[d]&cpio.S_IFMT, d)
	}
	require.Equal(t, uint64(cpio.S_IFDIR|cpio.S_ISVTX|0o777), modes["tmp"])
	require.Equal(t, uint64(cpio.S_IFCHR|0o600), modes["dev/console"])
	// Modules land below lib's target (usr/lib), listed in load order.
	list := strings.Split(strings.TrimSpace(content[".hpcvmm/modules"]), "\n")
	require.Len(t, list, 11)
	require.Equal(t, "/usr/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio_pci_legacy_dev.ko", list[0])
	require.Equal(t, "/usr/lib/modules/6.1.0-test/kernel/drivers/nvme/host/nvme.ko", list[10])
	for _, l := range list {
		require.True(t, strings.HasPrefix(content[strings.TrimPrefix(l, "/")], "\x7fELF fixture module"), l)
	}

	// The same archive as cpio(1) reads it, where the tool is installed.
	if _, err := os.Stat("/usr/bin/cpio"); err == nil {
		out, err := runCmd("/usr/bin/cpio", res.Path, "-it", "--quiet")
		require.NoError(t, err, out)
		require.Contains(t, out, ".hpcvmm/hpcvmm-agent\n")
		require.Contains(t, out, "usr/lib/modules/6.1.0-test/kernel/drivers/nvme/host/nvme.ko\n")
	}
}

func TestBuildIsReproducibleAndCached(t *testing.T) {
	cfg := config(t, imageDir(t))
	first, err := Build(cfg)
	require.NoError(t, err)
	a, err := os.ReadFile(first.Path)
	require.NoError(t, err)

	im, err := rootfs.Open(cfg.Image.Path())
	require.NoError(t, err)
	cfg.Image = im
	second, err := Build(cfg)
	require.NoError(t, err)
	require.True(t, second.Hit)
	require.Equal(t, first.Key, second.Key)
	require.Equal(t, first.Modules, second.Modules)
	require.Equal(t, first.Unpacked, second.Unpacked)

	// Rebuilt elsewhere: the same bytes.
	cfg2 := cfg
	cfg2.CacheDir = filepath.Join(t.TempDir(), "other")
	cfg2.Image, _ = rootfs.Open(cfg.Image.Path())
	third, err := Build(cfg2)
	require.NoError(t, err)
	require.False(t, third.Hit)
	b, err := os.ReadFile(third.Path)
	require.NoError(t, err)
	require.Equal(t, a, b)

	// Another modalias set, another key.
	cfg3 := cfg
	cfg3.Modaliases = nil
	cfg3.Image, _ = rootfs.Open(cfg.Image.Path())
	fourth, err := Build(cfg3)
	require.NoError(t, err)
	require.False(t, fourth.Hit)
	require.NotEqual(t, first.Key, fourth.Key)
}

func TestCacheTamperedEntryRebuilt(t *testing.T) {
	cfg := config(t, imageDir(t))
	res, err := Build(cfg)
	require.NoError(t, err)
	c, err := OpenCache(cfg.CacheDir, 0)
	require.NoError(t, err)
	// A clean hit that trusts the identity record hashes nothing.
	_, _, hashed, err := c.get(res.Key)
	require.NoError(t, err)
	require.False(t, hashed)

	for name, tamper := range map[string]func(p string){
		"flipped byte": func(p string) {
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			require.NoError(t, os.WriteFile(p, b, 0o444))
		},
		"truncated":      func(p string) { require.NoError(t, os.Truncate(p, 100)) },
		"group-writable": func(p string) { require.NoError(t, os.Chmod(p, 0o664)) },
	} {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, os.Chmod(res.Path, 0o644))
			tamper(res.Path)
			_, _, _, err := c.get(res.Key)
			require.Error(t, err)
			require.NotErrorIs(t, err, errMiss)
			cfg.Image, _ = rootfs.Open(cfg.Image.Path())
			again, err := Build(cfg)
			require.NoError(t, err)
			require.False(t, again.Hit, "a tampered entry is rebuilt, not used")
			require.NotEmpty(t, again.Replaced)
			cfg.Image, _ = rootfs.Open(cfg.Image.Path())
			hit, err := Build(cfg)
			require.NoError(t, err)
			require.True(t, hit.Hit)
		})
	}
}

func TestCacheChangedImageMisses(t *testing.T) {
	dir := imageDir(t)
	cfg := config(t, dir)
	res, err := Build(cfg)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/hostname"), []byte("other\n"), 0o644))
	cfg.Image, _ = rootfs.Open(dir)
	again, err := Build(cfg)
	require.NoError(t, err)
	require.False(t, again.Hit)
	require.NotEqual(t, res.Key, again.Key)
}

func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	defer func(g time.Duration) { evictGrace = g }(evictGrace)
	evictGrace = 0
	cacheDir := filepath.Join(t.TempDir(), "cache")
	var paths []string
	for i := range 3 {
		dir := imageDir(t)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/big"), bytes.Repeat([]byte{byte(i)}, 64<<10), 0o644))
		cfg := config(t, dir)
		cfg.CacheDir, cfg.CacheMax = cacheDir, 200<<10 // room for two
		res, err := Build(cfg)
		require.NoError(t, err)
		paths = append(paths, res.Path)
		time.Sleep(20 * time.Millisecond)
	}
	_, err := os.Stat(paths[0])
	require.ErrorIs(t, err, os.ErrNotExist, "the oldest entry is evicted")
	for _, p := range paths[1:] {
		_, err := os.Stat(p)
		require.NoError(t, err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(cacheDir, tempPrefix+"*"))
	require.Empty(t, leftovers)
}

func TestCacheDirRefused(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	_, err := OpenCache(dir, 0)
	require.ErrorContains(t, err, "writable by group or others")
	_, err = OpenCache("relative/cache", 0)
	require.ErrorContains(t, err, "not an absolute path")
}

func TestDynamicAgentRefused(t *testing.T) {
	cfg := config(t, imageDir(t))
	cfg.Agent = writeAgent(t, true)
	_, err := Build(cfg)
	require.EqualError(t, err, fmt.Sprintf("hpcvmm at %s is dynamically linked; rebuild it with CGO_ENABLED=0", cfg.Agent))
	if _, err := os.Stat("/bin/true"); err == nil {
		if err := CheckAgent("/bin/true"); err != nil {
			require.Contains(t, err.Error(), "dynamically linked")
		}
	}
	require.NoError(t, CheckAgent(writeAgent(t, false)))
	cfg.Agent = "/nonexistent/hpcvmm"
	_, err = Build(cfg)
	require.ErrorContains(t, err, "/nonexistent/hpcvmm")
}

func TestImageTooLargeForGuest(t *testing.T) {
	dir := imageDir(t)
	big := make([]byte, 8<<20)
	_, _ = rand.Read(big)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "data"), big, 0o644))
	cfg := config(t, dir)
	cfg.GuestMemory = Headroom + 12<<20 // less than archive + unpacked
	_, err := Build(cfg)
	require.ErrorContains(t, err, dir)
	require.ErrorContains(t, err, "raise --memory")
	entries, _ := os.ReadDir(cfg.CacheDir)
	for _, e := range entries {
		require.False(t, strings.HasSuffix(e.Name(), archiveExt) || strings.HasPrefix(e.Name(), tempPrefix), "a refused build leaves %s", e.Name())
	}
	// Enough memory: built; and the hit is checked against the same rule.
	cfg.GuestMemory = 1 << 30
	cfg.Image, _ = rootfs.Open(dir)
	_, err = Build(cfg)
	require.NoError(t, err)
	cfg.GuestMemory = Headroom + 12<<20
	cfg.Image, _ = rootfs.Open(dir)
	_, err = Build(cfg)
	require.ErrorContains(t, err, "raise --memory")
}

func TestFits(t *testing.T) {
	require.NoError(t, Fits(100<<20, 200<<20, 1<<30))
	require.Error(t, Fits(400<<20, 500<<20, 1<<30))  // archive + unpacked + headroom > RAM
	require.Error(t, Fits(100<<20, 480<<20, 1<<30))  // more than tmpfs's half
	require.NoError(t, Fits(10<<20, 440<<20, 1<<30)) // 2*440+128 = 1008 MiB
	err := Fits(400<<20, 500<<20, 1<<30)
	require.ErrorContains(t, err, "needs at least 1128 MiB")
	require.False(t, errors.Is(err, errMiss))
}

func TestBuildFromOCIAndTar(t *testing.T) {
	// A tar IMAGE: the key comes from the file's hash, remembered by the
	// cache, and the build walks the archive.
	dir := imageDir(t)
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	out, err := runCmd("/usr/bin/tar", "", "-C", dir, "-cf", tarPath, ".")
	require.NoError(t, err, out)
	cfg := config(t, tarPath)
	res, err := Build(cfg)
	require.NoError(t, err)
	_, content := readArchive(t, res.Path)
	require.Equal(t, "#!shell", content["usr/bin/ash"])
	cfg.Image, _ = rootfs.Open(tarPath)
	hit, err := Build(cfg)
	require.NoError(t, err)
	require.True(t, hit.Hit)
	// A tampered index: the entry is rebuilt.
	ip := filepath.Join(cfg.CacheDir, hit.Key+indexExt)
	require.NoError(t, os.Chmod(ip, 0o644))
	require.NoError(t, os.WriteFile(ip, []byte("hpcvmm-rootfs-index v2\n\"usr/bin/python3\" 493 1 0 0 0 0 0 \"\"\nusage 1 1 1 1\n"), 0o444))
	cfg.Image, _ = rootfs.Open(tarPath)
	again, err := Build(cfg)
	require.NoError(t, err)
	require.False(t, again.Hit)
	require.Contains(t, again.Replaced, "index")
	cfg.Image, _ = rootfs.Open(tarPath)
	hit, err = Build(cfg)
	require.NoError(t, err)
	require.True(t, hit.Hit)
	// The hit brought the image's index: LookPath reads nothing of the
	// tar (here: which is gone).
	require.NoError(t, os.Remove(tarPath))
	got, err := cfg.Image.LookPath("ash", rootfs.DefaultPath)
	require.NoError(t, err)
	require.Equal(t, "/usr/bin/ash", got)
	_, err = cfg.Image.LookPath("python3", rootfs.DefaultPath)
	require.ErrorIs(t, err, rootfs.ErrNotFound)
}

func TestDirectoryKeyMemo(t *testing.T) {
	dir := imageDir(t)
	c, err := OpenCache(filepath.Join(t.TempDir(), "cache"), 0)
	require.NoError(t, err)
	plain, err := rootfs.Open(dir)
	require.NoError(t, err)
	want, err := plain.Key()
	require.NoError(t, err)
	// First with the memo: the files are read, and the key is Key's.
	im, _ := rootfs.Open(dir)
	got, err := im.KeyUsing(c)
	require.NoError(t, err)
	require.Equal(t, want, got)
	// Then the memo answers without opening anything.
	tm := c.TreeMemo(dir)
	fi, err := os.Lstat(filepath.Join(dir, "usr/bin/sh"))
	require.NoError(t, err)
	noOpen := func() (io.ReadCloser, error) { return nil, errors.New("opened a remembered file") }
	sum, err := tm.Sum("usr/bin/sh", fi, noOpen)
	require.NoError(t, err)
	require.Equal(t, sha256.Sum256([]byte("#!shell")), sum)
	// A changed file is read again.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "usr/bin/sh"), []byte("#!other"), 0o755))
	fi, _ = os.Lstat(filepath.Join(dir, "usr/bin/sh"))
	_, err = tm.Sum("usr/bin/sh", fi, noOpen)
	require.ErrorContains(t, err, "opened a remembered file")
	im, _ = rootfs.Open(dir)
	changed, err := im.KeyUsing(c)
	require.NoError(t, err)
	require.NotEqual(t, want, changed)
}

func TestBuildFromOCILayoutWithWhiteouts(t *testing.T) {
	layer := func(files map[string]string) v1.Layer {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, n := range slices.Sorted(maps.Keys(files)) {
			require.NoError(t, tw.WriteHeader(&tar.Header{Name: n, Mode: 0o755, Size: int64(len(files[n])), Typeflag: tar.TypeReg}))
			_, _ = tw.Write([]byte(files[n]))
		}
		require.NoError(t, tw.Close())
		b := buf.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		require.NoError(t, err)
		return l
	}
	img, err := mutate.AppendLayers(empty.Image,
		layer(map[string]string{"bin/sh": "#!sh", "etc/deleted": "x", "opq/old": "o"}),
		layer(map[string]string{"etc/.wh.deleted": "", "opq/.wh..wh..opq": "", "opq/new": "n"}))
	require.NoError(t, err)
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	require.NoError(t, err)
	require.NoError(t, lp.AppendImage(img))
	cfg := config(t, dir)
	res, err := Build(cfg)
	require.NoError(t, err)
	_, content := readArchive(t, res.Path)
	require.Equal(t, "#!sh", content["bin/sh"])
	require.Equal(t, "n", content["opq/new"])
	for _, gone := range []string{"etc/deleted", "etc/.wh.deleted", "opq/old", "opq/.wh..wh..opq"} {
		_, ok := content[gone]
		require.False(t, ok, gone)
	}
	// The warm launch: the key is the manifest digest, nothing is read.
	cfg.Image, _ = rootfs.Open(dir)
	hit, err := Build(cfg)
	require.NoError(t, err)
	require.True(t, hit.Hit)
}

// TestBuildWithHostDebianModules builds against the host's real Debian
// kernel modules (skipped where linux-image-amd64 is not installed; the
// fixture covers the logic everywhere).
func TestBuildWithHostDebianModules(t *testing.T) {
	m, _ := filepath.Glob("/lib/modules/*-amd64/modules.dep")
	if len(m) == 0 {
		t.Skip("no Debian kernel modules in /lib/modules: install linux-image-amd64 to run this against real modules")
	}
	cfg := config(t, imageDir(t))
	cfg.Release = filepath.Base(filepath.Dir(m[0]))
	cfg.HostModules = ""
	res, err := Build(cfg)
	require.NoError(t, err)
	require.Equal(t, "/lib/modules/"+cfg.Release, res.ModuleSource)
	require.Contains(t, res.Modules, "virtio_console")
	require.Contains(t, res.Modules, "nvme")
	_, content := readArchive(t, res.Path)
	list := strings.Split(strings.TrimSpace(content[".hpcvmm/modules"]), "\n")
	require.Len(t, list, len(res.Modules))
	for _, l := range list {
		require.True(t, strings.HasPrefix(l, "/usr/lib/modules/"+cfg.Release+"/kernel/"), l)
		require.True(t, strings.HasPrefix(content[strings.TrimPrefix(l, "/")], "\x7fELF"), l)
	}
}

// TestArchiveUnpacksAndRuns unpacks a built archive with GNU cpio, as the
// kernel would unpack it, and runs a busybox-static shell from it under
// chroot: the tree is usable, not only well-formed. It needs root (device
// nodes, chroot), cpio(1) and busybox-static, and skips without them.
func TestArchiveUnpacksAndRuns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to create /dev/console and chroot")
	}
	for _, tool := range []string{"/usr/bin/cpio", "/bin/busybox", "/usr/sbin/chroot"} {
		if _, err := os.Stat(tool); err != nil {
			t.Skipf("needs %s (cpio, busybox-static, coreutils)", tool)
		}
	}
	if out, err := runCmd("/usr/bin/file", "", "-L", "/bin/busybox"); err == nil && !strings.Contains(out, "statically linked") {
		t.Skip("/bin/busybox is not static: install busybox-static")
	}
	root := imageDir(t)
	bb, err := os.ReadFile("/bin/busybox")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/bin/busybox"), bb, 0o755))
	require.NoError(t, os.Remove(filepath.Join(root, "usr/bin/sh")))
	require.NoError(t, os.Remove(filepath.Join(root, "usr/bin/ash")))
	require.NoError(t, os.Symlink("busybox", filepath.Join(root, "usr/bin/sh")))
	require.NoError(t, os.Link(filepath.Join(root, "usr/bin/busybox"), filepath.Join(root, "usr/bin/cat")))
	cfg := config(t, root)
	res, err := Build(cfg)
	require.NoError(t, err)

	dst := t.TempDir()
	out, err := runCmd("/bin/sh", res.Path, "-c", "cd "+dst+" && /usr/bin/cpio -idm --quiet --no-absolute-filenames")
	require.NoError(t, err, out)
	fi, err := os.Lstat(filepath.Join(dst, "etc/pw"))
	require.NoError(t, err)
	require.Equal(t, os.ModeSymlink, fi.Mode().Type())
	fi, err = os.Lstat(filepath.Join(dst, "tmp"))
	require.NoError(t, err)
	require.Equal(t, os.ModeDir|os.ModeSticky|0o777, fi.Mode())
	fi, err = os.Lstat(filepath.Join(dst, "dev/console"))
	require.NoError(t, err)
	require.Equal(t, os.ModeDevice|os.ModeCharDevice, fi.Mode().Type())
	list, err := os.ReadFile(filepath.Join(dst, ".hpcvmm/modules"))
	require.NoError(t, err)
	require.Contains(t, string(list), "/usr/lib/modules/6.1.0-test/kernel/drivers/nvme/host/nvme.ko\n")

	out, err = runCmd("/usr/sbin/chroot", "", dst, "/bin/sh", "-c", "echo out; cat /etc/hostname; exit 7")
	require.Error(t, err)
	require.Equal(t, "out\njob\n", out)
	require.Contains(t, err.Error(), "exit status 7")
}

func TestBuildWithModulesFromImage(t *testing.T) {
	root := imageDir(t)
	dst := filepath.Join(root, "usr/lib/modules/6.1.0-test")
	require.NoError(t, os.CopyFS(dst, os.DirFS(filepath.Join(fixtureModules(t), "6.1.0-test"))))
	cfg := config(t, root)
	cfg.HostModules = t.TempDir() // the host has none: only the image's count
	res, err := Build(cfg)
	require.NoError(t, err)
	require.Equal(t, "image:/lib/modules/6.1.0-test", res.ModuleSource)
	recs, content := readArchive(t, res.Path)
	count := map[string]int{}
	for _, r := range recs {
		count[r.Name]++
	}
	// nvme.ko is in the image uncompressed: written once, by the walk.
	require.Equal(t, 1, count["usr/lib/modules/6.1.0-test/kernel/drivers/nvme/host/nvme.ko"])
	// virtio.ko.xz is in the image; its decompressed copy is added beside.
	require.Equal(t, 1, count["usr/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio.ko.xz"])
	require.True(t, strings.HasPrefix(content["usr/lib/modules/6.1.0-test/kernel/drivers/virtio/virtio.ko"], "\x7fELF fixture module virtio"))
}

// A record that lies about a file (its identity unchanged, its bytes
// not: a write through a shared mapping, a FUSE file system) chooses the
// key, but cannot put other bytes under it: the build's walk checks what
// it reads, fails, and forgets the record, and the next launch hashes the
// file and builds it under its true key.
func TestStaleHashRecordCannotPoison(t *testing.T) {
	dir := t.TempDir()
	tarPath := filepath.Join(dir, "image.tar")
	genuine := filepath.Join(dir, "genuine")
	require.NoError(t, os.Mkdir(genuine, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(genuine, "sh"), []byte("genuine"), 0o755))
	out, err := runCmd("/usr/bin/tar", "", "-C", genuine, "-cf", tarPath, ".")
	require.NoError(t, err, out)
	genuineTar, err := os.ReadFile(tarPath)
	require.NoError(t, err)

	// The record says the file holds the genuine tar; it holds another.
	require.NoError(t, os.WriteFile(filepath.Join(genuine, "sh"), []byte("evil!!!"), 0o755))
	out, err = runCmd("/usr/bin/tar", "", "-C", genuine, "-cf", tarPath, ".")
	require.NoError(t, err, out)
	cfg := config(t, tarPath)
	c, err := OpenCache(cfg.CacheDir, 0)
	require.NoError(t, err)
	require.NoError(t, c.Remember(tarPath, sha256.Sum256(genuineTar)))
	_, hashed, err := c.FileSHA256(tarPath)
	require.NoError(t, err)
	require.False(t, hashed, "the lying record is believed")

	_, err = Build(cfg)
	require.ErrorContains(t, err, "changed while hpcvmm read it")
	archives, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "*"+archiveExt))
	require.Empty(t, archives, "nothing stored under the genuine tar's key")

	cfg.Image, _ = rootfs.Open(tarPath)
	res, err := Build(cfg)
	require.NoError(t, err, "the record was forgotten: hashed again, built under its own key")
	_, content := readArchive(t, res.Path)
	require.Equal(t, "evil!!!", content["sh"])
}

// An IMAGE changed between its key and the build's walk is not cached
// under the key (the kernel cache's poisoning, issue 23): the build fails
// and leaves nothing.
func TestBuildRefusesImageChangedAfterItsKey(t *testing.T) {
	root := imageDir(t)
	cfg := config(t, root)
	_, err := cfg.Image.Key()
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/hostname"), []byte("evi\n"), 0o644))
	_, err = Build(cfg)
	require.ErrorContains(t, err, "changed while hpcvmm read it")
	entries, _ := os.ReadDir(cfg.CacheDir)
	for _, e := range entries {
		require.False(t, strings.HasSuffix(e.Name(), archiveExt) || strings.HasSuffix(e.Name(), metaExt) || strings.HasPrefix(e.Name(), tempPrefix), "left %s", e.Name())
	}
}

func TestLookupBeforeBuild(t *testing.T) {
	dir := imageDir(t)
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	out, err := runCmd("/usr/bin/tar", "", "-C", dir, "-cf", tarPath, ".")
	require.NoError(t, err, out)
	cfg := config(t, tarPath)
	res, err := Lookup(cfg)
	require.NoError(t, err)
	require.Nil(t, res, "cold: no entry")
	built, err := Build(cfg)
	require.NoError(t, err)

	// Warm: Lookup finds the entry and brings the index, so checking
	// COMMAND before Build reads nothing of IMAGE (here: truncated after
	// Lookup, so any walk would fail).
	cfg.Image, _ = rootfs.Open(tarPath)
	res, err = Lookup(cfg)
	require.NoError(t, err)
	require.NotNil(t, res)
	require.True(t, res.Hit)
	require.Equal(t, built.Key, res.Key)
	require.NoError(t, os.Truncate(tarPath, 1024))
	_, err = cfg.Image.LookPath("ash", rootfs.DefaultPath)
	require.NoError(t, err)
	u, err := cfg.Image.Usage()
	require.NoError(t, err)
	require.Positive(t, u.Bytes)
	again, err := Build(cfg)
	require.NoError(t, err)
	require.True(t, again.Hit)
}

// TestExtraBoundsTheBuild: IMAGE's Usage plus Extra is what Fits judges
// before the build; it is never less than what the build makes (so the
// first refusal's minimum is one the build accepts) and at most a few KiB
// more. The agent here is padded to 8 MiB so it weighs as hpcvmm does.
func TestExtraBoundsTheBuild(t *testing.T) {
	cfg := config(t, imageDir(t))
	f, err := os.OpenFile(cfg.Agent, os.O_WRONLY, 0)
	require.NoError(t, err)
	require.NoError(t, f.Truncate(8<<20))
	require.NoError(t, f.Close())
	u, err := cfg.Image.Usage()
	require.NoError(t, err)
	a, m, err := Extra(cfg)
	require.NoError(t, err)
	res, err := Build(cfg)
	require.NoError(t, err)
	require.NotEmpty(t, res.Modules, "the fixture's modules are counted")
	require.GreaterOrEqual(t, u.Archive+a, res.Size, "archive bytes")
	require.GreaterOrEqual(t, u.Memory+m, res.Unpacked, "unpacked bytes")
	require.Less(t, u.Archive+a-res.Size, int64(64<<10), "archive estimate close to the build")
	require.Less(t, u.Memory+m-res.Unpacked, int64(64<<10), "unpacked estimate close to the build")
	require.Greater(t, a, int64(8<<20), "the agent counts")
	// So a guest of Fits' minimum from the estimate builds.
	need := max(u.Archive+a+Headroom, 2*(u.Memory+m)+Headroom)
	cfg.GuestMemory, cfg.CacheDir = need, filepath.Join(t.TempDir(), "cache")
	_, err = Build(cfg)
	require.NoError(t, err)
	cfg.GuestMemory, cfg.CacheDir = need-(u.Memory+m-res.Unpacked)*2-(1<<20), filepath.Join(t.TempDir(), "cache")
	_, err = Build(cfg)
	require.ErrorContains(t, err, "raise --memory", "a MiB below the build's own minimum is refused")
}

// TestBuildGPUModules: an NVIDIA GPU's module set (gpudriver.ForModaliases:
// nvidia and nvidia_uvm to load, nvidia_modeset optional, nouveau
// excluded) from a module tree where they live outside the distribution's
// kernel/ directory (updates/dkms, as DKMS installs them; extra/ is the
// same to kmodules: any relative modules.dep path): the archive holds them
// at those paths and lists them in load order, without nouveau; a
// different Optional or Exclude set is another cache entry.
func TestBuildGPUModules(t *testing.T) {
	const h100 = "pci:v000010DEd00002330sv000010DEsd000016C1bc03sc02i00"
	tree, err := filepath.Abs("../gpudriver/testdata/host/usr/lib/modules")
	require.NoError(t, err)
	cfg := config(t, imageDir(t))
	cfg.Release, cfg.HostModules, cfg.Modaliases = "6.18.44-fc-v657-gpu", tree, []string{h100}
	cfg.Modules = []string{"nvidia", "nvidia_uvm"}
	cfg.Optional, cfg.Exclude = []string{"nvidia_modeset"}, []string{"nouveau"}
	res, err := Build(cfg)
	require.NoError(t, err)
	require.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_modeset"}, res.Modules)
	_, content := readArchive(t, res.Path)
	require.Equal(t, "/usr/lib/modules/6.18.44-fc-v657-gpu/updates/dkms/nvidia.ko\n"+
		"/usr/lib/modules/6.18.44-fc-v657-gpu/updates/dkms/nvidia-uvm.ko\n"+
		"/usr/lib/modules/6.18.44-fc-v657-gpu/updates/dkms/nvidia-modeset.ko\n", content[".hpcvmm/modules"])
	require.True(t, strings.HasPrefix(content["usr/lib/modules/6.18.44-fc-v657-gpu/updates/dkms/nvidia-uvm.ko"], "\x7fELF"))

	reopen := func(c Config) Config {
		c.Image, err = rootfs.Open(cfg.Image.Path())
		require.NoError(t, err)
		return c
	}
	hit, err := Build(reopen(cfg))
	require.NoError(t, err)
	require.True(t, hit.Hit, "the same module set hits")

	noExclude := reopen(cfg)
	noExclude.Exclude = nil
	other, err := Build(noExclude)
	require.NoError(t, err)
	require.False(t, other.Hit, "without Exclude: another key")
	require.NotEqual(t, res.Key, other.Key)
	require.Contains(t, other.Modules, "nouveau", "the modalias brings nouveau when it is not excluded")

	noOptional := reopen(cfg)
	noOptional.Optional = nil
	other, err = Build(noOptional)
	require.NoError(t, err)
	require.False(t, other.Hit, "without Optional: another key")
	require.NotContains(t, other.Modules, "nvidia_modeset")

	// Spelling and order do not matter: the same set, the same entry.
	respelled := reopen(cfg)
	respelled.Optional, respelled.Exclude = []string{"nvidia-modeset"}, []string{"nouveau"}
	again, err := Build(respelled)
	require.NoError(t, err)
	require.True(t, again.Hit)
	require.Equal(t, res.Key, again.Key)
}
