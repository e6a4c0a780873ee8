package imagepack

import (
	"archive/tar"
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/stretchr/testify/require"
)

// The benchmark's image: 1,000 files in 20 directories, sizes cycling
// through 4 KiB, 16 KiB, 64 KiB, 256 KiB and 1 MiB (266 MiB in all),
// every other file pseudo-random bytes (nothing to compress), the rest
// text-like log lines (words drawn from a small vocabulary: compresses
// about 4:1, as text and code do). Made once per test binary run, as a
// directory, a tar of it and an OCI layout of one gzip layer of it.
const (
	benchFiles = 1000
	benchDirs  = 20
)

var benchSizes = []int{4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20}

var (
	benchOnce  sync.Once
	benchRoot  string // holds dir/, image.tar, layout/
	benchBytes int64  // the files' content
	benchErr   error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if benchRoot != "" {
		_ = os.RemoveAll(benchRoot)
	}
	os.Exit(code)
}

// textLike fills b with log-like lines of words from a vocabulary.
func textLike(rng *rand.ChaCha8, b []byte) {
	r := rand.New(rng)
	words := make([]string, 400)
	for i := range words {
		w := make([]byte, 3+r.IntN(8))
		for j := range w {
			w[j] = byte('a' + r.IntN(26))
		}
		words[i] = string(w)
	}
	n := 0
	for n < len(b) {
		line := fmt.Sprintf("2026-%02d-%02d %02d:%02d:%02d %s", 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), []string{"INFO", "WARN", "DEBUG"}[r.IntN(3)])
		for range 6 + r.IntN(10) {
			line += " " + words[r.IntN(len(words))]
		}
		n += copy(b[n:], line+"\n")
	}
}

func makeBenchImage() (root string, total int64, err error) {
	root, err = os.MkdirTemp("", "hpcvmm-bench-imagepack-")
	if err != nil {
		return "", 0, err
	}
	dir := filepath.Join(root, "dir")
	rng := rand.NewChaCha8([32]byte{31})
	buf := make([]byte, 1<<20)
	for i := range benchFiles {
		d := filepath.Join(dir, "usr/share", "d"+strconv.Itoa(i%benchDirs))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return root, 0, err
		}
		b := buf[:benchSizes[i%len(benchSizes)]]
		if i%2 == 0 {
			_, _ = rng.Read(b)
		} else {
			textLike(rng, b)
		}
		if err := os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), b, 0o644); err != nil {
			return root, 0, err
		}
		total += int64(len(b))
	}
	tarPath := filepath.Join(root, "image.tar")
	if err := writeTar(dir, tarPath); err != nil {
		return root, 0, err
	}
	layer, err := tarball.LayerFromFile(tarPath)
	if err != nil {
		return root, 0, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return root, 0, err
	}
	p, err := layout.Write(filepath.Join(root, "layout"), empty.Index)
	if err != nil {
		return root, 0, err
	}
	return root, total, p.AppendImage(img)
}

// writeTar writes the tree at dir as a tar at out.
func writeTar(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	bw := bufio.NewWriter(f)
	tw := tar.NewWriter(bw)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return bw.Flush()
}

func benchImage(b *testing.B) string {
	benchOnce.Do(func() { benchRoot, benchBytes, benchErr = makeBenchImage() })
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchRoot
}

// report sets the rate's bytes (the image's content) and reports the
// output's size against it.
func report(b *testing.B, out int64) {
	b.SetBytes(benchBytes)
	b.ReportMetric(float64(out)/float64(benchBytes), "out/in")
}

// BenchmarkConvert converts the tar and the OCI layout with mksquashfs
// -tar (the package's path: rootfs's walk streamed as a tar), at the
// chosen settings and the alternatives the package doc compares.
func BenchmarkConvert(b *testing.B) {
	tl := tool(b, toolName)
	root := benchImage(b)
	for _, tc := range []struct {
		image string
		s     settings
	}{
		{"image.tar", chosen},
		{"image.tar", settings{"zstd", 3, 1 << 20}},
		{"image.tar", settings{"zstd", 15, 128 << 10}}, // mksquashfs's zstd level
		{"image.tar", settings{"gzip", 9, 128 << 10}},  // mksquashfs's defaults
		{"image.tar", settings{"gzip", 6, 1 << 20}},
		{"layout", chosen},
	} {
		b.Run(tc.image+"/"+tc.s.String(), func(b *testing.B) {
			c, err := OpenCache(filepath.Join(b.TempDir(), "cache"), 0)
			require.NoError(b, err)
			var out int64
			i := 0
			for b.Loop() {
				im := openImage(b, filepath.Join(root, tc.image))
				key := fmt.Sprintf("bench%064d", i)
				i++
				st, err := pass{tool: tl, s: tc.s}.convert(context.Background(), im, c, key)
				require.NoError(b, err)
				out = st.size
				for _, ext := range []string{dataExt, metaExt, indexExt, ".ok"} {
					_ = os.Remove(c.Path(key, ext))
				}
			}
			report(b, out)
		})
	}
}

// BenchmarkMksquashfsTree is mksquashfs over the extracted tree, for the
// record: what the conversion would take if the image were extracted onto
// the host first (the extraction not counted).
func BenchmarkMksquashfsTree(b *testing.B) {
	tl := tool(b, toolName)
	root := benchImage(b)
	for _, s := range []settings{chosen, {"gzip", 9, 128 << 10}} {
		b.Run(s.String(), func(b *testing.B) {
			out := filepath.Join(b.TempDir(), "out.sqfs")
			for b.Loop() {
				args := append([]string{filepath.Join(root, "dir"), out}, toolArgs(out, s)[3:]...)
				run(b, tl, args...)
			}
			report(b, fileSize(b, out))
		})
	}
}

// BenchmarkMkfsErofsTree is mkfs.erofs over the extracted tree, for the
// record (erofs-utils 1.5 reads no tar), uncompressed and with lz4hc (the
// one compressor Debian 12's kernel reads: CONFIG_EROFS_FS_ZIP, no LZMA).
func BenchmarkMkfsErofsTree(b *testing.B) {
	tl := tool(b, "mkfs.erofs")
	root := benchImage(b)
	for _, tc := range []struct{ name, opt string }{{"uncompressed", ""}, {"lz4hc", "-zlz4hc"}} {
		b.Run(tc.name, func(b *testing.B) {
			out := filepath.Join(b.TempDir(), "out.erofs")
			for b.Loop() {
				args := []string{"--quiet", "-T0"}
				if tc.opt != "" {
					args = append(args, tc.opt)
				}
				run(b, tl, append(args, out, filepath.Join(root, "dir"))...)
			}
			report(b, fileSize(b, out))
		})
	}
}

func run(b *testing.B, name string, args ...string) {
	out, err := exec.Command(name, args...).CombinedOutput()
	require.NoError(b, err, "%s: %s", name, out)
}

func fileSize(b *testing.B, p string) int64 {
	fi, err := os.Stat(p)
	require.NoError(b, err)
	return fi.Size()
}

// BenchmarkSquashfsReads reads the converted image through the kernel's
// squashfs (a loop mount, fresh for each iteration: nothing decompressed
// is cached) as a job starting up does: every small file (4 and 16 KiB,
// packed into fragments) in a shuffled order, then 4 KiB at 200 random
// offsets of the 1 MiB files. The block size sets how much one such read
// decompresses (a whole data block or fragment block, and the kernel
// caches 3 fragment blocks: CONFIG_SQUASHFS_FRAGMENT_CACHE_SIZE). Needs
// root and loop devices; skipped otherwise.
func BenchmarkSquashfsReads(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("mounting needs root")
	}
	tl := tool(b, toolName)
	root := benchImage(b)
	for _, s := range []settings{chosen, {"zstd", 3, 1 << 20}, {"gzip", 9, 128 << 10}} {
		b.Run(s.String(), func(b *testing.B) {
			c, err := OpenCache(filepath.Join(b.TempDir(), "cache"), 0)
			require.NoError(b, err)
			im := openImage(b, filepath.Join(root, "image.tar"))
			key := fmt.Sprintf("reads%059d", 0)
			_, err = pass{tool: tl, s: s}.convert(context.Background(), im, c, key)
			require.NoError(b, err)
			mnt := b.TempDir()
			var small, big []string
			for i := range benchFiles {
				name := filepath.Join(mnt, "usr/share", "d"+strconv.Itoa(i%benchDirs), "f"+strconv.Itoa(i))
				switch benchSizes[i%len(benchSizes)] {
				case 4 << 10, 16 << 10:
					small = append(small, name)
				case 1 << 20:
					big = append(big, name)
				}
			}
			r := rand.New(rand.NewChaCha8([32]byte{7}))
			r.Shuffle(len(small), func(i, j int) { small[i], small[j] = small[j], small[i] })
			buf := make([]byte, 16<<10)
			for range b.N {
				b.StopTimer()
				if out, err := exec.Command("mount", "-t", "squashfs", "-o", "loop,ro", c.Path(key, dataExt), mnt).CombinedOutput(); err != nil {
					b.Skipf("cannot mount a squashfs here: %v: %s", err, out)
				}
				b.StartTimer()
				for _, p := range small {
					data, err := os.ReadFile(p)
					require.NoError(b, err)
					require.NotEmpty(b, data)
				}
				for i := range 200 {
					f, err := os.Open(big[i%len(big)])
					require.NoError(b, err)
					_, err = f.ReadAt(buf[:4<<10], int64(r.IntN(256))<<12)
					require.NoError(b, err)
					f.Close()
				}
				b.StopTimer()
				out, err := exec.Command("umount", mnt).CombinedOutput()
				require.NoError(b, err, "umount: %s", out)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkPack streams a tar IMAGE of one file through rootfs's walk and
// the packer into io.Discard: the allocations are per entry and per walk,
// none per chunk of content (run with -benchmem: the 16 MiB and 64 MiB
// files allocate the same).
func BenchmarkPack(b *testing.B) {
	for _, size := range []int{16 << 20, 64 << 20} {
		b.Run(strconv.Itoa(size>>20)+"MiB", func(b *testing.B) {
			p := writeFile(b, tarBytes(b, file("big", string(make([]byte, size)), 0o644)))
			im := openImage(b, p)
			_, err := im.Key()
			require.NoError(b, err)
			b.SetBytes(int64(size))
			for b.Loop() {
				pk := newPacker(&sink{w: io.Discard, limit: 1 << 40}, p, true, nil)
				require.NoError(b, im.WalkKeyed(pk.entry))
				require.NoError(b, pk.close())
			}
		})
	}
}
