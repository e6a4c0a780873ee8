package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// JobsOpenMPIRoot is where the jobs profile's L1 holds a root file system
// of Debian's Open MPI runtime (openmpi-bin, libopenmpi3 and what they
// depend on) and busybox-static, unpacked by the test bed
// (openMPIRootfs), with tests/guest/ompihello at OpenMPIHello: the Open
// MPI singleton of issue 35.
const JobsOpenMPIRoot = "/hpcvmm/jobs/openmpi"

// OpenMPIHello is the singleton program's path in JobsOpenMPIRoot.
const OpenMPIHello = "/usr/local/bin/ompi-hello"

// OpenMPISingletonEnv is what a job running OpenMPIHello as a singleton
// (no mpirun) passes with --env. MPI_Init of a singleton forks Open MPI's
// orted, which by default picks the rsh launcher and aborts when no ssh
// or rsh is on PATH ("plm_rsh_agent: ssh : rsh ... could not be found"),
// although it never launches anything remotely; "isolated" is Open MPI
// 4's launcher for one node without one. Measured on the test bed with
// the root chroot'ed as the guest sees it: with it the program prints
// "rank 0 of 1" and exits 0, without it MPI_Init fails.
// The job must also have HOME set (PMIx dereferences getpwuid's NULL
// without it and the root has no /etc/passwd): the agent sets HOME=/root.
const OpenMPISingletonEnv = "OMPI_MCA_plm=isolated"

// openMPIWanted are the packages the root is made of, with their
// dependencies (openMPIPackages).
var openMPIWanted = []string{"openmpi-bin", "libopenmpi3", "busybox-static"}

// openMPIExcluded are dependencies left out of the root, with their own
// dependencies unless something else needs them: the root is held in L1's
// RAM, and none of them is used by a singleton.
var openMPIExcluded = map[string]string{
	// libibverbs1's maintainer script adds the rdma group with it; dpkg -x
	// runs no maintainer scripts. It pulls passwd, PAM and debconf.
	"adduser": "maintainer scripts only",
	// mpirun starts orted on other nodes through it; a singleton's orted
	// runs locally (OpenMPISingletonEnv). It pulls Kerberos and FIDO.
	"openssh-client": "remote launch only",
	// hwloc's optional plugins (X11, NVML, OpenCL topology), dlopen'ed
	// when present; the topology comes from /sys without them. They pull
	// libicu72 (~35 MB), libxml2 and libx11.
	"libhwloc-plugins": "optional dlopen'ed plugins",
}

// openMPIDevPackage has the headers and the libmpi.so link the program
// is compiled with; it is unpacked into a build directory, not the root.
const openMPIDevPackage = "libopenmpi-dev"

// aptDependsFlags keep apt-cache depends to what a package needs to be
// installed: its Depends and PreDepends.
var aptDependsFlags = []string{"--no-recommends", "--no-suggests", "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}

// openMPIPackages are openMPIWanted and their Depends and PreDepends,
// recursively, but for openMPIExcluded: of an "a | b" dependency the
// first alternative, of a virtual package its first provider.
func openMPIPackages() ([]string, error) {
	seen := map[string]bool{}
	for _, p := range openMPIWanted {
		seen[p] = true
	}
	var all []string
	frontier := openMPIWanted
	for len(frontier) > 0 {
		all = append(all, frontier...)
		args := append(append([]string{"depends"}, aptDependsFlags...), frontier...)
		out, err := exec.Command("apt-cache", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("apt-cache depends %s: %w (Debian's apt is needed for the jobs profile)", strings.Join(frontier, " "), err)
		}
		deps := parseAptDepends(string(out))
		var next []string
		for _, p := range frontier {
			if _, ok := deps[p]; !ok {
				return nil, fmt.Errorf("apt-cache depends printed nothing for %s (is the package known to apt? run apt-get update)", p)
			}
			for _, d := range deps[p] {
				if !seen[d] && openMPIExcluded[d] == "" {
					seen[d] = true
					next = append(next, d)
				}
			}
		}
		frontier = next
	}
	return all, nil
}

// parseAptDepends reads `apt-cache depends` output: per package, one
// real package per dependency: the first alternative of an "a | b" group
// (its lines but the last start with " |") that is a real package or a
// virtual one ("<name>") with a provider (listed indented under it), then
// that provider. A dependency nothing satisfies is left out.
func parseAptDepends(out string) map[string][]string {
	type alt struct {
		name      string
		providers []string
	}
	deps := map[string][]string{}
	var pkg string
	var group []alt
	inGroup := false // the last dependency line ended with "|"
	flush := func() {
		for _, a := range group {
			if !strings.HasPrefix(a.name, "<") {
				deps[pkg] = append(deps[pkg], a.name)
				break
			}
			if len(a.providers) > 0 {
				deps[pkg] = append(deps[pkg], a.providers[0])
				break
			}
		}
		group = nil
	}
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.TrimSpace(line) == "":
		case !strings.HasPrefix(line, " "):
			flush()
			pkg, inGroup = line, false
			if _, ok := deps[pkg]; !ok {
				deps[pkg] = nil
			}
		case strings.HasPrefix(line, "    "):
			if len(group) > 0 {
				last := &group[len(group)-1]
				last.providers = append(last.providers, strings.TrimSpace(line))
			}
		case len(line) < 3:
		default:
			kind, name, ok := strings.Cut(strings.TrimSpace(line[2:]), ":")
			if !ok || (kind != "Depends" && kind != "PreDepends") {
				continue
			}
			if !inGroup {
				flush()
			}
			group = append(group, alt{name: strings.TrimSpace(name)})
			inGroup = line[1] == '|'
		}
	}
	flush()
	return deps
}

// openMPIRootfs downloads the packages (apt-get download, kept in the
// cache, so a second build needs no network), unpacks them (dpkg -x)
// into a fresh root, and compiles tests/guest/ompihello into it against
// libopenmpi-dev unpacked into a build directory. It returns the root.
func openMPIRootfs(cache string) (string, error) {
	pkgs, err := openMPIPackages()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "jobs-openmpi")
	debs := filepath.Join(dir, "debs")
	if err := os.MkdirAll(debs, 0o755); err != nil {
		return "", err
	}
	debOf := map[string]string{}
	var missing []string
	for _, p := range append(pkgs, openMPIDevPackage) {
		have, _ := filepath.Glob(filepath.Join(debs, p+"_*.deb"))
		if len(have) == 0 {
			missing = append(missing, p)
		} else {
			debOf[p] = have[0]
		}
	}
	if len(missing) > 0 {
		cmd := exec.Command("apt-get", append([]string{"download", "-q", "-o", "APT::Sandbox::User=root"}, missing...)...)
		cmd.Dir = debs
		if out, err := cmd.CombinedOutput(); err != nil {
			return "", fmt.Errorf("apt-get download %s: %w\n%s", strings.Join(missing, " "), err, out)
		}
		for _, p := range missing {
			have, _ := filepath.Glob(filepath.Join(debs, p+"_*.deb"))
			if len(have) == 0 {
				return "", fmt.Errorf("apt-get download %s left no %s_*.deb in %s", p, p, debs)
			}
			debOf[p] = have[0]
		}
	}
	root, build := filepath.Join(dir, "root"), filepath.Join(dir, "build")
	for _, d := range []string{root, build} {
		if err := os.RemoveAll(d); err != nil {
			return "", err
		}
	}
	unpack := func(pkg, into string) error {
		if out, err := exec.Command("dpkg", "-x", debOf[pkg], into).CombinedOutput(); err != nil {
			return fmt.Errorf("dpkg -x %s: %w\n%s", debOf[pkg], err, out)
		}
		return nil
	}
	for _, p := range pkgs {
		if err := unpack(p, root); err != nil {
			return "", err
		}
	}
	// libopenmpi-dev's libmpi.so links to ../../libmpi.so.40, libopenmpi3's.
	for _, p := range []string{openMPIDevPackage, "libopenmpi3"} {
		if err := unpack(p, build); err != nil {
			return "", err
		}
	}
	if err := openMPIAlternatives(root); err != nil {
		return "", err
	}
	if err := buildOpenMPIHello(root, build); err != nil {
		return "", err
	}
	return root, nil
}

// openMPIAlternatives makes the links the packages' maintainer scripts
// make with update-alternatives, which dpkg -x does not run: Open MPI's
// PSM transport loads libpsm_infinipath.so.1 by that name (without it
// every MPI_Init says it cannot open mca_mtl_psm), and mpirun and
// mpiexec are openmpi-bin's.
func openMPIAlternatives(root string) error {
	psm, _ := filepath.Glob(filepath.Join(root, "usr/lib/libpsm1/libpsm_infinipath.so.1.*"))
	if len(psm) != 1 {
		return fmt.Errorf("%s: want one libpsm_infinipath.so.1.* (libpsm-infinipath1), have %v", filepath.Join(root, "usr/lib/libpsm1"), psm)
	}
	links := map[string]string{
		"usr/lib/x86_64-linux-gnu/libpsm_infinipath.so.1": "../libpsm1/" + filepath.Base(psm[0]),
		"usr/bin/mpirun":  "mpirun.openmpi",
		"usr/bin/mpiexec": "mpiexec.openmpi",
	}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			return err
		}
	}
	return nil
}

// buildOpenMPIHello compiles tests/guest/ompihello with gcc against the
// headers and libmpi.so in build, dynamically: the guest's loader finds
// libmpi.so.40 in the root's /usr/lib/x86_64-linux-gnu, and the link
// resolves libmpi's own libraries in the root (-rpath-link).
func buildOpenMPIHello(root, build string) error {
	mod, err := ModuleRoot()
	if err != nil {
		return err
	}
	src := filepath.Join(mod, "tests", "guest", "ompihello", "ompi_hello.c")
	out := filepath.Join(root, OpenMPIHello)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	lib := filepath.Join(build, "usr/lib/x86_64-linux-gnu/openmpi")
	args := []string{"-O2", "-Wall", "-I" + filepath.Join(lib, "include"), "-o", out, src,
		"-L" + filepath.Join(lib, "lib"),
		"-Wl,-rpath-link," + filepath.Join(root, "usr/lib/x86_64-linux-gnu"),
		"-Wl,-rpath-link," + filepath.Join(root, "lib/x86_64-linux-gnu"),
		"-lmpi"}
	if b, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("gcc %s: %w (run tests/testbed-packages.sh: installs gcc)\n%s", src, err, b)
	}
	return nil
}
