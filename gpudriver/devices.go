package gpudriver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// MaxMajor bounds a device major: the kernel's dev_t has 12 bits of major
// (MINORBITS is 20), so majors are below 4096.
const MaxMajor = 4095

// ParseProcDevices returns the character-device majors /proc/devices
// lists, by name ("nvidia" 195, "nvidia-uvm" 238, ...). Lines after "Block
// devices:" are block devices and left out; lines before any heading are
// taken as character devices (a grep of the file). Small and over bytes
// so the guest's agent parses its own /proc/devices with it: the majors of
// nvidia-uvm and nvidia-caps are dynamic and differ between the host and
// the guest. An entry that is not "MAJOR NAME" with 0 < MAJOR <= MaxMajor
// is an error naming the line.
func ParseProcDevices(b []byte) (map[string]uint32, error) {
	out := map[string]uint32{}
	char := true
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch line {
		case "":
			continue
		case "Character devices:":
			char = true
			continue
		case "Block devices:":
			char = false
			continue
		}
		num, name, ok := strings.Cut(line, " ")
		name = strings.TrimSpace(name)
		maj, err := strconv.ParseUint(num, 10, 32)
		if !ok || err != nil || maj == 0 || maj > MaxMajor || name == "" || len(name) > 64 || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("/proc/devices line %d: %.80q is not \"MAJOR NAME\" with a major from 1 to %d", n, line, MaxMajor)
		}
		if char {
			if _, dup := out[name]; !dup { // the first, as the kernel's own lookups
				out[name] = uint32(maj)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("/proc/devices: %w", err)
	}
	return out, nil
}

// Cap is one NVIDIA capability device (/dev/nvidia-caps/nvidia-capN), as
// the driver describes it in /proc/driver/nvidia/capabilities/...: its
// minor under the nvidia-caps major and the mode its node gets.
type Cap struct {
	Minor uint32
	Mode  fs.FileMode
}

// ParseCapability parses a capability file of
// /proc/driver/nvidia/capabilities ("DeviceFileMinor: 1",
// "DeviceFileMode: 256" (decimal; 0400), "DeviceFileModify: 1"), as
// nvidia-modprobe reads it to make the node.
func ParseCapability(b []byte) (Cap, error) {
	var c Cap
	var haveMinor, haveMode bool
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32)
		switch k = strings.TrimSpace(k); {
		case k == "DeviceFileMinor" && err == nil && n < 1<<20:
			c.Minor, haveMinor = uint32(n), true
		case k == "DeviceFileMode" && err == nil && n <= 0o777:
			c.Mode, haveMode = fs.FileMode(n), true
		case k == "DeviceFileMinor" || k == "DeviceFileMode":
			return Cap{}, fmt.Errorf("%s %q is not a minor (below 2^20) or a permission mode", k, strings.TrimSpace(v))
		}
	}
	if !haveMinor || !haveMode {
		return Cap{}, errors.New("no DeviceFileMinor and DeviceFileMode lines")
	}
	return c, nil
}

// CapabilityFiles are the capability files the driver has for every GPU
// (MIG's config and monitor capabilities), relative to
// /proc/driver/nvidia/capabilities; per-instance MIG capabilities
// (gpuN/mig/giM/...) exist only once MIG instances are made.
var CapabilityFiles = []string{"mig/config", "mig/monitor"}

// Capabilities reads CapabilityFiles under root's /proc: the nvidia-caps
// nodes the host's driver offers. A file that does not exist is left out
// (drivers before 450 have none).
func Capabilities(root string) ([]Cap, error) {
	var out []Cap
	for _, f := range CapabilityFiles {
		p := "/proc/driver/nvidia/capabilities/" + f
		b, err := readBounded(root, p, 4096)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err == nil {
			var c Cap
			if c, err = ParseCapability(b); err == nil {
				out = append(out, c)
				continue
			}
		}
		return nil, fmt.Errorf("gpudriver: %s: %w", p, err)
	}
	return out, nil
}

// Node is a device node the guest's agent creates, as the driver's own
// tools (nvidia-modprobe) do on a host: no udev rule makes them.
type Node struct {
	// Path is the node's absolute path (/dev/nvidia0).
	Path         string
	Major, Minor uint32
	// Mode is its permission bits (0666; a capability's own).
	Mode fs.FileMode
}

// Fixed minors of the nvidia major (nvidia-modprobe-utils.h).
const (
	minorControl = 255
	nodeMode     = 0o666
)

// Nodes are the device nodes for gpus GPUs (minors 0..gpus-1, the order
// the driver probes them in) and the capabilities caps, with the majors
// of the /proc/devices that majors came from (ParseProcDevices; in the
// guest, the guest's own): /dev/nvidiaN and /dev/nvidiactl under
// "nvidia-frontend" or else "nvidia", /dev/nvidia-uvm (minor 0) and
// /dev/nvidia-uvm-tools (1) under "nvidia-uvm", /dev/nvidia-caps/nvidia-capN
// under "nvidia-caps". A major that is missing means its module is not
// loaded, an error naming it.
func Nodes(majors map[string]uint32, gpus int, caps []Cap) ([]Node, error) {
	major := func(names ...string) (uint32, error) {
		for _, n := range names {
			if m, ok := majors[n]; ok && m > 0 && m <= MaxMajor {
				return m, nil
			}
		}
		return 0, fmt.Errorf("gpudriver: /proc/devices has no %q major: is its module loaded?", names[len(names)-1])
	}
	if gpus < 1 || gpus > minorControl {
		return nil, fmt.Errorf("gpudriver: %d GPUs: want 1 to %d", gpus, minorControl)
	}
	nv, err := major("nvidia-frontend", "nvidia")
	if err != nil {
		return nil, err
	}
	uvm, err := major("nvidia-uvm")
	if err != nil {
		return nil, err
	}
	var out []Node
	for i := range gpus {
		out = append(out, Node{Path: fmt.Sprintf("/dev/nvidia%d", i), Major: nv, Minor: uint32(i), Mode: nodeMode})
	}
	out = append(out,
		Node{Path: "/dev/nvidiactl", Major: nv, Minor: minorControl, Mode: nodeMode},
		Node{Path: "/dev/nvidia-uvm", Major: uvm, Minor: 0, Mode: nodeMode},
		Node{Path: "/dev/nvidia-uvm-tools", Major: uvm, Minor: 1, Mode: nodeMode})
	if len(caps) > 0 {
		cm, err := major("nvidia-caps")
		if err != nil {
			return nil, err
		}
		caps = slices.Clone(caps)
		slices.SortFunc(caps, func(a, b Cap) int { return int(a.Minor) - int(b.Minor) })
		for _, c := range caps {
			out = append(out, Node{Path: fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", c.Minor), Major: cm, Minor: c.Minor, Mode: c.Mode.Perm()})
		}
	}
	return out, nil
}

// readBounded reads the file at absolute path p beneath root (symbolic
// links resolved beneath it), refusing more than limit bytes.
func readBounded(root, p string, limit int) ([]byte, error) {
	real, err := ResolveIn(root, p)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(filepath.Join(root, filepath.FromSlash(real)))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", p, limit)
	}
	return b, nil
}

// maxHops bounds the symbolic links one lookup follows (the kernel's
// limit, MAXSYMLINKS).
const maxHops = 40

// ResolveIn resolves the absolute path p as if root were "/": every
// symbolic link on the way, absolute targets taken from root and ".."
// stopping at it, so the result never lies outside root. It returns the
// resolved absolute, clean path seen from root (join it to root to open
// it); the last element must exist.
func ResolveIn(root, p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("%q is not an absolute path", p)
	}
	rest := strings.Split(p, "/")
	cur, hops := "/", 0
	for len(rest) > 0 {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		host := filepath.Join(root, filepath.FromSlash(next))
		fi, err := os.Lstat(host)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > maxHops {
			return "", fmt.Errorf("%s: more than %d symbolic links", p, maxHops)
		}
		t, err := os.Readlink(host)
		if err != nil {
			return "", err
		}
		if strings.HasPrefix(t, "/") {
			cur = "/"
		}
		rest = append(strings.Split(t, "/"), rest...)
	}
	return cur, nil
}
