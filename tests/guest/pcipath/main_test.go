package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/host/hosttest"
	"github.com/hpcvmm/hpcvmm/tests/harness"
)

const bridge = 0x060400

func dev(bdf string, vendor, device uint16, class uint32) hosttest.Device {
	return hosttest.Device{BDF: bdf, Vendor: vendor, DeviceID: device, Class: class, NUMANode: -1, IOMMUGroup: -1}
}

// guestTree is what hpcvmm's --topology host gives the switch scenario's
// guest: edu and the NVMe VF behind one switch, each below its own
// downstream port.
func guestTree(t *testing.T, flat bool) string {
	tr := hosttest.New(t)
	if flat {
		tr.AddDeviceUnder(dev("0000:00:0a.0", 0x1234, 0x11e8, 0x00ff00))
		tr.AddDeviceUnder(dev("0000:00:0b.0", 0x1b36, 0x0010, 0x010802))
		tr.Link("0000:00:0b.0", "2.5 GT/s PCIe", 1)
		return tr.Sys()
	}
	tr.AddDeviceUnder(dev("0000:00:0a.0", 0x1b36, 0x000c, bridge))
	tr.AddDeviceUnder(dev("0000:01:00.0", 0x104c, 0x8232, bridge), "0000:00:0a.0")
	tr.AddDeviceUnder(dev("0000:02:00.0", 0x104c, 0x8233, bridge), "0000:00:0a.0", "0000:01:00.0")
	tr.AddDeviceUnder(dev("0000:02:01.0", 0x104c, 0x8233, bridge), "0000:00:0a.0", "0000:01:00.0")
	tr.AddDeviceUnder(dev("0000:03:00.0", 0x1234, 0x11e8, 0x00ff00), "0000:00:0a.0", "0000:01:00.0", "0000:02:00.0")
	tr.AddDeviceUnder(dev("0000:04:00.0", 0x1b36, 0x0010, 0x010802), "0000:00:0a.0", "0000:01:00.0", "0000:02:01.0")
	tr.Link("0000:00:0a.0", "16.0 GT/s PCIe", 32)
	tr.Link("0000:01:00.0", "2.5 GT/s PCIe", 1)
	tr.Link("0000:02:00.0", "16.0 GT/s PCIe", 16)
	tr.Link("0000:02:01.0", "2.5 GT/s PCIe", 1)
	tr.Link("0000:04:00.0", "2.5 GT/s PCIe", 1)
	return tr.Sys()
}

func results(t *testing.T, sys string) map[string]string {
	var out bytes.Buffer
	require.NoError(t, run(sys, []string{"0x1234:0x11e8", "0x1b36:0x0010"}, &out))
	vals, bad := harness.ParseGuestResults(out.String())
	require.Empty(t, bad, "malformed lines in:\n%s", out.String())
	return vals
}

func TestSwitchIsPIX(t *testing.T) {
	g := results(t, guestTree(t, false))
	assert.Equal(t, "PIX", g["nccl_path"])
	assert.Equal(t, "0000:03:00.0", g["nccl_gpu"])
	assert.Equal(t, "0000:04:00.0", g["nccl_nic"])
	assert.Equal(t, "0000:01:00.0", g["nccl_gpu_switches"])
	assert.Equal(t, "none", g["gpu_max_link_speed"], "edu has no link attributes")
	assert.Equal(t, "16.0 GT/s PCIe", g["gpu_port_max_link_speed"])
	assert.Equal(t, "16", g["gpu_port_max_link_width"])
	assert.Equal(t, "2.5 GT/s PCIe", g["nic_max_link_speed"])
	assert.Equal(t, "16.0 GT/s PCIe/32,2.5 GT/s PCIe/1,16.0 GT/s PCIe/16,none/none", g["gpu_chain"])
	assert.Equal(t, "16.0 GT/s PCIe/32,2.5 GT/s PCIe/1,2.5 GT/s PCIe/1,2.5 GT/s PCIe/1", g["nic_chain"])
	assert.True(t, strings.HasPrefix(g["gpu_sysfs"], "pci0000:00/0000:00:0a.0/"), g["gpu_sysfs"])
}

func TestFlatIsPHB(t *testing.T) {
	g := results(t, guestTree(t, true))
	assert.Equal(t, "PHB", g["nccl_path"])
	assert.Equal(t, "none", g["nccl_gpu_switches"])
	assert.Equal(t, "none/none", g["gpu_chain"])
}

func TestMissingDeviceIsAnError(t *testing.T) {
	var out bytes.Buffer
	err := run(guestTree(t, false), []string{"0x10de:0x2330", "0x1b36:0x0010"}, &out)
	assert.ErrorContains(t, err, "no PCI function 0x10de:0x2330")
	assert.ErrorContains(t, run(guestTree(t, false), []string{"0x10de"}, &out), "usage")
	assert.ErrorContains(t, run(guestTree(t, false), []string{"nodevice", "0x1b36:0x0010"}, &out), "want VENDOR:DEVICE")
}
