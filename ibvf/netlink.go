package ibvf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Identity is what a PF reports about one of its VFs.
type Identity struct {
	NodeGUID, PortGUID GUID
	Link               LinkState
}

// Netlink reads and sets VF identities on a PF's netdev. System is the
// kernel's; hoststate's tests give a recording fake.
type Netlink interface {
	// Identity reads VF vf's GUIDs and link state from netdev.
	Identity(netdev string, vf int) (Identity, error)
	// SetNodeGUID, SetPortGUID and SetLinkState each send one message.
	SetNodeGUID(netdev string, vf int, g GUID) error
	SetPortGUID(netdev string, vf int, g GUID) error
	SetLinkState(netdev string, vf int, s LinkState) error
}

// System talks to the kernel in the calling thread's network namespace,
// each call through a Conn of its own (opened and closed around it): for
// `hpcvmm bind`/`unbind` and the VM's setup, which run without a seccomp
// filter. What runs under the filter (the VM's teardown) uses a Conn
// opened before it.
type System struct{}

// ErrGUIDsNotReported means the kernel gave the VF's link state but not its
// GUIDs: its driver has no ndo_get_vf_guid (mlx5 reports them since Linux
// 5.5), so the values to restore are unknown.
var ErrGUIDsNotReported = errors.New("the kernel does not report this VF's GUIDs (IFLA_VF_IB_NODE_GUID missing in RTM_GETLINK; mlx5 reports them since Linux 5.5)")

// with runs f on a Conn opened for it.
func with(f func(*Conn) error) error {
	c, err := Open()
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// Identity implements Netlink (see Conn.Identity).
func (System) Identity(netdev string, vf int) (id Identity, err error) {
	err = with(func(c *Conn) error { id, err = c.Identity(netdev, vf); return err })
	return id, err
}

// SetNodeGUID implements Netlink (see Conn.SetNodeGUID).
func (System) SetNodeGUID(netdev string, vf int, g GUID) error {
	return with(func(c *Conn) error { return c.SetNodeGUID(netdev, vf, g) })
}

// SetPortGUID implements Netlink (see Conn.SetPortGUID).
func (System) SetPortGUID(netdev string, vf int, g GUID) error {
	return with(func(c *Conn) error { return c.SetPortGUID(netdev, vf, g) })
}

// SetLinkState implements Netlink (see Conn.SetLinkState).
func (System) SetLinkState(netdev string, vf int, s LinkState) error {
	return with(func(c *Conn) error { return c.SetLinkState(netdev, vf, s) })
}

// identityFromNewLink decodes VF vf from an RTM_NEWLINK message's payload
// (the ifinfomsg and its attributes, after the nlmsghdr).
func identityFromNewLink(payload []byte, vf int) (Identity, error) {
	if len(payload) < unix.SizeofIfInfomsg {
		return Identity{}, fmt.Errorf("RTM_NEWLINK of %d bytes, shorter than an ifinfomsg", len(payload))
	}
	return decodeVFIdentity(payload[unix.SizeofIfInfomsg:], vf)
}

// rtextFilterSkipStats is linux/rtnetlink.h's RTEXT_FILTER_SKIP_STATS
// (Linux 4.19), which neither x/sys/unix nor vishvananda/netlink's nl
// defines.
const rtextFilterSkipStats = 1 << 3

// vfFirst are the IFLA_VF_INFO attributes whose payload is a struct
// ifla_vf_* that begins with __u32 vf. The others do not: IFLA_VF_STATS and
// IFLA_VF_VLAN_LIST are nests (their first u32 is an attribute header: the
// stats nest's reads as 12), IFLA_VF_BROADCAST is 32 address bytes. Reading
// the VF number from any attribute made VF 12 match VF 0's entry (issue 23).
// The value is the struct's size, the least a payload may have.
var vfFirst = map[uint16]int{
	nl.IFLA_VF_MAC:          4,
	nl.IFLA_VF_VLAN:         4,
	nl.IFLA_VF_TX_RATE:      4,
	nl.IFLA_VF_SPOOFCHK:     4,
	nl.IFLA_VF_LINK_STATE:   8,
	nl.IFLA_VF_RATE:         4,
	nl.IFLA_VF_RSS_QUERY_EN: 4,
	nl.IFLA_VF_TRUST:        4,
	nl.IFLA_VF_IB_NODE_GUID: 16,
	nl.IFLA_VF_IB_PORT_GUID: 16,
}

// decodeVFIdentity finds VF vf in a link message's attributes:
// IFLA_VFINFO_LIST → IFLA_VF_INFO → IFLA_VF_LINK_STATE {u32 vf; u32
// link_state} and IFLA_VF_IB_NODE_GUID/PORT_GUID {u32 vf; u64 guid}, the
// u64 8-aligned (offset 8), all in host byte order. An IFLA_VF_INFO's VF
// number is read only from the attributes that carry one (vfFirst), and
// they must agree.
func decodeVFIdentity(attrs []byte, vf int) (Identity, error) {
	top, err := nl.ParseRouteAttr(attrs)
	if err != nil {
		return Identity{}, err
	}
	for _, a := range top {
		if a.Attr.Type != unix.IFLA_VFINFO_LIST {
			continue
		}
		infos, err := nl.ParseRouteAttr(a.Value)
		if err != nil {
			return Identity{}, err
		}
		for _, info := range infos {
			if info.Attr.Type != nl.IFLA_VF_INFO {
				continue
			}
			fields, err := nl.ParseRouteAttr(info.Value)
			if err != nil {
				return Identity{}, err
			}
			num, known := -1, false
			for _, f := range fields {
				size, ok := vfFirst[f.Attr.Type]
				if !ok {
					continue
				}
				if len(f.Value) < size {
					return Identity{}, fmt.Errorf("IFLA_VF_INFO attribute %d of %d bytes, shorter than its struct (%d)", f.Attr.Type, len(f.Value), size)
				}
				n := int(binary.NativeEndian.Uint32(f.Value[0:4]))
				if known && n != num {
					return Identity{}, fmt.Errorf("IFLA_VF_INFO with attributes for VF %d and VF %d", num, n)
				}
				num, known = n, true
			}
			if !known || num != vf {
				continue
			}
			var id Identity
			var haveLink, haveNode, havePort bool
			for _, f := range fields {
				switch f.Attr.Type {
				case nl.IFLA_VF_LINK_STATE:
					id.Link, haveLink = LinkState(binary.NativeEndian.Uint32(f.Value[4:8])), true
				case nl.IFLA_VF_IB_NODE_GUID:
					id.NodeGUID, haveNode = GUID(binary.NativeEndian.Uint64(f.Value[8:16])), true
				case nl.IFLA_VF_IB_PORT_GUID:
					id.PortGUID, havePort = GUID(binary.NativeEndian.Uint64(f.Value[8:16])), true
				}
			}
			if !haveLink {
				return Identity{}, errors.New("no IFLA_VF_LINK_STATE in the PF's answer")
			}
			if !haveNode || !havePort {
				return Identity{}, ErrGUIDsNotReported
			}
			return id, nil
		}
	}
	return Identity{}, errors.New("the PF reports no such VF (is sriov_numvfs large enough?)")
}
