package guestnet_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/guestnet"
)

// nsThread is an OS thread in a network namespace of its own, created for
// the test; do runs a function on it. The namespace goes away with the
// thread (close) once nothing else holds it.
type nsThread struct {
	fns chan func()
	fd  int // the namespace, for moving interfaces into it
}

func newNSThread(t *testing.T) *nsThread {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces")
	}
	n := &nsThread{fns: make(chan func())}
	ready := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the namespace
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			ready <- err
			return
		}
		fd, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		n.fd = fd
		ready <- err
		for fn := range n.fns {
			fn()
		}
	}()
	require.NoError(t, <-ready)
	t.Cleanup(func() {
		close(n.fns)
		unix.Close(n.fd)
	})
	return n
}

func (n *nsThread) do(fn func()) {
	done := make(chan struct{})
	n.fns <- func() {
		defer close(done)
		fn()
	}
	<-done
}

var guestMAC = net.HardwareAddr{0x02, 0x68, 0x70, 0x12, 0x34, 0x56}

// vethPair makes guest (with guestMAC) and its peer in the client's
// namespace, moves the peer to server's (when given), and brings the peer
// up there with hostAddr.
func vethPair(t *testing.T, client, server *nsThread, hostAddr string) {
	t.Helper()
	client.do(func() {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "guest0", HardwareAddr: guestMAC}, PeerName: "host0"}
		require.NoError(t, netlink.LinkAdd(v))
		if server != nil {
			peer, err := netlink.LinkByName("host0")
			require.NoError(t, err)
			require.NoError(t, netlink.LinkSetNsFd(peer, server.fd))
		}
	})
	if server == nil {
		server = client
	}
	server.do(func() {
		peer, err := netlink.LinkByName("host0")
		require.NoError(t, err)
		a, err := netlink.ParseAddr(hostAddr)
		require.NoError(t, err)
		require.NoError(t, netlink.AddrAdd(peer, a))
		require.NoError(t, netlink.LinkSetUp(peer))
	})
}

// addrsOf returns the IPv4 addresses of the interface with guestMAC and
// the default route's gateway.
func addrsOf(t *testing.T) (addrs []string, gw string, loUp bool) {
	t.Helper()
	l, err := linkByMAC(guestMAC)
	require.NoError(t, err)
	as, err := netlink.AddrList(l, netlink.FAMILY_V4)
	require.NoError(t, err)
	for _, a := range as {
		addrs = append(addrs, a.IPNet.String())
	}
	rs, err := netlink.RouteList(l, netlink.FAMILY_V4)
	require.NoError(t, err)
	for _, r := range rs {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() {
			gw = r.Gw.String()
		}
	}
	lo, err := netlink.LinkByName("lo")
	require.NoError(t, err)
	return addrs, gw, lo.Attrs().Flags&net.FlagUp != 0
}

func linkByMAC(mac net.HardwareAddr) (netlink.Link, error) {
	ls, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if bytes.Equal(l.Attrs().HardwareAddr, mac) {
			return l, nil
		}
	}
	return nil, fmt.Errorf("no link with %s", mac)
}

func TestConfigureStatic(t *testing.T) {
	ns := newNSThread(t)
	vethPair(t, ns, nil, "10.78.0.1/24")
	resolv := filepath.Join(t.TempDir(), "etc", "resolv.conf")
	ns.do(func() {
		_, ipnet, _ := net.ParseCIDR("10.78.0.0/24")
		ipnet.IP = net.ParseIP("10.78.0.2").To4()
		err := guestnet.Config{ResolvConf: resolv}.Configure([]guestnet.Interface{
			{MAC: guestMAC, Address: ipnet, Gateway: net.ParseIP("10.78.0.1")},
		}, []string{"10.78.0.53", "2001:db8::53"})
		require.NoError(t, err)
		addrs, gw, loUp := addrsOf(t)
		assert.Equal(t, []string{"10.78.0.2/24"}, addrs)
		assert.Equal(t, "10.78.0.1", gw, "default route")
		assert.True(t, loUp, "lo up")
		// The address works: the peer answers on it.
		c, err := net.DialTimeout("tcp", "10.78.0.1:9", time.Second)
		if err == nil {
			c.Close()
		} else {
			assert.ErrorIs(t, err, unix.ECONNREFUSED, "the peer should refuse (nothing listens), not be unreachable")
		}
	})
	b, err := os.ReadFile(resolv)
	require.NoError(t, err)
	assert.Equal(t, "nameserver 10.78.0.53\nnameserver 2001:db8::53\n", string(b))
}

// TestConfigureBadInput: errors name the input, and nothing changes
// before validation passed.
func TestConfigureBadInput(t *testing.T) {
	ns := newNSThread(t)
	vethPair(t, ns, nil, "10.79.0.1/24")
	resolv := filepath.Join(t.TempDir(), "resolv.conf")
	cfg := guestnet.Config{ResolvConf: resolv, LinkWait: 50 * time.Millisecond}
	addr := &net.IPNet{IP: net.ParseIP("10.79.0.2").To4(), Mask: net.CIDRMask(24, 32)}
	ns.do(func() {
		for _, tc := range []struct {
			ifs  []guestnet.Interface
			dns  []string
			want string
		}{
			{[]guestnet.Interface{{MAC: guestMAC, Address: addr, Gateway: net.ParseIP("10.1.0.1")}}, nil, "gateway 10.1.0.1 is outside 10.79.0.2/24"},
			{[]guestnet.Interface{{MAC: guestMAC, Address: addr}}, []string{"dns.example"}, `DNS server "dns.example" is not an IP address`},
			{[]guestnet.Interface{{MAC: guestMAC, DHCP: true, Address: addr}}, nil, "DHCP together with a static address"},
			{[]guestnet.Interface{{MAC: guestMAC}, {MAC: guestMAC}}, nil, "given twice"},
			{[]guestnet.Interface{{MAC: net.HardwareAddr{2, 0, 0, 0, 0, 9}, Address: addr}}, nil, "no interface with MAC 02:00:00:00:00:09"},
		} {
			err := cfg.Configure(tc.ifs, tc.dns)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		}
		addrs, _, _ := addrsOf(t)
		assert.Empty(t, addrs, "an address was set by a configuration that failed validation")
	})
	_, err := os.Stat(resolv)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

// dnsmasq runs Debian's dnsmasq as the DHCP server on host0 in ns, with
// its lease file and log in dir; it is killed at the end of the test.
func dnsmasq(t *testing.T, ns *nsThread, dir string) {
	t.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		t.Skip("dnsmasq not installed")
	}
	cmd := exec.Command(bin, "-k", "-u", "root", "-C", "/dev/null",
		"--interface=host0", "--bind-interfaces", "--port=0", "--dhcp-authoritative",
		"--dhcp-range=10.77.0.50,10.77.0.59,255.255.255.0,2m",
		"--dhcp-option=option:router,10.77.0.1", "--dhcp-option=option:dns-server,10.77.0.53",
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-facility="+filepath.Join(dir, "log"), "--log-dhcp")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// Started from the namespace's thread: the child is in that namespace.
	ns.do(func() { err = cmd.Start() })
	require.NoError(t, err)
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			log, _ := os.ReadFile(filepath.Join(dir, "log"))
			t.Logf("dnsmasq output: %s\nlog:\n%s", out.String(), log)
		}
	})
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "log"))
		return bytes.Contains(b, []byte("DHCP, IP range"))
	}, 10*time.Second, 10*time.Millisecond, "dnsmasq did not start: %s", &out)
}

// TestConfigureDHCP: the guest's interface in a namespace of its own gets
// its lease from Debian's dnsmasq, in another namespace at the other end
// of a veth pair (a bridge in L1, a VM's TAP, in the real case): the leased
// address with its prefix, the router as default route, the offered name
// server in resolv.conf; the lease is renewed (RenewAfter 1 s).
func TestConfigureDHCP(t *testing.T) {
	server := newNSThread(t)
	client := newNSThread(t)
	vethPair(t, client, server, "10.77.0.1/24")
	dir := t.TempDir()
	dnsmasq(t, server, dir)
	resolv := filepath.Join(dir, "resolv.conf")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var addrs []string
	var gw string
	client.do(func() {
		err := guestnet.Config{ResolvConf: resolv, DHCPTimeout: 20 * time.Second, RenewAfter: time.Second, Context: ctx,
			OnRenewError: func(err error) { t.Errorf("renewal: %v", err) }}.Configure(
			[]guestnet.Interface{{MAC: guestMAC, DHCP: true}}, nil)
		require.NoError(t, err)
		addrs, gw, _ = addrsOf(t)
	})
	require.Len(t, addrs, 1)
	ip, ipnet, err := net.ParseCIDR(addrs[0])
	require.NoError(t, err)
	assert.Equal(t, "10.77.0.0/24", ipnet.String(), "leased prefix")
	assert.True(t, bytes.Compare(ip.To4(), net.IP{10, 77, 0, 50}) >= 0 && bytes.Compare(ip.To4(), net.IP{10, 77, 0, 59}) <= 0, "leased address %s outside the range", ip)
	assert.Equal(t, "10.77.0.1", gw, "default route via the DHCP router")
	b, err := os.ReadFile(resolv)
	require.NoError(t, err)
	assert.Equal(t, "nameserver 10.77.0.53\n", string(b))
	leases, err := os.ReadFile(filepath.Join(dir, "leases"))
	require.NoError(t, err)
	assert.Contains(t, string(leases), guestMAC.String()+" "+ip.String(), "dnsmasq's lease file")

	// Renewal: dnsmasq acknowledges the same address again.
	require.Eventually(t, func() bool {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		return strings.Count(string(log), "DHCPACK(host0) "+ip.String()) >= 3
	}, 15*time.Second, 50*time.Millisecond, "lease not renewed")
	cancel()

	// The address is usable: the server's side is reachable from it.
	client.do(func() {
		c, err := net.DialTimeout("tcp", "10.77.0.1:9", time.Second)
		if err == nil {
			c.Close()
		} else {
			assert.ErrorIs(t, err, unix.ECONNREFUSED)
		}
	})
}

// TestConfigureWaitsForTheCarrier: Configure returns only once the
// interface is running (a carrier), as a program that lists usable
// interfaces right after needs; an interface that never gets one is an
// error naming it. A veth has its carrier while its peer is up.
func TestConfigureWaitsForTheCarrier(t *testing.T) {
	ns := newNSThread(t)
	vethPair(t, ns, nil, "10.76.0.1/24")
	_, ipnet, _ := net.ParseCIDR("10.76.0.0/24")
	ipnet.IP = net.ParseIP("10.76.0.2").To4()
	ifs := []guestnet.Interface{{MAC: guestMAC, Address: ipnet}}
	ns.do(func() {
		peer, err := netlink.LinkByName("host0")
		require.NoError(t, err)
		require.NoError(t, netlink.LinkSetDown(peer))
		err = guestnet.Config{LinkWait: 200 * time.Millisecond, ResolvConf: filepath.Join(t.TempDir(), "r")}.Configure(ifs, nil)
		require.ErrorContains(t, err, "no carrier 200ms after it was brought up")
		require.ErrorContains(t, err, guestMAC.String())

		// The peer comes up a little later: Configure waits for it. (A
		// handle made here keeps this namespace on the goroutine's thread.)
		h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
		require.NoError(t, err)
		defer h.Close()
		go func() {
			time.Sleep(100 * time.Millisecond)
			_ = h.LinkSetUp(peer)
		}()
		require.NoError(t, guestnet.Config{ResolvConf: filepath.Join(t.TempDir(), "r")}.Configure(ifs, nil))
		l, err := linkByMAC(guestMAC)
		require.NoError(t, err)
		assert.NotZero(t, l.Attrs().RawFlags&unix.IFF_RUNNING, "running when Configure returned")
	})
}
