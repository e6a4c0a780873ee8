//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/tests/harness"
	"github.com/hpcvmm/hpcvmm/vmlinux"
)

// linkedText is where Debian's x86-64 kernel links _text
// (__START_KERNEL_map + CONFIG_PHYSICAL_START): where it runs without KASLR.
const linkedText = "ffffffff81000000"

// TestKernelDecompress boots Debian's stock bzImage with the kernel
// decompressed on the host, first with an empty kernel cache (decompressed,
// cached), then warm (read from the cache, its SHA-256 checked and
// recorded), then warm again (the record trusted, nothing hashed), then the
// cached vmlinux ELF itself as --kernel, then with the guest's own
// decompressor (--kernel-decompress=guest). Each boot must reach /init with
// the command line it was given; the host-decompressed kernels must run at
// their link address (no KASLR), and the cache file must be root's, 0400 in a 0700 directory (private: issue 30),
// and hold the vmlinux its header's SHA-256 names. Launch to /init and the
// guest's uptime at /init are recorded for each.
func TestKernelDecompress(t *testing.T) {
	harness.Run(t, harness.ProfileBasic, func(t *testing.T, env *harness.Env) {
		cacheDir := filepath.Join(t.TempDir(), "kernels") // created by hpcvmm
		bzImage := env.L2Kernel(t)
		image, err := os.ReadFile(bzImage)
		require.NoError(t, err)
		cacheFile := filepath.Join(cacheDir, vmlinux.KeyOf(image).String()+".vmlinux")

		launch := func(t *testing.T, kernel, token string, extra ...string) (map[string]string, string) {
			args := append([]string{"run",
				"--kernel", kernel,
				"--initrd", env.L2Initrd(t),
				"--cmdline", "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=kernel hpcvmm.token=" + token,
				"--memory", "512M", "--hugepages", "none",
				"--kernel-cache", cacheDir,
			}, extra...)
			start := time.Now()
			vm := env.StartVM(t, args...)
			_, ok := vm.WaitForLine("HPCVMM-GUEST-MARKER init-started", 3*time.Minute)
			require.True(t, ok, "the guest's /init never started")
			env.Record(t, "launch_to_init_ms", strconv.FormatInt(time.Since(start).Milliseconds(), 10))
			require.Equal(t, 0, vm.Wait(), "hpcvmm exit status after the guest rebooted")
			g := vm.GuestResults()
			require.Contains(t, vm.Console(), "HPCVMM-GUEST-MARKER done", "the guest's /init did not finish")
			assert.Equal(t, token, g["cmdline_token"], "the guest's /proc/cmdline")
			env.Record(t, "guest_uptime_at_init", g["uptime"])
			env.Record(t, "kernel_text", g["kernel_text"])
			// Where the time before the guest's clock went, from hpcvmm's
			// own log: the kernel step (cache read and SHA-256 check, or
			// decompression), guest RAM, and process start to KVM_RUN.
			for _, m := range logSteps.FindAllStringSubmatch(vm.Log(), -1) {
				env.Record(t, m[1], m[2])
			}
			return g, vm.Log()
		}

		t.Run("host-cold", func(t *testing.T) {
			_, err := os.Stat(cacheFile)
			require.ErrorIs(t, err, os.ErrNotExist, "the cache starts empty")
			g, log := launch(t, bzImage, "cold")
			assert.Contains(t, log, "cache_hit=false", "a first launch decompresses")
			assert.Contains(t, log, "format=xz", "Debian's kernel is xz-compressed")
			assert.Equal(t, linkedText, g["kernel_text"], "a host-decompressed kernel runs at its link address: no KASLR")
			checkCacheFile(t, cacheDir, cacheFile)
		})
		t.Run("host-warm", func(t *testing.T) {
			g, log := launch(t, bzImage, "warm")
			assert.Contains(t, log, "cache_hit=true", "a second launch reads the cache")
			assert.Contains(t, log, "sha256_verified=now", "the first read of an entry hashes it")
			assert.Equal(t, linkedText, g["kernel_text"], "a cached kernel runs at its link address: no KASLR")
			checkCacheFile(t, cacheDir, cacheFile)
			_, err := os.Stat(cacheFile + ".ok")
			require.NoError(t, err, "the hash of the settled entry is recorded")
		})
		t.Run("host-recorded", func(t *testing.T) {
			g, log := launch(t, bzImage, "recorded")
			assert.Contains(t, log, "cache_hit=true")
			assert.Contains(t, log, "sha256_verified=recorded", "the same unchanged entry is not hashed again")
			assert.Equal(t, linkedText, g["kernel_text"])
		})
		t.Run("vmlinux-elf", func(t *testing.T) {
			file, err := os.ReadFile(cacheFile)
			require.NoError(t, err)
			elf, err := vmlinux.Verify(file)
			require.NoError(t, err)
			path := filepath.Join(t.TempDir(), "vmlinux")
			require.NoError(t, os.WriteFile(path, elf, 0o644))
			g, log := launch(t, path, "elf")
			assert.Contains(t, log, "format=\"vmlinux (ELF)\"")
			assert.Equal(t, linkedText, g["kernel_text"], "a vmlinux runs at its link address")
		})
		t.Run("guest", func(t *testing.T) {
			g, log := launch(t, bzImage, "guest", "--kernel-decompress", "guest")
			assert.Contains(t, log, "decompress=guest")
			assert.NotContains(t, log, "cache_hit")
			// KASLR picks one of about 475 2 MiB slots, the link address
			// among them, so a moved _text is likely but not certain: the
			// address is recorded, not asserted.
			assert.Regexp(t, `^[0-9a-f]{16}$`, g["kernel_text"], "the guest reports where its kernel runs")
			env.Record(t, "kaslr_moved_kernel", strconv.FormatBool(g["kernel_text"] != linkedText))
		})
	})
}

// logSteps picks the step durations out of hpcvmm's log lines.
var logSteps = regexp.MustCompile(`\b(elapsed|setup|prefault|since_start)=([0-9.]+[mµn]?s)\b`)

// checkCacheFile checks the cache directory and entry from the host side:
// root's, not writable by others, and the file's content is the vmlinux
// whose SHA-256 its header records (checked here independently of hpcvmm's
// own check) and an x86-64 ELF the loader accepts.
func checkCacheFile(t *testing.T, dir, file string) {
	t.Helper()
	for _, c := range []struct {
		path string
		mode os.FileMode
	}{{dir, 0o700 | os.ModeDir}, {file, 0o400}} {
		fi, err := os.Lstat(c.path)
		require.NoError(t, err)
		assert.Equal(t, c.mode, fi.Mode(), "mode of %s", c.path)
		st := fi.Sys().(*syscall.Stat_t)
		assert.Equal(t, uint32(0), st.Uid, "owner of %s", c.path)
	}
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	elf, err := vmlinux.Verify(data)
	require.NoError(t, err, "cache file's content against its header's SHA-256")
	v, err := boot.ParseVmlinux(elf)
	require.NoError(t, err)
	assert.Equal(t, uint64(0x1000000), v.Entry, "Debian's vmlinux enters at CONFIG_PHYSICAL_START")
	t.Logf("cache file %s: %d bytes of vmlinux, %d PT_LOAD segments, [%#x, %#x)", file, len(elf), len(v.Segments), v.Start, v.End)
}
