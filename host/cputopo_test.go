package host_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

func TestCPUTopologiesFromSysfs(t *testing.T) {
	tr := hosttest.New(t)
	// 2 packages x 2 cores x 2 threads, siblings n and n+4; one L3 per package.
	for n := 0; n < 8; n++ {
		pkg, core := (n%4)/2, n%2
		llc := "0-1,4-5"
		if pkg == 1 {
			llc = "2-3,6-7"
		}
		tr.CPU(n, pkg, core, llc)
	}
	got, err := tr.Host().CPUTopologies([]int{0, 4, 2, 7})
	require.NoError(t, err)
	assert.Equal(t, []host.CPUTopology{
		{CPU: 0, Package: 0, Core: 0, LLC: 0},
		{CPU: 4, Package: 0, Core: 0, LLC: 0},
		{CPU: 2, Package: 1, Core: 0, LLC: 2},
		{CPU: 7, Package: 1, Core: 1, LLC: 2},
	}, got)
	_, err = tr.Host().CPUTopologies([]int{9})
	assert.ErrorContains(t, err, "CPU 9 topology")
}

func TestCPUTopologiesFromCapture(t *testing.T) {
	h := fixtureHost(t)
	got, err := h.CPUTopologies([]int{0, 1, 15})
	require.NoError(t, err)
	// lscpu.txt: 1 socket, 16 cores, 1 thread per core, 1 L3 instance.
	assert.Equal(t, []host.CPUTopology{
		{CPU: 0, Package: 0, Core: 0, LLC: 0},
		{CPU: 1, Package: 0, Core: 1, LLC: 0},
		{CPU: 15, Package: 0, Core: 15, LLC: 0},
	}, got)
	_, err = h.CPUTopologies([]int{16})
	assert.ErrorContains(t, err, "not among the 16 CPUs")
}
