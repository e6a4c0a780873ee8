package initramfs

import (
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hpcvmm/hpcvmm/rootfs"
)

// benchImage is a 512 MiB directory rootfs: 64 directories of 64 files of
// 128 KiB (pseudo-random bytes, nothing to gain from sparse files or
// compression), made once per test binary run.
var (
	benchOnce sync.Once
	benchDir  string
	benchErr  error
)

const (
	benchDirs  = 64
	benchFiles = 64
	benchSize  = 128 << 10 // 64 × 64 × 128 KiB = 512 MiB
)

func benchRootfs(b *testing.B) string {
	benchOnce.Do(func() {
		benchDir, benchErr = os.MkdirTemp("", "hpcvmm-bench-rootfs-")
		if benchErr != nil {
			return
		}
		rng := rand.NewChaCha8([32]byte{1})
		buf := make([]byte, benchSize)
		for d := range benchDirs {
			dir := filepath.Join(benchDir, "usr/share", string(rune('a'+d%26))+string(rune('a'+d/26)))
			if benchErr = os.MkdirAll(dir, 0o755); benchErr != nil {
				return
			}
			for f := range benchFiles {
				_, _ = rng.Read(buf)
				if benchErr = os.WriteFile(filepath.Join(dir, string(rune('a'+f%26))+string(rune('a'+f/26))), buf, 0o644); benchErr != nil {
					return
				}
			}
		}
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return benchDir
}

func TestMain(m *testing.M) {
	testenv.RunChild(asUserEnv, buildAsUser)
	code := m.Run()
	if benchDir != "" {
		_ = os.RemoveAll(benchDir)
	}
	os.Exit(code)
}

// BenchmarkBuild512MiBDir measures a launch's initramfs step for a 512 MiB
// directory IMAGE: cold (a build into an empty cache: the key's hash of
// the tree, then the archive written) and hit (a warm launch: rootfs.Open,
// the key, the cache entry checked; nothing built).
func BenchmarkBuild512MiBDir(b *testing.B) {
	dir := benchRootfs(b)
	agent := writeAgent(b, false)
	mods := fixtureModules(b)
	cfg := func(cache string) Config {
		im, err := rootfs.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		return Config{Image: im, Agent: agent, Release: "6.1.0-test", HostModules: mods, CacheDir: cache}
	}
	b.Run("cold", func(b *testing.B) {
		for b.Loop() {
			cache := filepath.Join(b.TempDir(), "cache")
			res, err := Build(cfg(cache))
			if err != nil || res.Hit {
				b.Fatal(err, res)
			}
			b.StopTimer()
			_ = os.RemoveAll(cache)
			b.StartTimer()
		}
		b.SetBytes(benchDirs * benchFiles * benchSize)
	})
	b.Run("hit", func(b *testing.B) {
		cache := filepath.Join(b.TempDir(), "cache")
		if _, err := Build(cfg(cache)); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			res, err := Build(cfg(cache))
			if err != nil || !res.Hit {
				b.Fatal(err, res)
			}
		}
		b.SetBytes(benchDirs * benchFiles * benchSize)
	})
	// The same tree as a tar IMAGE: a warm launch takes the file's hash
	// and the image's index from the cache, and reads nothing of it.
	tarPath := filepath.Join(b.TempDir(), "rootfs.tar")
	if out, err := runCmd("/usr/bin/tar", "", "-C", dir, "-cf", tarPath, "."); err != nil {
		b.Fatal(err, out)
	}
	tarCfg := func(cache string) Config {
		c := cfg(cache)
		im, err := rootfs.Open(tarPath)
		if err != nil {
			b.Fatal(err)
		}
		c.Image = im
		return c
	}
	b.Run("tar-cold", func(b *testing.B) {
		for b.Loop() {
			cache := filepath.Join(b.TempDir(), "cache")
			res, err := Build(tarCfg(cache))
			if err != nil || res.Hit {
				b.Fatal(err, res)
			}
			b.StopTimer()
			_ = os.RemoveAll(cache)
			b.StartTimer()
		}
		b.SetBytes(benchDirs * benchFiles * benchSize)
	})
	b.Run("tar-hit+lookpath", func(b *testing.B) {
		cache := filepath.Join(b.TempDir(), "cache")
		if _, err := Build(tarCfg(cache)); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			c := tarCfg(cache)
			res, err := Build(c)
			if err != nil || !res.Hit {
				b.Fatal(err, res)
			}
			if _, err := c.Image.LookPath("sh", rootfs.DefaultPath); err == nil {
				b.Fatal("found a sh the image lacks")
			}
		}
		b.SetBytes(benchDirs * benchFiles * benchSize)
	})
}
