package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/hugelgupf/p9/p9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/ninep"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// TestFileServerDispatch: hpcvmm's binary started as hpcvmm-9p (as hpcvmm
// run starts the binds' file server) serves 9P: a client negotiates the
// version, attaches and reads a file of the export. Without the dispatch
// in main the child runs as the CLI and the guest's mount fails (the binds
// bench found it: EFAULT from the kernel's 9P client).
func TestFileServerDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds hpcvmm's binary")
	}
	bin := filepath.Join(t.TempDir(), "hpcvmm")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("hello"), 0o644))
	root, err := os.Open(dir)
	require.NoError(t, err)
	defer root.Close()
	p, err := ninep.Spawn(bin, []ninep.Export{{Root: root}}, ninep.SpawnOptions{MaxMessageSize: jobrun.DefaultBindMSize, Seccomp: true})
	require.NoError(t, err)
	defer p.Close()
	c, err := p9.NewClient(struct {
		io.Reader
		io.WriteCloser
	}{p.Conns[0].Replies, p.Conns[0].Requests}, p9.WithMessageSize(jobrun.DefaultBindMSize))
	require.NoError(t, err, "version")
	a, err := c.Attach("")
	require.NoError(t, err)
	_, f, err := a.Walk([]string{"f"})
	require.NoError(t, err)
	_, _, err = f.Open(p9.ReadOnly)
	require.NoError(t, err)
	b := make([]byte, 16)
	n, err := f.ReadAt(b, 0)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(b[:n]))
}

// TestAgentDispatch: hpcvmm's binary, built static as it ships, passes
// jobrun.CheckAgent: main dispatches on argv[0] hpcvmm-agent through
// jobrun.Dispatch, which answers the probe.
func TestAgentDispatch(t *testing.T) {
	if testing.Short() {
		t.Skip("builds hpcvmm's binary")
	}
	bin := filepath.Join(t.TempDir(), "hpcvmm")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for range 3 {
		start := time.Now()
		require.NoError(t, jobrun.CheckAgent(bin, nil))
		t.Logf("jobrun.CheckAgent of hpcvmm's binary: %v", time.Since(start))
	}
}
