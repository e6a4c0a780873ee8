package harness

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// jobGuestModules are the modules a job's guest loads (kmodules'
// defaults, and the power button's): the jobs profile puts them, with
// the kernel's module indexes, in L1's /lib/modules, where hpcvmm run
// --rootfs looks for the host's modules.
// The pmem ones are what a SquashFS, EROFS or SIF IMAGE mapped as
// persistent memory adds (issue 31): nd_e820 and nd_pmem for /dev/pmem0,
// the image's file system, and overlay for the writable layer.
var jobGuestModules = []string{"virtio_pci", "virtio_console", "virtio_net", "button", "evdev", "9pnet_fd", "9p",
	"nd_e820", "nd_pmem", "squashfs", "crc32c_generic", "erofs", "overlay"}

// jobsImageTools make the SquashFS and EROFS images of the pmem scenario
// in L1, as a site makes them (tests/testbed-packages.sh installs them).
var jobsImageTools = []string{"mksquashfs", "mkfs.erofs"}

// jobModuleIndexes are the text indexes package kmodules reads.
var jobModuleIndexes = []string{"modules.dep", "modules.alias", "modules.builtin", "modules.builtin.modinfo", "modules.order"}

// jobsDnsmasq is Debian's dnsmasq, the DHCP server of the jobs profile.
const jobsDnsmasq = "/usr/sbin/dnsmasq"

// ProfileJobs is ProfileBasic with what `hpcvmm run --rootfs IMAGE --
// COMMAND` needs of its host (L1): the guest kernel's modules directory
// (its indexes and the job guest's modules, as the distribution installs
// them), so hpcvmm builds the job's initramfs as on a real host.
var ProfileJobs = func() Profile {
	p := ProfileBasic
	p.Name = "jobs"
	p.Files = func(im *Image) error {
		if err := addJobFiles(im); err != nil {
			return err
		}
		// The DHCP server of the ip=dhcp scenario.
		if _, err := os.Stat(jobsDnsmasq); err != nil {
			return fmt.Errorf("%s: %w (run tests/testbed-packages.sh: installs dnsmasq)", jobsDnsmasq, err)
		}
		if err := addDynamicProgram(im, jobsDnsmasq); err != nil {
			return err
		}
		for _, tool := range jobsImageTools {
			p, err := exec.LookPath(tool)
			if err != nil {
				return fmt.Errorf("%s: %w (run tests/testbed-packages.sh: installs squashfs-tools and erofs-utils)", tool, err)
			}
			if err := addLocalProgram(im, p); err != nil {
				return err
			}
		}
		return nil
	}
	// The --net ...,bridge= scenarios' bridge in L1.
	p.Modules = []string{"bridge"}
	// Its scenarios took 9-13 minutes of the default 15 before the pmem
	// images (five L2 boots) and the Open MPI singleton came.
	p.Timeout = 20 * time.Minute
	return p
}()

// addLocalProgram adds the dynamic program prog to im as /usr/bin/NAME,
// with its libraries; those found under /usr/local (where
// tests/testbed-packages.sh unpacks squashfs-tools and erofs-utils when
// dpkg cannot install them) go to /usr/lib/x86_64-linux-gnu, which L1's
// loader searches without an ld.so.cache, as /usr/local/lib it does not.
func addLocalProgram(im *Image, prog string) error {
	im.AddFile("/usr/bin/"+filepath.Base(prog), prog, 0o755)
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", prog, err)
	}
	// glibc loads libgcc_s.so.1 itself (dlopen, so ldd does not list it)
	// the first time a thread exits: mksquashfs's threads abort
	// ("libgcc_s.so.1 must be installed for pthread_exit to work")
	// without it.
	libs := append(parseLdd(string(out)), "/lib/x86_64-linux-gnu/libgcc_s.so.1")
	for _, lib := range libs {
		dst := lib
		if strings.HasPrefix(lib, "/usr/local/") {
			dst = "/usr/lib/x86_64-linux-gnu/" + filepath.Base(lib)
		}
		im.AddFile(dst, lib, 0o755)
	}
	return nil
}

func addJobFiles(im *Image) error {
	if err := AddJobModules(im); err != nil {
		return err
	}
	cache, err := CacheDir()
	if err != nil {
		return err
	}
	deb, err := debianRootfs(cache)
	if err != nil {
		return err
	}
	if err := addTree(im, deb, JobsDebianRoot); err != nil {
		return err
	}
	ompi, err := openMPIRootfs(cache)
	if err != nil {
		return err
	}
	return addTree(im, ompi, JobsOpenMPIRoot)
}

// AddJobModules puts in an L1 image what `hpcvmm run --rootfs` takes from
// the host for the job guest's initramfs: the guest kernel's module
// indexes and the modules a job guest loads, where the distribution
// installs them (the jobs profile, and the bench's job cases).
func AddJobModules(im *Image) error {
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
			return fmt.Errorf("jobs profile: %s: %w (the kernel's modules are not installed: run tests/testbed-packages.sh)", p, err)
		}
		im.AddFile(p, p, 0o644)
	}
	return nil
}

// JobsDebianRoot is where the jobs profile's L1 holds a root file system of
// Debian packages, unpacked by the test bed (debianRootfs), for
// `hpcvmm run --rootfs` scenarios with files no one here wrote.
const JobsDebianRoot = "/hpcvmm/jobs/debian"

// debianPackages are busybox-static, python3-minimal and the packages its
// interpreter needs to start (python3.X-minimal is found from
// python3-minimal's dependencies): its standard library and the shared
// libraries python3.X links.
func debianPackages() ([]string, error) {
	out, err := exec.Command("apt-cache", "depends", "python3-minimal").Output()
	if err != nil {
		return nil, fmt.Errorf("apt-cache depends python3-minimal: %w (Debian's apt is needed for the jobs profile)", err)
	}
	var py string
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 2 && strings.HasSuffix(f[0], "Depends:") && strings.HasPrefix(f[1], "python3.") && strings.HasSuffix(f[1], "-minimal") {
			py = f[1]
		}
	}
	if py == "" {
		return nil, fmt.Errorf("python3-minimal depends on no python3.X-minimal:\n%s", out)
	}
	ver := strings.TrimSuffix(strings.TrimPrefix(py, "python3."), "-minimal")
	return []string{"busybox-static", "python3-minimal", py, "libpython3." + ver + "-minimal",
		"libc6", "libexpat1", "zlib1g", "libssl3"}, nil
}

// debianRootfs downloads the packages (apt-get download, kept in the
// cache) and unpacks them (dpkg -x) into a fresh directory, returned.
func debianRootfs(cache string) (string, error) {
	pkgs, err := debianPackages()
	if err != nil {
		return "", err
	}
	debs := filepath.Join(cache, "jobs-debian", "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", err
	}
	have, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	if len(have) < len(pkgs) {
		cmd := exec.Command("apt-get", "download", "-q", "-o", "APT::Sandbox::User=root")
		cmd.Args = append(cmd.Args, pkgs...)
		cmd.Dir = debs
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get download %s: %w\n%s", strings.Join(pkgs, " "), err, out)
		}
	}
	root := filepath.Join(cache, "jobs-debian", "root")
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	all, _ := filepath.Glob(filepath.Join(debs, "*.deb"))
	for _, d := range all {
		if out, err := exec.Command("dpkg", "-x", d, root).CombinedOutput(); err != nil {
			return "", fmt.Errorf("dpkg -x %s: %w\n%s", d, err, out)
		}
	}
	return root, nil
}

// addTree adds the files and symlinks under src to im under dst.
func addTree(im *Image, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || rel == "." {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			im.AddSymlink(target, link)
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			im.AddFile(target, p, fi.Mode().Perm())
		}
		return nil
	})
}

// ProfileJobsPassthrough is ProfilePassthrough (edu and the NVMe VF) with
// the jobs profile's guest modules and the guest's nvme driver in L1's
// /lib/modules, so a job's initramfs carries the passed-through devices'
// drivers found by their modaliases.
var ProfileJobsPassthrough = func() Profile {
	p := ProfilePassthrough
	p.Name = "jobs-passthrough"
	p.Files = func(im *Image) error {
		if err := addJobFiles(im); err != nil {
			return err
		}
		k, err := FindKernel()
		if err != nil {
			return err
		}
		mods, err := ModuleDeps(k, []string{"nvme"})
		if err != nil {
			return err
		}
		for _, m := range mods {
			im.AddFile(m, m, 0o644)
		}
		return nil
	}
	return p
}()
