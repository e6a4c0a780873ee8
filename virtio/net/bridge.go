// Attaching the TAP to a host bridge (`--net tap=NAME,bridge=BRIDGE`), so
// the guest is on the bridge's network without a script around hpcvmm.

package net

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// CheckBridge checks, before anything changes, that bridge exists and is a
// Linux bridge, and that TAP tap, when it exists already, is on it:
// hpcvmm attaches only a TAP it creates (which the kernel removes, and with
// it its bridge port, when hpcvmm exits or is killed), and never moves a
// TAP someone else set up.
func CheckBridge(tap, bridge string) error {
	if err := ValidateTAPName(bridge); err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return fmt.Errorf("bridge %s does not exist: create it first (ip link add %s type bridge; ip link set %s up)", bridge, bridge, bridge)
		}
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	if br.Type() != "bridge" {
		return fmt.Errorf("bridge %s is a %s interface, not a bridge", bridge, br.Type())
	}
	l, err := netlink.LinkByName(tap)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil // hpcvmm creates it and attaches it
		}
		return fmt.Errorf("tap %s: %w", tap, err)
	}
	if l.Attrs().MasterIndex != br.Attrs().Index {
		return fmt.Errorf("tap %s exists and is not on bridge %s: hpcvmm attaches only a TAP it creates; attach it yourself (ip link set %s master %s) or choose a new TAP name", tap, bridge, tap, bridge)
	}
	return nil
}

// SetBridge makes the TAP, which hpcvmm created, a port of bridge; an
// existing TAP must already be on it (CheckBridge).
func (t *TAP) SetBridge(bridge string) error {
	br, err := netlink.LinkByName(bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", bridge, err)
	}
	l, err := netlink.LinkByName(t.name)
	if err != nil {
		return fmt.Errorf("tap %s: %w", t.name, err)
	}
	if l.Attrs().MasterIndex == br.Attrs().Index {
		return nil
	}
	if !t.created {
		return fmt.Errorf("tap %s is not on bridge %s and hpcvmm did not create it: attach it yourself (ip link set %s master %s)", t.name, bridge, t.name, bridge)
	}
	if err := netlink.LinkSetMasterByIndex(l, br.Attrs().Index); err != nil {
		return fmt.Errorf("tap %s: attach to bridge %s: %w", t.name, bridge, err)
	}
	return nil
}

// OpenVMTAP opens the TAP of one VM interface as `hpcvmm run --net
// tap=NAME[,bridge=BRIDGE]` does. A TAP that exists (a persistent one the
// Prolog made for this user with `hpcvmm bind --tap`) is attached to with
// TUNSETIFF only, which its owner may do without CAP_NET_ADMIN: no netlink
// link change, its bridge checked and never changed, and it is left in
// place on Close for the Epilog to delete. A missing one is created (which
// needs CAP_NET_ADMIN), brought up and made a port of bridge, and goes away
// with Close. Call CheckBridge for every interface first.
func OpenVMTAP(name string, queues int, bridge string) (*TAP, error) {
	tap, err := OpenTAP(name, queues)
	if err != nil {
		return nil, err
	}
	if bridge != "" {
		if err := tap.SetBridge(bridge); err != nil {
			tap.Close() // a TAP hpcvmm created goes away with it
			return nil, err
		}
	}
	return tap, nil
}
