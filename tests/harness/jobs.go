package harness

import (
	"fmt"
	"os"
	"path/filepath"
)

// jobGuestModules are the modules a job's guest loads (kmodules'
// defaults, and the power button's): the jobs profile puts them, with
// the kernel's module indexes, in L1's /lib/modules, where hpcvmm run
// --rootfs looks for the host's modules.
var jobGuestModules = []string{"virtio_pci", "virtio_console", "virtio_net", "button", "evdev"}

// jobModuleIndexes are the text indexes package kmodules reads.
var jobModuleIndexes = []string{"modules.dep", "modules.alias", "modules.builtin", "modules.builtin.modinfo", "modules.order"}

// ProfileJobs is ProfileBasic with what `hpcvmm run --rootfs IMAGE --
// COMMAND` needs of its host (L1): the guest kernel's modules directory
// (its indexes and the job guest's modules, as the distribution installs
// them), so hpcvmm builds the job's initramfs as on a real host.
var ProfileJobs = func() Profile {
	p := ProfileBasic
	p.Name = "jobs"
	p.Files = addJobFiles
	return p
}()

func addJobFiles(im *Image) error {
	k, err := FindKernel()
	if err != nil {
		return err
	}
	mods, err := ModuleDeps(k, jobGuestModules)
	if err != nil {
		return err
	}
	for _, m := range mods {
		im.AddFile(m, m, 0o644)
	}
	for _, idx := range jobModuleIndexes {
		p := filepath.Join(k.Modules, idx)
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("jobs profile: %s: %w (the kernel's modules are not installed: run tests/setup.sh)", p, err)
		}
		im.AddFile(p, p, 0o644)
	}
	return nil
}
