package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ModulesList is where the initramfs lists the kernel modules to load, one
// path a line, dependencies first (package initramfs writes it).
const ModulesList = "/.hpcvmm/modules"

// readModules reads the list; no file means no modules (a kernel with the
// drivers built in).
func readModules(list string) ([]string, error) {
	f, err := os.Open(list)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mods []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		if l := strings.TrimSpace(s.Text()); l != "" && !strings.HasPrefix(l, "#") {
			mods = append(mods, l)
		}
	}
	return mods, s.Err()
}

// loadModules loads each module with finit_module (already loaded or built
// in is fine). A module that fails is reported and the rest still loaded:
// a missing driver of a passed-through device should not keep the job from
// running and saying what it lacks. (u-root's pkg/kmodule resolves
// modules.dep itself; the host has done that already, so the system call is
// all that is left.)
func loadModules(list string) error {
	mods, err := readModules(list)
	if err != nil {
		return fmt.Errorf("reading %s: %w", list, err)
	}
	var errs []error
	for _, m := range mods {
		if err := loadModule(m); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("module %s: %w", path, err)
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("module %s: finit_module: %w", path, err)
	}
	return nil
}
