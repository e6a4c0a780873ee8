package preflight_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/cpuclaim"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// TestCPUMode: the mode a VM would get on the chosen node, counting the
// CPUs other VMs claim; dedicated asked for without enough free CPUs
// fails, the automatic choice warns.
func TestCPUMode(t *testing.T) {
	_, h := goodHost(t)
	req := goodRequest()
	req.CPUs = 4
	req.RunDir = t.TempDir()
	r := preflight.Run(h, req)
	x := find(t, r, "cpu-mode", "node 1")
	assert.Equal(t, preflight.Pass, x.Status)
	assert.Contains(t, x.Detail, "dedicated")

	n, err := h.Node(1)
	require.NoError(t, err)
	other, err := cpuclaim.Take(req.RunDir, n.CPUs, len(n.CPUs)-2)
	require.NoError(t, err)
	defer other.Release()
	r = preflight.Run(h, req)
	x = find(t, r, "cpu-mode", "node 1")
	assert.Equal(t, preflight.Warn, x.Status)
	assert.Contains(t, x.Detail, "2 free CPUs")
	assert.Contains(t, x.Detail, "claimed by other VMs")
	assert.Equal(t, "use --cpus 2 or wait for another VM to end for dedicated vCPUs", x.Fix)
	assert.True(t, r.OK())

	req.CPUMode = "dedicated"
	r = preflight.Run(h, req)
	x = find(t, r, "cpu-mode", "node 1")
	assert.Equal(t, preflight.Fail, x.Status)
	assert.False(t, r.OK())

	req.CPUMode = "shared"
	r = preflight.Run(h, req)
	assert.Equal(t, preflight.Pass, find(t, r, "cpu-mode", "node 1").Status)
}
