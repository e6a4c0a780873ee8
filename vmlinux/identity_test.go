package vmlinux

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// settleAtOnce makes every file count as settled, so a test need not wait
// racyWindow, and restores the window afterwards.
func settleAtOnce(t *testing.T) {
	old := racyWindow
	racyWindow = 0
	t.Cleanup(func() { racyWindow = old })
}

// tick waits longer than a file-timestamp tick, so the next write gives the
// file a new modification and status-change time.
func tick() { time.Sleep(20 * time.Millisecond) }

// TestCacheTrustsAnUnchangedFileItHashed: the first Get hashes the entry
// and records its identity; the next Get of the same, unchanged file does
// not hash (shown by a record forged for a corrupted file, which Get then
// believes); a file changed after its record is hashed again and refused.
func TestCacheTrustsAnUnchangedFileItHashed(t *testing.T) {
	settleAtOnce(t)
	c := openTestCache(t, 0)
	elf := fixture(t, "vmlinux.elf")
	key := KeyOf([]byte("bz"))
	require.NoError(t, c.Put(key, elf))

	e, err := c.Get(key)
	require.NoError(t, err)
	assert.True(t, e.Hashed(), "the first read of an entry hashes it")
	require.NoError(t, e.Close())
	rec, err := os.ReadFile(verifiedPath(c.Path(key)))
	require.NoError(t, err)
	assert.Contains(t, string(rec), "ino ")

	e, err = c.Get(key)
	require.NoError(t, err)
	assert.False(t, e.Hashed(), "the same file, unchanged, is not hashed again")
	assert.True(t, bytes.Equal(elf, e.Bytes()))
	require.NoError(t, e.Close())

	// Only the record stands between a read and the hash: a record that
	// names a corrupted file's identity is believed.
	tick()
	b := readWritable(t, c.Path(key))
	b[len(b)-100] ^= 1
	writeBack(t, c.Path(key), b)
	fi, err := os.Stat(c.Path(key))
	require.NoError(t, err)
	id, settled := identityOf(fi)
	require.True(t, settled)
	forged := verifiedPath(c.Path(key))
	require.NoError(t, os.Chmod(forged, 0o644))
	require.NoError(t, os.WriteFile(forged, []byte(recordMagic+id.String()+"\n"), 0o644))
	e, err = c.Get(key)
	require.NoError(t, err, "a matching record is trusted")
	assert.False(t, e.Hashed())
	require.NoError(t, e.Close())

	// A change after the record gives the file a new identity: hashed,
	// and the corruption found.
	tick()
	writeBack(t, c.Path(key), b)
	_, err = c.Get(key)
	require.ErrorContains(t, err, "does not match the header")

	// A record anyone could have written is not believed.
	require.NoError(t, c.Put(key, elf))
	_, err = c.Get(key)
	require.NoError(t, err)
	require.NoError(t, os.Chmod(verifiedPath(c.Path(key)), 0o666))
	e, err = c.Get(key)
	require.NoError(t, err)
	assert.True(t, e.Hashed(), "a group- or world-writable record is ignored")
	require.NoError(t, e.Close())
}

// TestCacheHashesAFileChangedWithinTheRacyWindow: a file written less than
// racyWindow ago may still change within the same timestamp tick, so its
// identity is not recorded and every read hashes it.
func TestCacheHashesAFileChangedWithinTheRacyWindow(t *testing.T) {
	c := openTestCache(t, 0)
	elf := fixture(t, "vmlinux.elf")
	key := KeyOf([]byte("fresh"))
	require.NoError(t, c.Put(key, elf))
	for range 2 {
		e, err := c.Get(key)
		require.NoError(t, err)
		assert.True(t, e.Hashed(), "a file written just now is hashed at every read")
		require.NoError(t, e.Close())
	}
	rec, err := os.ReadFile(verifiedPath(c.Path(key)))
	require.NoError(t, err)
	assert.Equal(t, recordMagic+"unsettled\n", string(rec), "the record only keeps the time of use")
}

// TestKeyForRemembersABzImage: a bzImage's key is hashed once per file
// identity; the same file is not hashed again, a changed one is.
func TestKeyForRemembersABzImage(t *testing.T) {
	settleAtOnce(t)
	c := openTestCache(t, 0)
	path := filepath.Join(t.TempDir(), "vmlinuz")
	img := []byte(strings.Repeat("bzImage ", 1000))
	require.NoError(t, os.WriteFile(path, img, 0o644))
	stat := func() os.FileInfo {
		fi, err := os.Stat(path)
		require.NoError(t, err)
		return fi
	}

	key, hashed := c.KeyFor(img, stat())
	assert.True(t, hashed)
	assert.Equal(t, KeyOf(img), key)
	key, hashed = c.KeyFor(img, stat())
	assert.False(t, hashed, "the same file is not hashed again")
	assert.Equal(t, KeyOf(img), key)

	tick()
	img2 := append([]byte("new "), img[4:]...)
	require.NoError(t, os.WriteFile(path, img2, 0o644))
	key, hashed = c.KeyFor(img2, stat())
	assert.True(t, hashed, "a rewritten file (same size) is hashed")
	assert.Equal(t, KeyOf(img2), key)

	// Bytes that do not match the file's size are never matched against
	// a record (the caller stat'ed another file than it read).
	key, hashed = c.KeyFor(img2[:10], stat())
	assert.True(t, hashed)
	assert.Equal(t, KeyOf(img2[:10]), key)
}

// TestEvictTakesRecordsAlong: an evicted entry's record goes with it, and
// a record whose entry is gone is removed.
func TestEvictTakesRecordsAlong(t *testing.T) {
	settleAtOnce(t)
	elf := fixture(t, "vmlinux.elf")
	c := openTestCache(t, 1) // holds only the entry just written
	a, b := KeyOf([]byte("a")), KeyOf([]byte("b"))
	require.NoError(t, c.Put(a, elf))
	e, err := c.Get(a)
	require.NoError(t, err)
	require.NoError(t, e.Close())
	orphan := filepath.Join(c.Dir(), strings.Repeat("0", 64)+cacheSuffix+verifiedSuffix)
	require.NoError(t, os.WriteFile(orphan, []byte(recordMagic+"unsettled\n"), 0o444))
	require.NoError(t, c.Put(b, elf))
	for _, p := range []string{c.Path(a), verifiedPath(c.Path(a)), orphan} {
		_, err := os.Stat(p)
		assert.ErrorIs(t, err, os.ErrNotExist, p)
	}
}

// TestKeyForTrustsRecordsOnlyOfFilesOthersCannotWrite: a bzImage another
// user can write (owned by them, or group/other-writable) can change its
// bytes without changing the identity the record holds (through a shared
// writable mapping, whose writes do not always update the file's times, or
// a FUSE file system whose owner reports any identity), so its key is
// hashed at every launch and never recorded; a file only root or hpcvmm's
// user can write keeps its record.
func TestKeyForTrustsRecordsOnlyOfFilesOthersCannotWrite(t *testing.T) {
	settleAtOnce(t)
	c := openTestCache(t, 0)
	img := []byte(strings.Repeat("bzImage ", 1000))
	for _, tc := range []struct {
		name    string
		mode    os.FileMode
		uid     int
		trusted bool
	}{
		{"ours 0644", 0o644, os.Geteuid(), true},
		{"ours 0664", 0o664, os.Geteuid(), false},
		{"ours 0646", 0o646, os.Geteuid(), false},
		{"another user's 0644", 0o644, 4242, false},
	} {
		path := filepath.Join(t.TempDir(), "vmlinuz")
		require.NoError(t, os.WriteFile(path, img, 0o644))
		require.NoError(t, os.Chmod(path, tc.mode))
		if tc.uid != os.Geteuid() {
			if os.Geteuid() != 0 {
				t.Logf("%s: not root, cannot give the file away; case not run", tc.name)
				continue
			}
			require.NoError(t, os.Chown(path, tc.uid, -1))
		}
		fi, err := os.Stat(path)
		require.NoError(t, err)
		key, hashed := c.KeyFor(img, fi)
		assert.True(t, hashed, tc.name)
		assert.Equal(t, KeyOf(img), key, tc.name)
		_, hashed = c.KeyFor(img, fi)
		assert.Equal(t, !tc.trusted, hashed, "%s: hashed again", tc.name)
		_, err = os.Lstat(c.keyRecordPath(mustIdentity(t, fi)))
		assert.Equal(t, tc.trusted, err == nil, "%s: record written", tc.name)
	}
}

func mustIdentity(t *testing.T, fi os.FileInfo) identity {
	id, ok := identityOf(fi)
	require.True(t, ok)
	return id
}
