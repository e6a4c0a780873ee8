package vmm

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
)

func TestValidateNets(t *testing.T) {
	c := Config{Nets: []NetConfig{
		{TAP: "tap0", MAC: "02:68:70:00:00:01", Queues: 2, Vhost: VhostOff},
		{TAP: "tap1"},
	}}
	assert.Empty(t, c.validateNets())

	for _, tc := range []struct {
		n    []NetConfig
		want string
	}{
		{[]NetConfig{{TAP: ""}}, "no TAP name"},
		{[]NetConfig{{TAP: "a/b"}}, "'/'"},
		{[]NetConfig{{TAP: "t", MAC: "02:00"}}, "not six hex bytes"},
		{[]NetConfig{{TAP: "t", MAC: "01:00:00:00:00:01"}}, "multicast"},
		{[]NetConfig{{TAP: "t", Queues: 1000}}, "queues=1000"},
		{[]NetConfig{{TAP: "t", Vhost: "yes"}}, "vhost"},
		{[]NetConfig{{TAP: "t"}, {TAP: "t"}}, "given twice"},
	} {
		c := Config{Nets: tc.n}
		errs := c.validateNets()
		if assert.NotEmpty(t, errs, tc.want) {
			err := errors.Join(errs...)
			assert.ErrorContains(t, err, tc.want)
			var fe *FieldError
			assert.True(t, errors.As(errs[0], &fe))
			assert.Equal(t, "Nets", fe.Field)
		}
	}
}

func TestWorkerCPUs(t *testing.T) {
	all := func(cpus ...int) unix.CPUSet {
		var s unix.CPUSet
		for _, c := range cpus {
			s.Set(c)
		}
		return s
	}
	every := all(0, 1, 2, 3, 4, 5, 6, 7, 8)
	for _, c := range []struct {
		vcpus, node []int
		allowed     unix.CPUSet
		want        []int
	}{
		{[]int{0}, []int{0, 1}, every, []int{1}},             // the test bed's L1: vCPU on 0, vhost on 1
		{[]int{4, 5}, []int{4, 5, 6, 7}, every, []int{6, 7}}, // spare CPUs of the node
		{[]int{0, 1}, []int{0, 1}, every, []int{0, 1}},       // none spare: the whole node
		{[]int{0, 0, 0}, []int{0, 1, 2}, every, []int{1, 2}}, // vCPUs sharing a CPU
		{[]int{8}, []int{0, 1}, every, []int{0, 1}},          // --cpu-list off the node
		{[]int{0}, []int{0, 1}, all(0), []int{0}},            // a Slurm step's cpuset of one CPU
		{[]int{4}, []int{4, 5, 6, 7}, all(4, 6), []int{6}},   // the spare CPU the cpuset allows
		{[]int{0}, []int{0, 1}, all(5), nil},                 // none of the node's: the kernel's placement
	} {
		got := workerCPUs(placement{vcpuCPUs: c.vcpus, nodeCPUs: c.node}, c.allowed)
		assert.Equal(t, c.want, got, "vCPUs on %v, node CPUs %v", c.vcpus, c.node)
	}
}
