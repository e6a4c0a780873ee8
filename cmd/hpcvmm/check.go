package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/pcitopo"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// kvmCapabilityCheck, when set (by the file that wires in the uapi
// package), checks the KVM capabilities hpcvmm needs; `hpcvmm check` calls it
// when /dev/kvm exists. Left nil, only the device's presence is checked.
var kvmCapabilityCheck func(devPath string) []preflight.Result

// runCheck implements `hpcvmm check`: it checks that this host can run the
// described VM and prints every problem with its fix. Exit status
// (exitTable): 0 when the VM could start (warnings allowed), 3 when a check
// failed, 2 for invalid input, 1 when the report could not be written.
func runCheck(args []string, stdout, stderr io.Writer) int {
	c := newCommand("hpcvmm check",
		"Check that this host can run the described VM: KVM and its capabilities, the IOMMU and interrupt remapping, "+
			"each device (driver, IOMMU group, NUMA node, reset method, BARs against the guest address space, VF to PF), "+
			"an NVIDIA GPU's host driver and GSP firmware for jobs, "+
			"the node's CPUs and free hugepages, RLIMIT_MEMLOCK. Every problem is printed with the command that fixes it. "+
			"hpcvmm run runs the same checks first (but the GPU driver's: jobs check it before they boot).",
		"hpcvmm check [--gpu BDF]... [--vf BDF]... [--memory SIZE] [--hugepages 1G|2M|none]",
		"[--cpus N] [--numa-node N|auto] [--cpu-mode dedicated|shared] [--json]")
	c.footer = exitHelp("check")
	var gpus, vfs bdfList
	req := preflight.Request{CPUs: 1, Memory: 1 << 30, NUMANode: vmm.NUMANodeAuto, KVMCheck: kvmCapabilityCheck, PortSlots: vmm.PassthroughSlots()}
	page := guestmem.Page1G
	g := c.group("The VM to check")
	g.Var(&gpus, "gpu", "`BDF`: a PCI device to pass through whole, e.g. 0000:82:00.0 (repeatable; a comma-separated list adds several)")
	g.Var(&vfs, "vf", "`BDF`: an SR-IOV virtual function to pass through (repeatable)")
	g.Var(sizeValue{&req.Memory}, "memory", "guest RAM, with a K, M, G or T suffix")
	g.Var(pageSizeValue{&page}, "hugepages", "page size backing guest RAM: 1G, 2M or none")
	g.IntVar(&req.CPUs, "cpus", req.CPUs, "`N`: vCPUs")
	g.Var(nodeValue{&req.NUMANode}, "numa-node", "host NUMA node; auto: the node of the first device, else the node with the most free hugepages")
	var cpuMode vmm.CPUMode
	g.Var(cpuModeValue{&cpuMode}, "cpu-mode", "dedicated or shared: the CPU mode to check for (default: the one hpcvmm run would choose)")
	asJSON := c.group("Output").Bool("json", false, "print the report as JSON")
	sysRoot, procRoot := hostRootFlags(c)
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return rc
	}
	if rc := c.noArgs(stderr, "devices are given with --gpu and --vf"); rc >= 0 {
		return rc
	}
	switch {
	case req.CPUs < 1:
		return c.usageError(stderr, "--cpus %d: want 1 or more", req.CPUs)
	}
	// A malformed address is bad input, as for bind and run, not a failed
	// check of the host.
	for i, s := range append(append([]string(nil), gpus...), vfs...) {
		if _, err := host.ParseBDF(s); err != nil {
			return c.usageError(stderr, "--%s: %v", map[bool]string{true: "gpu", false: "vf"}[i < len(gpus)], err)
		}
	}
	req.GPUs, req.VFs, req.PageSize = gpus, vfs, uint64(page)
	req.CPUMode, req.KVMCheck = string(cpuMode), withCPUChecks(req.KVMCheck, req.CPUs)
	// An NVIDIA GPU's driver as a job would find it (job.go's root and
	// loader cache, which jobrun.Request gets: the host's, a fixture in
	// tests).
	req.GPUDriver, req.DriverRoot, req.DriverCache = true, gpuDriverRoot, gpuDriverCache
	if *sysRoot == "/sys" {
		req.RunDir = hoststate.DefaultStateDir // other VMs' CPU claims
		// The live host: read InfiniBand VFs' GUIDs over netlink, and
		// open the devices' VFIO groups as the VM would.
		req.VFIdentity = ibvf.System{}.Identity
		req.GroupOpen = vmm.ProbeVFIOGroup
	}

	h := host.New(*sysRoot, *procRoot)
	// The validation of sizes hpcvmm run makes (vmm.Config.Validate and
	// vmm.New call it too): a size that can never fit is bad input.
	if err := preflight.CheckInput(h, req); err != nil {
		return c.usageError(stderr, "%s", describeInputError(err))
	}
	rep := preflight.Run(h, req)
	var tree string
	var treeErr error
	if len(gpus)+len(vfs) > 0 {
		tree, treeErr = guestTree(h, gpus, vfs)
	}
	var err error
	if *asJSON {
		err = writeCheckJSON(stdout, rep, tree)
	} else {
		err = rep.WriteTable(stdout)
		switch {
		case err != nil:
		case tree != "":
			_, err = fmt.Fprintf(stdout, "\nguest PCI tree (hpcvmm run --topology host):\n%s", tree)
		case treeErr != nil && !deviceFailed(rep):
			// A device the report refused already says why there is no
			// tree (issue 35: a stray "unknown: lstat" line after it).
			_, err = fmt.Fprintf(stdout, "\nguest PCI tree: unknown: %v\n", treeErr)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm check: write report: %v\n", err)
		return exitFailed
	}
	if !rep.OK() {
		return exitHost
	}
	return exitOK
}

// requestFlags maps preflight.Request fields to the flags of hpcvmm check
// that set them.
var requestFlags = map[string]string{"Memory": "--memory", "PageSize": "--hugepages", "NUMANode": "--numa-node"}

// describeInputError renders preflight.CheckInput's errors one per line,
// each naming its flag.
func describeInputError(err error) string {
	list := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	}
	msgs := make([]string, 0, len(list))
	for _, e := range list {
		var ie *preflight.InputError
		if errors.As(e, &ie) && requestFlags[ie.Field] != "" {
			msgs = append(msgs, requestFlags[ie.Field]+": "+ie.Err.Error())
			continue
		}
		msgs = append(msgs, e.Error())
	}
	return strings.Join(msgs, "\nhpcvmm check: ")
}

// guestTree is the guest PCI tree hpcvmm run builds for the devices with
// the default --topology host, as lspci -tv prints one.
func guestTree(h *host.Host, gpus, vfs []string) (string, error) {
	var names []string
	var bdfs []host.BDF
	for i, s := range append(append([]string(nil), gpus...), vfs...) {
		b, err := host.ParseBDF(s)
		if err != nil {
			return "", err
		}
		bdfs = append(bdfs, b)
		names = append(names, map[bool]string{true: "gpu", false: "vf"}[i < len(gpus)])
	}
	devs, links, err := pcitopo.FromHost(h, names, bdfs)
	if err != nil {
		return "", err
	}
	plan, err := pcitopo.New(pcitopo.Host, devs, links, vmm.PassthroughSlots())
	if err != nil {
		return "", err
	}
	return plan.String(), nil
}

// deviceFailed reports whether a device check of rep failed.
func deviceFailed(rep preflight.Report) bool {
	for _, r := range rep.Failures() {
		if r.Name == "device" {
			return true
		}
	}
	return false
}

// writeCheckJSON writes the report as preflight does, with the guest PCI
// tree (lines of lspci -tv's form) when there is one.
func writeCheckJSON(w io.Writer, rep preflight.Report, tree string) error {
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		return err
	}
	if tree == "" {
		_, err := w.Write(b.Bytes())
		return err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b.Bytes(), &fields); err != nil {
		return err
	}
	lines, err := json.Marshal(strings.Split(strings.TrimSuffix(tree, "\n"), "\n"))
	if err != nil {
		return err
	}
	fields["guest_pci_tree"] = lines
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // fix commands hold ">" and "&&"
	return enc.Encode(fields)
}

// deviceRow is one device in `hpcvmm devices --json`.
type deviceRow struct {
	BDF          string   `json:"bdf"`
	Vendor       string   `json:"vendor"`
	Device       string   `json:"device"`
	Class        string   `json:"class"`
	ClassName    string   `json:"class_name"`
	Driver       string   `json:"driver"`
	NUMANode     int      `json:"numa_node"`
	IOMMUGroup   int      `json:"iommu_group"`
	ResetMethods []string `json:"reset_methods"`
	// HostUse says what the host uses the function for (its NIC, its
	// disks): such a function is not for passthrough.
	HostUse []string    `json:"host_use,omitempty"`
	VFs     []deviceRow `json:"vfs,omitempty"`
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
	c := newCommand("hpcvmm devices",
		"List the host's passthrough-capable devices (GPUs, network and InfiniBand functions, accelerators, anything on vfio-pci) "+
			"with their NUMA node, IOMMU group, driver, reset methods and SR-IOV virtual functions: the BDFs for --gpu and --vf.",
		"hpcvmm devices [--json]")
	c.footer = exitHelp("devices")
	asJSON := c.group("Output").Bool("json", false, "print the list as JSON")
	sysRoot, procRoot := hostRootFlags(c)
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return rc
	}
	if rc := c.noArgs(stderr, ""); rc >= 0 {
		return rc
	}
	h := host.New(*sysRoot, *procRoot)
	devs, err := h.PassthroughDevices()
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
		return exitHost
	}
	rows := make([]deviceRow, 0, len(devs))
	withUse := func(d *host.Device) (deviceRow, error) {
		r := rowOf(d)
		if host.IsVFIODriver(d.Driver) {
			return r, nil
		}
		u, err := h.DeviceUse(d.BDF)
		r.HostUse = u.Reasons()
		return r, err
	}
	for _, d := range devs {
		r, err := withUse(d)
		if err != nil {
			fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
			return exitHost
		}
		for _, v := range d.VirtFns {
			vd, err := h.Device(v)
			if err != nil {
				fmt.Fprintf(stderr, "hpcvmm devices: VF %s of %s: %v\n", v, d.BDF, err)
				return exitHost
			}
			vr, err := withUse(vd)
			if err != nil {
				fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
				return exitHost
			}
			r.VFs = append(r.VFs, vr)
		}
		rows = append(rows, r)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rows); err != nil {
			fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
			return exitFailed
		}
		return exitOK
	}
	if len(rows) == 0 {
		fmt.Fprintln(stdout, "no passthrough-capable devices (GPUs, network/InfiniBand functions, accelerators, or devices on vfio-pci)")
		return exitOK
	}
	if err := writeDeviceTable(stdout, rows); err != nil {
		fmt.Fprintf(stderr, "hpcvmm devices: %v\n", err)
		return exitFailed
	}
	return exitOK
}

// writeDeviceTable writes `hpcvmm devices`' rows to w as a table, each
// device's VFs indented under it.
func writeDeviceTable(w io.Writer, rows []deviceRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
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
		use := ""
		if len(r.HostUse) > 0 {
			use = "\tthe host uses it, not for passthrough: " + strings.Join(r.HostUse, "; ")
		}
		fmt.Fprintf(tw, "%s%s\t%s:%s\t%s\t%s\t%s\t%s\t%s\t%s%s\n", prefix, r.BDF, r.Vendor, r.Device, r.ClassName,
			num(r.NUMANode), num(r.IOMMUGroup), dash(r.Driver), dash(strings.Join(r.ResetMethods, ",")), vfs, use)
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
	return tw.Flush()
}

// hostRootFlags adds the hidden --sysfs and --procfs flags that point a
// command at a captured or synthetic host tree (tests).
func hostRootFlags(c *command) (sysRoot, procRoot *string) {
	sysRoot, procRoot = new(string), new(string)
	c.hidden(func(fs *pflag.FlagSet) {
		fs.StringVar(sysRoot, "sysfs", "/sys", "sysfs root (tests)")
		fs.StringVar(procRoot, "procfs", "/proc", "procfs root (tests)")
	})
	return sysRoot, procRoot
}
