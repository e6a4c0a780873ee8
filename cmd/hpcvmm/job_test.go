package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJobInputErrors(t *testing.T) {
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/data"), []byte("x"), 0o644))
	dyn, err := os.ReadFile("/bin/true") // dynamic, and IMAGE has no C library
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/dyn"), dyn, 0o755))
	kernel := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kernel, []byte("not checked before the image"), 0o644))
	for _, c := range []struct {
		args []string
		code int
		want []string
	}{
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--initrd", kernel, "--", "sh"}, 2, []string{"--rootfs and --initrd"}},
		{[]string{"run", "--kernel", kernel, "--", "sh"}, 2, []string{"--rootfs IMAGE"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img}, 2, []string{"--rootfs without a COMMAND"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "sh"}, 2, []string{`unexpected argument "sh"`, "after --"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", filepath.Join(img, "absent"), "--", "sh"}, 2, []string{"--rootfs", "does not exist"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--", "nosuch"}, 127, []string{"nosuch", "not found"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--", "/bin/data"}, 126, []string{"/bin/data", "not executable"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--", "dyn"}, 127, []string{"command dyn (/bin/dyn) is dynamically linked", "ELF interpreter /lib64/ld-linux-x86-64.so.2 is not in the image"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--memory", "64M", "--", "sh"}, 2, []string{"--memory", "raise --memory"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--user", "alice", "--", "sh"}, 2, []string{"--user alice", "numeric"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--env", "=x", "--", "sh"}, 2, []string{"--env", "KEY=VALUE"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--env-file", "/nonexistent", "--", "sh"}, 2, []string{"--env-file /nonexistent"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--dns", "x", "--", "sh"}, 2, []string{"--dns"}},
		// Said before boot rather than ignored or found in the guest (issue 35).
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--workdir", "work", "--", "sh"}, 2, []string{`--workdir "work"`, "absolute"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--console", "serial", "--", "sh"}, 2, []string{"--console serial", "leave --console out"}},
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--console", "virtio", "--", "nosuch"}, 127, []string{"nosuch"}},
	} {
		code, _, errOut := hpcvmm(onKVMHost(t, c.args)...)
		assert.Equal(t, c.code, code, "%v: %s", c.args, errOut)
		for _, w := range c.want {
			assert.Contains(t, errOut, w, "%v", c.args)
		}
		assert.NotRegexp(t, `rootfs: (image|rootfs)|--rootfs: |--rootfs \S+: (rootfs|initramfs): `, errOut, "%v: one prefix", c.args)
	}
}

func TestJobEnv(t *testing.T) {
	file := filepath.Join(t.TempDir(), "env")
	require.NoError(t, os.WriteFile(file, []byte("# comment\n\nA=1\nB=two words\nHOSTONLY\n"), 0o644))
	host := map[string]string{"HOSTONLY": "h", "FROMHOST": "f"}
	lookup := func(k string) (string, bool) { v, ok := host[k]; return v, ok }
	env, err := jobEnv(&jobFlags{envFiles: []string{file}, env: []string{"A=3", "FROMHOST", "UNSET", "E="}}, lookup, nil)
	require.NoError(t, err)
	require.Equal(t, []string{"A=1", "B=two words", "HOSTONLY=h", "A=3", "FROMHOST=f", "E="}, env)
	_, err = jobEnv(&jobFlags{env: []string{"A B=1"}}, lookup, nil)
	require.Error(t, err)
}

func TestParseUserAndDNS(t *testing.T) {
	uid, gid, err := parseUser("1000")
	require.NoError(t, err)
	require.Equal(t, [2]uint32{1000, 1000}, [2]uint32{uid, gid})
	uid, gid, err = parseUser("0:100")
	require.NoError(t, err)
	require.Equal(t, [2]uint32{0, 100}, [2]uint32{uid, gid})
	for _, bad := range []string{"", ":1", "1:", "-1", "4294967296", "a:b"} {
		_, _, err = parseUser(bad)
		require.Error(t, err, bad)
	}
}

// TestJobBindInputErrors: every bad -B/--bind is a one-line error (exit 2)
// before anything on the host changes: no initramfs cache is made.
func TestJobBindInputErrors(t *testing.T) {
	img := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(img, "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "bin/sh"), []byte("#!/bin/sh\n"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "data"), []byte("x"), 0o644))
	kernel := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kernel, []byte("not checked before the binds"), 0o644))
	src := t.TempDir()
	file := filepath.Join(src, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	cache := filepath.Join(t.TempDir(), "cache")
	t.Setenv("XDG_CACHE_HOME", cache)
	t.Setenv("HOME", cache)
	job := func(extra ...string) []string {
		return onKVMHost(t, append(append([]string{"run", "--kernel", kernel, "--rootfs", img, "--contain"}, extra...), "--", "sh"))
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{job("--bind", filepath.Join(src, "absent")), []string{"--bind", "absent", "no such directory on the host"}},
		{job("-B", file), []string{file, "not a directory"}},
		{job("-B", src+":data"), []string{`"data" is relative`}},
		{job("-B", src+":/"), []string{"covers /"}},
		{job("-B", src+":/proc"), []string{"covers /proc"}},
		{job("-B", src+":/sys/x"), []string{"covers /sys"}},
		{job("-B", src+":/dev"), []string{"covers /dev"}},
		{job("-B", src+":/.hpcvmm"), []string{"covers /.hpcvmm"}},
		{job("-B", src+":/d", "-B", t.TempDir()+":/d"), []string{"both bound at /d"}},
		{job("-B", src+":/d:rx"), []string{`option "rx"`}},
		{job("-B", src+":/data"), []string{"the image has a file at /data"}},
		{job("--bind", "--gpu"), []string{"--bind-devices"}},
		{[]string{"run", "--kernel", kernel, "--bind=true"}, []string{"--bind-devices"}},
		{[]string{"run", "--kernel", kernel, "--bind", src}, []string{"give it after --"}},
		{job("-B", src+":/d", "--bind-msize", "1K"), []string{"--bind-msize 1024", "4096 to 4194304"}},
		{job("-B", src+":/d", "--bind-msize", "8M"), []string{"--bind-msize 8388608"}},
		{job("-B", src+":/d", "--bind-cache", "mmap,rw"), []string{`--bind-cache "mmap,rw"`, "none, loose, fscache, mmap"}},
		{job("-B", src+":/d", "--bind-cache", "readahead"), []string{`--bind-cache "readahead"`}},
	} {
		code, _, errOut := hpcvmm(c.args...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		for _, w := range c.want {
			assert.Contains(t, errOut, w, "%v", c.args)
		}
		assert.LessOrEqual(t, strings.Count(strings.TrimSpace(errOut), "\n"), 1, "%v: one line (and a usage hint): %s", c.args, errOut)
	}
	_, err := os.Stat(cache)
	assert.True(t, os.IsNotExist(err), "no cache made for refused input")
}

func TestModuleFlagInputErrors(t *testing.T) {
	img := t.TempDir()
	kernel := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kernel, []byte("not read"), 0o644))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--kernel", kernel, "--rootfs", img, "--module", "fs/nfs/nfs.ko", "--", "sh"}, `module name "fs/nfs/nfs.ko" holds "/"`},
		{[]string{"run", "--kernel", kernel, "--initrd", kernel, "--module", "nfs", "--", "sh"}, "--module nfs needs --rootfs IMAGE"},
		{[]string{"run", "--kernel", kernel, "--module", "nfs"}, "--module without a COMMAND"},
	} {
		code, _, errOut := hpcvmm(c.args...)
		assert.Equal(t, 2, code, "%v: %s", c.args, errOut)
		assert.Contains(t, errOut, c.want, "%v", c.args)
	}
}

func TestGPULibsFlag(t *testing.T) {
	img := t.TempDir()
	kernel := filepath.Join(t.TempDir(), "bzImage")
	require.NoError(t, os.WriteFile(kernel, []byte("not read"), 0o644))
	code, _, errOut := hpcvmm("run", "--kernel", kernel, "--rootfs", img, "--gpu-libs", "maybe", "--", "sh")
	assert.Equal(t, 2, code, errOut)
	assert.Contains(t, errOut, `"maybe": give on or off`)
}

// TestBindTuningFlags: the hidden --bind-msize and --bind-cache (the
// bench's knobs) take sizes with a suffix; jobrun checks their values.
func TestBindTuningFlags(t *testing.T) {
	for _, tc := range []struct {
		msize string
		want  uint64
	}{{"128K", 128 << 10}, {"1M", 1 << 20}, {"4096", 4096}, {"4M", 4 << 20}} {
		fs := newFlagSet("t")
		var f bindFlags
		addBindTuningFlags(fs, &f)
		require.NoError(t, fs.Parse([]string{"--bind-msize", tc.msize, "--bind-cache", "loose"}))
		assert.Equal(t, tc.want, f.msize, tc.msize)
		assert.Equal(t, "loose", f.cache)
	}
}
