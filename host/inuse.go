package host

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// NetUse is one network interface of a PCI function and what the host
// uses it for.
type NetUse struct {
	// Name is the interface (eth0, ib0).
	Name string
	// Up: IFF_UP in its flags, administratively up.
	Up bool
	// DefaultRoute: an IPv4 or IPv6 default route goes through it.
	DefaultRoute bool
	// Routes counts the IPv4 and IPv6 routes through it: an IPv4 address
	// adds its prefix route here (a /32 or noprefixroute one adds none,
	// and it serves traffic only while the interface is up).
	Routes int
	// IPv6 lists its IPv6 addresses, link-local ones included.
	IPv6 []string
	// Master is the bond, bridge or team it is a port of.
	Master string
}

// InUse reports whether taking the interface away changes what the host
// can reach.
func (n NetUse) InUse() bool {
	return n.Up || n.DefaultRoute || n.Routes > 0 || len(n.IPv6) > 0 || n.Master != ""
}

// String says how the host uses the interface.
func (n NetUse) String() string {
	var why []string
	if n.Up {
		why = append(why, "up")
	}
	if n.DefaultRoute {
		why = append(why, "carries the default route")
	}
	if n.Routes > 0 {
		why = append(why, fmt.Sprintf("%d routes", n.Routes))
	}
	if len(n.IPv6) > 0 {
		why = append(why, "addresses "+strings.Join(n.IPv6, ", "))
	}
	if n.Master != "" {
		why = append(why, "a port of "+n.Master)
	}
	if len(why) == 0 {
		return "network interface " + n.Name + " (down, unused)"
	}
	return "network interface " + n.Name + " (" + strings.Join(why, "; ") + ")"
}

// BlockUse is one block device (disk or partition) of a PCI function and
// what the host uses it for.
type BlockUse struct {
	// Name is the block device (nvme0n1, nvme0n1p2, sda1).
	Name string
	// Mounts lists where it is mounted.
	Mounts []string
	// Holders lists the devices stacked on it: device-mapper (LVM,
	// dm-crypt, multipath), md RAID, bcache.
	Holders []string
	// Swap: it is an active swap partition.
	Swap bool
}

// InUse reports whether the host uses the block device.
func (b BlockUse) InUse() bool { return len(b.Mounts) > 0 || len(b.Holders) > 0 || b.Swap }

// String says how the host uses the block device.
func (b BlockUse) String() string {
	var why []string
	if len(b.Mounts) > 0 {
		why = append(why, "mounted at "+strings.Join(b.Mounts, ", "))
	}
	if len(b.Holders) > 0 {
		why = append(why, "held by "+strings.Join(b.Holders, ", ")+" (LVM, dm-crypt or md RAID)")
	}
	if b.Swap {
		why = append(why, "active swap")
	}
	if len(why) == 0 {
		return "block device " + b.Name + " (unused)"
	}
	return "block device " + b.Name + " (" + strings.Join(why, "; ") + ")"
}

// Use is what the host uses a PCI function for: its network interfaces
// and block devices, each with its use.
type Use struct {
	Net   []NetUse
	Block []BlockUse
}

// Busy reports whether rebinding the function would take something from
// the host: an interface that is up, routes or carries an address, a disk
// that is mounted, stacked on or swapped to.
func (u Use) Busy() bool { return len(u.Reasons()) > 0 }

// Reasons lists, one string each, the interfaces and block devices the
// host uses; empty when none.
func (u Use) Reasons() []string {
	var out []string
	for _, n := range u.Net {
		if n.InUse() {
			out = append(out, n.String())
		}
	}
	for _, b := range u.Block {
		if b.InUse() {
			out = append(out, b.String())
		}
	}
	return out
}

// String joins Reasons.
func (u Use) String() string { return strings.Join(u.Reasons(), "; ") }

// iffUp is IFF_UP of linux/if.h, bit 0 of /sys/class/net/<if>/flags.
const iffUp = 0x1

// DeviceUse finds what the host uses PCI function b for, before it is
// taken from its driver: the network interfaces (/sys/class/net) and block
// devices (/sys/class/block, partitions included) whose sysfs directory is
// below b's, however the driver nests them (net/eth0, virtio2/net/eth0,
// nvme/nvme0/nvme0n1, host0/.../block/sda), and an NVMe controller's
// namespaces that native multipath puts under
// /sys/devices/virtual/nvme-subsystem (named by the controller's path
// devices nvme<S>c<C>n<N>); then, from procfs, the interfaces' routes
// (/proc/net/route, /proc/net/ipv6_route) and IPv6 addresses
// (/proc/net/if_inet6), and the block devices' mounts
// (/proc/self/mountinfo, by device number or source), holders and swap
// (/proc/swaps). Files a host tree lacks (a capture) read as empty.
func (h *Host) DeviceUse(b BDF) (Use, error) {
	dev, err := filepath.EvalSymlinks(h.devDir(b))
	if err != nil {
		return Use{}, fmt.Errorf("host: %s: %w", b, err)
	}
	var u Use
	nets, err := classBelow(h.Layout.NetClass, dev, nil)
	if err != nil {
		return Use{}, err
	}
	heads, err := nvmeHeads(dev)
	if err != nil {
		return Use{}, err
	}
	blocks, err := classBelow(h.Layout.BlockClass, dev, heads)
	if err != nil {
		return Use{}, err
	}
	if len(nets) > 0 {
		routes, defaults, err := h.routes()
		if err != nil {
			return Use{}, err
		}
		v6, err := h.ipv6Addrs()
		if err != nil {
			return Use{}, err
		}
		for _, name := range nets {
			n := NetUse{Name: name, Routes: routes[name], DefaultRoute: defaults[name], IPv6: v6[name]}
			dir := filepath.Join(h.Layout.NetClass, name)
			flags, err := readUint(filepath.Join(dir, "flags"), 32)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return Use{}, fmt.Errorf("host: %s interface %s: %w", b, name, err)
			}
			n.Up = flags&iffUp != 0
			if t, err := os.Readlink(filepath.Join(dir, "master")); err == nil {
				n.Master = filepath.Base(t)
			}
			u.Net = append(u.Net, n)
		}
	}
	if len(blocks) > 0 {
		mounts, err := h.mounts()
		if err != nil {
			return Use{}, err
		}
		swaps, err := h.swaps()
		if err != nil {
			return Use{}, err
		}
		for _, name := range blocks {
			bu := BlockUse{Name: name, Swap: swaps["/dev/"+name]}
			dir := filepath.Join(h.Layout.BlockClass, name)
			num, err := readString(filepath.Join(dir, "dev"))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return Use{}, fmt.Errorf("host: %s block device %s: %w", b, name, err)
			}
			for _, m := range mounts {
				if (num != "" && m.dev == num) || m.source == "/dev/"+name {
					bu.Mounts = append(bu.Mounts, m.point)
				}
			}
			holders, err := os.ReadDir(filepath.Join(dir, "holders"))
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return Use{}, fmt.Errorf("host: %s block device %s: %w", b, name, err)
			}
			for _, e := range holders {
				bu.Holders = append(bu.Holders, e.Name())
			}
			u.Block = append(u.Block, bu)
		}
	}
	return u, nil
}

// classBelow lists the entries of a /sys/class directory whose target is
// below the device directory dev, or whose name is one of heads or a
// partition of one (heads[i] + "p" + digits).
func classBelow(class, dev string, heads []string) ([]string, error) {
	if class == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(class)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host: list %s: %w", class, err)
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if isHeadOrPartition(name, heads) {
			out = append(out, name)
			continue
		}
		p, err := filepath.EvalSymlinks(filepath.Join(class, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, fmt.Errorf("host: %s/%s: %w", class, name, err)
		}
		if strings.HasPrefix(p, dev+string(filepath.Separator)) {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out, nil
}

func isHeadOrPartition(name string, heads []string) bool {
	for _, h := range heads {
		if name == h {
			return true
		}
		if rest, ok := strings.CutPrefix(name, h+"p"); ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			return true
		}
	}
	return false
}

// nvmePath is an NVMe multipath path device: nvme<subsystem>c<controller>n<namespace>.
var nvmePath = regexp.MustCompile(`^nvme([0-9]+)c[0-9]+n([0-9]+)$`)

// nvmeHeads names the multipath namespace disks (nvme<S>n<N>) served by the
// NVMe controllers below dev (dev/nvme/nvme<C>/nvme<S>c<C>n<N>).
func nvmeHeads(dev string) ([]string, error) {
	ctrls, err := os.ReadDir(filepath.Join(dev, "nvme"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host: list %s/nvme: %w", dev, err)
	}
	var heads []string
	for _, c := range ctrls {
		ents, err := os.ReadDir(filepath.Join(dev, "nvme", c.Name()))
		if err != nil {
			return nil, fmt.Errorf("host: list %s/nvme/%s: %w", dev, c.Name(), err)
		}
		for _, e := range ents {
			if m := nvmePath.FindStringSubmatch(e.Name()); m != nil {
				heads = append(heads, "nvme"+m[1]+"n"+m[2])
			}
		}
	}
	return heads, nil
}

// lines returns the lines of a procfs file; a missing file or an empty
// path (a capture) has none.
func lines(p string) ([]string, error) {
	if p == "" {
		return nil, nil
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host: read %s: %w", p, err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("host: read %s: %w", p, err)
	}
	return out, nil
}

// routes counts the IPv4 (/proc/net/route: Iface Destination Gateway Flags
// RefCnt Use Metric Mask ...) and IPv6 (/proc/net/ipv6_route: dest plen src
// srclen nexthop metric refcnt use flags iface) routes per interface and
// marks those with a default route.
func (h *Host) routes() (count map[string]int, def map[string]bool, err error) {
	count, def = map[string]int{}, map[string]bool{}
	v4, err := lines(h.Layout.NetRoute)
	if err != nil {
		return nil, nil, err
	}
	for i, l := range v4 {
		f := strings.Fields(l)
		if i == 0 || len(f) < 8 {
			continue // the header
		}
		count[f[0]]++
		if f[1] == "00000000" && f[7] == "00000000" {
			def[f[0]] = true
		}
	}
	v6, err := lines(h.ipv6RoutePath())
	if err != nil {
		return nil, nil, err
	}
	for _, l := range v6 {
		f := strings.Fields(l)
		if len(f) < 10 || f[9] == "lo" {
			continue // loopback holds every local and unreachable route
		}
		count[f[9]]++
		if f[0] == strings.Repeat("0", 32) && f[1] == "00" {
			def[f[9]] = true
		}
	}
	return count, def, nil
}

// ipv6RoutePath is /proc/net/ipv6_route beside NetRoute.
func (h *Host) ipv6RoutePath() string {
	if h.Layout.NetRoute == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(h.Layout.NetRoute), "ipv6_route")
}

// ipv6Addrs reads /proc/net/if_inet6 (address ifindex prefixlen scope flags
// name) into addresses per interface.
func (h *Host) ipv6Addrs() (map[string][]string, error) {
	ls, err := lines(h.Layout.IfInet6)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, l := range ls {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		a := f[0]
		if raw, err := hex.DecodeString(f[0]); err == nil && len(raw) == net.IPv6len {
			a = net.IP(raw).String()
		}
		out[f[5]] = append(out[f[5]], a+"/"+prefixLen(f[2]))
	}
	return out, nil
}

func prefixLen(hexLen string) string {
	n, err := strconv.ParseUint(hexLen, 16, 8)
	if err != nil {
		return hexLen
	}
	return strconv.FormatUint(n, 10)
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	dev, point, source string
}

// mounts reads /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT POINT OPTS
// [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS".
func (h *Host) mounts() ([]mount, error) {
	ls, err := lines(h.Layout.Mountinfo)
	if err != nil {
		return nil, err
	}
	var out []mount
	for _, l := range ls {
		f := strings.Fields(l)
		if len(f) < 7 {
			continue
		}
		m := mount{dev: f[2], point: unescapeMount(f[4])}
		for i := 6; i+2 < len(f); i++ {
			if f[i] == "-" {
				m.source = unescapeMount(f[i+2])
				break
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// unescapeMount undoes the kernel's octal escapes in mountinfo fields
// (\040 space, \011 tab, \012 newline, \134 backslash).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// swaps reads /proc/swaps' file names.
func (h *Host) swaps() (map[string]bool, error) {
	ls, err := lines(h.Layout.Swaps)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for i, l := range ls {
		f := strings.Fields(l)
		if i == 0 || len(f) == 0 {
			continue // the header
		}
		out[unescapeMount(f[0])] = true
	}
	return out, nil
}
