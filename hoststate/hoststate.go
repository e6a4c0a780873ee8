// Package hoststate records what hpcvmm changes on the host and undoes it.
//
// Passthrough needs host changes that must not outlive the VM: a device
// rebound from its driver to vfio-pci, an InfiniBand VF's node/port GUIDs
// and link state set on its PF (and later TAP devices and hugepage
// reservations). Each change is written to a journal file
// (<StateDir>/<pid>.json, /run/hpcvmm by default) and synced BEFORE the
// change is made, so whatever kills hpcvmm the file says what to undo.
// Restore undoes every change, newest first, and deletes the file; the VMM
// calls it on every exit path it controls (normal exit, error, signal).
// After a SIGKILL or a crash, RestoreStale (behind `hpcvmm unbind` and
// `hpcvmm cleanup`) finds journals whose process is gone and undoes them.
//
// All sysfs paths are below a root directory, and sysfs writes go through a
// replaceable function, so tests run against synthetic trees with a small
// simulation of the kernel's driver core.
package hoststate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
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
	}
	return c.Kind
}

// file is the journal's on-disk form.
type file struct {
	PID int `json:"pid"`
	// StartTime is the process start time (clock ticks since boot, field 22
	// of /proc/<pid>/stat), so a reused PID is not mistaken for a live
	// hpcvmm.
	StartTime uint64   `json:"start_time,omitempty"`
	Changes   []Change `json:"changes"`
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
	// PID is this process's ID in the journal name; 0 means os.Getpid().
	PID int
	// Netlink sets InfiniBand VF identities; nil means the kernel's
	// (ibvf.System). Tests record the messages here.
	Netlink ibvf.Netlink
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
	if o.WriteFile == nil {
		o.WriteFile = writeAttr
	}
	if o.PID == 0 {
		o.PID = os.Getpid()
	}
	if o.Netlink == nil {
		o.Netlink = ibvf.System{}
	}
}

// writeAttr writes a sysfs attribute in one write(2), which is how sysfs
// wants it (it applies each write as a whole).
func writeAttr(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
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
	f    file
}

// Open returns the journal for this process. Nothing is written until the
// first change.
func Open(opts Options) *Journal {
	opts.fill()
	j := &Journal{opts: opts, path: filepath.Join(opts.StateDir, strconv.Itoa(opts.PID)+".json")}
	j.f.PID = opts.PID
	j.f.StartTime, _ = startTime(opts.ProcRoot, opts.PID)
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

// save writes the journal durably (temp file, fsync, rename), or removes
// it when empty.
func (j *Journal) save() error {
	if len(j.f.Changes) == 0 {
		if err := os.Remove(j.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hoststate: remove journal %s: %w", j.path, err)
		}
		return nil
	}
	if err := os.MkdirAll(j.opts.StateDir, 0o700); err != nil {
		return fmt.Errorf("hoststate: create state directory %s: %w", j.opts.StateDir, err)
	}
	b, err := json.MarshalIndent(j.f, "", "  ")
	if err != nil {
		return fmt.Errorf("hoststate: encode journal: %w", err)
	}
	tmp := j.path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("hoststate: write journal %s: %w", tmp, err)
	}
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, j.path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	return nil
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

// undo gives c's device back: off any driver it is on now (unless that is
// the original), driver_override restored, reprobed so the original driver
// binds, explicitly bound if the probe picked nothing.
func (j *Journal) undo(c Change) error {
	return undoChange(j.opts, c)
}

func undoChange(o Options, c Change) error {
	if c.Kind == KindIBVF {
		return undoIBVF(o, c)
	}
	if c.Kind != KindPCIBind {
		return fmt.Errorf("hoststate: cannot undo change of unknown kind %q (journal from a newer hpcvmm?)", c.Kind)
	}
	w := o.WriteFile
	dir := filepath.Join(o.SysfsRoot, "bus/pci/devices", c.BDF)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("hoststate: restore %s: device gone (%w); nothing to undo", c.BDF, err)
	}
	cur, err := currentDriver(o.SysfsRoot, c.BDF)
	if err != nil {
		return err
	}
	if cur != "" && cur != c.OriginalDriver {
		if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers", cur, "unbind"), []byte(c.BDF)); err != nil {
			return fmt.Errorf("hoststate: restore %s: unbind from %s: %w", c.BDF, cur, err)
		}
	}
	// Writing a newline clears driver_override.
	ov := c.OriginalOverride
	if ov == "" {
		ov = "\n"
	}
	if err := w(filepath.Join(dir, "driver_override"), []byte(ov)); err != nil {
		return fmt.Errorf("hoststate: restore %s: reset driver_override: %w", c.BDF, err)
	}
	if c.OriginalDriver == "" || cur == c.OriginalDriver {
		return nil
	}
	if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers_probe"), []byte(c.BDF)); err != nil {
		return fmt.Errorf("hoststate: restore %s: reprobe: %w", c.BDF, err)
	}
	if now, _ := currentDriver(o.SysfsRoot, c.BDF); now == c.OriginalDriver {
		return nil
	}
	if err := w(filepath.Join(o.SysfsRoot, "bus/pci/drivers", c.OriginalDriver, "bind"), []byte(c.BDF)); err != nil {
		return fmt.Errorf("hoststate: restore %s: bind to %s: %w", c.BDF, c.OriginalDriver, err)
	}
	if now, _ := currentDriver(o.SysfsRoot, c.BDF); now != c.OriginalDriver {
		return fmt.Errorf("hoststate: restore %s: still not on %s after bind; bind it by hand: echo %s > /sys/bus/pci/drivers/%s/bind", c.BDF, c.OriginalDriver, c.BDF, c.OriginalDriver)
	}
	return nil
}

// Restore undoes every recorded change, newest first. Changes that could
// not be undone stay in the journal (so `hpcvmm unbind` can retry) and are
// reported together.
func (j *Journal) Restore() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	var errs []error
	var left []Change
	for i := len(j.f.Changes) - 1; i >= 0; i-- {
		c := j.f.Changes[i]
		if err := j.undo(c); err != nil {
			errs = append(errs, err)
			left = append([]Change{c}, left...)
		}
	}
	j.f.Changes = left
	if err := j.save(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// startTime reads field 22 (starttime) of /proc/<pid>/stat.
func startTime(proc string, pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may contain spaces and parentheses; the
	// fields after it start after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("hoststate: malformed %s/%d/stat", proc, pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return 0, fmt.Errorf("hoststate: short %s/%d/stat", proc, pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// alive reports whether the journal's process still runs (same PID and,
// when recorded, same start time).
func alive(o Options, f file) bool {
	if f.PID <= 0 {
		return false
	}
	if err := syscall.Kill(f.PID, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	st, err := startTime(o.ProcRoot, f.PID)
	if err != nil {
		// Signal 0 succeeded but procfs is unreadable (different procfs
		// root in a test): trust the signal.
		return true
	}
	return f.StartTime == 0 || st == f.StartTime
}

// StaleReport says what RestoreStale did.
type StaleReport struct {
	// Restored are the changes undone.
	Restored []Change
	// Skipped names journals left alone because their hpcvmm still runs.
	Skipped []string
}

// RestoreStale undoes the changes recorded by hpcvmm processes that no
// longer run (killed, crashed), for `hpcvmm unbind` and cleanup. With bdfs,
// only changes to those PCI functions are undone; the rest stay journaled.
// Journals of live processes (other than this one) are never touched.
func RestoreStale(opts Options, bdfs ...host.BDF) (StaleReport, error) {
	opts.fill()
	var rep StaleReport
	ents, err := os.ReadDir(opts.StateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	}
	if err != nil {
		return rep, fmt.Errorf("hoststate: list %s: %w", opts.StateDir, err)
	}
	want := map[string]bool{}
	for _, b := range bdfs {
		want[b.String()] = true
	}
	var errs []error
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(opts.StateDir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, fmt.Errorf("hoststate: read %s: %w", path, err))
			continue
		}
		var f file
		if err := json.Unmarshal(b, &f); err != nil {
			errs = append(errs, fmt.Errorf("hoststate: parse %s: %w (remove it after checking the devices by hand)", path, err))
			continue
		}
		if f.PID != opts.PID && alive(opts, f) {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s (hpcvmm pid %d still running)", path, f.PID))
			continue
		}
		j := &Journal{opts: opts, path: path, f: f}
		var left []Change
		for i := len(f.Changes) - 1; i >= 0; i-- {
			c := f.Changes[i]
			if len(want) > 0 && !want[c.BDF] {
				left = append([]Change{c}, left...)
				continue
			}
			if err := undoChange(opts, c); err != nil {
				errs = append(errs, fmt.Errorf("%w (journal %s)", err, path))
				left = append([]Change{c}, left...)
				continue
			}
			rep.Restored = append(rep.Restored, c)
		}
		j.f.Changes = left
		if err := j.save(); err != nil {
			errs = append(errs, err)
		}
	}
	return rep, errors.Join(errs...)
}
