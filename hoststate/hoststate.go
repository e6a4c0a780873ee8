// Package hoststate records what hpcvmm changes on the host and undoes it.
//
// Passthrough needs host changes that must not outlive the VM: a device
// rebound from its driver to vfio-pci, an InfiniBand VF's node/port GUIDs
// and link state set on its PF (and later TAP devices and hugepage
// reservations). Each change is written to a journal file
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
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/trustfs"
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
	StartTime uint64 `json:"start_time,omitempty"`
	// SlurmJob and SlurmStep are the Slurm job and step the process ran
	// in (SLURM_JOB_ID, SLURM_STEP_ID; "" outside Slurm): a Prolog's
	// journal outlives its process, and only the job's own Epilog, or
	// anyone once Slurm no longer runs the job, may restore it.
	SlurmJob  string   `json:"slurm_job,omitempty"`
	SlurmStep string   `json:"slurm_step,omitempty"`
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

// journalName is a fresh journal path for pid: the PID for the
// administrator, a random part so that a later process with the same PID
// (PIDs wrap, PID namespaces repeat them) gets another file.
func journalName(dir string, pid int) string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return filepath.Join(dir, fmt.Sprintf("%d-%s.json", pid, hex.EncodeToString(b[:])))
}

// validStep reports whether s looks like a SLURM_STEP_ID: a number or a
// name such as "batch" or "extern", short and plain.
func validStep(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '.' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

// Path is the journal file's path.
func (j *Journal) Path() string { return j.path }

// Changes returns the recorded changes, oldest first.
func (j *Journal) Changes() []Change {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]Change(nil), j.f.Changes...)
}

// save writes the journal durably (temporary file, fsync, rename), or
// removes it when empty. The first save claims the journal's name
// exclusively (a rename that never replaces: another process's journal
// with the same name stays, and this one takes a new name).
//
// After PrepareRestore, a journal whose new form fits in the file is
// rewritten in place through the file opened then (rewriteInPlace), with
// no open or rename: the way a restore under the seccomp filter records
// what it could not undo.
func (j *Journal) save() error {
	if len(j.f.Changes) == 0 {
		j.dropRewrite()
		if !j.claimed {
			return nil
		}
		if err := os.Remove(j.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("hoststate: remove journal %s: %w", j.path, err)
		}
		j.claimed = false
		return nil
	}
	b, err := json.MarshalIndent(j.f, "", "  ")
	if err != nil {
		return fmt.Errorf("hoststate: encode journal: %w", err)
	}
	if j.rewrite != nil && j.claimed {
		done, err := j.rewriteInPlace(b)
		if done || err != nil {
			return err
		}
	}
	if err := stateDir(j.opts.StateDir, true); err != nil {
		return err
	}
	f, err := os.CreateTemp(j.opts.StateDir, ".tmp-"+filepath.Base(j.path)+"-*")
	if err != nil {
		return fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	switch {
	case err != nil:
	case j.claimed:
		err = os.Rename(tmp, j.path)
	default:
		for try := 0; ; try++ {
			err = renameNoReplace(tmp, j.path)
			if !errors.Is(err, fs.ErrExist) || try == 8 {
				break
			}
			j.path = journalName(j.opts.StateDir, j.opts.PID)
		}
		j.claimed = err == nil
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	// The file PrepareRestore opened is no longer the journal.
	j.dropRewrite()
	return nil
}

// PrepareRestore opens the journal file for writing now, for a Restore
// that runs under a seccomp filter which refuses opens for writing and
// file creation (hpcvmm's process filter; the VM's teardown runs under
// it): when some changes cannot be undone there, Restore records the rest
// through this file instead of writing a new one. Call it after the last
// change. Without it (or when nothing is journaled) Restore writes the
// journal as every save does.
func (j *Journal) PrepareRestore() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.dropRewrite()
	if !j.claimed {
		return nil
	}
	f, err := os.OpenFile(j.path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("hoststate: open journal %s for the restore: %w", j.path, err)
	}
	j.rewrite = f
	return nil
}

// dropRewrite closes the file PrepareRestore opened.
func (j *Journal) dropRewrite() {
	if j.rewrite != nil {
		j.rewrite.Close()
		j.rewrite = nil
	}
}

// rewriteInPlace writes journal b over the file PrepareRestore opened, in
// one write at offset 0 padded with spaces to the file's length (JSON
// allows trailing white space; the filter has no ftruncate), then syncs
// it. A restore only removes changes, so the new journal is never longer;
// one that is (done false) is left to save's usual path. Unlike that path
// it is not atomic against a crash of the machine in the middle of the
// write, but the default state directory is tmpfs, which a crash empties
// along with every change it records.
func (j *Journal) rewriteInPlace(b []byte) (done bool, err error) {
	fi, err := j.rewrite.Stat()
	if err != nil {
		return false, fmt.Errorf("hoststate: write journal %s: %w", j.path, err)
	}
	size := fi.Size()
	if int64(len(b))+1 > size {
		return false, nil
	}
	buf := make([]byte, size)
	copy(buf, b)
	for i := len(b); i < len(buf)-1; i++ {
		buf[i] = ' '
	}
	buf[len(buf)-1] = '\n'
	if _, err := j.rewrite.WriteAt(buf, 0); err != nil {
		return true, fmt.Errorf("hoststate: rewrite journal %s: %w", j.path, err)
	}
	if err := j.rewrite.Sync(); err != nil {
		return true, fmt.Errorf("hoststate: rewrite journal %s: %w", j.path, err)
	}
	return true, nil
}

// renameNoReplace renames from to to unless to exists (fs.ErrExist), with
// RENAME_NOREPLACE, or a hard link and unlink where the file system lacks
// it. A name already taken on either path is kept: os.Link fails with
// EEXIST too.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) {
		if err = os.Link(from, to); err == nil {
			return os.Remove(from)
		}
		return err
	}
	if err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// stateDir checks the state directory: owned by root or hpcvmm's user, not
// writable by group or others, not a symbolic link (anyone who can write
// there chooses what a root `hpcvmm unbind` writes into sysfs). create
// makes it (0700) when it is missing.
func stateDir(dir string, create bool) error {
	fi, err := os.Lstat(dir)
	if create && errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("hoststate: create state directory %s: %w", dir, err)
		}
		fi, err = os.Lstat(dir)
	}
	if err != nil {
		return fmt.Errorf("hoststate: state directory: %w", err)
	}
	return checkOwner(dir, fi, true)
}

// checkOwner refuses a state directory or journal (dir false) that is a
// symbolic link, of the wrong kind, owned by another user than root or
// hpcvmm's, or writable by group or others, with a one-line error naming
// it and the fix.
func checkOwner(path string, fi fs.FileInfo, dir bool) error {
	bad := trustfs.Check(path, fi, dir)
	if bad == nil {
		return nil
	}
	w := trustfs.Wording{
		Subject:   "hoststate: journal " + path,
		Fix:       "check the devices it names by hand, then remove it",
		OwnerRisk: ", who could have written it",
		ModeRisk:  ", who could choose what hpcvmm unbind writes as root",
		ModeFix:   "check the devices it names by hand, then chmod go-w " + path + " (or remove it)",
	}
	if dir {
		w.Subject = "hoststate: state directory " + path
		w.Fix = "chown root " + path + "; chmod go-w " + path + ", or pass another --state-dir"
		w.ModeFix = ""
	}
	return bad.Explain(w)
}

// validDriver reports whether s can be a kernel driver's name (a directory
// of /sys/bus/pci/drivers): letters, digits, '_', '-', '.', '+', not
// starting with '.', at most 64 bytes.
func validDriver(s string) bool {
	if s == "" || len(s) > 64 || s[0] == '.' {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c == '-' || c == '.' || c == '+') {
			return false
		}
	}
	return true
}

// validNetdev reports whether s can be a network interface name
// (dev_valid_name: 1-15 bytes, not "." or "..", no '/', ':' or space).
func validNetdev(s string) bool {
	if s == "" || len(s) >= 16 || s == "." || s == ".." {
		return false
	}
	for _, c := range s {
		if c == '/' || c == ':' || c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// validBDF reports whether s is a PCI address in the canonical form
// hpcvmm writes (0000:82:00.0), the form sysfs names devices by.
func validBDF(s string) bool {
	b, err := host.ParseBDF(s)
	return err == nil && b.String() == s
}

// validate checks what a change read from a journal will turn into sysfs
// path parts, written values and netlink targets.
func (c Change) validate() error {
	if c.Kind != KindPCIBind && c.Kind != KindIBVF {
		return nil // undoChange refuses it, naming the kind
	}
	if !validBDF(c.BDF) {
		return fmt.Errorf("BDF %q is not a PCI address such as 0000:82:00.0", c.BDF)
	}
	switch c.Kind {
	case KindPCIBind:
		if c.OriginalDriver != "" && !validDriver(c.OriginalDriver) {
			return fmt.Errorf("original_driver %q is not a driver name", c.OriginalDriver)
		}
		if c.OriginalOverride != "" && !validDriver(c.OriginalOverride) {
			return fmt.Errorf("original_override %q is not a driver name", c.OriginalOverride)
		}
	case KindIBVF:
		v := c.IBVF
		if v == nil {
			return nil // undoIBVF says what to do
		}
		if !validBDF(v.PF) {
			return fmt.Errorf("ib_vf.pf %q is not a PCI address such as 0000:82:00.0", v.PF)
		}
		if !validNetdev(v.Netdev) {
			return fmt.Errorf("ib_vf.netdev %q is not a network interface name", v.Netdev)
		}
		if v.VFIndex < 0 || v.VFIndex > 0xffff {
			return fmt.Errorf("ib_vf.vf_index %d is not a VF number", v.VFIndex)
		}
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
	if err := c.validate(); err != nil {
		return fmt.Errorf("hoststate: restore %q: %w; nothing done", c.BDF, err)
	}
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
	if cur != "" && !validDriver(cur) {
		return fmt.Errorf("hoststate: restore %s: its driver link names %q, not a driver", c.BDF, cur)
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
// reported together, in one error that names the journal. Under a seccomp
// filter that refuses write-opens, call PrepareRestore before it goes on.
func (j *Journal) Restore() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	defer j.dropRewrite()
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
	} else if len(left) > 0 {
		errs = append(errs, fmt.Errorf("hoststate: %d change(s) not undone stay in journal %s: hpcvmm unbind retries them", len(left), j.path))
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
	// Skipped names journals left alone and why: their hpcvmm still runs,
	// their Slurm job still runs (or Slurm could not say), or they belong
	// to another job than the Epilog's.
	Skipped []string
}

// maxJournal bounds a journal's size: a few hundred bytes per change.
const maxJournal = 1 << 20

// RestoreStale undoes the changes recorded by hpcvmm processes that no
// longer run (killed, crashed, or a Prolog's `hpcvmm bind`), for `hpcvmm
// unbind`. With bdfs, only changes to those PCI functions are undone; the
// rest stay journaled. Journals of live processes (other than this one)
// are never touched. With SLURM_JOB_ID set (the job's Epilog), only that
// job's journals are undone; without, a journal of a Slurm job is undone
// only once Slurm says the job no longer runs (Options.JobRunning).
// Journals and a state directory that someone else could have written are
// refused (checkOwner), and so is a journal whose contents are not what
// hpcvmm writes (Change.validate), before anything is changed for it.
func RestoreStale(opts Options, bdfs ...host.BDF) (StaleReport, error) {
	opts.fill()
	var rep StaleReport
	if err := stateDir(opts.StateDir, false); errors.Is(err, fs.ErrNotExist) {
		return rep, nil
	} else if err != nil {
		return rep, err
	}
	ents, err := os.ReadDir(opts.StateDir)
	if err != nil {
		return rep, fmt.Errorf("hoststate: list %s: %w", opts.StateDir, err)
	}
	want := map[string]bool{}
	for _, b := range bdfs {
		want[b.String()] = true
	}
	epilog := opts.Getenv("SLURM_JOB_ID")
	if !slurm.ValidJobID(epilog) {
		epilog = ""
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			removeStaleTemp(opts.StateDir, e.Name())
			continue
		}
		if !strings.HasSuffix(e.Name(), ".json") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		path := filepath.Join(opts.StateDir, e.Name())
		f, err := readJournal(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if f.PID != opts.PID && alive(opts, f) {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s (hpcvmm pid %d still running)", path, f.PID))
			continue
		}
		if why := keep(opts, epilog, f); why != "" {
			rep.Skipped = append(rep.Skipped, fmt.Sprintf("%s (%s)", path, why))
			continue
		}
		j := &Journal{opts: opts, path: path, claimed: true, f: f}
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

// removeStaleTemp removes a journal's temporary file (".tmp-<pid>-…", see
// save) once its process is gone: an hpcvmm killed between writing it and
// renaming it into place. Such a file never recorded a change that was
// made, since a change is made only after its journal is in place.
func removeStaleTemp(dir, name string) {
	pidStr, _, ok := strings.Cut(strings.TrimPrefix(name, ".tmp-"), "-")
	pid, err := strconv.Atoi(pidStr)
	if !ok || err != nil || pid <= 0 {
		return
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		_ = os.Remove(filepath.Join(dir, name))
	}
}

// keep says why journal f must be left alone for now, "" when it may be
// restored: in job epilog's Epilog, unless it is that job's; outside a job,
// while the Slurm job it records still runs or Slurm cannot say.
func keep(o Options, epilog string, f file) string {
	if epilog != "" {
		if f.SlurmJob == epilog {
			return ""
		}
		if f.SlurmJob == "" {
			return fmt.Sprintf("not of Slurm job %s; hpcvmm unbind outside a job restores it", epilog)
		}
		return fmt.Sprintf("Slurm job %s's, not job %s's; its own Epilog restores it", f.SlurmJob, epilog)
	}
	if f.SlurmJob == "" {
		return ""
	}
	running, err := o.JobRunning(f.SlurmJob)
	if err != nil {
		return fmt.Sprintf("cannot tell whether Slurm job %s still runs: %v; its Epilog, or hpcvmm unbind once Slurm answers, restores it", f.SlurmJob, err)
	}
	if running {
		return fmt.Sprintf("Slurm job %s still runs; its Epilog restores it", f.SlurmJob)
	}
	return ""
}

// readJournal reads and checks the journal at path: not a symbolic link,
// owned by root or hpcvmm's user, not writable by others, parsed, and
// every change of it valid. A journal that fails is refused whole, with an
// error naming it.
func readJournal(path string) (file, error) {
	var f file
	fd, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if errors.Is(err, unix.ELOOP) {
		return f, fmt.Errorf("hoststate: journal %s is a symbolic link: remove it, and check the devices by hand", path)
	}
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	defer fd.Close()
	fi, err := fd.Stat()
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	if err := checkOwner(path, fi, false); err != nil {
		return f, err
	}
	b, err := io.ReadAll(io.LimitReader(fd, maxJournal+1))
	if err != nil {
		return f, fmt.Errorf("hoststate: read %s: %w", path, err)
	}
	if len(b) > maxJournal {
		return f, fmt.Errorf("hoststate: journal %s is larger than %d bytes, not one hpcvmm wrote: check the devices by hand, then remove it", path, maxJournal)
	}
	if err := json.Unmarshal(b, &f); err != nil {
		return f, fmt.Errorf("hoststate: parse %s: %w (remove it after checking the devices by hand)", path, err)
	}
	if f.SlurmJob != "" && !slurm.ValidJobID(f.SlurmJob) {
		return f, fmt.Errorf("hoststate: journal %s: slurm_job %q is not a job ID: check the devices by hand, then remove it", path, f.SlurmJob)
	}
	for _, c := range f.Changes {
		if err := c.validate(); err != nil {
			return f, fmt.Errorf("hoststate: journal %s: %v: not what hpcvmm writes; check the devices by hand, then remove it", path, err)
		}
	}
	return f, nil
}
