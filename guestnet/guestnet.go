// Package guestnet configures the network of a guest that hpcvmm's agent
// runs in (issue 26, `hpcvmm run --net ...,ip=...|dhcp`): loopback up, each
// interface (found by its MAC, which the host chose) up with a static
// address and default route or a DHCP lease, and /etc/resolv.conf.
//
// Addresses and routes go through rtnetlink (github.com/vishvananda/netlink,
// already hpcvmm's). DHCP is github.com/insomniacslk/dhcp's nclient4, the
// client under u-root's pkg/dhclient, used directly rather than through
// dhclient: dhclient's Configure writes a package-global resolv.conf path,
// logs through the log package and pulls in DHCPv6, while what it adds over
// nclient4 for one IPv4 lease is the few netlink calls below. The lease is
// renewed in the background (at T1, RFC 2131 4.4.5) for as long as the
// process lives, since a job may outlast it.
//
// The package is the guest side: it changes the network of the namespace it
// runs in and is meant for the guest's PID 1.
package guestnet

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Interface is one guest interface as the host configured it.
type Interface struct {
	// MAC identifies the interface (the host gave the virtio-net device
	// this address).
	MAC net.HardwareAddr
	// Address is the static IPv4 or IPv6 address with its prefix; nil with
	// DHCP or for an interface that is only brought up.
	Address *net.IPNet
	// Gateway is the default route's next hop for a static Address (nil:
	// no default route through this interface).
	Gateway net.IP
	// DHCP asks a DHCPv4 server for the address, the default route (the
	// router option) and, when Configure is given no DNS servers, the
	// name servers.
	DHCP bool
}

// DefaultResolvConf is where Configure writes the name servers.
const DefaultResolvConf = "/etc/resolv.conf"

// Config tunes Configure. The zero value is the guest's: /etc/resolv.conf,
// a 5 s wait for each interface to appear, and DHCP with nclient4's
// per-attempt timeout and retries.
type Config struct {
	// ResolvConf is the file written with the name servers (default
	// DefaultResolvConf).
	ResolvConf string
	// LinkWait is how long an interface may take to appear (its driver
	// probing) before Configure gives up on it; 0 means 5 s.
	LinkWait time.Duration
	// DHCPTimeout bounds obtaining one lease; 0 means 30 s.
	DHCPTimeout time.Duration
	// RenewAfter, when set, renews DHCP leases this often instead of at
	// the lease's T1 (tests).
	RenewAfter time.Duration
	// OnRenewError hears lease renewals that failed (they are retried at
	// half the time left); nil ignores them.
	OnRenewError func(error)
	// Context ends the renewals when done; nil renews for the process's
	// life.
	Context context.Context
}

// Configure configures the guest's network with the zero Config.
func Configure(ifs []Interface, dns []string) error {
	return Config{}.Configure(ifs, dns)
}

// Configure brings lo and every interface of ifs up and configures them,
// then writes ResolvConf with dns (IP addresses) or, when dns is empty, the
// name servers DHCP offered; with neither, ResolvConf is left alone. It
// stops at the first error, which names the interface by its MAC.
func (c Config) Configure(ifs []Interface, dns []string) error {
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	if c.LinkWait == 0 {
		c.LinkWait = 5 * time.Second
	}
	if c.DHCPTimeout == 0 {
		c.DHCPTimeout = 30 * time.Second
	}
	servers := make([]net.IP, 0, len(dns))
	for _, s := range dns {
		ip := net.ParseIP(s)
		if ip == nil {
			return fmt.Errorf("guestnet: DNS server %q is not an IP address", s)
		}
		servers = append(servers, ip)
	}
	if err := validate(ifs); err != nil {
		return err
	}
	if c.Context == nil {
		c.Context = context.Background()
	}
	// A handle's sockets stay in the network namespace of the thread that
	// made it, so the renewals (on other threads) change this one. Only
	// rtnetlink: NewHandle() without families also opens NETLINK_XFRM and
	// NETLINK_NETFILTER sockets, which fail (EPROTONOSUPPORT) in a guest
	// whose kernel has xfrm_user as a module no one loads.
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("guestnet: netlink: %w", err)
	}
	leases := 0
	defer func() {
		if leases == 0 {
			h.Close()
		}
	}()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("guestnet: loopback: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("guestnet: bring loopback up: %w", err)
	}
	var offered []net.IP
	for _, ifc := range ifs {
		link, err := c.findLink(h, ifc.MAC)
		if err != nil {
			return err
		}
		name := link.Attrs().Name
		if err := h.LinkSetUp(link); err != nil {
			return fmt.Errorf("guestnet: interface %s (%s): bring up: %w", ifc.MAC, name, err)
		}
		switch {
		case ifc.DHCP:
			ns, err := c.dhcp(h, link, ifc.MAC)
			if err != nil {
				return err
			}
			leases++
			offered = append(offered, ns...)
		case ifc.Address != nil:
			if err := static(h, link, ifc); err != nil {
				return err
			}
		}
	}
	if len(servers) == 0 {
		servers = offered
	}
	if len(servers) == 0 {
		return nil
	}
	return writeResolvConf(c.ResolvConf, servers)
}

// validate checks what the host sent before anything changes.
func validate(ifs []Interface) error {
	seen := map[string]bool{}
	for i, ifc := range ifs {
		if len(ifc.MAC) != 6 {
			return fmt.Errorf("guestnet: interface %d: MAC %q is not an Ethernet address", i, ifc.MAC)
		}
		if seen[ifc.MAC.String()] {
			return fmt.Errorf("guestnet: interface %d: MAC %s given twice", i, ifc.MAC)
		}
		seen[ifc.MAC.String()] = true
		if ifc.DHCP && (ifc.Address != nil || ifc.Gateway != nil) {
			return fmt.Errorf("guestnet: interface %s: DHCP together with a static address or gateway", ifc.MAC)
		}
		if ifc.Gateway != nil {
			if ifc.Address == nil {
				return fmt.Errorf("guestnet: interface %s: gateway %s without an address", ifc.MAC, ifc.Gateway)
			}
			if !ifc.Address.Contains(ifc.Gateway) {
				return fmt.Errorf("guestnet: interface %s: gateway %s is outside %s", ifc.MAC, ifc.Gateway, ifc.Address)
			}
		}
	}
	return nil
}

// findLink waits up to LinkWait for the interface with this MAC.
func (c Config) findLink(h *netlink.Handle, mac net.HardwareAddr) (netlink.Link, error) {
	deadline := time.Now().Add(c.LinkWait)
	for {
		links, err := h.LinkList()
		if err != nil {
			return nil, fmt.Errorf("guestnet: list interfaces: %w", err)
		}
		var have []string
		for _, l := range links {
			a := l.Attrs()
			if a.HardwareAddr.String() == mac.String() && l.Type() != "bridge" {
				return l, nil
			}
			if len(a.HardwareAddr) == 6 {
				have = append(have, a.Name+"="+a.HardwareAddr.String())
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("guestnet: no interface with MAC %s after %v (interfaces: %s); is its virtio_net driver loaded?",
				mac, c.LinkWait, strings.Join(have, ", "))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// static sets ifc's address and default route on link.
func static(h *netlink.Handle, link netlink.Link, ifc Interface) error {
	name := link.Attrs().Name
	if err := h.AddrReplace(link, &netlink.Addr{IPNet: ifc.Address}); err != nil {
		return fmt.Errorf("guestnet: interface %s (%s): address %s: %w", ifc.MAC, name, ifc.Address, err)
	}
	if ifc.Gateway == nil {
		return nil
	}
	r := &netlink.Route{LinkIndex: link.Attrs().Index, Gw: ifc.Gateway}
	if err := h.RouteReplace(r); err != nil {
		return fmt.Errorf("guestnet: interface %s (%s): default route via %s: %w", ifc.MAC, name, ifc.Gateway, err)
	}
	return nil
}

// dhcp obtains a lease on link, applies it, keeps renewing it (the renewals
// own h from then on), and returns the name servers it offered.
func (c Config) dhcp(h *netlink.Handle, link netlink.Link, mac net.HardwareAddr) ([]net.IP, error) {
	name := link.Attrs().Name
	client, err := nclient4.New(name, nclient4.WithHWAddr(mac), nclient4.WithTimeout(c.DHCPTimeout/4), nclient4.WithRetry(3))
	if err != nil {
		return nil, fmt.Errorf("guestnet: interface %s (%s): DHCP client: %w", mac, name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.DHCPTimeout)
	lease, err := client.Request(ctx)
	cancel()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("guestnet: interface %s (%s): no DHCP lease within %v: %w", mac, name, c.DHCPTimeout, err)
	}
	if err := applyLease(h, link, lease.ACK); err != nil {
		client.Close()
		return nil, fmt.Errorf("guestnet: interface %s (%s): %w", mac, name, err)
	}
	go c.renew(h, client, link, lease)
	return lease.ACK.DNS(), nil
}

// applyLease sets the leased address and the router as default route.
func applyLease(h *netlink.Handle, link netlink.Link, ack *dhcpv4.DHCPv4) error {
	mask := ack.SubnetMask()
	if mask == nil {
		mask = ack.YourIPAddr.DefaultMask()
	}
	addr := &net.IPNet{IP: ack.YourIPAddr.To4(), Mask: mask}
	if addr.IP == nil || addr.IP.IsUnspecified() {
		return fmt.Errorf("DHCP lease without an address (yiaddr %s)", ack.YourIPAddr)
	}
	if err := h.AddrReplace(link, &netlink.Addr{IPNet: addr}); err != nil {
		return fmt.Errorf("leased address %s: %w", addr, err)
	}
	if gw := ack.Router(); len(gw) > 0 {
		if err := h.RouteReplace(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw[0]}); err != nil {
			return fmt.Errorf("default route via %s (DHCP router): %w", gw[0], err)
		}
	}
	return nil
}

// renew keeps the lease until c.Context ends: at T1 (or RenewAfter) a
// renewal; a failed one is retried at half the wait, at least a minute.
func (c Config) renew(h *netlink.Handle, client *nclient4.Client, link netlink.Link, lease *nclient4.Lease) {
	defer h.Close()
	defer client.Close()
	wait := c.RenewAfter
	if wait == 0 {
		wait = renewalTime(lease.ACK)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-c.Context.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(c.Context, c.DHCPTimeout)
		next, err := client.Renew(ctx, lease)
		cancel()
		if err == nil {
			lease = next
			err = applyLease(h, link, next.ACK)
			wait = c.RenewAfter
			if wait == 0 {
				wait = renewalTime(lease.ACK)
			}
		} else if c.RenewAfter == 0 {
			wait = max(wait/2, time.Minute)
		}
		if err != nil && c.OnRenewError != nil && c.Context.Err() == nil {
			c.OnRenewError(fmt.Errorf("guestnet: renew DHCP lease on %s: %w", link.Attrs().Name, err))
		}
		t.Reset(wait)
	}
}

// renewalTime is the lease's T1: the renewal time option, else half the
// lease time (RFC 2131 4.4.5), at least a minute.
func renewalTime(ack *dhcpv4.DHCPv4) time.Duration {
	t1 := ack.IPAddressRenewalTime(0)
	if t1 == 0 {
		t1 = ack.IPAddressLeaseTime(0) / 2
	}
	if t1 == 0 {
		t1 = 30 * time.Minute
	}
	return max(t1, time.Minute)
}

// writeResolvConf replaces path with one nameserver line each, atomically
// (a temporary file renamed over it).
func writeResolvConf(path string, servers []net.IP) error {
	var b strings.Builder
	for _, s := range servers {
		fmt.Fprintf(&b, "nameserver %s\n", s)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("guestnet: %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, ".resolv.conf-*")
	if err != nil {
		return fmt.Errorf("guestnet: write %s: %w", path, err)
	}
	_, err = f.WriteString(b.String())
	err = errors.Join(err, f.Chmod(0o644), f.Close())
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("guestnet: write %s: %w", path, err)
	}
	return nil
}
