package vmm

import (
	"errors"
	"testing"

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
	for _, c := range []struct {
		vcpus, node, want []int
	}{
		{[]int{0}, []int{0, 1}, []int{1}},             // the test bed's L1: vCPU on 0, vhost on 1
		{[]int{4, 5}, []int{4, 5, 6, 7}, []int{6, 7}}, // spare CPUs of the node
		{[]int{0, 1}, []int{0, 1}, []int{0, 1}},       // none spare: the whole node
		{[]int{0, 0, 0}, []int{0, 1, 2}, []int{1, 2}}, // vCPUs sharing a CPU
		{[]int{8}, []int{0, 1}, []int{0, 1}},          // --cpu-list off the node
	} {
		got := workerCPUs(placement{vcpuCPUs: c.vcpus, nodeCPUs: c.node})
		assert.Equal(t, c.want, got, "vCPUs on %v, node CPUs %v", c.vcpus, c.node)
	}
}
