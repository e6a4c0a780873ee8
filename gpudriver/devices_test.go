package gpudriver

import (
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hostNodes reads testdata/dev-nodes.txt, the fixture host's `ls -l` of
// /dev/nvidia* and /dev/nvidia-caps, into Nodes.
func hostNodes(t *testing.T) []Node {
	b, err := os.ReadFile("testdata/dev-nodes.txt")
	require.NoError(t, err)
	var out []Node
	seen := map[string]bool{}
	dir := ""
	for _, line := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutSuffix(line, ":"); ok {
			dir = d
			continue
		}
		if !strings.HasPrefix(line, "c") {
			continue
		}
		// crw-rw-rw- 1 root root 195,   0 Nov 27 13:22 /dev/nvidia0
		f := strings.Fields(strings.Replace(line, ",", " ", 1))
		require.Len(t, f, 10, line)
		maj, err1 := strconv.Atoi(f[4])
		minor, err2 := strconv.Atoi(f[5])
		require.NoError(t, err1)
		require.NoError(t, err2)
		var mode fs.FileMode
		for i, c := range f[0][1:10] {
			if c != '-' {
				mode |= 1 << (8 - i)
			}
		}
		p := f[9]
		if !strings.HasPrefix(p, "/") {
			p = path.Join(dir, p)
		}
		if !seen[p] { // the capture lists /dev/nvidia-caps twice
			seen[p] = true
			out = append(out, Node{Path: p, Major: uint32(maj), Minor: uint32(minor), Mode: mode})
		}
	}
	return out
}

// TestNodesAsOnTheHost: the nodes made from the fixture host's
// /proc/devices and capability files for its one GPU are the nodes its
// driver's tools made (dev-nodes.txt): numbers and modes.
func TestNodesAsOnTheHost(t *testing.T) {
	b, err := os.ReadFile(hostRoot + "/proc/devices")
	require.NoError(t, err)
	majors, err := ParseProcDevices(b)
	require.NoError(t, err)
	require.Equal(t, map[string]uint32{"mem": 1, "tty": 4, "/dev/tty": 5, "misc": 10, "nvidia": 195, "nvidiactl": 195,
		"nvidia-uvm": 238, "nvidia-nvswitch": 239, "nvidia-nvlink": 240, "nvidia-caps": 241, "nvidia-caps-imex-channels": 242}, majors,
		"block devices left out")
	caps, err := Capabilities(hostRoot)
	require.NoError(t, err)
	require.Equal(t, []Cap{{Minor: 1, Mode: 0o400}, {Minor: 2, Mode: 0o444}}, caps)

	nodes, err := Nodes(majors, 1, caps)
	require.NoError(t, err)
	want := hostNodes(t)
	require.Len(t, want, 6)
	require.Equal(t, want, nodes)

	nodes, err = Nodes(majors, 3, nil)
	require.NoError(t, err)
	require.Equal(t, []Node{
		{"/dev/nvidia0", 195, 0, 0o666}, {"/dev/nvidia1", 195, 1, 0o666}, {"/dev/nvidia2", 195, 2, 0o666},
		{"/dev/nvidiactl", 195, 255, 0o666}, {"/dev/nvidia-uvm", 238, 0, 0o666}, {"/dev/nvidia-uvm-tools", 238, 1, 0o666},
	}, nodes)

	// A guest whose nvidia-uvm got another dynamic major, an older driver's
	// "nvidia-frontend".
	guest, err := ParseProcDevices([]byte("Character devices:\n195 nvidia-frontend\n511 nvidia-uvm\n510 nvidia-caps\n"))
	require.NoError(t, err)
	nodes, err = Nodes(guest, 1, caps[:1])
	require.NoError(t, err)
	require.Equal(t, Node{"/dev/nvidia-uvm-tools", 511, 1, 0o666}, nodes[3])
	require.Equal(t, Node{"/dev/nvidia-caps/nvidia-cap1", 510, 1, 0o400}, nodes[4])
}

func TestNodesRefuse(t *testing.T) {
	_, err := Nodes(map[string]uint32{"nvidia": 195}, 1, nil)
	require.ErrorContains(t, err, `no "nvidia-uvm" major`)
	_, err = Nodes(map[string]uint32{"nvidia-uvm": 238}, 1, nil)
	require.ErrorContains(t, err, `no "nvidia" major`)
	_, err = Nodes(map[string]uint32{"nvidia": 195, "nvidia-uvm": 238}, 1, []Cap{{Minor: 1, Mode: 0o400}})
	require.ErrorContains(t, err, `no "nvidia-caps" major`)
	_, err = Nodes(map[string]uint32{"nvidia": 195, "nvidia-uvm": 238}, 0, nil)
	require.ErrorContains(t, err, "0 GPUs")

	for _, bad := range []string{"0 zero\n", "4096 big\n", "x tty\n", "12\n", "-1 neg\n", "12 two words\n"} {
		_, err := ParseProcDevices([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
	for _, bad := range []string{"DeviceFileMinor: 1\n", "DeviceFileMinor: x\nDeviceFileMode: 256\n", "DeviceFileMinor: 1\nDeviceFileMode: 4096\n"} {
		_, err := ParseCapability([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}
