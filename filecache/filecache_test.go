package filecache

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func open(t *testing.T, max int64) *Cache {
	t.Helper()
	c, err := Open(filepath.Join(t.TempDir(), "cache"), Options{
		Name: "test", Kind: "initramfs", DataExt: ".data", SideExts: []string{MetaExt}, Setting: "the test's dir", Max: max,
	})
	require.NoError(t, err)
	return c
}

// put stores data under key the way a cache does, and returns its SHA-256.
func put(t *testing.T, c *Cache, key string, data []byte) string {
	t.Helper()
	f, err := c.CreateTemp(key)
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	require.NoError(t, c.Put(key, f.Name(), File{MetaExt, []byte("record")}))
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

func TestOpenRefusals(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(dir, 0o777))
	require.NoError(t, os.Chmod(dir, 0o777))
	_, err := Open(dir, Options{Name: "x"})
	require.ErrorContains(t, err, "writable by group or others")
	_, err = Open("relative", Options{Name: "x", Setting: "--cache"})
	require.EqualError(t, err, `x: cache "relative" is not an absolute path: pass an absolute --cache`)
	c := open(t, 1<<20)
	fi, err := os.Stat(c.Dir())
	require.NoError(t, err)
	require.Equal(t, fs.ModeDir|0o700, fi.Mode())
}

func TestVerify(t *testing.T) {
	c := open(t, 1<<20)
	_, err := c.Verify("k", 1, "")
	require.ErrorIs(t, err, ErrMiss)
	data := []byte("entry data")
	sum := put(t, c, "k", data)
	fi, err := os.Stat(c.Path("k", ".data"))
	require.NoError(t, err)
	require.Equal(t, fs.FileMode(0o400), fi.Mode())

	hashed, err := c.Verify("k", int64(len(data)), sum)
	require.NoError(t, err)
	require.False(t, hashed, "Put recorded the identity: nothing hashed")
	_, err = c.Verify("k", int64(len(data))+1, sum)
	require.ErrorContains(t, err, "truncated or replaced")

	// Same size, other bytes, new identity: hashed and refused.
	p := c.Path("k", ".data")
	require.NoError(t, os.Chmod(p, 0o600))
	require.NoError(t, os.WriteFile(p, []byte("entry DATA"), 0o400))
	hashed, err = c.Verify("k", int64(len(data)), sum)
	require.True(t, hashed)
	require.ErrorContains(t, err, "corrupt or replaced")
	require.NotErrorIs(t, err, ErrMiss)

	// A group-writable entry is refused before its content is read.
	require.NoError(t, os.Chmod(p, 0o620))
	_, err = c.Verify("k", int64(len(data)), sum)
	require.ErrorContains(t, err, "writable by group or others")
}

func TestEvictOldestKeepsBound(t *testing.T) {
	c := open(t, 3000)
	for i, key := range []string{"a", "b", "c"} {
		put(t, c, key, make([]byte, 1200))
		old := time.Now().Add(time.Duration(i-10) * time.Minute)
		require.NoError(t, os.Chtimes(c.Path(key, ".data"), old, old))
		require.NoError(t, os.Chtimes(c.Path(key, okExt), old, old))
	}
	// c was just put; a and b are older than Grace (0): the oldest goes.
	require.NoError(t, c.Evict("c"))
	for key, kept := range map[string]bool{"a": false, "b": true, "c": true} {
		for _, ext := range []string{".data", MetaExt, okExt} {
			_, err := os.Stat(c.Path(key, ext))
			require.Equal(t, kept, err == nil, "%s%s", key, ext)
		}
	}
	// A stale temporary file and an orphaned record are removed.
	tmp, err := c.CreateTemp("zz")
	require.NoError(t, err)
	tmp.Close()
	orphan := c.Path("gone", MetaExt)
	require.NoError(t, os.WriteFile(orphan, nil, 0o400))
	old := time.Now().Add(-2 * time.Hour)
	require.NoError(t, os.Chtimes(tmp.Name(), old, old))
	require.NoError(t, os.Chtimes(orphan, old, old))
	require.NoError(t, c.Evict(""))
	for _, p := range []string{tmp.Name(), orphan} {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, fs.ErrNotExist, p)
	}
}

func TestFileSHA256Remembered(t *testing.T) {
	c := open(t, 1<<20)
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("content"), 0o644))
	sum, hashed, err := c.FileSHA256(p)
	require.NoError(t, err)
	require.True(t, hashed)
	require.Equal(t, sha256.Sum256([]byte("content")), sum)
	again, hashed, err := c.FileSHA256(p)
	require.NoError(t, err)
	require.False(t, hashed, "the record answers for the unchanged file")
	require.Equal(t, sum, again)
	// A changed file (new ctime) is hashed again.
	require.NoError(t, os.WriteFile(p, []byte("CONTENT"), 0o644))
	sum, hashed, err = c.FileSHA256(p)
	require.NoError(t, err)
	require.True(t, hashed)
	require.Equal(t, sha256.Sum256([]byte("CONTENT")), sum)
	// Forget drops the record.
	c.Forget(p)
	_, hashed, _ = c.FileSHA256(p)
	require.True(t, hashed)
}

func TestTreeMemo(t *testing.T) {
	c := open(t, 1<<20)
	root := t.TempDir()
	p := filepath.Join(root, "f")
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	fi, err := os.Lstat(p)
	require.NoError(t, err)
	opened := 0
	openF := func() (io.ReadCloser, error) { opened++; return os.Open(p) }
	tm := c.TreeMemo(root)
	sum, err := tm.Sum("f", fi, openF)
	require.NoError(t, err)
	tm.Close()
	require.Equal(t, sha256.Sum256([]byte("x")), sum)
	tm = c.TreeMemo(root)
	again, err := tm.Sum("f", fi, func() (io.ReadCloser, error) { return nil, errors.New("opened a remembered file") })
	require.NoError(t, err)
	require.Equal(t, sum, again)
	require.Equal(t, 1, opened)
}
