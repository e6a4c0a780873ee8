package ibvf

import (
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Conn is one rtnetlink (NETLINK_ROUTE) socket, opened by Open in the
// network namespace of the calling thread and bound there for its life,
// through which every message of its methods goes. The VM opens one before
// its seccomp filter goes on and restores VF identities through it at
// teardown: the process filter has no socket(2) (a compromised thread must
// not open sockets), only sendto, recvfrom and getsockname on this
// socket's descriptor (FD), which is all a request on an open socket
// takes (vishvananda/netlink's nl.NetlinkSocket: sendto, recvfrom, and
// getsockname for the port ID the answers are matched against; its waits
// are the runtime poller's, registered when the socket was opened).
//
// The messages are built with vishvananda/netlink's nl package, as its
// LinkSetVfNodeGUID, LinkSetVfPortGUID and LinkSetVfState build them (one
// attribute per RTM_SETLINK), and executed on this socket (a
// netlink.Handle would do the same, but keeps its socket's descriptor to
// itself, and the filter needs it). Conn implements Netlink; its methods
// are safe for concurrent use (the socket is locked per request).
type Conn struct {
	s     *nl.NetlinkSocket
	socks map[int]*nl.SocketHandle
}

// Open opens an rtnetlink socket in the calling thread's network
// namespace. Call it before a seccomp filter that has no socket(2).
func Open() (*Conn, error) {
	s, err := nl.GetNetlinkSocketAt(netns.None(), netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("ibvf: open an rtnetlink socket: %w", err)
	}
	// The timeouts nl gives the sockets it opens per request: a kernel
	// that never answers fails the request instead of hanging teardown.
	_ = s.SetSendTimeout(&nl.SocketTimeoutTv)
	_ = s.SetReceiveTimeout(&nl.SocketTimeoutTv)
	return &Conn{s: s, socks: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}}, nil
}

// FD is the socket's descriptor, for the seccomp filter's argument rule.
func (c *Conn) FD() int { return c.s.GetFd() }

// Close closes the socket.
func (c *Conn) Close() error {
	c.s.Close()
	return nil
}

// request starts a message that Execute sends on c's socket.
func (c *Conn) request(typ int) *nl.NetlinkRequest {
	req := nl.NewNetlinkRequest(typ, unix.NLM_F_ACK)
	req.Sockets = c.socks
	return req
}

// getLink sends RTM_GETLINK for netdev by name (IFLA_IFNAME: no lookup of
// the index first) with ext mask extMask and returns the RTM_NEWLINK
// payload.
func (c *Conn) getLink(netdev string, extMask uint32) ([]byte, error) {
	if netdev == "" || len(netdev) > 15 {
		return nil, fmt.Errorf("ibvf: netdev %q: not an interface name", netdev)
	}
	req := c.request(unix.RTM_GETLINK)
	req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
	req.AddData(nl.NewRtAttr(unix.IFLA_EXT_MASK, nl.Uint32Attr(extMask)))
	req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(netdev)))
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWLINK)
	if err != nil {
		return nil, fmt.Errorf("ibvf: netdev %s: RTM_GETLINK: %w", netdev, err)
	}
	if len(msgs) != 1 {
		return nil, fmt.Errorf("ibvf: netdev %s: RTM_GETLINK: %d answers", netdev, len(msgs))
	}
	if len(msgs[0]) < unix.SizeofIfInfomsg {
		return nil, fmt.Errorf("ibvf: netdev %s: RTM_NEWLINK of %d bytes, shorter than an ifinfomsg", netdev, len(msgs[0]))
	}
	return msgs[0], nil
}

// Identity implements Netlink: an RTM_GETLINK with RTEXT_FILTER_VF and
// RTEXT_FILTER_SKIP_STATS, its IFLA_VFINFO_LIST decoded for VF vf.
func (c *Conn) Identity(netdev string, vf int) (Identity, error) {
	// Without the statistics the answer is smaller and carries nothing
	// this package does not read (rtnl_fill_vfinfo skips IFLA_VF_STATS).
	m, err := c.getLink(netdev, nl.RTEXT_FILTER_VF|rtextFilterSkipStats)
	if err != nil {
		return Identity{}, err
	}
	id, err := identityFromNewLink(m, vf)
	if err != nil {
		return Identity{}, fmt.Errorf("ibvf: netdev %s VF %d: %w", netdev, vf, err)
	}
	return id, nil
}

// index returns netdev's interface index.
func (c *Conn) index(netdev string) (int32, error) {
	m, err := c.getLink(netdev, rtextFilterSkipStats)
	if err != nil {
		return 0, err
	}
	idx := nl.DeserializeIfInfomsg(m).Index
	if idx <= 0 {
		return 0, fmt.Errorf("ibvf: netdev %s: RTM_NEWLINK with interface index %d", netdev, idx)
	}
	return idx, nil
}

// setVF sends one RTM_SETLINK to netdev carrying IFLA_VFINFO_LIST →
// IFLA_VF_INFO → attribute typ with payload: one attribute per message,
// because the kernel's do_setvfinfo returns after the first GUID in a nest.
func (c *Conn) setVF(netdev string, typ int, payload []byte) error {
	idx, err := c.index(netdev)
	if err != nil {
		return err
	}
	req := c.request(unix.RTM_SETLINK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = idx
	req.AddData(msg)
	list := nl.NewRtAttr(unix.IFLA_VFINFO_LIST, nil)
	info := list.AddRtAttr(nl.IFLA_VF_INFO, nil)
	info.AddRtAttr(typ, payload)
	req.AddData(list)
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// SetNodeGUID implements Netlink: IFLA_VF_IB_NODE_GUID.
func (c *Conn) SetNodeGUID(netdev string, vf int, g GUID) error {
	m := nl.VfGUID{Vf: uint32(vf), GUID: uint64(g)}
	if err := c.setVF(netdev, nl.IFLA_VF_IB_NODE_GUID, m.Serialize()); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set node GUID %s: %w", netdev, vf, g, err)
	}
	return nil
}

// SetPortGUID implements Netlink: IFLA_VF_IB_PORT_GUID.
func (c *Conn) SetPortGUID(netdev string, vf int, g GUID) error {
	m := nl.VfGUID{Vf: uint32(vf), GUID: uint64(g)}
	if err := c.setVF(netdev, nl.IFLA_VF_IB_PORT_GUID, m.Serialize()); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set port GUID %s: %w", netdev, vf, g, err)
	}
	return nil
}

// SetLinkState implements Netlink: IFLA_VF_LINK_STATE.
func (c *Conn) SetLinkState(netdev string, vf int, s LinkState) error {
	m := nl.VfLinkState{Vf: uint32(vf), LinkState: uint32(s)}
	if err := c.setVF(netdev, nl.IFLA_VF_LINK_STATE, m.Serialize()); err != nil {
		return fmt.Errorf("ibvf: %s VF %d: set link state %s: %w", netdev, vf, s, err)
	}
	return nil
}
