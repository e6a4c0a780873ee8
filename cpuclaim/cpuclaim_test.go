package cpuclaim

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTwoPlacementsTakeDifferentCPUs is two VMs placed one after the other
// in one process: the second skips the first's CPUs, and a third finds
// none free until the first releases.
func TestTwoPlacementsTakeDifferentCPUs(t *testing.T) {
	run := t.TempDir()
	node := []int{0, 1, 2, 3}
	a, err := Take(run, node, 2)
	require.NoError(t, err)
	b, err := Take(run, node, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, a.CPUs())
	assert.Equal(t, []int{2, 3}, b.CPUs())
	c, err := Take(run, node, 2)
	require.NoError(t, err)
	assert.Empty(t, c.CPUs(), "every CPU of the node is claimed")
	held, err := Held(run, node)
	require.NoError(t, err)
	assert.Equal(t, node, held)

	a.Release()
	a.Release() // twice is harmless
	c, err = Take(run, node, 4)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, c.CPUs(), "only the released CPUs are free")
	c.Release()
	b.Release()
	held, err = Held(run, node)
	require.NoError(t, err)
	assert.Empty(t, held)
}

func TestTakeSkipsDuplicatesAndNegative(t *testing.T) {
	c, err := Take(t.TempDir(), []int{-1, 5, 5, 6}, 3)
	require.NoError(t, err)
	defer c.Release()
	assert.Equal(t, []int{5, 6}, c.CPUs())
}

func TestHeldWithoutDirectory(t *testing.T) {
	held, err := Held(filepath.Join(t.TempDir(), "none"), []int{0, 1})
	require.NoError(t, err)
	assert.Empty(t, held)
}

// TestUnsafeDirectoryRefused: a lock directory others can write would let
// any user keep VMs off CPUs; a symlinked lock file is not followed.
func TestUnsafeDirectoryRefused(t *testing.T) {
	run := t.TempDir()
	require.NoError(t, os.MkdirAll(Dir(run), 0o755))
	require.NoError(t, os.Chmod(Dir(run), 0o777))
	_, err := Take(run, []int{0}, 1)
	require.ErrorContains(t, err, "writable by group or others")

	run = t.TempDir()
	require.NoError(t, os.MkdirAll(Dir(run), 0o755))
	require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(Dir(run), "0.lock")))
	_, err = Take(run, []int{0}, 1)
	require.Error(t, err)
}

// TestKilledHolderReleases claims CPUs in a child process, kills it with
// SIGKILL, and finds the CPUs free: the kernel drops the flocks with the
// process.
func TestKilledHolderReleases(t *testing.T) {
	if os.Getenv("CPUCLAIM_CHILD") != "" {
		c, err := Take(os.Getenv("CPUCLAIM_CHILD"), []int{0, 1, 2}, 2)
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("claimed", c.CPUs())
		select {} // until killed
	}
	run := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestKilledHolderReleases$")
	cmd.Env = append(os.Environ(), "CPUCLAIM_CHILD="+run)
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "claimed [0 1]", strings.TrimSpace(line))

	held, err := Held(run, []int{0, 1, 2})
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, held, "the child's claims")
	mine, err := Take(run, []int{0, 1, 2}, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{2}, mine.CPUs(), "only the CPU the child left")
	mine.Release()

	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	held, err = Held(run, []int{0, 1, 2})
	require.NoError(t, err)
	assert.Empty(t, held, "a killed VM's CPUs are free")
	mine, err = Take(run, []int{0, 1, 2}, 2)
	require.NoError(t, err)
	assert.Equal(t, []int{0, 1}, mine.CPUs())
	mine.Release()
}
