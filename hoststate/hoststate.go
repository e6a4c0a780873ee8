// Package hoststate records what hpcvmm changes on the host and undoes it.
//
// Passthrough needs host changes that must not outlive the VM: a device
// rebound from its driver to vfio-pci, an InfiniBand VF's node/port GUIDs
// and link state set on its PF (and later TAP devices and hugepage
// reservations), and what a Prolog grants a job's user: the job's VFIO
// group files and persistent TAPs owned by the user. Each change is written to a journal file
// (<StateDir>/<pid>-<random>.json, /run/hpcvmm by default; the name is
// claimed exclusively, so a later process with the same PID never
// overwrites a crashed one's journal) and synced BEFORE the change is made,
// so whatever kills hpcvmm the file says what to undo. Restore undoes
// every change, newest first, and deletes the file; the VMM calls it on
// every exit path it controls (normal exit, error, signal). After a
// SIGKILL or a crash, RestoreStale (behind `hpcvmm unbind`) finds journals
// whose process is gone and undoes them.
//
// A VM's teardown runs under its seccomp filter, which refuses opens for
// writing and file creation (and has no rename): PrepareRestore opens the
// journal file before the filter goes on, and a Restore that cannot undo
// everything rewrites it in place through that file, so the journal names
// exactly what is left for `hpcvmm unbind`.
//
// Under Slurm a journal records the job and step (SLURM_JOB_ID,
// SLURM_STEP_ID). A Prolog's `hpcvmm bind` exits as soon as it has bound,
// so its process is no proof of anything: with SLURM_JOB_ID set (the
// job's Epilog) RestoreStale undoes that job's journals only, and outside
// a job it never undoes the journal of a job Slurm still runs (or cannot
// say about).
//
// Journals become sysfs paths and values written as root, so they are
// trusted only as far as who could have written them: the state directory
// and every journal must be owned by root or hpcvmm's user and not be
// writable by group or others (nor be symbolic links), every BDF, driver
// name and network interface name read back is checked, and sysfs
// attributes are opened with O_NOFOLLOW.
//
// All sysfs paths are below a root directory, and sysfs writes go through a
// replaceable function, so tests run against synthetic trees with a small
// simulation of the kernel's driver core.
package hoststate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/slurm"
)

// DefaultStateDir is where journals live on a real host: tmpfs, so a reboot
// (which also undoes every change) clears them.
const DefaultStateDir = "/run/hpcvmm"

// VFIODriver is the driver passthrough devices are bound to.
const VFIODriver = "vfio-pci"

// Kinds of change.
const (
	// KindPCIBind is a PCI function rebound to vfio-pci.
	KindPCIBind = "pci-bind"
	// KindIBVF is an InfiniBand VF's GUIDs and/or link state set on its PF.
	KindIBVF = "ib-vf-identity"
)

// Change is one host modification and what is needed to undo it.
type Change struct {
	Kind string `json:"kind"`
	// BDF is the PCI function (KindPCIBind).
	BDF string `json:"bdf,omitempty"`
	// OriginalDriver is the driver the function was bound to, "" for none.
	OriginalDriver string `json:"original_driver,omitempty"`
	// OriginalOverride is driver_override before the change, "" for none.
	OriginalOverride string `json:"original_override,omitempty"`
	// IBVF is what a KindIBVF change set and the values before it.
	IBVF *IBVFChange `json:"ib_vf,omitempty"`
	// VFIOOwner is the group file a KindVFIOOwner change handed to a
	// user, and its owner and mode before.
	VFIOOwner *VFIOOwnerChange `json:"vfio_owner,omitempty"`
	// TAP is the TAP a KindTAP change created.
	TAP *TAPChange `json:"tap,omitempty"`
}

// IBVFChange records an InfiniBand VF identity change (BDF is the VF). The
// PF's netdev is looked up again from PF when undoing, since an interface
// may be renamed while the VM runs.
type IBVFChange struct {
	PF      string `json:"pf"`
	Netdev  string `json:"netdev"`
	VFIndex int    `json:"vf_index"`
	// Set says which attributes were changed; only those are restored.
	SetNode bool `json:"set_node_guid,omitempty"`
	SetPort bool `json:"set_port_guid,omitempty"`
	SetLink bool `json:"set_link_state,omitempty"`
	// Original values, read before the change.
	NodeGUID ibvf.GUID      `json:"original_node_guid"`
	PortGUID ibvf.GUID      `json:"original_port_guid"`
	Link     ibvf.LinkState `json:"original_link_state"`
}

func (c Change) String() string {
	switch c.Kind {
	case KindPCIBind:
		d := c.OriginalDriver
		if d == "" {
			d = "no driver"
		}
		return fmt.Sprintf("%s rebound from %s to %s", c.BDF, d, VFIODriver)
	case KindIBVF:
		if v := c.IBVF; v != nil {
			return fmt.Sprintf("InfiniBand VF %s (%s VF %d): node GUID %s, port GUID %s, link %s", c.BDF, v.Netdev, v.VFIndex, v.NodeGUID, v.PortGUID, v.Link)
		}
	case KindVFIOOwner:
		if v := c.VFIOOwner; v != nil {
			return fmt.Sprintf("VFIO group %d handed to uid %d (was uid %d gid %d mode %#o)", v.Group, v.UID, v.OriginalUID, v.OriginalGID, v.OriginalMode)
		}
	case KindTAP:
		if v := c.TAP; v != nil {
			on := ""
			if v.Bridge != "" {
				on = " on bridge " + v.Bridge
			}
			return fmt.Sprintf("TAP %s%s for uid %d gid %d", v.Name, on, v.UID, v.GID)
		}
	}
	return c.Kind
}

// Options configures Open and RestoreStale.
type Options struct {
	// StateDir holds the journals; "" means DefaultStateDir.
	StateDir string
	// SysfsRoot is the sysfs mount; "" means /sys.
	SysfsRoot string
	// ProcRoot is the procfs mount, for liveness of other journals' PIDs;
	// "" means /proc.
	ProcRoot string
	// WriteFile performs one sysfs attribute write; nil means an
	// O_WRONLY write of the existing file. Tests simulate the kernel here.
	WriteFile func(path string, data []byte) error
	// DevRoot is the device directory holding vfio/<group>; "" means
	// /dev.
	DevRoot string
	// PID is this process's ID in the journal name; 0 means os.Getpid().
	PID int
	// Netlink sets InfiniBand VF identities; nil means the kernel's
	// (ibvf.System). Tests record the messages here.
	Netlink ibvf.Netlink
	// Getenv reads the environment (SLURM_JOB_ID, SLURM_STEP_ID); nil
	// means os.Getenv.
	Getenv func(string) string
	// JobRunning reports whether Slurm still runs a job; nil means
	// slurm.JobRunning (squeue).
	JobRunning func(job string) (bool, error)
}

func (o *Options) fill() {
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir
	}
	if o.SysfsRoot == "" {
		o.SysfsRoot = "/sys"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	if o.DevRoot == "" {
		o.DevRoot = "/dev"
	}
	if o.WriteFile == nil {
		o.WriteFile = writeAttr
	}
	if o.PID == 0 {
		o.PID = os.Getpid()
	}
	if o.Netlink == nil {
		o.Netlink = ibvf.System{}
	}
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.JobRunning == nil {
		o.JobRunning = slurm.JobRunning
	}
}

// writeAttr writes a sysfs attribute in one write(2), which is how sysfs
// wants it (it applies each write as a whole). A symbolic link in the
// attribute's place is refused (O_NOFOLLOW): sysfs attributes are never
// links, and root following one writes wherever it points.
func writeAttr(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Journal is this process's record of host changes. Its methods are safe
// for concurrent use.
type Journal struct {
	mu   sync.Mutex
	opts Options
	path string
	// claimed is set once the file at path is this journal's: the first
	// save creates it exclusively, never replacing another's.
	claimed bool
	// rewrite is the journal file opened for writing by PrepareRestore,
	// before a seccomp filter that refuses write-opens and file creation:
	// Restore's save rewrites it in place when some changes could not be
	// undone (rewriteInPlace).
	rewrite *os.File
	f       file
}

// Open returns the journal for this process. Nothing is written until the
// first change.
func Open(opts Options) *Journal {
	opts.fill()
	j := &Journal{opts: opts, path: journalName(opts.StateDir, opts.PID)}
	j.f.PID = opts.PID
	j.f.StartTime, _ = startTime(opts.ProcRoot, opts.PID)
	if job := opts.Getenv("SLURM_JOB_ID"); slurm.ValidJobID(job) {
		j.f.SlurmJob = job
		if step := opts.Getenv("SLURM_STEP_ID"); validStep(step) {
			j.f.SlurmStep = step
		}
	}
	return j
}

// Path is the journal file's path.
func (j *Journal) Path() string { return j.path }

// Changes returns the recorded changes, oldest first.
func (j *Journal) Changes() []Change {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]Change(nil), j.f.Changes...)
}

func (j *Journal) devDir(bdf string) string {
	return filepath.Join(j.opts.SysfsRoot, "bus/pci/devices", bdf)
}

// currentDriver returns the driver bound to bdf, "" for none.
func currentDriver(sysfs, bdf string) (string, error) {
	t, err := os.Readlink(filepath.Join(sysfs, "bus/pci/devices", bdf, "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("hoststate: read driver of %s: %w", bdf, err)
	}
	return filepath.Base(t), nil
}

// readOverride returns driver_override, "" when unset ("(null)").
func readOverride(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, "driver_override"))
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "(null)" {
		s = ""
	}
	return s, nil
}

// Bind rebinds PCI function bdf to vfio-pci through driver_override: the
// change is journaled first, then driver_override is set, the current
// driver unbound and the device reprobed. A device already on a VFIO
// driver is left alone and not journaled. On failure the device is put
// back as it was.
func (j *Journal) Bind(bdf host.BDF) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	name := bdf.String()
	dir := j.devDir(name)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("hoststate: bind %s to %s: no such PCI device (%w); check the address with lspci -D", name, VFIODriver, err)
	}
	drv, err := currentDriver(j.opts.SysfsRoot, name)
	if err != nil {
		return err
	}
	if host.IsVFIODriver(drv) {
		return nil
	}
	override, err := readOverride(dir)
	if err != nil {
		return fmt.Errorf("hoststate: bind %s: read driver_override: %w (the kernel needs driver_override support, Linux 3.16+)", name, err)
	}
	if _, err := os.Stat(filepath.Join(j.opts.SysfsRoot, "bus/pci/drivers", VFIODriver)); err != nil {
		return fmt.Errorf("hoststate: bind %s: the %s driver is not loaded: run modprobe vfio-pci", name, VFIODriver)
	}
	c := Change{Kind: KindPCIBind, BDF: name, OriginalDriver: drv, OriginalOverride: override}
	j.f.Changes = append(j.f.Changes, c)
	if err := j.save(); err != nil {
		j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
		return fmt.Errorf("hoststate: bind %s: journal not written, nothing changed: %w", name, err)
	}
	if err := j.bind(c); err != nil {
		uerr := j.undo(c)
		if uerr == nil {
			j.f.Changes = j.f.Changes[:len(j.f.Changes)-1]
			j.save()
		}
		return errors.Join(err, uerr)
	}
	return nil
}

func (j *Journal) bind(c Change) error {
	w := j.opts.WriteFile
	dir := j.devDir(c.BDF)
	if err := w(filepath.Join(dir, "driver_override"), []byte(VFIODriver)); err != nil {
		return fmt.Errorf("hoststate: bind %s: set driver_override: %w", c.BDF, err)
	}
	if c.OriginalDriver != "" {
		if err := w(filepath.Join(j.opts.SysfsRoot, "bus/pci/drivers", c.OriginalDriver, "unbind"), []byte(c.BDF)); err != nil {
			return fmt.Errorf("hoststate: bind %s: unbind from %s: %w", c.BDF, c.OriginalDriver, err)
		}
	}
	if err := w(filepath.Join(j.opts.SysfsRoot, "bus/pci/drivers_probe"), []byte(c.BDF)); err != nil {
		return fmt.Errorf("hoststate: bind %s: probe with driver_override=%s: %w", c.BDF, VFIODriver, err)
	}
	drv, err := currentDriver(j.opts.SysfsRoot, c.BDF)
	if err != nil {
		return err
	}
	if drv != VFIODriver {
		if drv == "" {
			drv = "no driver"
		}
		return fmt.Errorf("hoststate: bind %s: after probing, the device is on %s, not %s (is vfio-pci loaded? see dmesg)", c.BDF, drv, VFIODriver)
	}
	return nil
}
