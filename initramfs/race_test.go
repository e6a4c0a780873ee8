package initramfs

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/stretchr/testify/require"
	"github.com/u-root/u-root/pkg/cpio"
)

// swapper is the attacker of issue 30 item 3: the owner of a directory
// IMAGE who watches two of its files with inotify and, when the walk opens
// the first (read before a/b), exchanges the directory a/b with a symlink
// to a directory outside IMAGE (renameat2 RENAME_EXCHANGE), and when it
// opens the second (read after a/b), exchanges them back. The key walk and
// the fill walk then see the same tree, one whose a/b holds the outside
// directory's files.
type swapper struct {
	f             *os.File // the inotify descriptor, through Go's poller so Close ends a Read
	a             string
	before, after int
	wg            sync.WaitGroup
}

func startSwapper(t *testing.T, a string) *swapper {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	require.NoError(t, err)
	s := &swapper{f: os.NewFile(uintptr(fd), "inotify"), a: a}
	s.before, err = unix.InotifyAddWatch(fd, filepath.Join(a, "aa"), unix.IN_OPEN)
	require.NoError(t, err)
	s.after, err = unix.InotifyAddWatch(fd, filepath.Join(a, "zz"), unix.IN_OPEN)
	require.NoError(t, err)
	s.wg.Add(1)
	go s.run()
	return s
}

func (s *swapper) run() {
	defer s.wg.Done()
	buf := make([]byte, 4096)
	swapped := false
	for {
		n, err := s.f.Read(buf)
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			wd := int(int32(uint32(buf[off]) | uint32(buf[off+1])<<8 | uint32(buf[off+2])<<16 | uint32(buf[off+3])<<24))
			nameLen := int(uint32(buf[off+12]) | uint32(buf[off+13])<<8 | uint32(buf[off+14])<<16 | uint32(buf[off+15])<<24)
			off += unix.SizeofInotifyEvent + nameLen
			if (wd == s.before && !swapped) || (wd == s.after && swapped) {
				if unix.Renameat2(unix.AT_FDCWD, filepath.Join(s.a, "b"), unix.AT_FDCWD, filepath.Join(s.a, "link"), unix.RENAME_EXCHANGE) == nil {
					swapped = !swapped
				}
			}
		}
	}
}

func (s *swapper) stop() {
	s.f.Close() // ends the reader's Read
	s.wg.Wait()
}

// Issue 30 item 3: the directory IMAGE walk was by path (filepath.WalkDir,
// O_NOFOLLOW on the last component only), so a/b swapped for a symlink
// during both the key walk and the fill walk put a host file from outside
// IMAGE into the archive (the reproducer won 4 of 4 runs as root).
// Before the fix the secret was in the archive within a few tries; now the
// walk holds each directory open and resolves every entry relative to it
// without following a symlink, so over many tries the secret never
// appears: a launch builds the tree with a/b as the directory or as the
// symlink (a link, not followed), or fails ("changed while hpcvmm read
// it").
func TestDirectoryWalkFollowsNoSwappedSymlink(t *testing.T) {
	const secret = "HOST SECRET 5f1c2a"
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(outside, "f"), []byte(secret), 0o600))
	root := t.TempDir()
	a := filepath.Join(root, "a")
	require.NoError(t, os.MkdirAll(filepath.Join(a, "b"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(a, "b", "f"), []byte("public"), 0o644))
	require.NoError(t, os.Symlink(outside, filepath.Join(a, "link")))
	// Big enough that the walk is still reading it when the swap lands.
	pad := bytes.Repeat([]byte("x"), 4<<20)
	require.NoError(t, os.WriteFile(filepath.Join(a, "aa"), pad, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(a, "zz"), pad, 0o644))

	s := startSwapper(t, a)
	defer s.stop()
	agent := writeAgent(t, false)
	built, refused, swapped := 0, 0, 0
	for try := range 40 {
		im, err := rootfs.Open(root)
		require.NoError(t, err)
		cache := filepath.Join(t.TempDir(), "cache")
		res, err := Build(Config{Image: im, Agent: agent, Release: "6.1.0-test", Modules: []string{}, HostModules: t.TempDir(), CacheDir: cache})
		if err != nil {
			require.True(t, strings.Contains(err.Error(), "changed while"), "try %d: %v", try, err)
			refused++
			continue
		}
		built++
		b, err := os.ReadFile(res.Path)
		require.NoError(t, err)
		require.False(t, bytes.Contains(b, []byte(secret)), "try %d: the archive holds a file from outside IMAGE", try)
		if recs, _ := readArchive(t, res.Path); slices.ContainsFunc(recs, func(r cpio.Record) bool {
			return r.Name == "a/b" && r.Mode&cpio.S_IFMT == cpio.S_IFLNK
		}) {
			swapped++ // the swap landed during the walks: a/b is kept as the link it was
		}
	}
	t.Logf("%d built (%d with a/b swapped for the symlink), %d refused as changed", built, swapped, refused)
}
