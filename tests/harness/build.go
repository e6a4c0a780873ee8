package harness

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// ModulePath is the Go module the harness builds from.
const ModulePath = "github.com/hpcvmm/hpcvmm"

// Modules the L2 guest's /init loads (and everything they depend on):
// virtio, nvme for a passed-through NVMe VF, uio_pci_generic for edu's
// INTx (it binds only to IDs written to its new_id).
var l2Modules = []string{"virtio_pci", "virtio_console", "virtio_net", "nvme", "uio_pci_generic", "button", "evdev"}

// Modules L1's /init loads: KVM, VFIO, vhost-net/TAP for the management NIC,
// nvme for the SR-IOV stand-in, and uio_pci_generic as a host driver that
// --bind-devices scenarios take a device from and give it back to.
var l1Modules = []string{"kvm_amd", "vfio", "vfio_iommu_type1", "vfio-pci", "vhost_net", "tun", "nvme", "uio_pci_generic"}

// Paths inside the L1 initramfs.
const (
	l1TestBinary  = "/hpcvmm/tests.test"
	l1HPCVMM      = "/hpcvmm/bin/hpcvmm"
	l1HPCVMMError = "/hpcvmm/hpcvmm-build-error"
	l1L2Kernel    = "/hpcvmm/l2/vmlinuz"
	l1L2Initrd    = "/hpcvmm/l2/initrd.cpio.gz"
	l1ModulesList = "/hpcvmm/modules.list"
	// l1ProfileModulesExt names the load-order list of Profile.Modules:
	// /hpcvmm/profiles/NAME.modules.
	l1ProfileModulesExt = ".modules"
	l1ProfilesDir       = "/hpcvmm/profiles"
	l2ModulesList       = "/etc/hpcvmm-modules"
	l2EduMSI            = "/lib/hpcvmm/edu_msi.ko"    // not in l2ModulesList: the scenario loads it
	l2EduMSIError       = "/etc/hpcvmm-edu-msi-error" // why edu_msi.ko is missing
	l2PCIPath           = "/bin/hpcvmm-pcipath"       // tests/guest/pcipath
	busyboxInImage      = "/bin/busybox"
)

// ModuleRoot finds the directory holding hpcvmm's go.mod, walking up from
// the working directory (go test runs in the package directory).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding module root: %w", err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module "+ModulePath+"\n")) {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", fmt.Errorf("finding module root: no go.mod of %s above %s", ModulePath, dir)
		}
	}
}

// CacheDir is the harness's build directory.
func CacheDir() (string, error) {
	if d := os.Getenv("HPCVMM_TEST_CACHE"); d != "" {
		return d, os.MkdirAll(d, 0o755)
	}
	uc, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("build directory: %w (set HPCVMM_TEST_CACHE)", err)
	}
	d := filepath.Join(uc, "hpcvmm-tests")
	return d, os.MkdirAll(d, 0o755)
}

// goTool returns the go command, preferring PATH, then the CI install.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return "/usr/local/go/bin/go"
}

// goBuild runs the go command in the module root with CGO disabled, so the
// binaries are static and run in an initramfs without a libc.
func goBuild(root string, args ...string) error {
	cmd := exec.Command(goTool(), args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// BuildHPCVMM builds the static hpcvmm binary into the cache and returns its
// path. Go's build cache makes a rebuild without changes cheap.
func BuildHPCVMM(root, cache string) (string, error) {
	out := filepath.Join(cache, "hpcvmm")
	return out, goBuild(root, "build", "-o", out, "./cmd/hpcvmm")
}

// BuildTestBinary builds the static integration test binary that runs the
// scenarios inside L1.
func BuildTestBinary(root, cache string) (string, error) {
	out := filepath.Join(cache, "tests.test")
	return out, goBuild(root, "test", "-c", "-tags", "integration", "-o", out, "./tests")
}

// Kernel is a Debian kernel image with its modules directory.
type Kernel struct {
	Version string // e.g. 6.1.0-56-amd64
	Image   string // /boot/vmlinuz-VERSION
	Modules string // /lib/modules/VERSION
	Reason  string // why FindKernel chose it, for the test log
}

// Generic reports whether the kernel is Debian's generic flavour
// (6.1.0-56-amd64), not a specialised one such as cloud (6.1.0-56-cloud-amd64,
// which lacks drivers the test bed's devices need) or rt: the flavour is what
// follows the last all-digit field of the version.
func (k Kernel) Generic() bool {
	fields := strings.Split(k.Version, "-")
	last := -1
	for i, f := range fields {
		if f != "" && strings.Trim(f, "0123456789") == "" {
			last = i
		}
	}
	flavour := strings.Join(fields[last+1:], "-")
	return flavour == "" || flavour == "amd64"
}

// FindKernel returns the kernel used for L1 and L2: HPCVMM_TEST_KERNEL if
// set, else the newest /boot/vmlinuz-* of the generic flavour whose modules
// are installed (the newest of any flavour when no generic one is). The
// choice and its reason are in Kernel.Reason.
func FindKernel() (Kernel, error) {
	if img := os.Getenv("HPCVMM_TEST_KERNEL"); img != "" {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Version: ver, Image: img, Modules: filepath.Join("/lib/modules", ver), Reason: "HPCVMM_TEST_KERNEL"}
		if _, err := os.Stat(filepath.Join(k.Modules, "modules.dep")); err != nil {
			return k, fmt.Errorf("HPCVMM_TEST_KERNEL=%s: no modules for version %q: %w", img, ver, err)
		}
		return k, nil
	}
	imgs, _ := filepath.Glob("/boot/vmlinuz-*")
	var ks []Kernel
	for _, img := range imgs {
		ver := strings.TrimPrefix(filepath.Base(img), "vmlinuz-")
		k := Kernel{Version: ver, Image: img, Modules: filepath.Join("/lib/modules", ver)}
		if _, err := os.Stat(filepath.Join(k.Modules, "modules.dep")); err == nil {
			ks = append(ks, k)
		}
	}
	if len(ks) == 0 {
		return Kernel{}, errors.New("no kernel: /boot/vmlinuz-* with /lib/modules/VERSION/modules.dep not found; run tests/testbed-packages.sh (installs linux-image-amd64)")
	}
	return pickKernel(ks), nil
}

// pickKernel chooses among installed kernels: generic flavour first, then
// the newest version.
func pickKernel(ks []Kernel) Kernel {
	ks = slices.Clone(ks)
	sort.Slice(ks, func(i, j int) bool {
		if gi, gj := ks[i].Generic(), ks[j].Generic(); gi != gj {
			return !gi
		}
		return versionLess(ks[i].Version, ks[j].Version)
	})
	k := ks[len(ks)-1]
	var others []string
	for _, o := range ks[:len(ks)-1] {
		others = append(others, o.Version)
	}
	switch {
	case len(others) == 0:
		k.Reason = "the only kernel with modules installed"
	case k.Generic():
		k.Reason = "the newest of the generic flavour; also installed: " + strings.Join(others, ", ")
	default:
		k.Reason = "no generic-flavour kernel installed; newest of: " + strings.Join(others, ", ") + " and this one"
	}
	return k
}

// versionLess compares version strings numerically where both have digits
// ("6.1.0-9" < "6.1.0-10").
func versionLess(a, b string) bool {
	for a != "" && b != "" {
		da, db := isDigit(a[0]), isDigit(b[0])
		if da && db {
			na, ra := splitDigits(a)
			nb, rb := splitDigits(b)
			na, nb = strings.TrimLeft(na, "0"), strings.TrimLeft(nb, "0")
			if len(na) != len(nb) {
				return len(na) < len(nb)
			}
			if na != nb {
				return na < nb
			}
			a, b = ra, rb
			continue
		}
		if a[0] != b[0] {
			return a[0] < b[0]
		}
		a, b = a[1:], b[1:]
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func splitDigits(s string) (digits, rest string) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	return s[:i], s[i:]
}

// modprobeTool finds kmod's modprobe, which is in /sbin and may be missing
// from a non-root PATH.
func modprobeTool() (string, error) {
	if p, err := exec.LookPath("modprobe"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/sbin/modprobe", "/sbin/modprobe"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("modprobe not found: run tests/testbed-packages.sh (installs kmod)")
}

// ModuleDeps returns, in load order and without duplicates, the module
// files (absolute paths) needed to load mods on kernel k. Built-in modules
// need no file and are left out.
func ModuleDeps(k Kernel, mods []string) ([]string, error) {
	mp, err := modprobeTool()
	if err != nil {
		return nil, err
	}
	var out []string
	seen := map[string]bool{}
	for _, m := range mods {
		cmd := exec.Command(mp, "-S", k.Version, "--show-depends", m)
		b, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			return nil, fmt.Errorf("modprobe -S %s --show-depends %s: %w %s", k.Version, m, err, bytes.TrimSpace(stderr))
		}
		for _, f := range parseShowDepends(string(b)) {
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// parseShowDepends extracts module paths from `modprobe --show-depends`
// output ("insmod /path/mod.ko [params]" lines; "builtin mod" lines need
// nothing).
func parseShowDepends(s string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "insmod" {
			out = append(out, f[1])
		}
	}
	return out
}

// addModules puts the module files into the image under their
// /lib/modules/VERSION/... paths and writes the load-order list to listPath.
// Compressed modules (.ko.xz, .ko.zst: newer Debian kernels) are stored
// decompressed, because busybox insmod may not support the compression.
func addModules(im *Image, k Kernel, files []string, listPath, cache string) error {
	var list []string
	for _, f := range files {
		rel, err := filepath.Rel("/", f)
		if err != nil {
			return fmt.Errorf("module %s: %w", f, err)
		}
		src := f
		var decomp []string
		switch {
		case strings.HasSuffix(f, ".ko.xz"):
			decomp = []string{"xz", "-dc", f}
		case strings.HasSuffix(f, ".ko.zst"):
			decomp = []string{"zstd", "-dcq", f}
		case strings.HasSuffix(f, ".ko.gz"):
			decomp = []string{"gzip", "-dc", f}
		}
		if decomp != nil {
			rel = rel[:strings.LastIndex(rel, ".ko")+3]
			src = filepath.Join(cache, "modules", rel)
			if err := decompressOnce(decomp, f, src); err != nil {
				return err
			}
		}
		im.AddFile("/"+rel, src, 0o644)
		list = append(list, "/"+rel)
	}
	im.AddBytes(listPath, []byte(strings.Join(list, "\n")+"\n"), 0o644)
	return nil
}

func decompressOnce(cmdline []string, src, dst string) error {
	if sst, err := os.Stat(src); err == nil {
		if dst, err := os.Stat(dst); err == nil && !dst.ModTime().Before(sst.ModTime()) {
			return nil
		}
	}
	out, err := exec.Command(cmdline[0], cmdline[1:]...).Output()
	if err != nil {
		return fmt.Errorf("decompressing module %s with %s: %w", src, cmdline[0], err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, out, 0o644)
}

// findBusybox locates the static busybox from busybox-static.
func findBusybox() (string, error) {
	for _, p := range []string{"/bin/busybox", "/usr/bin/busybox"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("busybox not found: run tests/testbed-packages.sh (installs busybox-static)")
}

// addDynamicProgram copies an ELF program and the shared libraries and
// interpreter ldd reports for it into the image at their host paths.
func addDynamicProgram(im *Image, prog string) error {
	im.AddFile(prog, prog, 0o755)
	out, err := exec.Command("ldd", prog).Output()
	if err != nil {
		return fmt.Errorf("ldd %s: %w", prog, err)
	}
	for _, lib := range parseLdd(string(out)) {
		im.AddFile(lib, lib, 0o755)
	}
	return nil
}

// parseLdd returns the absolute library and interpreter paths in ldd output.
func parseLdd(s string) []string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if _, after, ok := strings.Cut(line, "=> "); ok {
			line = after
		}
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "/") {
			out = append(out, f[0])
		}
	}
	return out
}

// BuildL2Initrd builds the L2 guest initramfs (busybox, tests/guest/init,
// the guest's kernel modules, tests/guest/pcipath) and returns its path.
func BuildL2Initrd(root, cache string, k Kernel) (string, error) {
	bb, err := findBusybox()
	if err != nil {
		return "", err
	}
	mods, err := ModuleDeps(k, l2Modules)
	if err != nil {
		return "", err
	}
	// The topology scenarios' NCCL path classifier: Go, static, so it
	// runs in the busybox initramfs.
	pcipath := filepath.Join(cache, "pcipath")
	if err := goBuild(root, "build", "-o", pcipath, "./tests/guest/pcipath"); err != nil {
		return "", err
	}
	im := NewImage()
	im.AddFile("/init", filepath.Join(root, "tests", "guest", "init"), 0o755)
	im.AddFile(busyboxInImage, bb, 0o755)
	im.AddFile(l2PCIPath, pcipath, 0o755)
	if err := addModules(im, k, mods, l2ModulesList, cache); err != nil {
		return "", err
	}
	// The MSI scenario's guest driver. Without kernel headers the image
	// carries the reason instead, so only the scenario that needs the
	// module fails, with that reason.
	if ko, err := BuildEduMSI(root, cache, k); err != nil {
		im.AddBytes(l2EduMSIError, []byte(err.Error()+"\n"), 0o644)
	} else {
		im.AddFile(l2EduMSI, ko, 0o644)
	}
	out := filepath.Join(cache, "l2-"+k.Version+".cpio.gz")
	_, err = im.Build(out, true)
	return out, err
}

// l1Inputs are the built pieces that go into the L1 initramfs.
type l1Inputs struct {
	kernel      Kernel
	testBinary  string
	hpcvmm      string // empty when the build failed
	hpcvmmError string // why hpcvmm is missing
	l2Initrd    string
}

// buildL1Initrd assembles the initramfs profile p's L1 boots and returns
// its path: l1.cpio, shared by the profiles without Files or Modules, or
// l1-NAME.cpio with those added. It is not compressed: QEMU loads it
// quickly and L1's kernel need not gunzip about 35 MiB under software
// emulation.
func buildL1Initrd(root, cache string, in l1Inputs, p Profile) (path string, rebuilt bool, err error) {
	bb, err := findBusybox()
	if err != nil {
		return "", false, err
	}
	mods, err := ModuleDeps(in.kernel, l1Modules)
	if err != nil {
		return "", false, err
	}
	nvme, err := findNVMe()
	if err != nil {
		return "", false, err
	}
	im := NewImage()
	im.AddFile("/init", filepath.Join(root, "tests", "l1", "init.sh"), 0o755)
	im.AddFile(busyboxInImage, bb, 0o755)
	if err := addModules(im, in.kernel, mods, l1ModulesList, cache); err != nil {
		return "", false, err
	}
	if err := addDynamicProgram(im, nvme); err != nil {
		return "", false, err
	}
	im.AddFile(l1TestBinary, in.testBinary, 0o755)
	if in.hpcvmm != "" {
		im.AddFile(l1HPCVMM, in.hpcvmm, 0o755)
	} else {
		im.AddBytes(l1HPCVMMError, []byte(in.hpcvmmError), 0o644)
	}
	im.AddFile(l1L2Kernel, in.kernel.Image, 0o644)
	im.AddFile(l1L2Initrd, in.l2Initrd, 0o644)
	for name, script := range profileScripts() {
		im.AddBytes(filepath.Join(l1ProfilesDir, name+".sh"), []byte(script), 0o644)
	}
	out := filepath.Join(cache, "l1.cpio")
	if p.ownImage() {
		if err := addProfileFiles(im, in.kernel, mods, p, cache); err != nil {
			return "", false, err
		}
		out = filepath.Join(cache, "l1-"+p.Name+".cpio")
	}
	rebuilt, err = im.Build(out, false)
	return out, rebuilt, err
}

// findNVMe finds nvme-cli, which the passthrough profiles' setup runs.
func findNVMe() (string, error) {
	if nvme, err := exec.LookPath("nvme"); err == nil {
		return nvme, nil
	}
	for _, p := range []string{"/usr/sbin/nvme", "/sbin/nvme"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("nvme-cli not found: run tests/testbed-packages.sh (installs nvme-cli)")
}

// addProfileFiles adds what profile p has beyond the common L1 image: its
// modules (Profile.Modules, less mods, which the image has and loads
// already) with their load-order list, and its files (Profile.Files).
func addProfileFiles(im *Image, k Kernel, mods []string, p Profile, cache string) error {
	if len(p.Modules) > 0 {
		extra, err := ModuleDeps(k, p.Modules)
		if err != nil {
			return fmt.Errorf("profile %s: %w", p.Name, err)
		}
		// The common modules are loaded already; their files are in
		// the image, so only the new ones are listed.
		var fresh []string
		for _, f := range extra {
			if !slices.Contains(mods, f) {
				fresh = append(fresh, f)
			}
		}
		if err := addModules(im, k, fresh, filepath.Join(l1ProfilesDir, p.Name+l1ProfileModulesExt), cache); err != nil {
			return err
		}
	}
	if p.Files != nil {
		if err := p.Files(im); err != nil {
			return fmt.Errorf("profile %s: %w", p.Name, err)
		}
	}
	return nil
}

// BuildEduMSI builds tests/guest/edumsi (an out-of-tree module that drives
// edu's MSI inside L2) against kernel k's headers (Debian's
// linux-headers-VERSION, /lib/modules/VERSION/build) and returns the .ko.
// The sources are copied into the cache, since kbuild writes its objects
// beside them; an unchanged copy is not rebuilt.
func BuildEduMSI(root, cache string, k Kernel) (string, error) {
	kdir := filepath.Join(k.Modules, "build")
	if _, err := os.Stat(filepath.Join(kdir, "Makefile")); err != nil {
		return "", fmt.Errorf("edu_msi.ko: no kernel headers for %s at %s (run tests/testbed-packages.sh: installs linux-headers-amd64 for Debian's kernel): %v", k.Version, kdir, err)
	}
	src := filepath.Join(root, "tests", "guest", "edumsi")
	dir := filepath.Join(cache, "edumsi-"+k.Version)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("edu_msi.ko: %w", err)
	}
	ko := filepath.Join(dir, "edu_msi.ko")
	koInfo, koErr := os.Stat(ko)
	stale := koErr != nil
	for _, f := range []string{"Kbuild", "edu_msi.c"} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return "", fmt.Errorf("edu_msi.ko: %w", err)
		}
		dst := filepath.Join(dir, f)
		if old, err := os.ReadFile(dst); err == nil && bytes.Equal(old, b) {
			if st, err := os.Stat(dst); err == nil && koErr == nil && st.ModTime().After(koInfo.ModTime()) {
				stale = true
			}
			continue
		}
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			return "", fmt.Errorf("edu_msi.ko: %w", err)
		}
		stale = true
	}
	if !stale {
		return ko, nil
	}
	cmd := exec.Command("make", "-C", kdir, "M="+dir, "modules")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("edu_msi.ko: make -C %s M=%s modules: %w\n%s", kdir, dir, err, Tail(string(out), 20))
	}
	return ko, nil
}
