package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/vmm"
)

func TestNetFlag(t *testing.T) {
	c, f := newRunCommand()
	require.NoError(t, c.fs.Parse([]string{"--net", "tap=tap0", "--net", "tap=tap1,mac=02:68:70:00:00:01,queues=2,vhost=off"}))
	assert.Equal(t, []vmm.NetConfig{
		{TAP: "tap0"},
		{TAP: "tap1", MAC: "02:68:70:00:00:01", Queues: 2, Vhost: vmm.VhostOff},
	}, f.cfg.Nets)

	for arg, msg := range map[string]string{
		"mac=02:00:00:00:00:01": "no tap=NAME",
		"tap=a,queues=0":        "at least 1",
		"tap=a,vhost=maybe":     "want on or off",
		"tap=a,speed=10":        "unknown key",
		"tap=a,tap=b":           "given twice",
		"tap":                   "key=value",
	} {
		c, _ := newRunCommand()
		err := c.fs.Parse([]string{"--net", arg})
		assert.ErrorContains(t, err, msg, arg)
	}
}
