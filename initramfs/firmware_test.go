package initramfs

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/kmodules/kmodtest"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// firmwareHost is the kmodules fixture's module tree with nvme (which the
// config's modalias brings) a real ELF object naming three firmware
// files, and a firmware directory holding two of them, one xz-compressed.
func firmwareHost(t *testing.T) (modules, firmware string) {
	modules = t.TempDir()
	require.NoError(t, os.CopyFS(modules, os.DirFS(fixtureModules(t))))
	writeObj(t, modules, "kernel/drivers/nvme/host/nvme.ko", "version=1.0", "firmware=test/nvme.bin", "firmware=test/opt.bin", "firmware=test/xz.bin")
	firmware = t.TempDir()
	writeFW(t, firmware, "test/nvme.bin", "NVMEFW")
	writeFW(t, firmware, "test/xz.bin.xz", "\xfd7zXZ compressed")
	return modules, firmware
}

func writeObj(t *testing.T, modules, name string, modinfo ...string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(modules, "6.1.0-test", name), kmodtest.Object(modinfo...), 0o644))
}

func writeFW(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
}

// firmwareConfig is config with firmwareHost's trees and a log in buf.
func firmwareConfig(t *testing.T, buf *bytes.Buffer) Config {
	cfg := config(t, imageDir(t))
	mods, fw := firmwareHost(t)
	cfg.HostModules, cfg.HostFirmware = mods, []string{fw}
	cfg.Log = slog.New(slog.NewTextHandler(buf, nil))
	return cfg
}

// reopen is cfg with its image opened again, as the next launch has it.
func reopen(t *testing.T, cfg Config) Config {
	im, err := rootfs.Open(cfg.Image.Path())
	require.NoError(t, err)
	cfg.Image = im
	return cfg
}

// TestBuildPacksFirmware: the firmware the modules name is in the archive
// at /lib/firmware/NAME (below /lib's target), a compressed variant with
// its suffix; one the host lacks is logged, naming the module and the
// file, and left out. The firmware is part of the key: a warm launch hits,
// a changed file or one that appears is another entry.
func TestBuildPacksFirmware(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	res, err := Build(cfg)
	require.NoError(t, err)
	require.Equal(t, []string{"test/nvme.bin", "test/xz.bin.xz"}, res.Firmware)
	require.Len(t, res.MissingFirmware, 1)
	require.Equal(t, kmodules.FirmwareRef{Module: "nvme", Name: "test/opt.bin", Version: "1.0"}, res.MissingFirmware[0].FirmwareRef)
	require.Contains(t, log.String(), "level=INFO")
	require.Contains(t, log.String(), "module=nvme")
	require.Contains(t, log.String(), "test/opt.bin (not found)")
	recs, content := readArchive(t, res.Path)
	require.Equal(t, "NVMEFW", content["usr/lib/firmware/test/nvme.bin"])
	require.Equal(t, "\xfd7zXZ compressed", content["usr/lib/firmware/test/xz.bin.xz"])
	modes := map[string]uint64{}
	for _, r := range recs {
		modes[r.Name] = r.Mode
	}
	require.Equal(t, uint64(0o100644), modes["usr/lib/firmware/test/nvme.bin"])
	require.Equal(t, uint64(0o40755), modes["usr/lib/firmware/test"], "its directory precedes it")

	log.Reset()
	hit, err := Lookup(reopen(t, cfg))
	require.NoError(t, err)
	require.NotNil(t, hit)
	require.True(t, hit.Hit)
	require.Equal(t, res.Key, hit.Key)
	require.Equal(t, res.Firmware, hit.Firmware)
	require.Equal(t, 1, strings.Count(log.String(), "test/opt.bin"), "a hit logs the missing file too, once")

	writeFW(t, cfg.HostFirmware[0], "test/nvme.bin", "NVMEFW v2")
	changed, err := Build(reopen(t, cfg))
	require.NoError(t, err)
	require.False(t, changed.Hit, "another firmware file: another key")
	_, content = readArchive(t, changed.Path)
	require.Equal(t, "NVMEFW v2", content["usr/lib/firmware/test/nvme.bin"])

	writeFW(t, cfg.HostFirmware[0], "test/opt.bin", "OPT")
	more, err := Build(reopen(t, cfg))
	require.NoError(t, err)
	require.False(t, more.Hit, "a file that appears: another key")
	require.Equal(t, []string{"test/nvme.bin", "test/opt.bin", "test/xz.bin.xz"}, more.Firmware)
	require.Empty(t, more.MissingFirmware)
}

// TestRequiredFirmwareMissing: a required file missing refuses the build
// (and Lookup, and Extra) with kmodules' one-line error, before an archive
// is written.
func TestRequiredFirmwareMissing(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	cfg.RequireFirmware = []string{"test/opt*"}
	_, err := Build(cfg)
	var me *kmodules.MissingFirmwareError
	require.ErrorAs(t, err, &me)
	require.Equal(t, "nvme", me.Module)
	require.Contains(t, err.Error(), "module nvme needs firmware test/opt.bin")
	require.Contains(t, err.Error(), "nvidia-firmware-1.0")
	require.NotContains(t, err.Error(), "\n")
	archives, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "*"+archiveExt))
	require.Empty(t, archives)
	_, err = Lookup(reopen(t, cfg))
	require.ErrorAs(t, err, &me, "the record of the names says it without the modules")
	_, _, err = Extra(reopen(t, cfg))
	require.ErrorAs(t, err, &me)

	cfg.RequireFirmware = []string{"test/nvme*"}
	res, err := Build(reopen(t, cfg))
	require.NoError(t, err, "present: built")
	require.Contains(t, res.Firmware, "test/nvme.bin")
}

// TestWarmLookupReadsNoModule: a warm launch takes the firmware names from
// the record the build left, not from the modules: with the module files
// gone (modules.dep unchanged) it still hits.
func TestWarmLookupReadsNoModule(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	res, err := Build(cfg)
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(cfg.HostModules, "6.1.0-test/kernel/drivers/nvme/host/nvme.ko")))
	hit, err := Lookup(reopen(t, cfg))
	require.NoError(t, err)
	require.NotNil(t, hit)
	require.Equal(t, res.Key, hit.Key)
}

// TestStaleFirmwareRecord: a module replaced without depmod (its
// modules.dep unchanged) whose entry was evicted while the names' record
// stayed: the build finds other names than the record's, refuses once and
// drops the record; the next launch builds with the module's own.
func TestStaleFirmwareRecord(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	res, err := Build(cfg)
	require.NoError(t, err)
	for _, ext := range []string{archiveExt, metaExt, okExt} {
		require.NoError(t, os.Remove(filepath.Join(cfg.CacheDir, res.Key+ext)))
	}
	writeObj(t, cfg.HostModules, "kernel/drivers/nvme/host/nvme.ko", "firmware=test/xz.bin")
	_, err = Build(reopen(t, cfg))
	require.ErrorContains(t, err, "name other firmware than when hpcvmm last read them")
	res, err = Build(reopen(t, cfg))
	require.NoError(t, err)
	require.Equal(t, []string{"test/xz.bin.xz"}, res.Firmware)
}

// TestFirmwareHashRecordCannotPoison: a hash record that lies about a
// firmware file (its identity unchanged, its bytes not) chooses the key,
// but the build hashes what it copies, refuses, and forgets the record.
func TestFirmwareHashRecordCannotPoison(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	c, err := OpenCache(cfg.CacheDir, 0)
	require.NoError(t, err)
	p := filepath.Join(cfg.HostFirmware[0], "test/nvme.bin")
	require.NoError(t, c.Remember(p, sha256.Sum256([]byte("genuine"))))
	_, err = Build(cfg)
	require.ErrorContains(t, err, "firmware "+p+" changed while hpcvmm read it")
	archives, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "*"+archiveExt))
	require.Empty(t, archives)
	res, err := Build(reopen(t, cfg))
	require.NoError(t, err, "the record was forgotten")
	_, content := readArchive(t, res.Path)
	require.Equal(t, "NVMEFW", content["usr/lib/firmware/test/nvme.bin"])
}

// TestImageFirmwareKept: a file IMAGE holds at the firmware's path stays
// IMAGE's, written once.
func TestImageFirmwareKept(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	root := cfg.Image.Path()
	writeFW(t, root, "usr/lib/firmware/test/nvme.bin", "IMAGE'S")
	cfg = reopen(t, cfg)
	res, err := Build(cfg)
	require.NoError(t, err)
	recs, content := readArchive(t, res.Path)
	n := 0
	for _, r := range recs {
		if r.Name == "usr/lib/firmware/test/nvme.bin" {
			n++
		}
	}
	require.Equal(t, 1, n)
	require.Equal(t, "IMAGE'S", content["usr/lib/firmware/test/nvme.bin"])
}

// TestExtraCountsFirmware: Extra's estimate holds the firmware (a 4 MiB
// GSP-like file here), stays an upper bound of the build, and a guest
// whose memory fits everything but the firmware is refused.
func TestExtraCountsFirmware(t *testing.T) {
	var log bytes.Buffer
	cfg := firmwareConfig(t, &log)
	big := strings.Repeat("G", 4<<20)
	writeFW(t, cfg.HostFirmware[0], "test/nvme.bin", big)
	u, err := cfg.Image.Usage()
	require.NoError(t, err)
	a, m, err := Extra(cfg)
	require.NoError(t, err)
	require.Greater(t, m, int64(4<<20), "unpacked: the firmware counts")
	res, err := Build(cfg)
	require.NoError(t, err)
	require.GreaterOrEqual(t, u.Archive+a, res.Size)
	require.GreaterOrEqual(t, u.Memory+m, res.Unpacked)
	require.Less(t, u.Archive+a-res.Size, int64(64<<10))
	require.Less(t, u.Memory+m-res.Unpacked, int64(64<<10))

	noFW := reopen(t, cfg)
	noFW.HostFirmware = []string{t.TempDir()}
	ua, um, err := Extra(noFW)
	require.NoError(t, err)
	need := max(u.Archive+ua+Headroom, 2*(u.Memory+um)+Headroom)
	cfg = reopen(t, cfg)
	cfg.GuestMemory, cfg.CacheDir = need, filepath.Join(t.TempDir(), "cache")
	_, err = Build(cfg)
	require.ErrorContains(t, err, "raise --memory", "enough without the firmware is not enough with it")
}

// BenchmarkLookupWarmFirmware is a warm launch's Lookup with an NVIDIA
// GPU's firmware (two files of GSP firmware's size: 72 and 30 MiB) and
// without: what the firmware adds is its record and a stat and a hash
// record per file, no hashing.
func BenchmarkLookupWarmFirmware(b *testing.B) {
	for _, withFW := range []bool{false, true} {
		b.Run(fmt.Sprintf("firmware=%v", withFW), func(b *testing.B) {
			cfg := config(b, imageDir(b))
			mods := b.TempDir()
			require.NoError(b, os.CopyFS(mods, os.DirFS(fixtureModules(b))))
			fw := b.TempDir()
			names := []string{"version=580.159.04"}
			if withFW {
				names = append(names, "firmware=nvidia/580.159.04/gsp_ga10x.bin", "firmware=nvidia/580.159.04/gsp_tu10x.bin")
				for name, size := range map[string]int{"gsp_ga10x.bin": 72 << 20, "gsp_tu10x.bin": 30 << 20} {
					p := filepath.Join(fw, "nvidia/580.159.04", name)
					require.NoError(b, os.MkdirAll(filepath.Dir(p), 0o755))
					require.NoError(b, os.WriteFile(p, bytes.Repeat([]byte{0x5a}, size), 0o644))
				}
			}
			require.NoError(b, os.WriteFile(filepath.Join(mods, "6.1.0-test/kernel/drivers/nvme/host/nvme.ko"), kmodtest.Object(names...), 0o644))
			cfg.HostModules, cfg.HostFirmware = mods, []string{fw}
			cfg.Log = slog.New(slog.DiscardHandler)
			res, err := Build(cfg)
			require.NoError(b, err)
			require.Len(b, res.Firmware, map[bool]int{false: 0, true: 2}[withFW])
			b.ReportAllocs()
			for b.Loop() {
				hit, err := Lookup(cfg)
				if err != nil || hit == nil {
					b.Fatal(err)
				}
			}
		})
	}
}
