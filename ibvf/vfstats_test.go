package ibvf

import (
	"encoding/binary"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// nla appends one netlink attribute as the kernel's nla_put does: a 4-byte
// header {u16 len; u16 type} (len without the padding), the payload, zero
// padding to 4 bytes.
func nla(b []byte, typ uint16, payload []byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(payload)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, payload...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// vfStruct is one of if_link.h's struct ifla_vf_* that begin with __u32 vf,
// size bytes in all, the rest filled by fill.
func vfStruct(vf uint32, size int, fill func([]byte)) []byte {
	s := make([]byte, size)
	binary.NativeEndian.PutUint32(s, vf)
	if fill != nil {
		fill(s)
	}
	return s
}

// kernelVFInfo lays out one IFLA_VF_INFO as Linux 6.x's rtnl_fill_vfinfo
// (net/core/rtnetlink.c) does for an mlx5 IPoIB PF without
// RTEXT_FILTER_SKIP_STATS: MAC (struct ifla_vf_mac, 36 bytes), BROADCAST
// (struct ifla_vf_broadcast, 32 bytes, no vf field), VLAN (12), RATE (12),
// TX_RATE (8), SPOOFCHK (8), LINK_STATE (8), RSS_QUERY_EN (8), TRUST (8),
// IB_NODE_GUID and IB_PORT_GUID (16: the u64 8-aligned), the nested
// VLAN_LIST {IFLA_VF_VLAN_INFO (16)}, and the nested STATS whose u64
// counters nla_put_u64_64bit writes unpadded on x86-64 (efficient unaligned
// access): 12-byte attributes, so the nest's first u32 is 12.
func kernelVFInfo(vf uint32, link uint32, node, port uint64) []byte {
	const (
		vfMAC, vfVLAN, vfTxRate, vfSpoofchk, vfLinkState, vfRate, vfRSS = 1, 2, 3, 4, 5, 6, 7
		vfStats, vfTrust, vfNodeGUID, vfPortGUID, vfVLANList, vfBcast   = 8, 9, 10, 11, 12, 13
		vfVLANInfo                                                      = 1
	)
	var in []byte
	in = nla(in, vfMAC, vfStruct(vf, 36, func(s []byte) { copy(s[4:], []byte{0, 0, 0, 0, 0, 0}) }))
	in = nla(in, vfBcast, make([]byte, 32))
	in = nla(in, vfVLAN, vfStruct(vf, 12, nil))
	in = nla(in, vfRate, vfStruct(vf, 12, nil))
	in = nla(in, vfTxRate, vfStruct(vf, 8, nil))
	in = nla(in, vfSpoofchk, vfStruct(vf, 8, func(s []byte) { binary.NativeEndian.PutUint32(s[4:], 1) }))
	in = nla(in, vfLinkState, vfStruct(vf, 8, func(s []byte) { binary.NativeEndian.PutUint32(s[4:], link) }))
	in = nla(in, vfRSS, vfStruct(vf, 8, nil))
	in = nla(in, vfTrust, vfStruct(vf, 8, nil))
	in = nla(in, vfNodeGUID, vfStruct(vf, 16, func(s []byte) { binary.NativeEndian.PutUint64(s[8:], node) }))
	in = nla(in, vfPortGUID, vfStruct(vf, 16, func(s []byte) { binary.NativeEndian.PutUint64(s[8:], port) }))
	in = nla(in, vfVLANList, nla(nil, vfVLANInfo, vfStruct(vf, 16, func(s []byte) {
		binary.BigEndian.PutUint16(s[12:], 0x8100)
	})))
	var stats []byte
	for typ := uint16(0); typ <= 8; typ++ {
		if typ == 6 { // IFLA_VF_STATS_PAD: only written where u64s need padding
			continue
		}
		stats = nla(stats, typ, binary.NativeEndian.AppendUint64(nil, uint64(1000*vf+uint32(typ))))
	}
	in = nla(in, vfStats, stats)
	return nla(nil, 1 /* IFLA_VF_INFO */, in)
}

// kernelNewLink is a whole RTM_NEWLINK message for an IPoIB PF with n VFs,
// as the kernel answers an RTM_GETLINK with RTEXT_FILTER_VF: nlmsghdr,
// ifinfomsg, IFLA_IFNAME, IFLA_MTU, IFLA_NUM_VF, IFLA_VFINFO_LIST. VF i has
// link state i%3 and GUIDs 0x1000+i (node) and 0x2000+i (port).
func kernelNewLink(n int) []byte {
	var attrs []byte
	attrs = nla(attrs, 3 /* IFLA_IFNAME */, []byte("ib0\x00"))
	attrs = nla(attrs, 4 /* IFLA_MTU */, binary.NativeEndian.AppendUint32(nil, 2044))
	attrs = nla(attrs, 21 /* IFLA_NUM_VF */, binary.NativeEndian.AppendUint32(nil, uint32(n)))
	var list []byte
	for i := 0; i < n; i++ {
		list = append(list, kernelVFInfo(uint32(i), uint32(i%3), 0x1000+uint64(i), 0x2000+uint64(i))...)
	}
	attrs = nla(attrs, 22 /* IFLA_VFINFO_LIST */, list)
	ifi := make([]byte, 16) // struct ifinfomsg
	ifi[0] = syscall.AF_UNSPEC
	binary.NativeEndian.PutUint16(ifi[2:], 32) // ARPHRD_INFINIBAND
	binary.NativeEndian.PutUint32(ifi[4:], 7)  // ifindex
	hdr := make([]byte, 16)                    // struct nlmsghdr
	binary.NativeEndian.PutUint32(hdr, uint32(16+len(ifi)+len(attrs)))
	binary.NativeEndian.PutUint16(hdr[4:], syscall.RTM_NEWLINK)
	return append(append(hdr, ifi...), attrs...)
}

// TestIdentityEveryVFWithStats is issue 23's defect 6: with IFLA_VF_STATS
// in every VF's info (the kernel sends it unless asked with
// RTEXT_FILTER_SKIP_STATS), the stats nest's first attribute header (length
// 12, type 0) must not read as VF 12.
func TestIdentityEveryVFWithStats(t *testing.T) {
	const n = 24
	msgs, err := syscall.ParseNetlinkMessage(kernelNewLink(n))
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	for vf := 0; vf < n; vf++ {
		t.Run(fmt.Sprint("VF", vf), func(t *testing.T) {
			id, err := identityFromNewLink(msgs[0].Data, vf)
			require.NoError(t, err)
			assert.Equal(t, Identity{NodeGUID: GUID(0x1000 + vf), PortGUID: GUID(0x2000 + vf), Link: LinkState(vf % 3)}, id)
		})
	}
	_, err = identityFromNewLink(msgs[0].Data, n)
	assert.ErrorContains(t, err, "no such VF")
}
