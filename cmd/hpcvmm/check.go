package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/hpcvmm/hpcvmm/guestmem"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// kvmCapabilityCheck, when set (by the file that wires in the uapi
// package), checks the KVM capabilities hpcvmm needs; `hpcvmm check` calls it
// when /dev/kvm exists. Left nil, only the device's presence is checked.
var kvmCapabilityCheck func(devPath string) []preflight.Result

// hiddenFlags are test-only flags left out of the usage text: they point the
// host reader at a capture or synthetic tree instead of /sys and /proc.
var hiddenFlags = map[string]bool{"sysfs": true, "procfs": true}

// bdfList collects a repeatable BDF flag; a comma-separated value adds
// several.
type bdfList []string

func (l *bdfList) String() string { return strings.Join(*l, ",") }

func (l *bdfList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// setUsage prints a synopsis and the visible flags.
func setUsage(fs *flag.FlagSet, synopsis string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "usage: %s\n\nflags:\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			if hiddenFlags[f.Name] {
				return
			}
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  %s\n    \t%s", strings.TrimSpace("--"+f.Name+" "+name), usage)
			if f.DefValue != "" && f.DefValue != "false" {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
			fmt.Fprintln(w)
		})
	}
}

// parseFlags parses args, reporting 0 for -h, 2 for a usage error, and -1 to
// continue.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) int {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (devices are given with --gpu/--vf)\n", fs.Name(), fs.Arg(0))
		return 2
	}
	return -1
}

// runCheck implements `hpcvmm check`: it checks that this host can run the
// described VM and prints every problem with its fix. Exit status: 0 when
// the VM could start (warnings allowed), 1 when a check failed, 2 for a
// usage error.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hpcvmm check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var gpus, vfs bdfList
	fs.Var(&gpus, "gpu", "PCI `BDF` of a device to pass through whole, e.g. 0000:82:00.0 (repeatable)")
	fs.Var(&vfs, "vf", "PCI `BDF` of an SR-IOV virtual function to pass through (repeatable)")
	memory := fs.String("memory", "1G", "guest RAM (K/M/G/T suffixes)")
	hugepages := fs.String("hugepages", "1G", "page size backing guest RAM: 1G, 2M or none")
	cpus := fs.Int("cpus", 1, "number of vCPUs")
	numaNode := fs.String("numa-node", "auto", "host NUMA `node` number, or auto: the node of the first device, else the node with the most free hugepages")
	asJSON := fs.Bool("json", false, "print the report as JSON")
	sysRoot := fs.String("sysfs", "/sys", "sysfs root (tests)")
	procRoot := fs.String("procfs", "/proc", "procfs root (tests)")
	setUsage(fs, "hpcvmm check [--gpu BDF]... [--vf BDF]... [--memory SIZE] [--hugepages 1G|2M|none] [--cpus N] [--numa-node N] [--json]")
	if rc := parseFlags(fs, args, stderr); rc >= 0 {
		return rc
	}

	req := preflight.Request{GPUs: gpus, VFs: vfs, CPUs: *cpus, NUMANode: -1, KVMCheck: kvmCapabilityCheck}
	var errs []error
	var err error
	if req.Memory, err = guestmem.ParseSize(*memory); err != nil {
		errs = append(errs, fmt.Errorf("--memory: %w", err))
	} else if req.Memory == 0 {
		errs = append(errs, errors.New("--memory: must be more than 0, e.g. 1G"))
	}
	page, err := guestmem.ParsePageSize(*hugepages)
	req.PageSize = uint64(page)
	if err != nil {
		errs = append(errs, fmt.Errorf("--hugepages: %w", err))
	}
	if *cpus < 1 {
		errs = append(errs, fmt.Errorf("--cpus %d: want 1 or more", *cpus))
	}
	if s := *numaNode; s != "auto" && s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Errorf("--numa-node %q: want a node number or auto", s))
		}
		req.NUMANode = n
	}
	if len(errs) > 0 {
		for _, err := range errs {
			fmt.Fprintf(stderr, "hpcvmm check: %v\n", err)
		}
		return 2
	}

	rep := preflight.Run(host.New(*sysRoot, *procRoot), req)
	if *asJSON {
		err = rep.WriteJSON(stdout)
	} else {
		err = rep.WriteTable(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm check: write report: %v\n", err)
		return 1
	}
	if !rep.OK() {
		return 1
	}
	return 0
}

// deviceRow is one device in `hpcvmm devices --json`.
type deviceRow struct {
	BDF          string      `json:"bdf"`
	Vendor       string      `json:"vendor"`
	Device       string      `json:"device"`
	Class        string      `json:"class"`
	ClassName    string      `json:"class_name"`
	Driver       string      `json:"driver"`
	NUMANode     int         `json:"numa_node"`
	IOMMUGroup   int         `json:"iommu_group"`
	ResetMethods []string    `json:"reset_methods"`
	VFs          []deviceRow `json:"vfs,omitempty"`
}

func rowOf(d *host.Device) deviceRow {
	r := deviceRow{
		BDF: d.BDF.String(), Vendor: fmt.Sprintf("%04x", d.Vendor), Device: fmt.Sprintf("%04x", d.DeviceID),
		Class: fmt.Sprintf("%#06x", d.Class), ClassName: d.ClassName(), Driver: d.Driver,
		NUMANode: d.NUMANode, IOMMUGroup: d.IOMMUGroup, ResetMethods: d.ResetMethods,
	}
	if r.ResetMethods == nil {
		r.ResetMethods = []string{}
	}
	return r
}

// runDevices implements `hpcvmm devices`: the host's passthrough-capable
// devices (GPUs, network/InfiniBand functions, accelerators, anything on
// vfio-pci) with their node, IOMMU group, driver and SR-IOV VFs, so an admin
// can pick BDFs for --gpu and --vf.
func runDevices(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hpcvmm devices", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print the list as JSON")
	sysRoot := fs.String("sysfs", "/sys", "sysfs root (tests)")
	procRoot := fs.String("procfs", "/proc", "procfs root (tests)")
	setUsage(fs, "hpcvmm devices [--json]")
	if rc := parseFlags(fs, args, stderr); rc >= 0 {
		return rc
	}
	h := host.New(*sysRoot, *procRoot)
	devs, err := h.PassthroughDevices()
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
		return 1
	}
	rows := make([]deviceRow, 0, len(devs))
	for _, d := range devs {
		r := rowOf(d)
		for _, v := range d.VirtFns {
			vd, err := h.Device(v)
			if err != nil {
				fmt.Fprintf(stderr, "hpcvmm devices: VF %s of %s: %v\n", v, d.BDF, err)
				return 1
			}
			r.VFs = append(r.VFs, rowOf(vd))
		}
		rows = append(rows, r)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
			return 1
		}
		return 0
	}
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no passthrough-capable devices (GPUs, network/InfiniBand functions, accelerators, or devices on vfio-pci)")
		return 0
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "BDF\tID\tCLASS\tNODE\tGROUP\tDRIVER\tRESET\tVFS")
	dash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	num := func(n int) string {
		if n < 0 {
			return "-"
		}
		return strconv.Itoa(n)
	}
	line := func(prefix string, r deviceRow, vfs string) {
		fmt.Fprintf(tw, "%s%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s\n", prefix, r.BDF, r.Vendor, r.Device, r.ClassName,
			num(r.NUMANode), num(r.IOMMUGroup), dash(r.Driver), dash(strings.Join(r.ResetMethods, ",")), vfs)
	}
	for _, r := range rows {
		nvf := "-"
		if len(r.VFs) > 0 {
			nvf = strconv.Itoa(len(r.VFs))
		}
		line("", r, nvf)
		for _, v := range r.VFs {
			line("  vf ", v, "")
		}
	}
	if err := tw.Flush(); err != nil {
		fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
		return 1
	}
	return 0
}
