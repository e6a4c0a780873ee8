package vmm

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/hoststate"
)

// sysfsWrites makes the journal's sysfs attribute writes (the restore that
// gives rebound devices back when the VM ends) through files opened before
// the seccomp filter went on: the process filter refuses opens for writing
// (issue 23: a compromised thread must not open /proc/sys/kernel/core_pattern
// or /etc/ld.so.preload), and the restore runs after it. It is the
// journal's Options.WriteFile.
type sysfsWrites struct {
	mu    sync.Mutex
	files map[string]*os.File
}

// write writes data to the attribute at path in one write at offset 0, as
// sysfs wants it, through the file prepare opened; a path prepare did not
// foresee is opened now (which, under the filter in Kill mode, ends the
// process with SIGSYS and leaves the journal for `hpcvmm unbind`).
func (w *sysfsWrites) write(path string, data []byte) error {
	w.mu.Lock()
	f := w.files[path]
	w.mu.Unlock()
	if f != nil {
		_, err := f.WriteAt(data, 0)
		return err
	}
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

// restorePaths are the sysfs attributes the journal's restore of c may
// write (hoststate's undoChange, which validates c before any write), and
// no other: the device's driver_override; the current driver's unbind,
// only when that is not the original driver; drivers_probe and the
// original driver's bind, only when there is an original driver to give
// the device back to. The unbind, drivers_probe and bind files are the
// kernel's per-driver and per-bus interface (they take any address), so
// they stay open under the filter only where this VM's teardown needs
// them; docs/hardening.md says what a hijacked thread could do with them.
func restorePaths(sysRoot string, c hoststate.Change) []string {
	if c.Kind != hoststate.KindPCIBind || c.BDF == "" || filepath.Base(c.BDF) != c.BDF {
		return nil
	}
	pci := filepath.Join(sysRoot, "bus/pci")
	paths := []string{filepath.Join(pci, "devices", c.BDF, "driver_override")}
	orig := c.OriginalDriver
	if orig != "" && filepath.Base(orig) != orig {
		orig = "" // not a driver name: undoChange refuses the change
	}
	if t, err := os.Readlink(filepath.Join(pci, "devices", c.BDF, "driver")); err == nil && filepath.Base(t) != orig {
		paths = append(paths, filepath.Join(pci, "drivers", filepath.Base(t), "unbind"))
	}
	if orig != "" {
		paths = append(paths, filepath.Join(pci, "drivers_probe"), filepath.Join(pci, "drivers", orig, "bind"))
	}
	return paths
}

// prepare opens, for writing, every attribute the restore of changes may
// write. An attribute that does not exist (the original driver not
// loaded) is left out: its write would fail anyway. It returns the first
// other failure, after opening what it could.
func (w *sysfsWrites) prepare(sysRoot string, changes []hoststate.Change) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.files == nil {
		w.files = map[string]*os.File{}
	}
	var errs []error
	for _, c := range changes {
		for _, p := range restorePaths(sysRoot, c) {
			if w.files[p] != nil {
				continue
			}
			// O_NOFOLLOW as hoststate's own writes: a symbolic
			// link in an attribute's place is refused.
			f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err != nil {
				errs = append(errs, err)
				continue
			}
			w.files[p] = f
		}
	}
	return errors.Join(errs...)
}

// close closes the files prepare opened.
func (w *sysfsWrites) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p, f := range w.files {
		f.Close()
		delete(w.files, p)
	}
}
