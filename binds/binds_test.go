package binds

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

func TestParse(t *testing.T) {
	got, err := Parse("/scratch/x:/data:ro,in,/a/../b:/b:rw", "/home/u")
	require.NoError(t, err)
	assert.Equal(t, []Bind{
		{Source: "/scratch/x", Target: "/data", ReadOnly: true},
		{Source: "/home/u/in", Target: "/home/u/in"},
		{Source: "/b", Target: "/b"},
	}, got)

	for spec, want := range map[string]string{
		"":               "empty",
		"true":           "--bind-devices",
		"--gpu":          "--bind-devices",
		"/a:rel":         `"rel" is relative`,
		"/a:/b:rx":       `option "rx"`,
		"/a:/b:ro:x":     "want SRC[:DST[:ro|rw]]",
		":/b":            "want SRC",
		"/a:/":           "covers /",
		"/a:/proc":       "covers /proc",
		"/a:/dev/shm":    "covers /dev",
		"/a:/sys/x":      "covers /sys",
		"/a:/.hpcvmm":    "covers /.hpcvmm",
		"/a:/x/../proc/": "covers /proc",
	} {
		_, err := Parse(spec, "/")
		assert.ErrorContains(t, err, want, "spec %q", spec)
	}
	// Beside a reserved path is fine.
	_, err = Parse("/a:/devices,/a:/procdata", "/")
	assert.NoError(t, err)
}

func TestWithDefaults(t *testing.T) {
	user := []Bind{{Source: "/scratch", Target: "/data"}}
	got := WithDefaults(user, Defaults{Cwd: "/home/u/run", Home: "/home/u"})
	assert.Equal(t, []Bind{user[0], {Source: "/home/u", Target: "/home/u", Default: "$HOME"}}, got,
		"the working directory inside $HOME is already there")

	got = WithDefaults(nil, Defaults{Cwd: "/lustre/p/run", Home: "/home/u"})
	assert.Equal(t, []string{"/home/u", "/lustre/p/run"}, targets(got))
	got = WithDefaults(nil, Defaults{Cwd: "/lustre/p/run", Home: "/home/u", NoHome: true})
	assert.Equal(t, []string{"/lustre/p/run"}, targets(got))
	got = WithDefaults(nil, Defaults{Cwd: "/lustre/p/run", Home: "/home/u", NoCwd: true})
	assert.Equal(t, []string{"/home/u"}, targets(got))
	for _, cwd := range []string{"/", "/usr/src", "/etc", "/proc/1", "/dev", "relative"} {
		got = WithDefaults(nil, Defaults{Cwd: cwd, NoHome: true})
		assert.Empty(t, got, "working directory %s is never bound by default", cwd)
	}
	// A user's bind of the same target wins over the default.
	got = WithDefaults([]Bind{{Source: "/elsewhere", Target: "/home/u"}}, Defaults{Home: "/home/u"})
	assert.Equal(t, []string{"/home/u"}, targets(got))
	assert.Equal(t, "/elsewhere", got[0].Source)
}

func targets(bs []Bind) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Target)
	}
	return out
}

func TestCheck(t *testing.T) {
	img := filepath.Join(t.TempDir(), "img")
	require.NoError(t, os.MkdirAll(filepath.Join(img, "data"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(img, "file"), nil, 0o644))
	require.NoError(t, os.Symlink("data", filepath.Join(img, "link")))
	im, err := rootfs.Open(img)
	require.NoError(t, err)
	defer im.Close()

	assert.NoError(t, Check([]Bind{{Source: "/s", Target: "/data"}, {Source: "/s", Target: "/link"}, {Source: "/s", Target: "/new/dir"}}, im))
	assert.ErrorContains(t, Check([]Bind{{Source: "/s", Target: "/file"}}, im), "the image has a file at /file")
	assert.ErrorContains(t, Check([]Bind{{Source: "/a", Target: "/d"}, {Source: "/b", Target: "/d"}}, nil), "/a:/d and /b:/d both bound at /d")
	many := make([]Bind, MaxBinds+1)
	for i := range many {
		many[i] = Bind{Source: "/s", Target: "/t" + string(rune('a'+i))}
	}
	assert.ErrorContains(t, Check(many, nil), "at most 10")
}

func TestOpen(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))

	opened, skipped, err := Open([]Bind{{Source: dir, Target: "/d"}, {Source: "/nonexistent-home", Target: "/h", Default: "$HOME"}}, nil)
	require.NoError(t, err)
	defer Close(opened)
	require.Len(t, opened, 1)
	assert.Len(t, skipped, 1, "a default whose directory is missing is left out")
	st, err := opened[0].Root.Stat()
	require.NoError(t, err)
	assert.True(t, st.IsDir())

	_, _, err = Open([]Bind{{Source: filepath.Join(dir, "missing"), Target: "/d"}}, nil)
	assert.ErrorContains(t, err, "no such directory on the host")
	_, _, err = Open([]Bind{{Source: file, Target: "/d"}}, nil)
	assert.ErrorContains(t, err, "not a directory")

	if os.Geteuid() == 0 {
		// As a user who cannot reach it (t.TempDir's parent is 0700).
		_, _, err = Open([]Bind{{Source: dir, Target: "/d"}}, &asuser.User{UID: 65534, GID: 65534})
		assert.ErrorContains(t, err, "permission denied for uid 65534")
	}
}

func TestMountsParentsFirst(t *testing.T) {
	opened := []Opened{{Bind: Bind{Target: "/home/u/run"}}, {Bind: Bind{Target: "/home/u", ReadOnly: true}}}
	ms := Mounts(opened, 1<<19, "none")
	require.Len(t, ms, 2)
	assert.Equal(t, "/home/u", ms[0].Target)
	assert.Equal(t, PortName(1), ms[0].Port)
	assert.True(t, ms[0].ReadOnly)
	assert.Equal(t, PortName(0), ms[1].Port)
}
