package agent

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// fakeKernel9P plays the guest kernel's 9P client for mountBind: it takes
// the descriptor named in the mount options (as the kernel takes its own
// reference), and the test talks through it.
type fakeKernel9P struct {
	mu      sync.Mutex
	conns   map[string]*os.File // target -> the kernel's end
	mounts  []string            // "target flags data"
	unmount []string
	fail    error
}

func (k *fakeKernel9P) mount(source, target, fstype string, flags uintptr, data string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.fail != nil {
		return k.fail
	}
	var rfd, wfd int
	for _, o := range strings.Split(data, ",") {
		fmt.Sscanf(o, "rfdno=%d", &rfd)
		fmt.Sscanf(o, "wfdno=%d", &wfd)
	}
	if rfd != wfd || rfd <= 2 {
		return fmt.Errorf("rfdno %d wfdno %d", rfd, wfd)
	}
	fd, err := unix.Dup(rfd)
	if err != nil {
		return err
	}
	k.conns[target] = os.NewFile(uintptr(fd), "kernel-9p")
	k.mounts = append(k.mounts, fmt.Sprintf("%s %s %#x %s", target, fstype, flags, data))
	return nil
}

func (k *fakeKernel9P) unmountAt(target string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.unmount = append(k.unmount, target)
	return nil
}

// TestServeMountsBinds: each Mount's port is relayed both ways to the
// descriptor the 9P client is given, the mounts are made before COMMAND
// starts (it sees the relayed bytes' effect), read-only ones with
// MS_RDONLY, and they are unmounted, innermost first, before the status.
func TestServeMountsBinds(t *testing.T) {
	k := &fakeKernel9P{conns: map[string]*os.File{}}
	hostEnds := map[string]*os.File{}
	s := sh("echo ran")
	s.Mounts = []jobproto.Mount{
		{Port: "org.hpcvmm.9p.0", Target: "/home/u", MSize: 8192, Cache: "none"},
		{Port: "org.hpcvmm.9p.1", Target: "/home/u/ro", ReadOnly: true},
	}
	h := startAgentWith(t, s, nil, func(a *Agent) {
		a.Mount, a.Unmount = k.mount, k.unmountAt
		a.OpenPort = func(name string) (*os.File, error) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
			if err != nil {
				return nil, err
			}
			hostEnds[name] = os.NewFile(uintptr(fds[1]), "host-"+name)
			return os.NewFile(uintptr(fds[0]), name), nil
		}
	})
	h.stdinW.Close()
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	assert.Equal(t, "ran\n", out)
	require.Len(t, k.mounts, 2)
	assert.Regexp(t, `^/home/u 9p 0x6 trans=fd,rfdno=\d+,wfdno=\d+,version=9p2000.L,msize=8192,cache=none$`, k.mounts[0])
	assert.Regexp(t, `^/home/u/ro 9p 0x7 trans=fd,rfdno=\d+,wfdno=\d+,version=9p2000.L,msize=524288$`, k.mounts[1])
	assert.Equal(t, []string{"/home/u/ro", "/home/u"}, k.unmount, "innermost first, before the status")

	// Both directions of each connection are relayed: a 1 MiB request
	// from the kernel reaches the host, a reply comes back.
	for target, port := range map[string]string{"/home/u": "org.hpcvmm.9p.0", "/home/u/ro": "org.hpcvmm.9p.1"} {
		kern, host := k.conns[target], hostEnds[port]
		req := make([]byte, 1<<20)
		for i := range req {
			req[i] = byte(i * 7)
		}
		go func() { _, _ = kern.Write(req) }()
		got := make([]byte, len(req))
		_, err := io.ReadFull(host, got)
		require.NoError(t, err)
		assert.Equal(t, req, got, "%s: kernel to host", target)
		_, err = host.Write([]byte("reply"))
		require.NoError(t, err)
		rep := make([]byte, 5)
		_, err = io.ReadFull(kern, rep)
		require.NoError(t, err)
		assert.Equal(t, "reply", string(rep), "%s: host to kernel", target)
	}
}

func TestServeMountFailures(t *testing.T) {
	for name, c := range map[string]struct {
		mount jobproto.Mount
		fail  error
		noFn  bool
		want  string
	}{
		"relative":   {mount: jobproto.Mount{Port: "p", Target: "data"}, want: "not an absolute clean path"},
		"unclean":    {mount: jobproto.Mount{Port: "p", Target: "/a/../proc"}, want: "not an absolute clean path"},
		"reserved":   {mount: jobproto.Mount{Port: "p", Target: "/proc/x"}, want: "covers /proc"},
		"cache":      {mount: jobproto.Mount{Port: "p", Target: "/d", Cache: "none,trans=tcp"}, want: "cache mode"},
		"mount":      {mount: jobproto.Mount{Port: "p", Target: "/d"}, fail: unix.EINVAL, want: "binding the host directory at /d: invalid argument"},
		"no mounter": {mount: jobproto.Mount{Port: "p", Target: "/d"}, noFn: true, want: "cannot mount"},
	} {
		t.Run(name, func(t *testing.T) {
			k := &fakeKernel9P{conns: map[string]*os.File{}, fail: c.fail}
			s := sh("echo never")
			s.Mounts = []jobproto.Mount{c.mount}
			h := startAgentWith(t, s, nil, func(a *Agent) {
				if c.noFn {
					return
				}
				a.Mount, a.Unmount = k.mount, k.unmountAt
				a.OpenPort = func(string) (*os.File, error) { r, _, err := os.Pipe(); return r, err }
			})
			h.stdinW.Close()
			m, out, _ := h.finish()
			f, ok := m.(*jobproto.Failed)
			require.True(t, ok, "%#v", m)
			assert.Equal(t, jobproto.FailAgent, f.Kind)
			assert.Contains(t, f.Reason, c.want)
			assert.Empty(t, out, "COMMAND never ran")
		})
	}
}

func TestEnsureUser(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nimg:x:1000:1000::/home/img:/bin/sh"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\n"), 0o644))
	s := &jobproto.Start{SetUser: true, UID: 5001, GID: 5001, UserName: "alice", GroupName: "alice", Home: "/home/alice"}
	require.NoError(t, ensureUser(root, s))
	require.NoError(t, ensureUser(root, s), "a second time adds nothing")
	pw, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	gr, _ := os.ReadFile(filepath.Join(root, "etc/group"))
	assert.Equal(t, "root:x:0:0:root:/root:/bin/sh\nimg:x:1000:1000::/home/img:/bin/sh\nalice:x:5001:5001::/home/alice:/bin/sh\n", string(pw))
	assert.Equal(t, "root:x:0:\nalice:x:5001:\n", string(gr))

	// The image's own entry for the uid stays; a name with a separator is
	// never written; an image without /etc/passwd gets one.
	require.NoError(t, ensureUser(root, &jobproto.Start{SetUser: true, UID: 1000, GID: 1000, UserName: "bob"}))
	require.NoError(t, ensureUser(root, &jobproto.Start{SetUser: true, UID: 7, GID: 7, UserName: "x:0:0::/:/bin/sh\nroot2"}))
	pw2, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	assert.Equal(t, string(pw), string(pw2))
	empty := t.TempDir()
	require.NoError(t, ensureUser(empty, s))
	pw3, _ := os.ReadFile(filepath.Join(empty, "etc/passwd"))
	assert.Equal(t, "alice:x:5001:5001::/home/alice:/bin/sh\n", string(pw3))
}

func TestCommandGroups(t *testing.T) {
	c := Command(&jobproto.Start{Argv: []string{"id"}, SetUser: true, UID: 5, GID: 6, Groups: []uint32{27, 100}}, "/bin/id", nil)
	assert.Equal(t, []uint32{27, 100}, c.SysProcAttr.Credential.Groups)
	c = Command(&jobproto.Start{Argv: []string{"id"}, SetUser: true, UID: 5, GID: 6}, "/bin/id", nil)
	assert.NotNil(t, c.SysProcAttr.Credential.Groups, "never nil: root's groups must not stay")
	assert.Empty(t, c.SysProcAttr.Credential.Groups)
	env := Env(&jobproto.Start{SetUser: true, UID: 5, Home: "/home/u"})
	assert.Contains(t, env, "HOME=/home/u")
}
