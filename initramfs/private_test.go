package initramfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/stretchr/testify/require"
)

var nobody = &asuser.User{UID: testenv.Nobody, GID: testenv.Nobody, Name: "nobody"}

// cacheFiles lists the cache's regular files by kind: the archive, its
// record, its identity record, the image index and the hash records.
func cacheFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	des, err := os.ReadDir(dir)
	require.NoError(t, err)
	kinds := map[string]string{}
	for _, de := range des {
		n := de.Name()
		for _, ext := range []string{archiveExt, metaExt, okExt, indexExt, hashExt} {
			if strings.HasSuffix(n, ext) {
				kinds[ext] = filepath.Join(dir, n)
			}
		}
	}
	require.Len(t, kinds, 5, "an entry of a tar IMAGE: archive, record, identity record, index, hash record: %v", kinds)
	return kinds
}

// Issue 30 item 2: the cache was 0755 with 0444 entries, so any local user
// read the whole archive of someone's image (files that were 0600 in a
// 0700 image directory included), its index and the hash records naming
// every file. Before the fix, nobody read every one of them. Now the
// directory is 0700 and every file 0400 (or 0600), and a cache made by an
// older hpcvmm is tightened when it is next opened.
func TestCacheUnreadableByOtherUsers(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.SkipOrFail(t, "needs root to read the cache as another uid")
	}
	dir := imageDir(t)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "etc/secret"), []byte("root only\n"), 0o600))
	tarPath := filepath.Join(t.TempDir(), "root.tar")
	out, err := runCmd("/usr/bin/tar", "", "-C", dir, "-cf", tarPath, ".")
	require.NoError(t, err, out)
	cfg := config(t, tarPath)
	// A parent every user may enter: only the cache's own modes keep
	// nobody out.
	cfg.CacheDir = filepath.Join(testenv.SharedDir(t), "cache")
	res, err := Build(cfg)
	require.NoError(t, err)

	nobodyCannotRead := func() {
		t.Helper()
		fi, err := os.Lstat(cfg.CacheDir)
		require.NoError(t, err)
		require.Equal(t, fs.ModeDir|0o700, fi.Mode(), "the cache directory")
		for kind, p := range cacheFiles(t, cfg.CacheDir) {
			fi, err := os.Lstat(p)
			require.NoError(t, err)
			require.Zero(t, fi.Mode().Perm()&0o077, "%s %s has mode %v", kind, p, fi.Mode())
			err = asuser.Do(nobody, func() error { _, err := os.ReadFile(p); return err })
			require.ErrorIs(t, err, fs.ErrPermission, "nobody read %s %s", kind, p)
		}
		// The entry itself stays readable through hpcvmm's own identity.
		_, content := readArchive(t, res.Path)
		require.Equal(t, "root only\n", content["etc/secret"])
	}
	nobodyCannotRead()

	// A cache an older hpcvmm left open: the next launch closes it.
	require.NoError(t, os.Chmod(cfg.CacheDir, 0o755))
	for _, p := range cacheFiles(t, cfg.CacheDir) {
		require.NoError(t, os.Chmod(p, 0o444))
	}
	cfg.Image, err = rootfs.Open(tarPath)
	require.NoError(t, err)
	hit, err := Build(cfg)
	require.NoError(t, err)
	require.True(t, hit.Hit, "a loose entry of ours is tightened and used")
	nobodyCannotRead()
}

// asUserEnv names, in a child run as another user, the directory holding
// the image and agent buildAsUser builds from.
const asUserEnv = "HPCVMM_INITRAMFS_TEST_AS_USER"

// buildAsUser, in a child the test binary started as an unprivileged uid,
// builds dir/image with the agent dir/agent into the cache the user gets
// by default (Config.CacheDir empty: cachedir.Default), twice, or into
// $CACHE when set, and prints the result.
func buildAsUser(dir string) error {
	for i := range 2 {
		im, err := rootfs.Open(filepath.Join(dir, "image"))
		if err != nil {
			return err
		}
		res, err := Build(Config{Image: im, Agent: filepath.Join(dir, "agent"), Release: "6.1.0-test",
			HostModules: "../kmodules/testdata/lib/modules", CacheDir: os.Getenv("CACHE")})
		if err != nil {
			fmt.Printf("RESULT error=%q\n", err)
			return nil
		}
		fmt.Printf("RESULT path%d=%s\nRESULT hit%d=%t\n", i, res.Path, i, res.Hit)
	}
	return nil
}

// userHome makes a home directory for uid under shared.
func userHome(t *testing.T, shared string, uid int) string {
	home := filepath.Join(shared, "home-"+strconv.Itoa(uid))
	require.NoError(t, os.Mkdir(home, 0o700))
	require.NoError(t, os.Chown(home, uid, uid))
	return home
}

// Issue 37: a job started as an unprivileged user failed before boot
// ("initramfs: cache: open /var/cache/hpcvmm/initramfs/.tmp-…: permission
// denied"): the default cache was root's. As uid 65534, with no cache
// directory named, the build now lands in $HOME/.cache/hpcvmm/initramfs,
// 0700 and owned by the user, its entry 0400; the next launch is a hit.
// And (issue 30, "a container image's cache hit reads no layer") a second
// user's lookup of the very same image never hits the first user's entry:
// their default cache is their own, and pointing at the first user's is
// refused.
func TestPerUserCache(t *testing.T) {
	shared := testenv.SharedDir(t)
	src := imageDir(t)
	out, err := runCmd("/usr/bin/cp", "", "-a", src, filepath.Join(shared, "image"))
	require.NoError(t, err, out)
	require.NoError(t, os.WriteFile(filepath.Join(shared, "agent"), elfExe(false), 0o755))
	const other = testenv.Nobody - 1
	homeA, homeB := userHome(t, shared, testenv.Nobody), userHome(t, shared, other)

	out, err = testenv.RunAs(t, testenv.Nobody, testenv.Nobody, asUserEnv+"="+shared, "HOME="+homeA, "XDG_CACHE_HOME=", "CACHE=")
	require.NoError(t, err, out)
	cacheA := filepath.Join(homeA, ".cache/hpcvmm/initramfs")
	require.Contains(t, out, "RESULT path0="+cacheA+"/", out)
	require.Contains(t, out, "RESULT hit0=false")
	require.Contains(t, out, "RESULT hit1=true", "the user's second launch is a hit")
	for _, d := range []string{cacheA, filepath.Dir(cacheA)} {
		fi, err := os.Lstat(d)
		require.NoError(t, err)
		require.Equal(t, fs.ModeDir|0o700, fi.Mode(), d)
		require.Equal(t, uint32(testenv.Nobody), fi.Sys().(*syscall.Stat_t).Uid, d)
	}
	entries, _ := filepath.Glob(filepath.Join(cacheA, "*"+archiveExt))
	require.Len(t, entries, 1)
	fi, err := os.Lstat(entries[0])
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o400), fi.Mode())
	require.Equal(t, uint32(testenv.Nobody), fi.Sys().(*syscall.Stat_t).Uid)

	// User B, the same image: a cache of B's own, so a miss.
	out, err = testenv.RunAs(t, other, other, asUserEnv+"="+shared, "HOME="+homeB, "XDG_CACHE_HOME=", "CACHE=")
	require.NoError(t, err, out)
	require.Contains(t, out, "RESULT path0="+filepath.Join(homeB, ".cache/hpcvmm/initramfs")+"/")
	require.Contains(t, out, "RESULT hit0=false", "user B's lookup hit user A's entry")
	// B naming A's cache gets no entry of A's: refused (A's home is 0700,
	// and the cache is A's, not B's).
	out, err = testenv.RunAs(t, other, other, asUserEnv+"="+shared, "HOME="+homeB, "CACHE="+cacheA)
	require.NoError(t, err, out)
	require.Contains(t, out, "RESULT error=")
	require.NotContains(t, out, "RESULT hit0=true")
}
