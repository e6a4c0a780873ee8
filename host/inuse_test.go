package host_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// usedHost is a node whose devices serve the host in every way DeviceUse
// looks for, with procfs as a live kernel writes it.
func usedHost(t *testing.T) *hosttest.Tree {
	tr := hosttest.New(t)
	for _, d := range []hosttest.Device{
		{BDF: "0000:00:02.0", Vendor: 0x1af4, DeviceID: 0x1001, Class: 0x010000, Driver: "virtio-pci", IOMMUGroup: 2},
		{BDF: "0000:00:03.0", Vendor: 0x1af4, DeviceID: 0x1000, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3},
		{BDF: "0000:00:04.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 4},
		{BDF: "0000:00:05.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 5},
		{BDF: "0000:00:06.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", IOMMUGroup: 6},
		{BDF: "0000:17:00.0", Vendor: 0x10de, DeviceID: 0x2330, Class: 0x030200, Driver: "nvidia", IOMMUGroup: 12},
		{BDF: "0000:3d:00.0", Vendor: 0x144d, DeviceID: 0xa80a, Class: 0x010802, Driver: "nvme", IOMMUGroup: 30},
		{BDF: "0000:5e:00.0", Vendor: 0x144d, DeviceID: 0xa80a, Class: 0x010802, Driver: "nvme", IOMMUGroup: 31},
		{BDF: "0000:5f:00.0", Vendor: 0x144d, DeviceID: 0xa80a, Class: 0x010802, Driver: "nvme", IOMMUGroup: 32},
	} {
		tr.AddDevice(d)
	}
	// Net: the virtio NIC carries the default route, e1000e eth1 is down
	// and unused, eth2 is down but a port of bond0, eth3 is down with an
	// IPv6 address kept (keep_addr_on_down).
	tr.ClassNet("0000:00:03.0", "virtio2/net", "eth0", 0x1003)
	tr.ClassNet("0000:00:04.0", "net", "eth1", 0x1002)
	tr.ClassNet("0000:00:05.0", "net", "eth2", 0x1802)
	tr.Symlink("sys/bus/pci/devices/0000:00:05.0/net/eth2/master", "../../../../virtual/net/bond0")
	tr.ClassNet("0000:00:06.0", "net", "eth3", 0x1002)
	tr.Symlink("sys/class/net/lo", "../../devices/virtual/net/lo")
	tr.Write("sys/devices/virtual/net/lo/flags", "0x9\n")
	tr.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"+
		"eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n")
	tr.Write("proc/net/ipv6_route", "fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n"+
		"00000000000000000000000000000001 80 00000000000000000000000000000000 00 00000000000000000000000000000000 00000000 00000002 00000000 80200001       lo\n")
	tr.Write("proc/net/if_inet6", "00000000000000000000000000000001 01 80 10 80       lo\n"+
		"fe8000000000000000fc00fffe000001 02 40 20 80     eth0\n"+
		"fd000000000000000000000000000007 05 40 00 80     eth3\n")
	// Block: vda is / (mountinfo's source is /dev/root, the device number
	// matches); nvme0n1's partitions are /boot/efi, an LVM PV and swap;
	// nvme1n1 is a native-multipath namespace (its disk under
	// virtual/nvme-subsystem) mounted at "/scratch dir"; nvme2n1 is unused.
	tr.ClassBlock("0000:00:02.0", "virtio1/block", "vda", "254:0")
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0", "nvme0n1", "259:0")
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0/nvme0n1", "nvme0n1p1", "259:1")
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0/nvme0n1", "nvme0n1p2", "259:2", "dm-0")
	tr.ClassBlock("0000:3d:00.0", "nvme/nvme0/nvme0n1", "nvme0n1p3", "259:3")
	tr.Write("sys/bus/pci/devices/0000:5e:00.0/nvme/nvme1/nvme1c1n1/nsid", "1\n")
	tr.Write("sys/devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1/dev", "259:5\n")
	tr.Symlink("sys/class/block/nvme1n1", "../../devices/virtual/nvme-subsystem/nvme-subsys1/nvme1n1")
	tr.ClassBlock("0000:5f:00.0", "nvme/nvme2", "nvme2n1", "259:6")
	tr.Write("sys/devices/virtual/block/loop0/dev", "7:0\n")
	tr.Symlink("sys/class/block/loop0", "../../devices/virtual/block/loop0")
	tr.Write("proc/self/mountinfo", "22 27 0:21 / /proc rw,relatime - proc proc rw\n"+
		"27 1 254:0 / / rw,relatime - ext4 /dev/root rw,discard\n"+
		"30 27 259:1 / /boot/efi rw,relatime shared:5 - vfat /dev/nvme0n1p1 rw\n"+
		"31 27 0:40 / /scratch\\040dir rw,relatime shared:6 - btrfs /dev/nvme1n1 rw\n"+
		"32 27 7:0 / /snap/core rw - squashfs /dev/loop0 ro\n")
	tr.Write("proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/nvme0n1p3                          partition\t8388604\t\t0\t\t-2\n")
	return tr
}

// TestDeviceUse is issue 23's defect 8 at its root: what the host uses a
// PCI function for, read from sysfs and procfs.
func TestDeviceUse(t *testing.T) {
	h := usedHost(t).Host()
	use := func(s string) host.Use {
		b, err := host.ParseBDF(s)
		require.NoError(t, err)
		u, err := h.DeviceUse(b)
		require.NoError(t, err)
		return u
	}
	for _, c := range []struct {
		bdf     string
		reasons []string
	}{
		{"0000:00:02.0", []string{"block device vda (mounted at /)"}},
		{"0000:00:03.0", []string{"network interface eth0 (up; carries the default route; 3 routes; addresses fe80::fc:ff:fe00:1/64)"}},
		{"0000:00:04.0", nil},
		{"0000:00:05.0", []string{"network interface eth2 (a port of bond0)"}},
		{"0000:00:06.0", []string{"network interface eth3 (addresses fd00::7/64)"}},
		{"0000:17:00.0", nil},
		{"0000:3d:00.0", []string{
			"block device nvme0n1p1 (mounted at /boot/efi)",
			"block device nvme0n1p2 (held by dm-0 (LVM, dm-crypt or md RAID))",
			"block device nvme0n1p3 (active swap)",
		}},
		{"0000:5e:00.0", []string{"block device nvme1n1 (mounted at /scratch dir)"}},
		{"0000:5f:00.0", nil},
	} {
		u := use(c.bdf)
		assert.Equal(t, c.reasons, u.Reasons(), c.bdf)
		assert.Equal(t, len(c.reasons) > 0, u.Busy(), c.bdf)
	}
	u := use("0000:00:04.0")
	assert.Equal(t, []host.NetUse{{Name: "eth1"}}, u.Net, "an unused interface is still listed")
	u = use("0000:3d:00.0")
	assert.Len(t, u.Block, 4, "the disk and its three partitions")
}
