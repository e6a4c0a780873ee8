package ninep

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hugelgupf/p9/linux"
	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The fixture's outside tree shows a read: reading it on the host changes
// the snapshot, so checkOutside can fail.
func TestFixtureSeesAnOutsideRead(t *testing.T) {
	fx := newFixture(t)
	_, err := os.ReadFile(filepath.Join(fx.outside, "secret"))
	require.NoError(t, err)
	assert.NotEqual(t, fx.before, snapshot(t, fx.outside), "a read outside does not show in the snapshot")
}

// Links the host has in the export, absolute, relative and to a
// directory, lead nowhere: walking through them fails, opening them
// fails, and their text is all the guest gets.
func TestSymlinksOutAreNotFollowed(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	for _, name := range []string{"abs", "rel", "updir"} {
		f, err := walk(root, name)
		require.NoError(t, err, "walking to the link itself")
		qid, _, attr, err := f.GetAttr(p9.AttrMaskAll)
		require.NoError(t, err)
		assert.Equal(t, p9.TypeSymlink, qid.Type, name)
		assert.True(t, attr.Mode.IsSymlink(), name)
		text, err := f.Readlink()
		require.NoError(t, err)
		assert.Contains(t, text, "outside", name)
		_, err = readAll(f)
		assert.Error(t, err, "open of link %s", name)
		f.Close()
	}
	for _, path := range []string{"updir/secret", "updir/dir/secret2", "abs/x", "updir/dir"} {
		_, err := walk(root, path)
		assert.Error(t, err, "walk %s", path)
	}
	fx.checkOutside(t)
}

// A link the guest makes (ln -s / /data/escape; cat /data/escape/etc/shadow)
// is a link on the host like any other: never followed.
func TestGuestSymlinkEscape(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	for name, target := range map[string]string{"escape": "/", "back": "..", "out": fx.outside, "deep": "../../../../../.."} {
		_, err := root.Symlink(target, name, p9.NoUID, p9.NoGID)
		require.NoError(t, err)
		_, err = walk(root, name+"/etc/shadow")
		assert.Error(t, err, "walk through %s -> %s", name, target)
		_, err = walk(root, name+"/secret")
		assert.Error(t, err)
		f, err := walk(root, name)
		require.NoError(t, err)
		_, err = readAll(f)
		assert.Error(t, err, "open of %s", name)
		f.Close()
	}
	got, err := os.Readlink(filepath.Join(fx.export, "escape"))
	require.NoError(t, err)
	assert.Equal(t, "/", got, "the link on the host has the guest's text")
	fx.checkOutside(t)
}

// ".." is never resolved on the host: at the root and below it is refused
// (the guest's kernel resolves ".." itself), as are names with "/".
func TestDotDotAndSlashNames(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	for _, names := range [][]string{{".."}, {"sub", ".."}, {"sub", "..", ".."}, {"."}, {"../outside"}, {"sub/../../outside"}, {""}} {
		_, _, err := root.Walk(names)
		assert.Error(t, err, "walk %q", names)
	}
	for _, name := range []string{"..", "../x", "a/b", ".", ""} {
		_, err := root.Mkdir(name, 0o755, p9.NoUID, p9.NoGID)
		assert.Error(t, err, "mkdir %q", name)
		_, _, _, err = root.Create(name, p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID)
		assert.Error(t, err, "create %q", name)
	}
	// The attacher itself refuses them too, whatever the library does.
	a, err := newAttacher(fx.root, false, Options{})
	require.NoError(t, err)
	defer a.close()
	rf, err := a.Attach()
	require.NoError(t, err)
	defer rf.Close()
	for _, n := range []string{"..", ".", "", "a/b", "x\x00y"} {
		_, _, err := rf.Walk([]string{n})
		assert.Error(t, err, "attacher walk %q", n)
	}
	assert.NoDirExists(t, filepath.Join(fx.dir, "x"))
	fx.checkOutside(t)
}

// A hard link can only name files the guest walked to in the export; a
// file "walked via a symlink" cannot be reached, and linking the link
// itself makes another link, not a link to what it points at.
func TestHardLinks(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	file, err := walk(root, "file")
	require.NoError(t, err)
	require.NoError(t, root.Link(file, "file2"), "a link within the export")
	b, err := os.ReadFile(filepath.Join(fx.export, "file2"))
	require.NoError(t, err)
	assert.Equal(t, "inside", string(b))

	_, err = walk(root, "updir/secret")
	assert.Error(t, err, "no fid reaches the outside file to link it")

	abs, err := walk(root, "abs")
	require.NoError(t, err)
	require.NoError(t, root.Link(abs, "abs2"))
	fi, err := os.Lstat(filepath.Join(fx.export, "abs2"))
	require.NoError(t, err)
	assert.Equal(t, os.ModeSymlink, fi.Mode()&os.ModeType, "the link names the symlink, not its target")

	sub, err := walk(root, "sub")
	require.NoError(t, err)
	assert.Error(t, root.Link(sub, "sub2"), "hard link to a directory")
	assert.Error(t, root.Link(file, "../escape"))
	fx.checkOutside(t)
}

// Renames stay within the export: names are one component, and a link
// to a directory outside is not a directory to rename into.
func TestRenameAcrossTheBoundary(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	updir, err := walk(root, "updir")
	require.NoError(t, err)
	assert.Error(t, root.RenameAt("file", updir, "stolen"), "rename into a link to outside")
	assert.Error(t, root.RenameAt("file", root, "../stolen"))
	assert.Error(t, root.RenameAt("../outside/secret", root, "got"))
	sub, err := walk(root, "sub")
	require.NoError(t, err)
	require.NoError(t, root.RenameAt("file", sub, "moved"), "a rename within the export")
	assert.FileExists(t, filepath.Join(fx.export, "sub", "moved"))
	assert.NoFileExists(t, filepath.Join(fx.dir, "stolen"))
	fx.checkOutside(t)
}

// mknod is always refused; nodes the host put in the export that are not
// files or directories (FIFO, socket, device) are shown but never opened.
func TestSpecialNodesAreNeverOpened(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	_, err := root.Mknod("fifo", p9.ModeNamedPipe|0o644, 0, 0, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.EPERM)
	_, err = root.Mknod("null", p9.ModeCharacterDevice|0o666, 1, 3, p9.NoUID, p9.NoGID)
	assert.ErrorIs(t, err, linux.EPERM)
	assert.NoFileExists(t, filepath.Join(fx.export, "fifo"))

	require.NoError(t, unix.Mkfifo(filepath.Join(fx.export, "hostfifo"), 0o666))
	l, err := net.Listen("unix", filepath.Join(fx.export, "hostsock"))
	require.NoError(t, err)
	defer l.Close()
	nodes := []string{"hostfifo", "hostsock"}
	if err := unix.Mknod(filepath.Join(fx.export, "hostnull"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err == nil {
		nodes = append(nodes, "hostnull")
	} else {
		t.Logf("no device node made here (%v): FIFO and socket only", err)
	}
	for _, name := range nodes {
		f, err := walk(root, name)
		require.NoError(t, err, "walk to %s", name)
		done := make(chan error, 1)
		go func() {
			_, _, err := f.Open(p9.ReadOnly)
			done <- err
		}()
		select {
		case err := <-done:
			// The library refuses a socket itself (EINVAL); the
			// others reach the attacher, which refuses them.
			assert.Error(t, err, "open of %s", name)
		case <-time.After(5 * time.Second):
			t.Fatalf("open of %s blocked the server", name)
		}
		f.Close()
	}
	assert.Contains(t, strings.Join(fx.refusals(), "\n"), "open of a FIFO")
	assert.Contains(t, strings.Join(fx.refusals(), "\n"), "mknod")
}

// A read-only bind refuses every request that changes anything with
// EROFS, and the export is unchanged.
func TestReadOnlyRefusesEveryChange(t *testing.T) {
	fx := newFixture(t)
	before := snapshot(t, fx.export)
	_, root := fx.serve(t, true, Options{}, 64<<10)
	file, err := walk(root, "file")
	require.NoError(t, err)
	sub, err := walk(root, "sub")
	require.NoError(t, err)
	ops := map[string]func() error{
		"create": func() error { _, _, _, err := root.Create("new", p9.ReadWrite, 0o644, p9.NoUID, p9.NoGID); return err },
		"mkdir":  func() error { _, err := root.Mkdir("d", 0o755, p9.NoUID, p9.NoGID); return err },
		"symlink": func() error {
			_, err := root.Symlink("file", "s", p9.NoUID, p9.NoGID)
			return err
		},
		"link":     func() error { return root.Link(file, "l") },
		"rename":   func() error { return root.RenameAt("file", sub, "f") },
		"unlink":   func() error { return root.UnlinkAt("file", 0) },
		"rmdir":    func() error { return root.UnlinkAt("sub", unix.AT_REMOVEDIR) },
		"mknod":    func() error { _, err := root.Mknod("n", p9.ModeNamedPipe|0o644, 0, 0, p9.NoUID, p9.NoGID); return err },
		"chmod":    func() error { return file.SetAttr(p9.SetAttrMask{Permissions: true}, p9.SetAttr{Permissions: 0o777}) },
		"truncate": func() error { return file.SetAttr(p9.SetAttrMask{Size: true}, p9.SetAttr{Size: 0}) },
		"utimes":   func() error { return file.SetAttr(p9.SetAttrMask{MTime: true}, p9.SetAttr{}) },
		"open-write": func() error {
			_, f, _ := file.Walk(nil)
			defer f.Close()
			_, _, err := f.Open(p9.WriteOnly)
			return err
		},
		"open-rdwr": func() error {
			_, f, _ := file.Walk(nil)
			defer f.Close()
			_, _, err := f.Open(p9.ReadWrite)
			return err
		},
		"open-trunc": func() error {
			_, f, _ := file.Walk(nil)
			defer f.Close()
			_, _, err := f.Open(p9.ReadOnly | dotlTrunc)
			return err
		},
	}
	for name, op := range ops {
		assert.ErrorIs(t, op(), linux.EROFS, name)
	}
	// The library answers xattr creation itself; it fails either way.
	assert.Error(t, file.SetXattr("user.x", []byte("y"), 0), "setxattr")
	assert.Equal(t, before, snapshot(t, fx.export), "the read-only export changed")
	assert.GreaterOrEqual(t, len(fx.refusals()), len(ops))
	got, err := readAll(file)
	require.NoError(t, err, "reading stays allowed")
	assert.Equal(t, "inside", got)
}

// The fid bound: a connection cannot hold more files than MaxFids.
func TestFidBound(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{MaxFids: 16}, 64<<10)
	var held []p9.File
	var err error
	for range 32 {
		var f p9.File
		if _, f, err = root.Walk([]string{"file"}); err != nil {
			break
		}
		held = append(held, f)
	}
	require.ErrorIs(t, err, linux.EMFILE)
	assert.Less(t, len(held), 16)
	for _, f := range held {
		f.Close()
	}
	_, f, err := root.Walk([]string{"file"})
	require.NoError(t, err, "files closed are given back")
	f.Close()
	assert.Contains(t, fx.refusals(), "more files than the fid bound")
}

// A host-side rename swaps a directory of the export for a link to the
// outside (RENAME_EXCHANGE) in a loop while the guest walks and reads
// through it: the guest reads the inside file or gets an error, never the
// secret, and nothing outside is read or changed.
func TestRenameRace(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	d := filepath.Join(fx.export, "d")
	require.NoError(t, os.Mkdir(d, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(d, "secret"), []byte("inside"), 0o644))
	require.NoError(t, os.Symlink(fx.outside, filepath.Join(fx.export, "l")))

	stop := make(chan struct{})
	var swaps atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if err := unix.Renameat2(unix.AT_FDCWD, d, unix.AT_FDCWD, filepath.Join(fx.export, "l"), unix.RENAME_EXCHANGE); err != nil {
				t.Errorf("exchange: %v", err)
				return
			}
			swaps.Add(1)
		}
	}()
	var inside, failed int
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; i < 20000 && time.Now().Before(deadline); i++ {
		name := []string{"d", "l"}[i%2]
		f, err := walk(root, name+"/secret")
		if err != nil {
			failed++
			continue
		}
		got, err := readAll(f)
		f.Close()
		if err != nil {
			failed++
			continue
		}
		require.NotContains(t, got, "TOPSECRET", "read the outside file through a swapped link")
		require.Equal(t, "inside", got)
		inside++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d swaps; %d reads of the inside file, %d refused or failed", swaps.Load(), inside, failed)
	require.Positive(t, inside, "no walk got through: the race proves nothing")
	require.Positive(t, failed, "no walk met the link: the race proves nothing")
	fx.checkOutside(t)
}

// A file the guest holds open stays the inode it walked to: a host rename
// that puts another file (a link to outside) under its name makes Open
// fail rather than open something else.
func TestOpenChecksTheWalkedInode(t *testing.T) {
	fx := newFixture(t)
	_, root := fx.serve(t, false, Options{}, 64<<10)
	f, err := walk(root, "file")
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(fx.export, "file"), filepath.Join(fx.export, "file.old")))
	require.NoError(t, os.WriteFile(filepath.Join(fx.export, "file"), []byte("other"), 0o644))
	_, _, err = f.Open(p9.ReadOnly)
	assert.ErrorIs(t, err, linux.ESTALE)
	require.NoError(t, os.Remove(filepath.Join(fx.export, "file")))
	require.NoError(t, os.Symlink(filepath.Join(fx.outside, "secret"), filepath.Join(fx.export, "file")))
	_, f2, err := f.Walk(nil)
	require.NoError(t, err)
	_, _, err = f2.Open(p9.ReadOnly)
	assert.Error(t, err)
	assert.False(t, errors.Is(err, nil))
	fx.checkOutside(t)
}
