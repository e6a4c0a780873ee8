// Package gpudriver finds, on a host, the NVIDIA driver's user space that
// belongs to its loaded kernel module, and what a guest needs besides to
// use a passed-through GPU: the device nodes to create and the kernel
// modules to load (issue 32).
//
// A job's image never carries the driver's libraries in the version of the
// host's module, and libcuda.so must match the module exactly; Apptainer's
// --nv, Enroot's hook and the NVIDIA container toolkit therefore give the
// container the host's copies. Find does what they do: the library names
// of Apptainer's nvliblist.conf (and the newer ones libnvidia-container
// lists) looked up in the host's loader cache (/etc/ld.so.cache, or
// `ldconfig -p`'s text), keeping the files whose version suffix is the
// module's (libcuda.so.580.159.04), never the CUDA toolkit's copies
// (/usr/local/cuda*, its compat and stubs directories), 64-bit unless
// asked for 32-bit too; and the driver's binaries (nvidia-smi, ...).
//
// Every host path is read beneath a root directory ("/" on a host, a tree
// in tests), symbolic links resolved beneath it (ResolveIn). The parsers
// (ParseLdconfig, ParseLdCache, ParseProcDevices, ParseCapability,
// ParseVersion) work on bytes; the guest's agent uses ParseProcDevices and
// Nodes on its own /proc. A building block: it imports only the standard
// library.
package gpudriver

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// LibraryNames are the driver libraries' base names: Apptainer's
// etc/nvliblist.conf (which Apptainer's --nv resolves through ldconfig -p),
// plus the compute and utility libraries libnvidia-container lists that it
// lacks (libcudadebugger, libnvidia-nvvm, libnvidia-allocator,
// libnvidia-pkcs11*, libnvidia-api, libnvidia-ngx, libnvidia-nscq,
// libnvidia-sandboxutils). glvnd's and ocl-icd's loaders (libEGL.so,
// libGL.so, libOpenCL.so, ...) are in nvliblist.conf but are not the
// driver's: their files carry their own versions, never the module's, so
// Find leaves them out.
var LibraryNames = []string{
	"libcuda.so", "libEGL_installertest.so", "libEGL_nvidia.so", "libEGL.so", "libGLdispatch.so",
	"libGLESv1_CM_nvidia.so", "libGLESv1_CM.so", "libGLESv2_nvidia.so", "libGLESv2.so", "libGL.so",
	"libGLX_installertest.so", "libGLX_nvidia.so", "libglx.so", "libGLX.so", "libnvcuvid.so",
	"libnvidia-cbl.so", "libnvidia-cfg.so", "libnvidia-compiler.so", "libnvidia-eglcore.so",
	"libnvidia-egl-wayland.so", "libnvidia-encode.so", "libnvidia-fatbinaryloader.so", "libnvidia-fbc.so",
	"libnvidia-glcore.so", "libnvidia-glsi.so", "libnvidia-glvkspirv.so", "libnvidia-gpucomp.so",
	"libnvidia-gtk2.so", "libnvidia-gtk3.so", "libnvidia-ifr.so", "libnvidia-ml.so", "libnvidia-opencl.so",
	"libnvidia-opticalflow.so", "libnvidia-ptxjitcompiler.so", "libnvidia-rtcore.so", "libnvidia-tls.so",
	"libnvidia-wfb.so", "libnvoptix.so", "libOpenCL.so", "libOpenGL.so", "libvdpau_nvidia.so",
	"nvidia_drv.so", "tls_test_.so",
	// libnvidia-container's, not in nvliblist.conf:
	"libcudadebugger.so", "libnvidia-nvvm.so", "libnvidia-allocator.so", "libnvidia-pkcs11.so",
	"libnvidia-pkcs11-openssl3.so", "libnvidia-api.so", "libnvidia-ngx.so", "libnvidia-nscq.so",
	"libnvidia-sandboxutils.so",
}

// BinaryNames are the driver's programs a job may run (nvliblist.conf's).
var BinaryNames = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced",
	"nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}

// BinaryDirs are where Find looks for BinaryNames, first match wins: the
// distributions' directories, and /usr/local/nvidia/bin, where a GPU
// operator or a node image puts the driver.
var BinaryDirs = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin", "/usr/local/nvidia/bin"}

// Options says where Find looks and what it keeps.
type Options struct {
	// Root is the host's root directory ("" means "/").
	Root string
	// Cache is the loader cache's entries; nil reads Root's
	// /etc/ld.so.cache (ParseLdCache). Tests pass ParseLdconfig's.
	Cache []CacheEntry
	// Compat32 keeps the 32-bit (i386) libraries too.
	Compat32 bool
}

// Library is one library file of the driver with the names the loader
// finds it by.
type Library struct {
	// File is the library's file on the host (absolute, beneath Root, its
	// symbolic links resolved): /usr/lib/x86_64-linux-gnu/libcuda.so.580.159.04.
	File string
	// Links are the loader cache's paths that lead to File, in the cache's
	// order: the soname link (.../libcuda.so.1) and any development link
	// (.../libcuda.so); a guest needs them to find File by name.
	Links []string
	// Is64 reports a 64-bit library (false: a 32-bit one, with Compat32).
	Is64 bool
}

// Driver is the host driver's user space for its loaded module.
type Driver struct {
	// Version is the kernel module's version, which every library's
	// file carries as its suffix.
	Version string
	// Libraries are the library files in the cache's order.
	Libraries []Library
	// Binaries are the driver's programs found (absolute host paths,
	// resolved beneath Root).
	Binaries []string
}

// MismatchError is a driver library of another version than the loaded
// kernel module: CUDA refuses to run (cudaErrorInsufficientDriver or
// "driver/library version mismatch").
type MismatchError struct {
	// Module is the kernel module's version, Library the library file's.
	Module, Library string
	// Link is the cache path that leads to File.
	Link, File string
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("gpudriver: the NVIDIA kernel module is version %s but its libraries are version %s (%s is %s): install the driver user space of version %s, or load the %s module (reboot after the driver's update)",
		e.Module, e.Library, e.Link, path.Base(e.File), e.Module, e.Library)
}

// Find returns the driver user space of the kernel module loaded on the
// host at opts.Root. A library of another driver version than the module
// is a *MismatchError; no libcuda of the module's version is an error too.
func Find(opts Options) (*Driver, error) {
	root := opts.Root
	if root == "" {
		root = "/"
	}
	v, err := ModuleVersion(root)
	if err != nil {
		return nil, err
	}
	cache := opts.Cache
	if cache == nil {
		b, err := readBounded(root, "/etc/ld.so.cache", 64<<20)
		if err != nil {
			return nil, fmt.Errorf("gpudriver: the loader cache: %w: run ldconfig", err)
		}
		if cache, err = ParseLdCache(b); err != nil {
			return nil, fmt.Errorf("gpudriver: /etc/ld.so.cache: %w", err)
		}
	}
	d := &Driver{Version: v}
	if d.Libraries, err = selectLibraries(root, v, cache, opts.Compat32); err != nil {
		return nil, err
	}
	if !slices.ContainsFunc(d.Libraries, func(l Library) bool { return l.Is64 && baseName(path.Base(l.File)) == "libcuda.so" }) {
		return nil, fmt.Errorf("gpudriver: the loader cache has no libcuda.so of driver %s (the kernel module's version): install the driver's user space and run ldconfig", v)
	}
	if d.Binaries, err = findBinaries(root); err != nil {
		return nil, err
	}
	return d, nil
}

// baseName is a library name up to and including ".so" (libcuda.so.1 →
// libcuda.so); "" when it has no ".so".
func baseName(name string) string {
	i := strings.Index(name, ".so")
	if i < 0 || (len(name) > i+3 && name[i+3] != '.') {
		return ""
	}
	return name[:i+3]
}

// toolkitPath reports a path of the CUDA toolkit, never the driver's: a
// directory element cuda or cuda-X.Y (/usr/local/cuda-13.0/...), or the
// toolkit's compat (forward-compatibility libcuda of another driver
// version) and stubs (link-time stand-ins) directories.
func toolkitPath(p string) bool {
	elems := strings.Split(path.Dir(p), "/")
	return slices.ContainsFunc(elems, func(e string) bool {
		return e == "cuda" || strings.HasPrefix(e, "cuda-") || e == "compat" || e == "stubs"
	})
}

// selectLibraries picks from the cache the driver's libraries: names of
// LibraryNames, glibc ELF libraries of the wanted word sizes, outside the
// toolkit, the first entry of each name and word size whose file exists
// (the one the loader uses), resolved beneath root to a file whose suffix is a driver version;
// one of another version than v is a *MismatchError.
func selectLibraries(root, v string, cache []CacheEntry, compat32 bool) ([]Library, error) {
	type key struct {
		name string
		is64 bool
	}
	seen := map[key]bool{}
	byFile := map[string]int{}
	var out []Library
	for _, e := range cache {
		k := key{e.Name, e.Is64()}
		if !e.Libc6 || (!k.is64 && (!compat32 || e.Arch != "")) || seen[k] ||
			!slices.Contains(LibraryNames, baseName(e.Name)) || toolkitPath(e.Path) {
			continue
		}
		file, err := ResolveIn(root, e.Path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // a stale entry: the loader goes on to the next one too
		}
		if err != nil {
			return nil, fmt.Errorf("gpudriver: %s (in the loader cache): %w: run ldconfig", e.Path, err)
		}
		seen[k] = true
		if toolkitPath(file) {
			continue // a link into the toolkit's compat directory
		}
		suffix, ok := strings.CutPrefix(path.Base(file), baseName(e.Name)+".")
		if !ok || !IsDriverVersion(suffix) {
			continue // glvnd's and ocl-icd's loaders: not the driver's
		}
		if suffix != v {
			return nil, &MismatchError{Module: v, Library: suffix, Link: e.Path, File: file}
		}
		if err := regularFile(root, file); err != nil {
			return nil, fmt.Errorf("gpudriver: %s (from %s): %w", file, e.Path, err)
		}
		i, ok := byFile[file]
		if !ok {
			i = len(out)
			byFile[file] = i
			out = append(out, Library{File: file, Is64: k.is64})
		}
		if e.Path != file {
			out[i].Links = append(out[i].Links, e.Path)
		}
	}
	return out, nil
}

// findBinaries looks BinaryNames up in BinaryDirs beneath root.
func findBinaries(root string) ([]string, error) {
	var out []string
	for _, b := range BinaryNames {
		for _, d := range BinaryDirs {
			file, err := ResolveIn(root, d+"/"+b)
			if errors.Is(err, fs.ErrNotExist) {
				continue
			}
			if err == nil {
				err = regularFile(root, file)
			}
			if err != nil {
				return nil, fmt.Errorf("gpudriver: %s/%s: %w", d, b, err)
			}
			out = append(out, file)
			break
		}
	}
	return out, nil
}

// regularFile checks that the resolved path p beneath root is a regular file.
func regularFile(root, p string) error {
	fi, err := os.Lstat(filepath.Join(root, filepath.FromSlash(p)))
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	return nil
}
