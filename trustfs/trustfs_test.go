package trustfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeInfo is a FileInfo with the mode and owner a test chooses: a foreign
// owner without root's chown.
type fakeInfo struct {
	mode fs.FileMode
	sys  any
}

func (f fakeInfo) Name() string       { return "x" }
func (f fakeInfo) Size() int64        { return 0 }
func (f fakeInfo) Mode() fs.FileMode  { return f.mode }
func (f fakeInfo) ModTime() time.Time { return time.Time{} }
func (f fakeInfo) IsDir() bool        { return f.mode.IsDir() }
func (f fakeInfo) Sys() any           { return f.sys }

func owned(uid uint32) *syscall.Stat_t { return &syscall.Stat_t{Uid: uid} }

var us = uint32(os.Geteuid())

// foreign is a uid that is neither root nor ours.
var foreign = map[bool]uint32{true: 65534, false: 65533}[us != 65534]

// TestCheck: each rule refuses what it should with the facts behind it,
// and a path that breaks none is trusted.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		fi   fakeInfo
		dir  bool
		want *Error
	}{
		{"our directory", fakeInfo{fs.ModeDir | 0o755, owned(us)}, true, nil},
		{"root's file", fakeInfo{0o444, owned(0)}, false, nil},
		{"symlink", fakeInfo{fs.ModeSymlink | 0o777, owned(us)}, false, &Error{Path: "/p", Problem: Symlink}},
		{"file for a directory", fakeInfo{0o644, owned(us)}, true, &Error{Path: "/p", Problem: WrongType}},
		{"directory for a file", fakeInfo{fs.ModeDir | 0o755, owned(us)}, false, &Error{Path: "/p", Problem: WrongType, Type: fs.ModeDir}},
		{"fifo for a file", fakeInfo{fs.ModeNamedPipe | 0o644, owned(us)}, false, &Error{Path: "/p", Problem: WrongType, Type: fs.ModeNamedPipe}},
		{"no stat", fakeInfo{0o644, nil}, false, &Error{Path: "/p", Problem: NoOwner}},
		{"foreign owner", fakeInfo{0o644, owned(foreign)}, false, &Error{Path: "/p", Problem: ForeignOwner, UID: foreign, OurUID: us}},
		{"group writable", fakeInfo{0o664, owned(us)}, false, &Error{Path: "/p", Problem: OpenMode, Perm: 0o664}},
		{"other writable directory", fakeInfo{fs.ModeDir | 0o757, owned(0)}, true, &Error{Path: "/p", Problem: OpenMode, Perm: 0o757}},
		// The symlink rule comes first: a link's 0777 is not its target's.
		{"foreign symlink", fakeInfo{fs.ModeSymlink | 0o777, owned(foreign)}, false, &Error{Path: "/p", Problem: Symlink}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check("/p", tc.fi, tc.dir)
			assert.Equal(t, tc.want, got)
			// OnlyWeWrite applies the owner and mode rules alone.
			onlyWe := tc.want == nil || tc.want.Problem == WrongType
			assert.Equal(t, onlyWe, OnlyWeWrite(tc.fi), "OnlyWeWrite")
		})
	}
}

// TestCheckRealFiles: Check on Lstat of real files and directories.
func TestCheckRealFiles(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o755))
	fi, err := os.Lstat(dir)
	require.NoError(t, err)
	assert.Nil(t, Check(dir, fi, true))

	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o644))
	require.NoError(t, os.Chmod(file, 0o666))
	fi, err = os.Lstat(file)
	require.NoError(t, err)
	assert.Equal(t, &Error{Path: file, Problem: OpenMode, Perm: 0o666}, Check(file, fi, false))

	link := filepath.Join(dir, "l")
	require.NoError(t, os.Symlink(file, link))
	fi, err = os.Lstat(link)
	require.NoError(t, err)
	assert.Equal(t, Symlink, Check(link, fi, false).Problem)
}

// TestExplain: the caller's wording, with each problem's facts, kind,
// risk and fix where the Wording asks for them.
func TestExplain(t *testing.T) {
	w := Wording{Subject: "pkg: cache file /p", Kind: "file", Fix: "remove it", OwnerRisk: ", who wrote it", ModeRisk: ", who could choose", ModeFix: "chmod go-w /p"}
	for _, tc := range []struct {
		e    *Error
		w    Wording
		want string
	}{
		{&Error{Problem: Symlink}, w, "pkg: cache file /p is a symbolic link: remove it"},
		{&Error{Problem: WrongType, Type: fs.ModeDir}, w, "pkg: cache file /p is a d---------, not a file: remove it"},
		{&Error{Problem: WrongType, Type: fs.ModeDir}, Wording{Subject: "s", Fix: "f"}, "s is a d---------: f"},
		{&Error{Problem: NoOwner}, w, "pkg: cache file /p: no owner information"},
		{&Error{Problem: ForeignOwner, UID: 7, OurUID: 9}, w, "pkg: cache file /p is owned by uid 7, not root or hpcvmm's uid 9, who wrote it: remove it"},
		{&Error{Problem: OpenMode, Perm: 0o666}, w, "pkg: cache file /p has mode 0666, writable by group or others, who could choose: chmod go-w /p"},
		{&Error{Problem: OpenMode, Perm: 0o777}, Wording{Subject: "s", Fix: "f"}, "s has mode 0777, writable by group or others: f"},
	} {
		err := tc.e.Explain(tc.w)
		assert.EqualError(t, err, tc.want)
		// The refusal stays findable beneath the caller's words.
		var te *Error
		if assert.ErrorAs(t, fmt.Errorf("wrapped: %w", err), &te) {
			assert.Same(t, tc.e, te)
		}
	}
	assert.EqualError(t, &Error{Path: "/q", Problem: OpenMode, Perm: 0o620}, "/q has mode 0620, writable by group or others")
}

// TestWriteFile: the content lands whole, read-only, and no temporary
// file is left behind, on success or on failure.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "entry")
	require.NoError(t, os.WriteFile(path, []byte("old"), 0o644))
	for _, sync := range []bool{false, true} {
		require.NoError(t, WriteFile(path, ".tmp-", PrivateFile, sync, []byte("head\n"), []byte("body")))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "head\nbody", string(b))
		fi, err := os.Lstat(path)
		require.NoError(t, err)
		assert.Equal(t, PrivateFile, fi.Mode())
		assert.Nil(t, Check(path, fi, false), "a file WriteFile wrote is one Check trusts")
	}

	// Renaming over a directory fails: the error says so and the
	// temporary file goes.
	sub := filepath.Join(dir, "sub")
	require.NoError(t, os.Mkdir(sub, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(sub, "keep"), nil, 0o644))
	err := WriteFile(sub, ".tmp-", PrivateFile, true, []byte("x"))
	require.Error(t, err)
	names, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, n := range names {
		assert.False(t, strings.HasPrefix(n.Name(), ".tmp-"), "temporary file %s left behind", n.Name())
	}

	// A directory that is not there: the create step's error.
	err = WriteFile(filepath.Join(dir, "missing", "f"), ".tmp-", PrivateFile, false)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// TestMakePrivateDir: a new directory and its parents are 0700; an
// existing one of ours that others may read is made 0700 through its
// descriptor; a symbolic link is refused, not followed.
func TestMakePrivateDir(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "a", "b")
	require.NoError(t, MakePrivateDir(dir))
	for _, p := range []string{dir, filepath.Dir(dir)} {
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		assert.Equal(t, fs.ModeDir|PrivateDir, fi.Mode(), p)
	}
	require.NoError(t, os.Chmod(dir, 0o755))
	require.NoError(t, MakePrivateDir(dir))
	fi, err := os.Lstat(dir)
	require.NoError(t, err)
	assert.Equal(t, fs.ModeDir|PrivateDir, fi.Mode(), "an open directory of ours is closed")

	outside := filepath.Join(base, "outside")
	require.NoError(t, os.Mkdir(outside, 0o755))
	require.NoError(t, os.Chmod(outside, 0o755))
	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(outside, link))
	require.Error(t, MakePrivateDir(link))
	fi, err = os.Lstat(outside)
	require.NoError(t, err)
	assert.Equal(t, fs.ModeDir|0o755, fi.Mode(), "a symlink's target is never changed")
}

// TestPrivate: a file of ours others may read becomes owner-only; one
// already private is left alone.
func TestPrivate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	require.NoError(t, os.Chmod(p, 0o444))
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	fi, err := f.Stat()
	require.NoError(t, err)
	perm, err := Private(f, fi)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o400), perm)
	fi, err = os.Lstat(p)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o400), fi.Mode())
	perm, err = Private(f, fi)
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o400), perm)
}
