package main

import (
	"fmt"
	"io"

	"github.com/spf13/pflag"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// addPassthroughFlags defines --gpu, --vf, --bind and --p2p on fs.
func addPassthroughFlags(fs *pflag.FlagSet, p *vmm.PassthroughConfig) {
	fs.Var((*stringList)(&p.GPUs), "gpu", "`BDF[,clique=N]`: pass a GPU (or any PCI device) through VFIO; clique=N gives an NVIDIA GPU the P2P clique capability (repeatable)")
	fs.Var((*stringList)(&p.VFs), "vf", "`BDF`: pass an SR-IOV virtual function through (repeatable)")
	fs.BoolVar(&p.Bind, "bind", false, "rebind devices held by a host driver to vfio-pci for this VM (journaled in "+hoststate.DefaultStateDir+") and give them back when it ends")
	fs.VarPF(notValue{&p.NoP2P}, "p2p", "", "DMA-map device BARs so passed-through devices reach each other (GPUDirect P2P/RDMA); --p2p=false skips it when they need not").NoOptDefVal = "true"
}

// runBind rebinds devices to vfio-pci and leaves them there; the change is
// journaled, so `hpcvmm unbind` gives them back to their drivers.
func runBind(args []string, stdout, stderr io.Writer) int {
	stateDir, bdfs, rc := parseJournalArgs("bind", args, stdout, stderr)
	if rc >= 0 {
		return rc
	}
	j := hoststate.Open(hoststate.Options{StateDir: stateDir})
	for _, b := range bdfs {
		if err := j.Bind(b); err != nil {
			fmt.Fprintln(stderr, "hpcvmm bind:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s bound to vfio-pci (hpcvmm unbind %s restores it; journal %s)\n", b, b, j.Path())
	}
	return 0
}

// runUnbind gives devices rebound by hpcvmm back to their original
// drivers: after `hpcvmm bind`, or after an hpcvmm that was killed before
// it could restore them itself.
func runUnbind(args []string, stdout, stderr io.Writer) int {
	stateDir, bdfs, rc := parseJournalArgs("unbind", args, stdout, stderr)
	if rc >= 0 {
		return rc
	}
	rep, err := hoststate.RestoreStale(hoststate.Options{StateDir: stateDir}, bdfs...)
	for _, c := range rep.Restored {
		fmt.Fprintln(stdout, "restored:", c)
	}
	for _, s := range rep.Skipped {
		fmt.Fprintln(stdout, "left alone (its hpcvmm is still running):", s)
	}
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm unbind:", err)
		return 1
	}
	if len(rep.Restored) == 0 {
		fmt.Fprintln(stdout, "nothing to restore")
	}
	return 0
}

// parseJournalArgs parses the flags and BDF arguments `hpcvmm bind` and
// `hpcvmm unbind` share. rc is -1 to go on, else the exit status after help
// or a usage error was printed.
func parseJournalArgs(cmd string, args []string, stdout, stderr io.Writer) (stateDir string, bdfs []host.BDF, rc int) {
	var c *command
	if cmd == "bind" {
		c = newCommand("hpcvmm bind",
			"Rebind PCI devices to vfio-pci and leave them there, journaled, until `hpcvmm unbind` gives them back to their drivers.",
			"hpcvmm bind [--state-dir DIR] BDF...")
	} else {
		c = newCommand("hpcvmm unbind",
			"Give devices rebound by hpcvmm back to their drivers: after `hpcvmm bind`, or after an hpcvmm that was killed before it could. "+
				"Without BDFs, every device of every journal whose hpcvmm no longer runs.",
			"hpcvmm unbind [--state-dir DIR] [BDF...]")
	}
	c.footer = "Exit status: 0 done, 1 a device could not be rebound, 2 invalid input."
	dir := c.group("Flags").String("state-dir", hoststate.DefaultStateDir, "`DIR`: where hpcvmm journals the host changes it makes")
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return "", nil, rc
	}
	if cmd == "bind" && c.fs.NArg() == 0 {
		return "", nil, c.usageError(stderr, "no device given: name the PCI functions, e.g. hpcvmm bind 0000:82:00.0")
	}
	bdfs, err := parseBDFs(c.fs.Args())
	if err != nil {
		return "", nil, c.usageError(stderr, "%v", err)
	}
	return *dir, bdfs, -1
}

// parseBDFs parses the BDF arguments, stopping at the first bad one so the
// error stays one line.
func parseBDFs(args []string) ([]host.BDF, error) {
	var out []host.BDF
	for _, a := range args {
		b, err := host.ParseBDF(a)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}
