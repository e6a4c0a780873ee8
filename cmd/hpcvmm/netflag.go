// --net and --dns: the host's half of an interface (vmm.NetConfig: TAP,
// bridge, ...) and the guest's half for a job (guestnet.Interface: the MAC
// that finds the interface, a static address and gateway or DHCP), and the
// job's name servers.

package main

import (
	"bufio"
	"fmt"
	"math/big"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/guestnet"
	virtionet "github.com/hpcvmm/hpcvmm/virtio/net"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// parseNet parses one --net value:
// tap=NAME[,mac=MAC][,queues=N][,vhost=on|off][,bridge=BRIDGE][,ip=ADDRESS/PREFIX[+rank|+node]|dhcp][,gw=GATEWAY].
// The host half's values are checked by vmm.Config.Validate; the guest
// half is checked here. getenv reads SLURM_PROCID/SLURM_NODEID for +rank
// and +node.
func parseNet(s string, getenv func(string) string) (vmm.NetConfig, guestnet.Interface, error) {
	var n vmm.NetConfig
	var g guestnet.Interface
	var ip, gw string
	seen := map[string]bool{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || v == "" {
			return n, g, fmt.Errorf("%q: want key=value pairs, e.g. tap=tap0,queues=2", kv)
		}
		if seen[k] {
			return n, g, fmt.Errorf("%q: %s given twice", s, k)
		}
		seen[k] = true
		switch k {
		case "tap":
			n.TAP = v
		case "mac":
			n.MAC = v
		case "queues":
			q, err := strconv.Atoi(v)
			if err != nil || q < 1 {
				return n, g, fmt.Errorf("queues=%s: want a number of queue pairs, at least 1", v)
			}
			n.Queues = q
		case "vhost":
			if v != vmm.VhostOn && v != vmm.VhostOff {
				return n, g, fmt.Errorf("vhost=%s: want on or off", v)
			}
			n.Vhost = v
		case "bridge":
			n.Bridge = v
		case "ip":
			ip = v
		case "gw":
			gw = v
		default:
			return n, g, fmt.Errorf("unknown key %q: use tap, mac, queues, vhost, bridge, ip or gw", k)
		}
	}
	if n.TAP == "" {
		return n, g, fmt.Errorf("%q: no tap=NAME", s)
	}
	// The guest finds its interface by the MAC the device gets: the one
	// given, else the one vmm derives from the TAP name.
	g.MAC = virtionet.DeriveMAC(n.TAP)
	if n.MAC != "" {
		m, err := virtionet.ParseMAC(n.MAC)
		if err != nil {
			return n, g, fmt.Errorf("mac=%s: %w", n.MAC, err)
		}
		g.MAC = m
	}
	switch {
	case ip == "dhcp":
		g.DHCP = true
		if gw != "" {
			return n, g, fmt.Errorf("gw=%s with ip=dhcp: the DHCP server names the gateway", gw)
		}
	case ip != "":
		a, err := parseGuestIP(ip, getenv)
		if err != nil {
			return n, g, err
		}
		g.Address = a
	}
	if gw != "" && !g.DHCP {
		if g.Address == nil {
			return n, g, fmt.Errorf("gw=%s without ip=ADDRESS/PREFIX", gw)
		}
		g.Gateway = net.ParseIP(gw)
		if g.Gateway == nil {
			return n, g, fmt.Errorf("gw=%s: want an IP address", gw)
		}
		if !g.Address.Contains(g.Gateway) {
			return n, g, fmt.Errorf("gw=%s is outside the interface's subnet %s", gw, g.Address)
		}
	}
	return n, g, nil
}

// rankVars are the +SUFFIX forms of ip=: the Slurm variable added to the
// address.
var rankVars = map[string]string{"rank": "SLURM_PROCID", "node": "SLURM_NODEID"}

// parseGuestIP parses ip=ADDRESS/PREFIX[+rank|+node]: with a suffix, the
// address is BASE plus the Slurm variable, and must stay inside the subnet
// (and, for IPv4 subnets of more than two addresses, not be its network or
// broadcast address).
func parseGuestIP(v string, getenv func(string) string) (*net.IPNet, error) {
	spec, suffix, hasSuffix := strings.Cut(v, "+")
	ip, ipnet, err := net.ParseCIDR(spec)
	if err != nil {
		return nil, fmt.Errorf("ip=%s: want ADDRESS/PREFIX (e.g. 10.0.0.2/24, 10.0.0.10/24+rank) or dhcp", v)
	}
	if ip4 := ip.To4(); ip4 != nil {
		ip = ip4
	}
	if hasSuffix {
		name, ok := rankVars[suffix]
		if !ok {
			return nil, fmt.Errorf("ip=%s: unknown +%s: use +rank (SLURM_PROCID) or +node (SLURM_NODEID)", v, suffix)
		}
		val := getenv(name)
		k, err := strconv.ParseUint(val, 10, 32)
		if err != nil {
			if val == "" {
				return nil, fmt.Errorf("ip=%s: %s is not set: +%s needs Slurm (srun) or %s in the environment", v, name, suffix, name)
			}
			return nil, fmt.Errorf("ip=%s: %s=%q is not a number", v, name, val)
		}
		sum := new(big.Int).Add(new(big.Int).SetBytes(ip), new(big.Int).SetUint64(k))
		b := sum.Bytes()
		if len(b) > len(ip) {
			return nil, fmt.Errorf("ip=%s: %s + %s=%d overflows the address", v, ip, name, k)
		}
		next := make(net.IP, len(ip))
		copy(next[len(ip)-len(b):], b)
		if !ipnet.Contains(next) {
			return nil, fmt.Errorf("ip=%s: %s + %s=%d = %s is outside %s", v, ip, name, k, next, ipnet)
		}
		ip = next
	}
	ones, bits := ipnet.Mask.Size()
	if bits == 32 && ones < 31 {
		bcast := make(net.IP, 4)
		for i := range bcast {
			bcast[i] = ipnet.IP[i] | ^ipnet.Mask[i]
		}
		if ip.Equal(ipnet.IP) || ip.Equal(bcast) {
			return nil, fmt.Errorf("ip=%s: %s is the network or broadcast address of %s", v, ip, ipnet)
		}
	}
	return &net.IPNet{IP: ip, Mask: ipnet.Mask}, nil
}

// jobDNS is the name servers for a job: --dns; else none when an
// interface uses DHCP (the guest takes the DHCP server's); else the host's.
func (f *runFlags) jobDNS() []string {
	if len(f.dns) > 0 {
		return f.dns
	}
	for _, g := range f.guestNets {
		if g.DHCP {
			return nil
		}
	}
	return hostNameservers("/etc/resolv.conf")
}

// hostNameservers reads the nameserver lines of a resolv.conf, leaving out
// loopback addresses (a local resolver such as systemd-resolved's
// 127.0.0.53 is the host's, unreachable from the guest). A missing file
// gives none.
func hostNameservers(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || fields[0] != "nameserver" {
			continue
		}
		if ip := net.ParseIP(fields[1]); ip != nil && !ip.IsLoopback() {
			out = append(out, ip.String())
		}
	}
	return out
}
