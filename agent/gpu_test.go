package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
)

// fakeMknod records the nodes asked for and leaves a regular file of mode
// 0 in each one's place (so the agent's chmod shows), or fails.
type fakeMknod struct {
	made []string // "path c MAJOR:MINOR mode"
	fail error
}

func (f *fakeMknod) mknod(p string, mode uint32, dev int) error {
	if f.fail != nil {
		return f.fail
	}
	if mode&unix.S_IFMT != unix.S_IFCHR {
		return fmt.Errorf("%s: mode %#o is not a character device", p, mode)
	}
	fd, err := unix.Open(p, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	unix.Close(fd)
	f.made = append(f.made, fmt.Sprintf("%s c %d:%d %#o", p, unix.Major(uint64(dev)), unix.Minor(uint64(dev)), mode&0o7777))
	return nil
}

// guestRoot is a guest's /proc as the NVIDIA driver leaves it: its majors
// (nvidia-uvm and nvidia-caps dynamic, other numbers than the fixture
// host's 238 and 241), the two MIG capability files.
func guestRoot(t *testing.T, devices string) string {
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "proc/driver/nvidia/capabilities/mig"), 0o755))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dev"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/devices"), []byte(devices), 0o444))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/driver/nvidia/capabilities/mig/config"), []byte("DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"), 0o444))
	require.NoError(t, os.WriteFile(filepath.Join(root, "proc/driver/nvidia/capabilities/mig/monitor"), []byte("DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"), 0o444))
	return root
}

const guestDevices = "Character devices:\n  1 mem\n  5 /dev/tty\n195 nvidia\n195 nvidiactl\n236 nvidia-caps\n237 nvidia-uvm\n\nBlock devices:\n  8 sd\n"

// TestGPUNodes: the nodes of two GPUs with the guest's majors, the
// driver's minors and modes (the umask's bits put back), /dev/nvidia-caps,
// a stale node replaced; a /proc/devices without a driver's major is an
// error naming it; mknod's failure names the node.
func TestGPUNodes(t *testing.T) {
	root := guestRoot(t, guestDevices)
	require.NoError(t, os.WriteFile(filepath.Join(root, "dev/nvidia0"), []byte("stale"), 0o600))
	old := unix.Umask(0o022)
	defer unix.Umask(old)
	fm := &fakeMknod{}
	require.NoError(t, GPUNodes{Root: root, Mknod: fm.mknod}.Make(2))
	var want []string
	for _, n := range []string{"/dev/nvidia0 c 195:0 0666", "/dev/nvidia1 c 195:1 0666", "/dev/nvidiactl c 195:255 0666",
		"/dev/nvidia-uvm c 237:0 0666", "/dev/nvidia-uvm-tools c 237:1 0666",
		"/dev/nvidia-caps/nvidia-cap1 c 236:1 0400", "/dev/nvidia-caps/nvidia-cap2 c 236:2 0444"} {
		want = append(want, root+n)
	}
	require.Equal(t, want, fm.made)
	for _, m := range fm.made {
		f := strings.Fields(m)
		fi, err := os.Stat(f[0])
		require.NoError(t, err)
		assert.Equal(t, f[3], fmt.Sprintf("%#o", fi.Mode().Perm()), "%s: the driver's mode, not the umask's", f[0])
	}
	fi, err := os.Stat(filepath.Join(root, "dev/nvidia-caps"))
	require.NoError(t, err)
	require.True(t, fi.IsDir())
	b, err := os.ReadFile(filepath.Join(root, "dev/nvidia0"))
	require.NoError(t, err)
	require.Empty(t, b, "the stale file was replaced")

	for devices, missing := range map[string]string{
		"Character devices:\n  1 mem\n":                     `no "nvidia" major`,
		"Character devices:\n195 nvidia\n236 nvidia-caps\n": `no "nvidia-uvm" major`,
		"Character devices:\n195 nvidia\n237 nvidia-uvm\n":  `no "nvidia-caps" major`,
		"Character devices:\nnot a line\n":                  `/proc/devices line 2`,
	} {
		fm := &fakeMknod{}
		err := GPUNodes{Root: guestRoot(t, devices), Mknod: fm.mknod}.Make(1)
		require.ErrorContains(t, err, missing)
		require.NotContains(t, err.Error(), "\n")
		require.Empty(t, fm.made, "nothing made before the majors are known")
	}
	err = GPUNodes{Root: t.TempDir(), Mknod: fm.mknod}.Make(1)
	require.ErrorContains(t, err, "reading the guest's /proc/devices")

	err = GPUNodes{Root: guestRoot(t, guestDevices), Mknod: (&fakeMknod{fail: unix.EPERM}).mknod}.Make(1)
	require.ErrorContains(t, err, "creating /dev/nvidia0 (195, 0): operation not permitted")
}

// TestServeGPUNodes: a Start with GPUs gets its nodes before COMMAND runs
// (COMMAND sees them); without the driver in the guest the job fails (125)
// with the one-line reason naming it and COMMAND never starts; an agent
// that cannot make nodes refuses such a Start.
func TestServeGPUNodes(t *testing.T) {
	root := guestRoot(t, guestDevices)
	fm := &fakeMknod{}
	s := sh("ls " + root + "/dev/nvidia-caps; test -e " + root + "/dev/nvidia-uvm && echo uvm")
	s.GPUs = 1
	h := startAgentWith(t, s, nil, func(a *Agent) { a.MakeGPUNodes = GPUNodes{Root: root, Mknod: fm.mknod}.Make })
	h.stdinW.Close()
	m, out, _ := h.finish()
	require.Equal(t, &jobproto.Exited{}, m)
	require.Equal(t, "nvidia-cap1\nnvidia-cap2\nuvm\n", out)
	require.Len(t, fm.made, 6)

	marker := filepath.Join(t.TempDir(), "ran")
	for name, setup := range map[string]func(*Agent){
		"no driver": func(a *Agent) {
			a.MakeGPUNodes = GPUNodes{Root: guestRoot(t, "Character devices:\n  1 mem\n"), Mknod: fm.mknod}.Make
		},
		"no mknodes": func(a *Agent) {},
	} {
		s := sh("touch " + marker)
		s.GPUs = 2
		h := startAgentWith(t, s, nil, setup)
		h.stdinW.Close()
		m, _, _ := h.finish()
		f, ok := m.(*jobproto.Failed)
		require.True(t, ok, "%s: %#v", name, m)
		require.Equal(t, jobproto.FailAgent, f.Kind)
		require.NotContains(t, f.Reason, "\n")
		if name == "no driver" {
			require.Equal(t, `NVIDIA GPUs: the guest's /proc/devices has no "nvidia" major: is its module loaded? (a module that failed to load is in hpcvmm's log)`, f.Reason)
		}
		require.False(t, h.started)
		_, err := os.Stat(marker)
		require.ErrorIs(t, err, fs.ErrNotExist, "%s: COMMAND never ran", name)
	}
}

// TestEnvDriverDirs: the driver's directories are appended to
// LD_LIBRARY_PATH and PATH when the spec mounts them (after the default
// PATH, after what the spec's variables hold, last value of a repeated
// one), and only then.
func TestEnvDriverDirs(t *testing.T) {
	lib := jobproto.Mount{Port: "p0", Target: jobproto.DriverLibDir, ReadOnly: true}
	bin := jobproto.Mount{Port: "p1", Target: jobproto.DriverBinDir, ReadOnly: true}
	env := Env(&jobproto.Start{Env: []string{"A=1"}, Mounts: []jobproto.Mount{lib, bin}})
	assert.Equal(t, []string{"A=1", "PATH=" + DefaultPath + ":/.hpcvmm/driver/bin", "HOME=/root", "LD_LIBRARY_PATH=/.hpcvmm/driver/lib"}, env)

	env = Env(&jobproto.Start{Env: []string{"LD_LIBRARY_PATH=/opt/a:/opt/b", "PATH=/x", "PATH=/y", "HOME=/h"}, Mounts: []jobproto.Mount{lib, bin}})
	assert.Equal(t, []string{"LD_LIBRARY_PATH=/opt/a:/opt/b:/.hpcvmm/driver/lib", "PATH=/x", "PATH=/y:/.hpcvmm/driver/bin", "HOME=/h"}, env)
	assert.Equal(t, "/y:/.hpcvmm/driver/bin", getenv(env, "PATH"))

	env = Env(&jobproto.Start{Env: []string{"LD_LIBRARY_PATH=", "HOME=/h", "PATH=/x"}, Mounts: []jobproto.Mount{lib}})
	assert.Equal(t, []string{"LD_LIBRARY_PATH=/.hpcvmm/driver/lib", "HOME=/h", "PATH=/x"}, env, "an empty list becomes the directory alone; no bin mount, PATH kept")

	env = Env(&jobproto.Start{Env: []string{"PATH=/x", "HOME=/h"}, Mounts: []jobproto.Mount{{Port: "p", Target: "/data"}}})
	assert.Equal(t, []string{"PATH=/x", "HOME=/h"}, env, "other mounts add nothing")
}

// TestDriverMountTargets: the agent takes the driver's two directories
// beneath the reserved /.hpcvmm, read-only only, and nothing else there.
func TestDriverMountTargets(t *testing.T) {
	for _, m := range []jobproto.Mount{
		{Target: jobproto.DriverLibDir, ReadOnly: true}, {Target: jobproto.DriverBinDir, ReadOnly: true},
	} {
		assert.NoError(t, validMount(m), m.Target)
	}
	for _, m := range []jobproto.Mount{
		{Target: jobproto.DriverLibDir}, {Target: jobproto.DriverBinDir},
		{Target: "/.hpcvmm/driver", ReadOnly: true}, {Target: "/.hpcvmm/driver/lib/x", ReadOnly: true}, {Target: "/.hpcvmm", ReadOnly: true},
	} {
		assert.Error(t, validMount(m), "%+v", m)
	}
}
