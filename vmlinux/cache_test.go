package vmlinux

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func openTestCache(t *testing.T, max int64) *Cache {
	t.Helper()
	c, err := OpenCache(filepath.Join(t.TempDir(), "kernels"), max)
	require.NoError(t, err)
	return c
}

// TestCacheRoundTrip: a miss, then Put, then a hit with the same bytes; the
// directory and file get modes nobody else can write, and the file holds
// the header with the content's SHA-256.
func TestCacheRoundTrip(t *testing.T) {
	c := openTestCache(t, 0)
	fi, err := os.Stat(c.Dir())
	require.NoError(t, err)
	assert.Equal(t, os.ModeDir|0o700, fi.Mode(), "created with 0700")

	key := KeyOf([]byte("a bzImage"))
	_, err = c.Get(key)
	require.ErrorIs(t, err, ErrMiss)

	elf := fixture(t, "vmlinux.elf")
	require.NoError(t, c.Put(key, elf))
	e, err := c.Get(key)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(elf, e.Bytes()))
	require.NoError(t, e.Close())
	require.NoError(t, e.Close(), "Close twice is harmless")
	assert.Nil(t, e.Bytes())

	fi, err = os.Stat(c.Path(key))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o400), fi.Mode())
	assert.Equal(t, uint32(os.Geteuid()), fi.Sys().(*syscall.Stat_t).Uid)
	raw, err := os.ReadFile(c.Path(key))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(string(raw), "hpcvmm-vmlinux v1\nsha256 "), "header: %q", raw[:80])
	body, err := Verify(raw)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(elf, body))
	assert.Equal(t, filepath.Join(c.Dir(), key.String()+".vmlinux"), c.Path(key))
	assert.Len(t, key.String(), 64)

	// Put over an existing entry replaces it whole.
	held, err := c.Get(key) // mapped by a launch while another replaces it
	require.NoError(t, err)
	require.NoError(t, c.Put(key, elf[:4096]))
	e, err = c.Get(key)
	require.NoError(t, err)
	assert.Equal(t, elf[:4096], e.Bytes())
	assert.True(t, bytes.Equal(elf, held.Bytes()), "a mapping taken before the replacement keeps the old kernel whole")
	require.NoError(t, e.Close())
	require.NoError(t, held.Close())
	leftovers, _ := filepath.Glob(filepath.Join(c.Dir(), ".tmp-*"))
	assert.Empty(t, leftovers, "no temporary files after Put")
}

// TestCacheDetectsDamage: a cache file changed behind hpcvmm's back (a
// flipped bit, a truncation, a foreign file, loose permissions, a symlink)
// is refused with an error that says what is wrong, and Put repairs it.
func TestCacheDetectsDamage(t *testing.T) {
	elf := fixture(t, "vmlinux.elf")
	key := KeyOf([]byte("k"))
	for _, c := range []struct {
		name, want string
		damage     func(t *testing.T, path string)
	}{
		{"bit flip", "does not match the header", func(t *testing.T, path string) {
			b := readWritable(t, path)
			b[len(b)-100] ^= 1
			writeBack(t, path, b)
		}},
		{"truncated", "truncated or corrupt", func(t *testing.T, path string) {
			b := readWritable(t, path)
			writeBack(t, path, b[:len(b)-1])
		}},
		{"empty", "is empty", func(t *testing.T, path string) { writeBack(t, path, nil) }},
		{"no header", "no hpcvmm-vmlinux v1 header", func(t *testing.T, path string) { writeBack(t, path, elf) }},
		{"hash replaced", "does not match", func(t *testing.T, path string) {
			b := readWritable(t, path)
			copy(b[len("hpcvmm-vmlinux v1\nsha256 "):], strings.Repeat("0", 64))
			writeBack(t, path, b)
		}},
		{"group writable", "writable by group or others", func(t *testing.T, path string) { require.NoError(t, os.Chmod(path, 0o664)) }},
		{"symlink", "symbolic link", func(t *testing.T, path string) {
			other := path + ".real"
			require.NoError(t, os.Rename(path, other))
			require.NoError(t, os.Symlink(other, path))
		}},
		{"directory", "is a d", func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
			require.NoError(t, os.Mkdir(path, 0o755))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cache := openTestCache(t, 0)
			require.NoError(t, cache.Put(key, elf))
			c.damage(t, cache.Path(key))
			_, err := cache.Get(key)
			require.Error(t, err)
			assert.NotErrorIs(t, err, ErrMiss)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), cache.Path(key), "the error names the file")
			if c.name == "directory" {
				return // rename cannot replace a directory: the user removes it
			}
			require.NoError(t, cache.Put(key, elf), "Put replaces a damaged entry")
			e, err := cache.Get(key)
			require.NoError(t, err)
			assert.True(t, bytes.Equal(elf, e.Bytes()))
			require.NoError(t, e.Close())
		})
	}
}

func readWritable(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return b
}

func writeBack(t *testing.T, path string, b []byte) {
	t.Helper()
	require.NoError(t, os.Chmod(path, 0o644))
	require.NoError(t, os.WriteFile(path, b, 0o644))
}

// TestOpenCacheRefusesUnsafeDirectories: whoever can write the cache
// directory chooses the kernel every VM boots, so a directory writable by
// group or others, a symlink, a file, or a relative path is refused with
// the fix.
func TestOpenCacheRefusesUnsafeDirectories(t *testing.T) {
	base := t.TempDir()
	open := filepath.Join(base, "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o777))
	_, err := OpenCache(open, 0)
	assert.ErrorContains(t, err, "mode 0777, writable by group or others")
	assert.ErrorContains(t, err, "chmod go-w")

	group := filepath.Join(base, "group")
	require.NoError(t, os.Mkdir(group, 0o755))
	require.NoError(t, os.Chmod(group, 0o775))
	_, err = OpenCache(group, 0)
	assert.ErrorContains(t, err, "writable by group or others")

	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(base, link))
	_, err = OpenCache(link, 0)
	assert.ErrorContains(t, err, "symbolic link")

	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	_, err = OpenCache(file, 0)
	assert.ErrorContains(t, err, "not a directory")

	_, err = OpenCache("relative/kernels", 0)
	assert.ErrorContains(t, err, "not an absolute path")

	if os.Geteuid() == 0 {
		// Root can give the directory away: owned by another user, it
		// is refused.
		other := filepath.Join(base, "other")
		require.NoError(t, os.Mkdir(other, 0o755))
		require.NoError(t, os.Chown(other, 65534, 65534))
		_, err = OpenCache(other, 0)
		assert.ErrorContains(t, err, "owned by uid 65534")
	} else {
		t.Log("not root: the foreign-owner case needs chown and did not run")
	}
}

// TestCacheEvictsLeastRecentlyUsed: beyond the bound the entries used
// longest ago go, never the one just written; a Get counts as a use; stale
// temporary files from a crashed launch are removed, fresh ones (a
// concurrent launch's Put in progress) are not.
func TestCacheEvictsLeastRecentlyUsed(t *testing.T) {
	elf := fixture(t, "vmlinux.elf")
	entry := int64(len(elf)) + 200 // the header is under 200 bytes
	c := openTestCache(t, 3*entry)
	keys := []Key{KeyOf([]byte("0")), KeyOf([]byte("1")), KeyOf([]byte("2")), KeyOf([]byte("3"))}
	base := time.Now().Add(-time.Hour)
	for i, k := range keys[:3] {
		require.NoError(t, c.Put(k, elf))
		at := base.Add(time.Duration(i) * time.Minute)
		require.NoError(t, os.Chtimes(c.Path(k), at, at))
	}
	e, err := c.Get(keys[0]) // used now: the newest
	require.NoError(t, err)
	require.NoError(t, e.Close())
	stale := filepath.Join(c.Dir(), ".tmp-stale")
	fresh := filepath.Join(c.Dir(), ".tmp-fresh")
	require.NoError(t, os.WriteFile(stale, []byte("x"), 0o600))
	require.NoError(t, os.WriteFile(fresh, []byte("x"), 0o600))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(stale, old, old))

	require.NoError(t, c.Put(keys[3], elf))
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	assert.True(t, exists(c.Path(keys[0])), "recently read: kept")
	assert.False(t, exists(c.Path(keys[1])), "least recently used: evicted")
	assert.True(t, exists(c.Path(keys[2])))
	assert.True(t, exists(c.Path(keys[3])), "just written: kept")
	assert.False(t, exists(stale), "stale temporary file removed")
	assert.True(t, exists(fresh), "a concurrent launch's temporary file kept")

	// A bound below one entry still keeps the entry just written.
	tiny := openTestCache(t, 1)
	require.NoError(t, tiny.Put(keys[0], elf))
	require.NoError(t, tiny.Put(keys[1], elf))
	assert.False(t, exists(tiny.Path(keys[0])))
	assert.True(t, exists(tiny.Path(keys[1])))
}

// TestCacheConcurrentLaunches: launches that miss at once all Put the same
// kernel while others Get it; every Get sees a miss or the whole kernel,
// never a part, and no temporary file is left.
func TestCacheConcurrentLaunches(t *testing.T) {
	elf := fixture(t, "vmlinux.elf")
	c := openTestCache(t, 0)
	key := KeyOf([]byte("shared"))
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				errs <- c.Put(key, elf)
				return
			}
			for range 20 {
				e, err := c.Get(key)
				switch {
				case errors.Is(err, ErrMiss):
				case err != nil:
					errs <- err
					return
				case !bytes.Equal(e.Bytes(), elf):
					errs <- errors.New("Get returned a partial or wrong kernel")
					return
				}
				if e != nil {
					_ = e.Close()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(c.Dir(), ".tmp-*"))
	assert.Empty(t, leftovers)
}
