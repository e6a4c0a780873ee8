// Command pcipath is the guest side of the PCI topology scenarios
// (tests/topology_test.go): inside the L2 guest it finds a GPU and a NIC
// by vendor and device ID, classifies the path between them with
// host/ncclpath exactly as NCCL would from this guest's sysfs (the NIC's
// bus ID rewritten as NCCL's IB transport does with NCCL_IB_MERGE_VFS=1),
// and prints what NCCL reads for each device's bandwidth: the
// max_link_speed and max_link_width of the device and of the port above
// it. Its output is "hpcvmm-guest key=value" lines, which
// harness.VMProcess.GuestResults parses; the harness builds it statically
// into the L2 initramfs as /bin/hpcvmm-pcipath.
//
// Usage: hpcvmm-pcipath GPU-VENDOR:DEVICE NIC-VENDOR:DEVICE
// (IDs as sysfs writes them, e.g. 0x1234:0x11e8).
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hpcvmm/hpcvmm/host/ncclpath"
)

func main() {
	if err := run("/sys", os.Args[1:], os.Stdout); err != nil {
		fmt.Printf("hpcvmm-guest pcipath_error=%s\n", strconv.Quote(err.Error()))
		os.Exit(1)
	}
}

// run classifies and reports for the sysfs tree at sysRoot, writing the
// result lines to w.
func run(sysRoot string, args []string, w io.Writer) error {
	if len(args) != 2 {
		return errors.New("usage: hpcvmm-pcipath GPU-VENDOR:DEVICE NIC-VENDOR:DEVICE")
	}
	gpu, err := find(sysRoot, args[0])
	if err != nil {
		return err
	}
	nic, err := find(sysRoot, args[1])
	if err != nil {
		return err
	}
	opt := ncclpath.DefaultOptions()
	g := ncclpath.Device{BDF: gpu}
	n := ncclpath.Device{BDF: nic, NIC: true}
	gn, err := ncclpath.Locate(sysRoot, g, opt)
	if err != nil {
		return err
	}
	nn, err := ncclpath.Locate(sysRoot, n, opt)
	if err != nil {
		return err
	}
	devices, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "devices"))
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "hpcvmm-guest nccl_gpu=%s nccl_nic=%s nccl_nic_busid=%s nccl_path=%s\n", gpu, nic, nn.BusID, ncclpath.Between(gn, nn))
	fmt.Fprintf(w, "hpcvmm-guest nccl_gpu_switches=%s nccl_nic_switches=%s nccl_gpu_cpu=%s nccl_nic_cpu=%s\n",
		list(gn.Switches), list(nn.Switches), gn.CPU, nn.CPU)
	for _, d := range []struct{ role, bdf string }{{"gpu", gpu}, {"nic", nic}} {
		p, err := filepath.EvalSymlinks(filepath.Join(sysRoot, "bus/pci/devices", d.bdf))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "hpcvmm-guest %s_sysfs=%s %s_max_link_speed=%s %s_max_link_width=%s %s_port_max_link_speed=%s %s_port_max_link_width=%s %s_chain=%s\n",
			d.role, strings.TrimPrefix(p, devices+"/"),
			d.role, attr(p, "max_link_speed"), d.role, attr(p, "max_link_width"),
			d.role, attr(filepath.Dir(p), "max_link_speed"), d.role, attr(filepath.Dir(p), "max_link_width"),
			d.role, strconv.Quote(chain(p)))
	}
	return nil
}

// chain lists the links of every PCI function on the sysfs path dev, from
// the one below the host bridge down to dev itself, as "SPEED/WIDTH"
// separated by commas ("none" for a missing attribute): what NCCL reads
// for each port and switch on the way. tests/topology_test.go builds the
// same list for L1 (linkChain).
func chain(dev string) string {
	var links []string
	for p := dev; isBDF(filepath.Base(p)); p = filepath.Dir(p) {
		links = append([]string{raw(p, "max_link_speed") + "/" + raw(p, "max_link_width")}, links...)
	}
	return strings.Join(links, ",")
}

// isBDF reports whether a sysfs directory name is a PCI function
// ("0000:03:00.0"), not the host bridge ("pci0000:00").
func isBDF(s string) bool { return len(s) == 12 && s[4] == ':' && s[7] == ':' && s[10] == '.' }

// raw reads a sysfs attribute trimmed, "none" when missing.
func raw(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "none"
	}
	return strings.TrimSpace(string(b))
}

// find returns the bus ID of the first PCI function with the given
// "VENDOR:DEVICE" IDs.
func find(sysRoot, ids string) (string, error) {
	vendor, device, ok := strings.Cut(ids, ":")
	if !ok {
		return "", fmt.Errorf("%q: want VENDOR:DEVICE such as 0x1234:0x11e8", ids)
	}
	dir := filepath.Join(sysRoot, "bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		if attr(filepath.Join(dir, e.Name()), "vendor") == vendor && attr(filepath.Join(dir, e.Name()), "device") == device {
			return e.Name(), nil
		}
	}
	return "", fmt.Errorf("no PCI function %s in %s", ids, dir)
}

// attr reads a sysfs attribute, quoted for a result line; "none" when the
// file is missing (a conventional PCI function has no link attributes).
func attr(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return "none"
	}
	v := strings.TrimSpace(string(b))
	if strings.ContainsAny(v, " \"") || v == "" {
		return strconv.Quote(v)
	}
	return v
}

func list(s []string) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}
