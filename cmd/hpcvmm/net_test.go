package main

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/guestnet"
	virtionet "github.com/hpcvmm/hpcvmm/virtio/net"
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

// TestNetFlagGuest: the guest half of --net for a job's spec: the MAC the
// device gets (given or derived from the TAP name), DHCP or a static
// address (with a Slurm rank or node added) and gateway, and the bridge on
// the host half.
func TestNetFlagGuest(t *testing.T) {
	env := map[string]string{"SLURM_PROCID": "5", "SLURM_NODEID": "1"}
	getenv := func(k string) string { return env[k] }
	cidr := func(s string) *net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		require.NoError(t, err)
		if ip4 := ip.To4(); ip4 != nil {
			ip = ip4
		}
		n.IP = ip
		return n
	}
	mac := func(s string) net.HardwareAddr {
		m, err := net.ParseMAC(s)
		require.NoError(t, err)
		return m
	}
	for _, tc := range []struct {
		arg   string
		host  vmm.NetConfig
		guest guestnet.Interface
	}{
		{"tap=t0,bridge=br0,ip=dhcp", vmm.NetConfig{TAP: "t0", Bridge: "br0"}, guestnet.Interface{MAC: virtionet.DeriveMAC("t0"), DHCP: true}},
		{"tap=t0,mac=02:00:00:00:00:07,ip=10.0.0.2/24,gw=10.0.0.1", vmm.NetConfig{TAP: "t0", MAC: "02:00:00:00:00:07"},
			guestnet.Interface{MAC: mac("02:00:00:00:00:07"), Address: cidr("10.0.0.2/24"), Gateway: net.ParseIP("10.0.0.1")}},
		{"tap=t0,ip=10.0.0.10/24+rank", vmm.NetConfig{TAP: "t0"}, guestnet.Interface{MAC: virtionet.DeriveMAC("t0"), Address: cidr("10.0.0.15/24")}},
		{"tap=t0,ip=10.0.0.254/23+rank", vmm.NetConfig{TAP: "t0"}, guestnet.Interface{MAC: virtionet.DeriveMAC("t0"), Address: cidr("10.0.1.3/23")}},
		{"tap=t0,ip=fd00::10/64+node", vmm.NetConfig{TAP: "t0"}, guestnet.Interface{MAC: virtionet.DeriveMAC("t0"), Address: cidr("fd00::11/64")}},
		{"tap=t0", vmm.NetConfig{TAP: "t0"}, guestnet.Interface{MAC: virtionet.DeriveMAC("t0")}},
	} {
		h, g, err := parseNet(tc.arg, getenv)
		require.NoError(t, err, tc.arg)
		assert.Equal(t, tc.host, h, tc.arg)
		assert.Equal(t, tc.guest, g, tc.arg)
	}

	for arg, msg := range map[string]string{
		"tap=a,ip=10.0.0.2":                   "want ADDRESS/PREFIX",
		"tap=a,ip=10.0.0.250/24+rank+1":       "unknown +rank+1",
		"tap=a,ip=10.0.0.252/24+rank":         "10.0.0.252 + SLURM_PROCID=5 = 10.0.1.1 is outside 10.0.0.0/24",
		"tap=a,ip=10.0.0.250/24+rank":         "10.0.0.255 is the network or broadcast address of 10.0.0.0/24",
		"tap=a,ip=10.0.0.0/24":                "network or broadcast",
		"tap=a,ip=10.0.0.2/24,gw=10.0.1.1":    "gw=10.0.1.1 is outside the interface's subnet 10.0.0.2/24",
		"tap=a,ip=dhcp,gw=10.0.0.1":           "the DHCP server names the gateway",
		"tap=a,gw=10.0.0.1":                   "gw=10.0.0.1 without ip=ADDRESS/PREFIX",
		"tap=a,ip=10.0.0.2/24,gw=gateway":     "gw=gateway: want an IP address",
		"tap=a,mac=01:00:00:00:00:01":         "multicast",
		"tap=a,ip=10.0.0.2/24+cpu":            "use +rank (SLURM_PROCID) or +node (SLURM_NODEID)",
		"tap=a,ip=255.255.255.254/24+rank":    "overflows the address",
		"tap=a,ip=10.0.0.2/24,ip=10.0.0.3/24": "ip given twice",
	} {
		_, _, err := parseNet(arg, getenv)
		assert.ErrorContains(t, err, msg, arg)
	}

	// Outside Slurm: the variable is named.
	_, _, err := parseNet("tap=a,ip=10.0.0.2/24+rank", func(string) string { return "" })
	assert.ErrorContains(t, err, "SLURM_PROCID is not set: +rank needs Slurm (srun) or SLURM_PROCID in the environment")
	_, _, err = parseNet("tap=a,ip=10.0.0.2/24+node", func(string) string { return "x" })
	assert.ErrorContains(t, err, `SLURM_NODEID="x" is not a number`)
}

func TestDNSFlag(t *testing.T) {
	c, f := newRunCommand()
	require.NoError(t, c.fs.Parse([]string{"--dns", "10.0.0.53", "--dns", "2001:db8::53", "--net", "tap=t0,bridge=br0,ip=dhcp"}))
	assert.Equal(t, []string{"10.0.0.53", "2001:db8::53"}, f.jobDNS())
	assert.Equal(t, []guestnet.Interface{{MAC: virtionet.DeriveMAC("t0"), DHCP: true}}, f.guestNets)
	assert.Equal(t, "br0", f.cfg.Nets[0].Bridge)
	f.dns = nil
	assert.Nil(t, f.jobDNS(), "with DHCP and no --dns: the DHCP server's")
	c, _ = newRunCommand()
	assert.ErrorContains(t, c.fs.Parse([]string{"--dns", "dns.example"}), `"dns.example": want an IP address`)

	p := filepath.Join(t.TempDir(), "resolv.conf")
	require.NoError(t, os.WriteFile(p, []byte("# generated\nsearch example\nnameserver 127.0.0.53\nnameserver 192.0.2.1\nnameserver  2001:db8::1 \nnameserver bogus\n"), 0o644))
	assert.Equal(t, []string{"192.0.2.1", "2001:db8::1"}, hostNameservers(p), "loopback and unparsable servers left out")
	assert.Nil(t, hostNameservers(filepath.Join(t.TempDir(), "none")))
}
