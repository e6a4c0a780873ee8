package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/vfio"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// addPassthroughFlags defines --gpu, --vf, --bind-devices and --p2p on fs.
func addPassthroughFlags(fs *pflag.FlagSet, p *vmm.PassthroughConfig) {
	fs.Var((*stringList)(&p.GPUs), "gpu", "`BDF[,clique=N]`: pass a GPU (or any PCI device) through VFIO; clique=N gives an NVIDIA GPU the P2P clique capability; slurm: the step's gpu GRES (repeatable)")
	fs.Var((*stringList)(&p.VFs), "vf", "`BDF[,node-guid=G,port-guid=G][,guid=auto][,link=auto|enable|disable]`: pass an SR-IOV virtual function through, an InfiniBand VF with the GUIDs and link state to set on its PF; slurm[,OPTIONS]: the step's nic GRES (repeatable)")
	fs.BoolVar(&p.Bind, "bind-devices", false, "rebind devices held by a host driver to vfio-pci for this VM (journaled in "+hoststate.DefaultStateDir+") and give them back when it ends")
	fs.VarPF(notValue{&p.NoP2P}, "p2p", "", "DMA-map device BARs so passed-through devices reach each other (GPUDirect P2P/RDMA); --p2p=false skips it when they need not").NoOptDefVal = "true"
}

// runBind rebinds devices to vfio-pci and leaves them there, sets
// InfiniBand VFs' GUIDs and link state, and (a Prolog's job) hands the
// devices' VFIO group files and new persistent TAPs to the job's user;
// every change is journaled, so `hpcvmm unbind` undoes it. Under Slurm (a
// Prolog) --gpu slurm and --vf slurm[,guid=auto] name the job's devices.
// All input is checked before the first change.
func runBind(args []string, stdout, stderr io.Writer) int {
	c := newCommand("hpcvmm bind",
		"Rebind PCI devices to vfio-pci and set InfiniBand VFs' GUIDs and link state, and leave them so, journaled, until `hpcvmm unbind` restores them. "+
			"In a Slurm Prolog, --gpu slurm and --vf slurm name the job's devices on this node, --owner hands exactly their VFIO group files to the job's user and --tap makes that user a TAP, so the job's steps run as the user.",
		"hpcvmm bind [--state-dir DIR] [--gpu BDF|slurm]... [--vf BDF|slurm[,IB-OPTIONS]]... [BDF...]",
		"hpcvmm bind --if-any --owner USER [--tap NAME,bridge=BR] --gpu slurm --vf slurm")
	c.footer = "IB-OPTIONS: node-guid=GUID,port-guid=GUID[,link=auto|enable|disable]\nor guid=auto (see hpcvmm run --help).\n\n" +
		exitHelp("bind")
	g := c.group("Flags")
	dir := g.String("state-dir", hoststate.DefaultStateDir, "`DIR`: where hpcvmm journals the host changes it makes")
	var r bindRequest
	g.Var((*stringList)(&r.p.GPUs), "gpu", "`BDF|slurm`: a device to bind; slurm: the job's gpu GRES (repeatable)")
	g.Var((*stringList)(&r.p.VFs), "vf", "`BDF|slurm[,IB-OPTIONS]`: a VF to bind, with the InfiniBand identity to set; slurm: the job's nic GRES (repeatable)")
	g.BoolVar(&r.ifAny, "if-any", false, "with --gpu slurm or --vf slurm: a job that holds no gpu (or nic) GRES on this node binds none, instead of failing (a Prolog under set -e)")
	g.StringVar(&r.owner, "owner", "", "`USER`: hand the VFIO group files of the devices bound (/dev/vfio/<group>, mode 0600) to this user, name or uid (in a Prolog: \"$SLURM_JOB_UID\"); hpcvmm unbind gives them back")
	g.Var((*stringList)(&r.taps), "tap", "`NAME[,bridge=BRIDGE]`: create a persistent TAP owned by --owner, up, on this existing bridge, for hpcvmm run --net tap=NAME as that user (no CAP_NET_ADMIN); hpcvmm unbind deletes it (repeatable)")
	force := g.Bool("force", false, "rebind even a device the host uses (a network interface that is up, routes or has an address; a mounted, stacked or swap disk): without it such a device is refused")
	sysRoot, procRoot := hostRootFlags(c)
	devRoot := new(string)
	c.hidden(func(fs *pflag.FlagSet) { fs.StringVar(devRoot, "devfs", "/dev", "device directory root (tests)") })
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return rc
	}
	r.p.GPUs = append(r.p.GPUs, c.fs.Args()...)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	env := &slurm.Env{Host: host.New(*sysRoot, *procRoot), DevDir: *devRoot}
	pl, err := planBind(r, env, log)
	if err != nil {
		if code := exitCode(err, exitInput); code != exitInput {
			fmt.Fprintln(stderr, "hpcvmm bind:", err) // the node's fault: no --help to point at
			return code
		}
		return c.usageError(stderr, "%v", err)
	}
	// A device the host uses is refused before the first change: rebinding
	// the node's NIC or root disk cuts it off (issue 23).
	if !*force {
		for _, b := range pl.bdfs {
			if _, err := os.Stat(filepath.Join(*sysRoot, "bus/pci/devices", b.String())); errors.Is(err, fs.ErrNotExist) {
				continue // the journal's Bind says so, with what to do
			}
			if err := vfio.CheckHostUse(env.Host, b); err != nil {
				fmt.Fprintf(stderr, "hpcvmm bind: %s: %v (--force rebinds it anyway)\n", b, err)
				return exitHost
			}
		}
	}
	j := hoststate.Open(hoststate.Options{StateDir: *dir, SysfsRoot: *sysRoot, DevRoot: *devRoot})
	if err := applyBind(pl, j, *devRoot, stdout); err != nil {
		fmt.Fprintln(stderr, "hpcvmm bind:", err)
		return exitCode(err, exitFailed) // 3: a state directory others can write
	}
	return exitOK
}

// runUnbind gives devices rebound by hpcvmm back to their original
// drivers: after `hpcvmm bind`, or after an hpcvmm that was killed before
// it could restore them itself.
func runUnbind(args []string, stdout, stderr io.Writer) int {
	stateDir, bdfs, rc := parseJournalArgs(args, stdout, stderr)
	if rc >= 0 {
		return rc
	}
	rep, err := hoststate.RestoreStale(hoststate.Options{StateDir: stateDir}, bdfs...)
	for _, c := range rep.Restored {
		fmt.Fprintln(stdout, "restored:", c)
	}
	for _, s := range rep.Skipped {
		fmt.Fprintln(stdout, "left alone:", s)
	}
	if err != nil {
		fmt.Fprintln(stderr, "hpcvmm unbind:", err)
		return exitCode(err, exitFailed) // 3: a state directory or journal others could have written
	}
	if len(rep.Restored) == 0 {
		fmt.Fprintln(stdout, "nothing to restore")
	}
	return exitOK
}

// parseJournalArgs parses the flags and BDF arguments of `hpcvmm unbind`.
// rc is -1 to go on, else the exit status after help or a usage error was
// printed.
func parseJournalArgs(args []string, stdout, stderr io.Writer) (stateDir string, bdfs []host.BDF, rc int) {
	c := newCommand("hpcvmm unbind",
		"Give devices rebound by hpcvmm back to their drivers, and InfiniBand VFs their previous GUIDs and link state: after `hpcvmm bind`, or after an hpcvmm that was killed before it could. "+
			"Without BDFs, every change of every journal whose hpcvmm no longer runs. "+
			"With SLURM_JOB_ID set (a Slurm Epilog), only that job's journals; without it, never a journal of a Slurm job that squeue says still runs.",
		"hpcvmm unbind [--state-dir DIR] [BDF...]")
	c.footer = exitHelp("unbind")
	dir := c.group("Flags").String("state-dir", hoststate.DefaultStateDir, "`DIR`: where hpcvmm journals the host changes it makes")
	c.done()
	if rc := c.parse(args, stdout, stderr); rc >= 0 {
		return "", nil, rc
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
