// Package cachedir chooses where hpcvmm keeps its caches (the kernel
// cache of package vmlinux, the initramfs cache of package initramfs, the
// converted images of package imagepack) when the user names none.
//
// A cache is trusted: whoever writes it chooses what guests boot, and an
// initramfs entry holds every file of a user's image. So each user has
// caches of their own (issue 37: an unprivileged job step could not write
// root's /var/cache/hpcvmm and failed before boot; issue 30: a shared
// cache let one user read, or boot, another's image):
//
//   - root: /var/cache/hpcvmm/KIND;
//   - root acting for another user (a Slurm step run as root for
//     SLURM_JOB_UID, or setuid: asuser.Acting): /var/cache/hpcvmm/users/UID/KIND,
//     so one user's lookup never finds what another user's job built;
//   - any other user: $XDG_CACHE_HOME/hpcvmm/KIND, else
//     $HOME/.cache/hpcvmm/KIND, with the home directory from the user
//     database when $HOME is unset (the XDG base directory rules, as
//     os.UserCacheDir, which has no passwd fallback).
//
// The caches create these directories 0700 and refuse one that breaks
// trustfs's rules (a symbolic link, another owner, writable by others).
package cachedir

import (
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"

	"github.com/hpcvmm/hpcvmm/asuser"
)

// The kinds of cache.
const (
	// Kernels is the kernel cache (package vmlinux).
	Kernels = "kernels"
	// Initramfs is the initramfs cache (package initramfs).
	Initramfs = "initramfs"
	// Images is the cache of container images and archives converted to
	// SquashFS (package imagepack).
	Images = "images"
)

// Root is where root's caches live.
const Root = "/var/cache/hpcvmm"

// Default returns the cache directory of kind (Kernels, Initramfs or Images) for
// the user hpcvmm runs as (see the package doc). It creates nothing.
func Default(kind string) (string, error) {
	return defaultFor(kind, os.Geteuid(), os.Getenv)
}

// defaultFor is Default for effective uid euid and environment getenv.
func defaultFor(kind string, euid int, getenv func(string) string) (string, error) {
	if kind != Kernels && kind != Initramfs && kind != Images {
		return "", fmt.Errorf("cachedir: unknown cache kind %q: use %q, %q or %q", kind, Kernels, Initramfs, Images)
	}
	if euid == 0 {
		u, err := asuser.Acting(getenv)
		if err != nil {
			return "", fmt.Errorf("cachedir: %w", err)
		}
		if u != nil && u.UID != 0 {
			return filepath.Join(Root, "users", strconv.FormatUint(uint64(u.UID), 10), kind), nil
		}
		return filepath.Join(Root, kind), nil
	}
	base, err := userCache(euid, getenv)
	if err != nil {
		return "", err
	}
	return filepath.Join(base, "hpcvmm", kind), nil
}

// userCache is the XDG cache home of uid: $XDG_CACHE_HOME when absolute
// (the specification ignores a relative one), else $HOME/.cache, else the
// user database's home directory + /.cache.
func userCache(uid int, getenv func(string) string) (string, error) {
	if x := getenv("XDG_CACHE_HOME"); filepath.IsAbs(x) {
		return filepath.Clean(x), nil
	}
	if h := getenv("HOME"); filepath.IsAbs(h) {
		return filepath.Join(h, ".cache"), nil
	}
	u, err := user.LookupId(strconv.Itoa(uid))
	if err == nil && filepath.IsAbs(u.HomeDir) {
		return filepath.Join(u.HomeDir, ".cache"), nil
	}
	return "", fmt.Errorf("cachedir: uid %d has no $XDG_CACHE_HOME, no $HOME and no home directory in the user database: set XDG_CACHE_HOME to an absolute directory of yours, or pass the cache directory (--kernel-cache)", uid)
}
