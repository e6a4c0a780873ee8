package vmm

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func cpuSetOf(cpus ...int) func() (unix.CPUSet, error) {
	return func() (unix.CPUSet, error) {
		var s unix.CPUSet
		for _, c := range cpus {
			s.Set(c)
		}
		return s, nil
	}
}

func TestPrefaultPlan(t *testing.T) {
	p := placement{node: 1, nodeCPUs: []int{8, 9, 10, 11, 12, 13, 14, 15}}

	cpus, n, err := prefaultPlan(p, 0, cpuSetOf(0, 1, 8, 9, 10, 11, 12, 13, 14, 15))
	require.NoError(t, err)
	assert.Equal(t, []int{8, 9, 10, 11, 12, 13, 14, 15}, cpus, "default: every CPU of the node")
	assert.Equal(t, 8, n)

	cpus, n, err = prefaultPlan(p, 3, cpuSetOf(8, 9, 10, 11, 12, 13, 14, 15))
	require.NoError(t, err)
	assert.Equal(t, 3, n, "--prefault-workers 3")
	assert.Len(t, cpus, 8, "the workers pick from all of the node's CPUs")

	// A job's cpuset holding part of the node: only those CPUs.
	cpus, n, err = prefaultPlan(p, 0, cpuSetOf(2, 3, 12, 13))
	require.NoError(t, err)
	assert.Equal(t, []int{12, 13}, cpus)
	assert.Equal(t, 2, n)

	_, _, err = prefaultPlan(p, 3, cpuSetOf(2, 3, 12, 13))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PrefaultWorkers")
	assert.Contains(t, err.Error(), "at most 2")
	assert.Contains(t, err.Error(), "12-13")

	// None of the node's CPUs allowed: unpinned, one per allowed CPU.
	cpus, n, err = prefaultPlan(p, 0, cpuSetOf(0, 1, 2))
	require.NoError(t, err)
	assert.Nil(t, cpus)
	assert.Equal(t, 3, n)

	_, _, err = prefaultPlan(p, 0, func() (unix.CPUSet, error) { return unix.CPUSet{}, errors.New("boom") })
	require.ErrorContains(t, err, "sched_getaffinity: boom")
}

func TestValidatePrefaultWorkers(t *testing.T) {
	c := validConfig(t)
	c.PrefaultWorkers = -1
	err := c.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "PrefaultWorkers")
	c.PrefaultWorkers = 4
	require.NoError(t, c.Validate())
}
