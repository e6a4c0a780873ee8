package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// MPIRoot is where the Slurm profile's L1 holds the MPI scenarios' rootfs
// (a directory IMAGE for hpcvmm run --rootfs): tests/guest/mpiapp built by
// Debian's mpicc at /mpi_app, with every shared library it loads, as the
// distribution installs them. The same binary runs natively in L1 (the
// control) with MPILibraryPath as its LD_LIBRARY_PATH.
const MPIRoot = "/hpcvmm/mpi/root"

// MPILibraryPath is the rootfs's library directory as L1 sees it.
const MPILibraryPath = MPIRoot + "/usr/lib/x86_64-linux-gnu"

// MPIApp is the program's path inside MPIRoot (and so in the guest).
const MPIApp = "/mpi_app"

// ucxPlugins are the UCX transport modules MPICH's UCX loads at run time
// (dlopen, from "ucx" beside libucs): cma is the only one whose libraries
// the test bed has; tcp, sysv, posix and self are in libuct itself, and
// the InfiniBand ones need rdma-core, which a guest without an HCA does not
// use.
var ucxPlugins = []string{"libuct_cma.so.0"}

// buildMPIApp compiles tests/guest/mpiapp with mpicc into the cache.
func buildMPIApp(cache string) (string, error) {
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	mpicc, err := exec.LookPath("mpicc")
	if err != nil {
		return "", fmt.Errorf("mpicc not found: run tests/testbed-packages.sh (installs mpich and libmpich-dev): %w", err)
	}
	out := filepath.Join(cache, "mpi_app")
	src := filepath.Join(root, "tests", "guest", "mpiapp", "mpi_app.c")
	if b, err := exec.Command(mpicc, "-O2", "-Wall", "-o", out, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("mpicc %s: %w\n%s", src, err, b)
	}
	return out, nil
}

// mpiLibraries are the shared libraries the program and the UCX plugins
// load (ldd), the plugins themselves, and the dynamic loader, as absolute
// host paths.
func mpiLibraries(app string) ([]string, error) {
	dir := "/usr/lib/x86_64-linux-gnu/ucx"
	seen := map[string]bool{}
	var libs []string
	add := func(elf string) error {
		out, err := exec.Command("ldd", elf).Output()
		if err != nil {
			return fmt.Errorf("ldd %s: %w", elf, err)
		}
		for _, l := range parseLdd(string(out)) {
			if !seen[l] {
				seen[l] = true
				libs = append(libs, l)
			}
		}
		return nil
	}
	if err := add(app); err != nil {
		return nil, err
	}
	for _, p := range ucxPlugins {
		plugin := filepath.Join(dir, p)
		if _, err := os.Stat(plugin); err != nil {
			return nil, fmt.Errorf("UCX plugin %s: %w (run tests/testbed-packages.sh: installs mpich)", plugin, err)
		}
		libs = append(libs, plugin)
		if err := add(plugin); err != nil {
			return nil, err
		}
	}
	return libs, nil
}

// addMPIFiles puts the MPI rootfs under MPIRoot. It is merged-/usr like
// Debian's (/lib and /lib64 link into /usr), so the UCX plugins sit beside
// libucs wherever the loader found it.
func addMPIFiles(im *Image) error {
	cache, err := CacheDir()
	if err != nil {
		return err
	}
	app, err := buildMPIApp(cache)
	if err != nil {
		return err
	}
	libs, err := mpiLibraries(app)
	if err != nil {
		return err
	}
	im.AddFile(MPIRoot+MPIApp, app, 0o755)
	im.AddSymlink(MPIRoot+"/lib", "usr/lib")
	im.AddSymlink(MPIRoot+"/lib64", "usr/lib64")
	for _, l := range libs {
		real, err := filepath.EvalSymlinks(l)
		if err != nil {
			return err
		}
		// The loader and libraries are found by their /lib paths: in the
		// rootfs those are /usr/lib paths through the links above.
		inRoot := l
		if !strings.HasPrefix(inRoot, "/usr/") {
			inRoot = "/usr" + inRoot
		}
		im.AddFile(MPIRoot+inRoot, real, 0o755)
	}
	// Name lookups (UCX and MPICH resolve the host name; the agent adds
	// the hostname to /etc/hosts) and a user database for getpwuid.
	im.AddBytes(MPIRoot+"/etc/hosts", []byte("127.0.0.1\tlocalhost\n"), 0o644)
	im.AddBytes(MPIRoot+"/etc/passwd", []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644)
	im.AddBytes(MPIRoot+"/etc/group", []byte("root:x:0:\n"), 0o644)
	return nil
}
