package ibvf

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
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

// System talks to the kernel in the calling thread's network namespace.
type System struct{}

func link(netdev string) (netlink.Link, error) {
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		return nil, fmt.Errorf("ibvf: netdev %s: %w", netdev, err)
	}
	return l, nil
}

// ErrGUIDsNotReported means the kernel gave the VF's link state but not its
// GUIDs: its driver has no ndo_get_vf_guid (mlx5 reports them since Linux
// 5.5), so the values to restore are unknown.
var ErrGUIDsNotReported = errors.New("the kernel does not report this VF's GUIDs (IFLA_VF_IB_NODE_GUID missing in RTM_GETLINK; mlx5 reports them since Linux 5.5)")

// Identity implements Netlink: an RTM_GETLINK with RTEXT_FILTER_VF, its
// IFLA_VFINFO_LIST decoded for VF vf.
func (System) Identity(netdev string, vf int) (Identity, error) {
	l, err := link(netdev)
	if err != nil {
		return Identity{}, err
	}
	req := nl.NewNetlinkRequest(unix.RTM_GETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(l.Attrs().Index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(nl.RTEXT_FILTER_VF)))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return Identity{}, fmt.Errorf("ibvf: RTM_GETLINK %s: %w", netdev, err)
	}
	if len(msgs) != 1 || len(msgs[0]) < unix.SizeofIfInfomsg {
		return Identity{}, fmt.Errorf("ibvf: RTM_GETLINK %s: %d answers", netdev, len(msgs))
	}
	id, err := decodeVFIdentity(msgs[0][unix.SizeofIfInfomsg:], vf)
	if err != nil {
		return Identity{}, fmt.Errorf("ibvf: netdev %s VF %d: %w", netdev, vf, err)
	}
	return id, nil
}

// decodeVFIdentity finds VF vf in a link message's attributes:
// IFLA_VFINFO_LIST → IFLA_VF_INFO → IFLA_VF_LINK_STATE {u32 vf; u32
// link_state} and IFLA_VF_IB_NODE_GUID/PORT_GUID {u32 vf; u64 guid}, the
// u64 8-aligned (offset 8), all in host byte order.
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
			var id Identity
			var haveLink, haveNode, havePort, match bool
			for _, f := range fields {
				if len(f.Value) < 4 {
					continue
				}
				if binary.NativeEndian.Uint32(f.Value[0:4]) != uint32(vf) {
					continue
				}
				switch f.Attr.Type {
				case nl.IFLA_VF_LINK_STATE:
					if len(f.Value) >= 8 {
						id.Link, haveLink, match = LinkState(binary.NativeEndian.Uint32(f.Value[4:8])), true, true
					}
				case nl.IFLA_VF_IB_NODE_GUID:
					if len(f.Value) >= 16 {
						id.NodeGUID, haveNode, match = GUID(binary.NativeEndian.Uint64(f.Value[8:16])), true, true
					}
				case nl.IFLA_VF_IB_PORT_GUID:
					if len(f.Value) >= 16 {
						id.PortGUID, havePort, match = GUID(binary.NativeEndian.Uint64(f.Value[8:16])), true, true
					}
				default:
					match = true // IFLA_VF_MAC and the rest start with the VF number too
				}
			}
			if !match {
				continue
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

// SetNodeGUID implements Netlink with netlink.LinkSetVfNodeGUID.
func (System) SetNodeGUID(netdev string, vf int, g GUID) error {
	l, err := link(netdev)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfNodeGUID(l, vf, g.hardwareAddr()); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set node GUID %s: %w", netdev, vf, g, err)
	}
	return nil
}

// SetPortGUID implements Netlink with netlink.LinkSetVfPortGUID.
func (System) SetPortGUID(netdev string, vf int, g GUID) error {
	l, err := link(netdev)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfPortGUID(l, vf, g.hardwareAddr()); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set port GUID %s: %w", netdev, vf, g, err)
	}
	return nil
}

// SetLinkState implements Netlink with netlink.LinkSetVfState.
func (System) SetLinkState(netdev string, vf int, s LinkState) error {
	l, err := link(netdev)
	if err != nil {
		return err
	}
	if err := netlink.LinkSetVfState(l, vf, uint32(s)); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set link state %s: %w", netdev, vf, s, err)
	}
	return nil
}
