package ibvf

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

func TestParseGUID(t *testing.T) {
	for in, want := range map[string]GUID{
		"02:1a:2b:3c:4d:5e:6f:70": 0x021a2b3c4d5e6f70,
		"0x021A2B3C4D5E6F70":      0x021a2b3c4d5e6f70,
		"021a2b3c4d5e6f70":        0x021a2b3c4d5e6f70,
	} {
		g, err := ParseGUID(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, g)
		assert.Equal(t, "02:1a:2b:3c:4d:5e:6f:70", g.String())
	}
	for _, bad := range []string{"", "02:1a", "02:1a:2b:3c:4d:5e:6f:7g", "00:00:00:00:00:00:00:00", "ff:ff:ff:ff:ff:ff:ff:ff", "0x12", "02:1a:2b:3c:4d:5e:6f:700"} {
		_, err := ParseGUID(bad)
		assert.Error(t, err, bad)
	}
}

func TestDeriveDeterministicUniqueLocal(t *testing.T) {
	vf := host.BDF{Bus: 0x41, Function: 1}
	seed := Seed{Cluster: "c", Job: "1234", Node: "n1"}
	n1, p1 := Derive(seed, vf)
	n2, p2 := Derive(seed, vf)
	assert.Equal(t, n1, n2, "same job, node and VF: same GUIDs")
	assert.Equal(t, p1, p2)
	seen := map[GUID]string{}
	for _, job := range []string{"1234", "1235"} {
		for _, node := range []string{"n1", "n2", "n10"} {
			for fn := 0; fn < 8; fn++ {
				for _, cluster := range []string{"c", "d"} {
					n, p := Derive(Seed{Cluster: cluster, Job: job, Node: node}, host.BDF{Bus: 0x41, Function: uint8(fn)})
					for _, g := range []GUID{n, p} {
						key := cluster + "/" + job + "/" + node + "/" + string(rune('0'+fn))
						require.NotContains(t, seen, g, "GUID %s of %s also derived for %s", g, key, seen[g])
						seen[g] = key
						b := uint64(g) >> 56
						assert.Equal(t, uint64(0x02), b&0x03, "locally administered, individual: %s", g)
					}
				}
			}
		}
	}
	assert.Len(t, seen, 2*2*3*8*2)
}

func TestSettings(t *testing.T) {
	var s Settings
	ok, err := s.Set("node-guid", "02:00:00:00:00:00:00:01")
	require.True(t, ok)
	require.NoError(t, err)
	_, err = s.Set("guid", "auto")
	assert.ErrorContains(t, err, "exclude each other")
	ok, _ = s.Set("clique", "1")
	assert.False(t, ok)
	var l Settings
	_, err = l.Set("link", "up")
	assert.ErrorContains(t, err, "want auto, enable or disable")
	var a Settings
	_, err = a.Set("guid", "yes")
	assert.ErrorContains(t, err, "the only value is auto")
	_, err = a.Set("guid", "auto")
	require.NoError(t, err)
	assert.ErrorContains(t, a.Resolve(Seed{}, host.BDF{}), "SLURM_JOB_ID")
	require.NoError(t, a.Resolve(Seed{Job: "1", Node: "n"}, host.BDF{Bus: 1}))
	assert.NotZero(t, a.NodeGUID)
	assert.NotEqual(t, a.NodeGUID, a.PortGUID)
}

// ibHost is a node with an InfiniBand PF (IPoIB netdev ib0), an Ethernet
// PF, and a PF whose ib_ipoib is not loaded, each with a VF.
func ibHost(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	for _, d := range []hosttest.Device{
		{BDF: "0000:41:00.0", Vendor: 0x15b3, DeviceID: 0x101b, Class: 0x020700, Driver: "mlx5_core", IOMMUGroup: 30},
		{BDF: "0000:41:00.3", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "vfio-pci", IOMMUGroup: 43},
		{BDF: "0000:42:00.0", Vendor: 0x15b3, DeviceID: 0x101d, Class: 0x020000, Driver: "mlx5_core", IOMMUGroup: 31},
		{BDF: "0000:42:00.1", Vendor: 0x15b3, DeviceID: 0x101e, Class: 0x020000, Driver: "vfio-pci", IOMMUGroup: 44},
		{BDF: "0000:43:00.0", Vendor: 0x15b3, DeviceID: 0x101b, Class: 0x020700, Driver: "mlx5_core", IOMMUGroup: 32},
		{BDF: "0000:43:00.1", Vendor: 0x15b3, DeviceID: 0x101c, Class: 0x020700, Driver: "vfio-pci", IOMMUGroup: 45},
	} {
		tr.AddDevice(d)
	}
	tr.LinkVF("0000:41:00.0", "0000:41:00.3", 2)
	tr.NetInterface("0000:41:00.0", "ib0", 32)
	tr.RDMADevice("0000:41:00.0", "mlx5_0", "InfiniBand")
	tr.LinkVF("0000:42:00.0", "0000:42:00.1", 0)
	tr.NetInterface("0000:42:00.0", "eth2", 1)
	tr.RDMADevice("0000:42:00.0", "mlx5_1", "Ethernet")
	tr.LinkVF("0000:43:00.0", "0000:43:00.1", 0)
	tr.RDMADevice("0000:43:00.0", "mlx5_2", "InfiniBand")
	return tr
}

func TestLocate(t *testing.T) {
	h := ibHost(t).Host()
	bdf := func(s string) host.BDF { b, err := host.ParseBDF(s); require.NoError(t, err); return b }
	tg, err := Locate(h, bdf("0000:41:00.3"))
	require.NoError(t, err)
	assert.Equal(t, Target{VF: bdf("0000:41:00.3"), PF: bdf("0000:41:00.0"), Netdev: "ib0", Index: 2, RDMADevice: "mlx5_0", LinkLayer: "InfiniBand"}, tg)

	_, err = Locate(h, bdf("0000:42:00.1"))
	assert.ErrorContains(t, err, "PF 0000:42:00.0 of VF 0000:42:00.1 is not InfiniBand (netdev [eth2 type 1], not type 32, link layer Ethernet)")
	_, err = Locate(h, bdf("0000:43:00.1"))
	assert.ErrorContains(t, err, "has no network interface")
	assert.ErrorContains(t, err, "modprobe ib_ipoib")
	_, err = Locate(h, bdf("0000:41:00.0"))
	assert.ErrorContains(t, err, "not an SR-IOV virtual function")
}

// vfInfo builds one IFLA_VF_INFO as the kernel's rtnl_fill_vfinfo does.
func vfInfo(vf uint32, link uint32, node, port uint64, guids bool) *nl.RtAttr {
	info := nl.NewRtAttr(nl.IFLA_VF_INFO, nil)
	mac := make([]byte, 36)
	binary.NativeEndian.PutUint32(mac, vf)
	info.AddRtAttr(nl.IFLA_VF_MAC, mac)
	ls := make([]byte, 8)
	binary.NativeEndian.PutUint32(ls, vf)
	binary.NativeEndian.PutUint32(ls[4:], link)
	info.AddRtAttr(nl.IFLA_VF_LINK_STATE, ls)
	if guids {
		for typ, g := range map[int]uint64{nl.IFLA_VF_IB_NODE_GUID: node, nl.IFLA_VF_IB_PORT_GUID: port} {
			b := make([]byte, 16)
			binary.NativeEndian.PutUint32(b, vf)
			binary.NativeEndian.PutUint64(b[8:], g)
			info.AddRtAttr(typ, b)
		}
	}
	return info
}

func TestDecodeVFIdentity(t *testing.T) {
	list := nl.NewRtAttr(unix.IFLA_VFINFO_LIST, nil)
	list.AddChild(vfInfo(0, 0, 0, 0, true))
	list.AddChild(vfInfo(1, 1, 0x0211, 0x0222, true))
	attrs := append(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(2044)).Serialize(), list.Serialize()...)
	id, err := decodeVFIdentity(attrs, 1)
	require.NoError(t, err)
	assert.Equal(t, Identity{NodeGUID: 0x0211, PortGUID: 0x0222, Link: LinkEnable}, id)
	id, err = decodeVFIdentity(attrs, 0)
	require.NoError(t, err)
	assert.Equal(t, Identity{}, id)
	_, err = decodeVFIdentity(attrs, 5)
	assert.ErrorContains(t, err, "no such VF")

	old := nl.NewRtAttr(unix.IFLA_VFINFO_LIST, nil)
	old.AddChild(vfInfo(0, 0, 0, 0, false))
	_, err = decodeVFIdentity(old.Serialize(), 0)
	assert.ErrorIs(t, err, ErrGUIDsNotReported)
}
