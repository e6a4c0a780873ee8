package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
)

// TestBindRefusesWhatTheHostUses is issue 23's defect 8: `hpcvmm bind` on
// the node's only NIC (its default route) rebound it and cut the node off.
// Now it refuses before anything changes, naming the interface, unless
// --force; a device the host does not use is still bound.
func TestBindRefusesWhatTheHostUses(t *testing.T) {
	tr := hosttest.New(t)
	const nic, disk = "0000:00:03.0", "0000:3d:00.0"
	tr.AddDevice(hosttest.Device{BDF: nic, Vendor: 0x1af4, DeviceID: 0x1041, Class: 0x020000, Driver: "virtio-pci", IOMMUGroup: 3})
	tr.AddDevice(hosttest.Device{BDF: disk, Vendor: 0x144d, DeviceID: 0xa80a, Class: 0x010802, Driver: "nvme", IOMMUGroup: 30})
	tr.ClassNet(nic, "virtio2/net", "eth0", 0x1003)
	tr.ClassBlock(disk, "nvme/nvme0", "nvme0n1", "259:0")
	tr.ClassBlock(disk, "nvme/nvme0/nvme0n1", "nvme0n1p2", "259:2")
	tr.Write("proc/net/route", "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"+
		"eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n")
	tr.Write("proc/self/mountinfo", "27 1 259:2 / / rw,relatime - ext4 /dev/nvme0n1p2 rw\n")
	tr.Write("sys/bus/pci/drivers_probe", "")
	tr.Write("sys/bus/pci/drivers/virtio-pci/unbind", "")
	tr.Write("sys/bus/pci/devices/"+nic+"/driver_override", "(null)\n")
	tr.Write("sys/bus/pci/devices/"+disk+"/driver_override", "(null)\n")
	tr.Write("sys/bus/pci/drivers/vfio-pci/new_id", "")
	state := filepath.Join(tr.Root, "state")
	bind := func(args ...string) (int, string, string) {
		return hpcvmm(append([]string{"bind", "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--state-dir", state}, args...)...)
	}

	rc, out, errs := bind(nic)
	assert.Equal(t, exitHost, rc, errs)
	assert.Empty(t, out)
	assert.Contains(t, errs, "hpcvmm bind: 0000:00:03.0: the host uses it: network interface eth0 (up; carries the default route; 1 routes)")
	assert.Contains(t, errs, "--force")
	override, err := os.ReadFile(filepath.Join(tr.Sys(), "bus/pci/devices", nic, "driver_override"))
	require.NoError(t, err)
	assert.Equal(t, "(null)\n", string(override), "nothing changed")
	assert.NoDirExists(t, state, "no journal")

	rc, _, errs = bind(disk, nic)
	assert.Equal(t, exitHost, rc)
	assert.Contains(t, errs, "0000:3d:00.0: the host uses it: block device nvme0n1p2 (mounted at /)", "the first refused device is named")

	// --force goes past the check to the rebind itself (which this fake
	// sysfs cannot perform: the device stays on virtio-pci).
	rc, _, errs = bind("--force", nic)
	assert.Equal(t, 1, rc)
	assert.NotContains(t, errs, "the host uses it")
	assert.Contains(t, errs, "after probing, the device is on virtio-pci")
}

// TestDevicesMarksWhatTheHostUses: `hpcvmm devices`, where a user picks
// BDFs, says which functions the host itself uses.
func TestDevicesMarksWhatTheHostUses(t *testing.T) {
	tr := hosttest.New(t)
	tr.AddDevice(hosttest.Device{BDF: "0000:00:03.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", NUMANode: -1, IOMMUGroup: 3})
	tr.AddDevice(hosttest.Device{BDF: "0000:00:04.0", Vendor: 0x8086, DeviceID: 0x10d3, Class: 0x020000, Driver: "e1000e", NUMANode: -1, IOMMUGroup: 4})
	tr.ClassNet("0000:00:03.0", "net", "eth0", 0x1003)
	tr.ClassNet("0000:00:04.0", "net", "eth1", 0x1002)
	rc, out, errs := runCLI(devices, "--sysfs", tr.Sys(), "--procfs", tr.Proc())
	require.Equal(t, 0, rc, errs)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assert.Regexp(t, `^0000:00:03.0\s+8086:10d3\s+Ethernet\s+-\s+3\s+e1000e\s+-\s+-\s+the host uses it, not for passthrough: network interface eth0 \(up\)$`, lines[1])
	assert.Regexp(t, `^0000:00:04.0\s+8086:10d3\s+Ethernet\s+-\s+4\s+e1000e\s+-\s+-$`, lines[2])

	rc, out, _ = runCLI(devices, "--sysfs", tr.Sys(), "--procfs", tr.Proc(), "--json")
	require.Equal(t, 0, rc)
	var rows []deviceRow
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 2)
	assert.Equal(t, []string{"network interface eth0 (up)"}, rows[0].HostUse)
	assert.Empty(t, rows[1].HostUse)
}
