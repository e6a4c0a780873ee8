package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// stringList collects a repeatable flag; a comma-separated value is kept
// whole (a --gpu value carries ",clique=N").
type stringList []string

func (l *stringList) String() string { return fmt.Sprint(*l) }
func (l *stringList) Set(v string) error {
	*l = append(*l, v)
	return nil
}

// addPassthroughFlags registers --gpu, --vf, --bind and --p2p on fs.
func addPassthroughFlags(fs *flag.FlagSet, p *vmm.PassthroughConfig) {
	fs.Var((*stringList)(&p.GPUs), "gpu", "pass a GPU (or any PCI device) through: BDF[,clique=N] (repeatable)")
	fs.Var((*stringList)(&p.VFs), "vf", "pass an SR-IOV virtual function through: BDF (repeatable)")
	fs.BoolVar(&p.Bind, "bind", false, "rebind devices held by a host driver to vfio-pci for this VM and give them back afterwards")
	fs.Func("p2p", "DMA-map device BARs for peer-to-peer between passed-through devices (default true)", func(s string) error {
		switch s {
		case "true", "on", "1":
			p.NoP2P = false
		case "false", "off", "0":
			p.NoP2P = true
		default:
			return fmt.Errorf("want true or false, got %q", s)
		}
		return nil
	})
}

// runBind rebinds devices to vfio-pci and leaves them there; the change is
// journaled, so `hpcvmm unbind` gives them back to their drivers.
func runBind(args []string, stdout, stderr io.Writer) int {
	stateDir, bdfs, ok := parseJournalArgs("bind", args, stderr)
	if !ok {
		return 2
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
	stateDir, bdfs, ok := parseJournalArgs("unbind", args, stderr)
	if !ok {
		return 2
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
// `hpcvmm unbind` share; ok is false after a usage error was printed.
func parseJournalArgs(cmd string, args []string, stderr io.Writer) (stateDir string, bdfs []host.BDF, ok bool) {
	fs := flag.NewFlagSet("hpcvmm "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("state-dir", "", "directory of hpcvmm's host-state journals (default "+hoststate.DefaultStateDir+")")
	if err := fs.Parse(args); err != nil {
		return "", nil, false
	}
	bdfs, err := parseBDFs(fs.Args())
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm %s: %v\n", cmd, err)
		return "", nil, false
	}
	return *dir, bdfs, true
}

func parseBDFs(args []string) ([]host.BDF, error) {
	var out []host.BDF
	var errs []error
	for _, a := range args {
		b, err := host.ParseBDF(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, b)
	}
	return out, errors.Join(errs...)
}
