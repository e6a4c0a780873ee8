package jobrun

import (
	"errors"
	"fmt"
	"log/slog"
	"path"
	"path/filepath"
	"slices"

	"github.com/hpcvmm/hpcvmm/binds"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/ninep"
)

// The host NVIDIA driver's user space in a job's guest (issue 32): the
// libraries of the loaded kernel module's version (gpudriver.Find, as
// Apptainer's --nv and the NVIDIA container toolkit choose them) and the
// driver's programs, each served read-only by hpcvmm's 9P file server as
// a flat directory (ninep.FileSet: no copy in guest RAM, nothing else of
// the host's directories), mounted by the agent at jobproto.DriverLibDir
// and DriverBinDir and appended to COMMAND's LD_LIBRARY_PATH and PATH.

// driverFiles is the driver's user space opened for a job: one file set
// for the libraries, one for the programs (nil when none were found).
type driverFiles struct {
	version  string
	lib, bin *ninep.FileSet
}

// sets are the file sets to serve, libraries first.
func (d *driverFiles) sets() []*ninep.FileSet {
	if d == nil {
		return nil
	}
	out := []*ninep.FileSet{d.lib}
	if d.bin != nil {
		out = append(out, d.bin)
	}
	return out
}

// Close closes the sets (the file server has its own descriptors).
func (d *driverFiles) Close() {
	for _, s := range d.sets() {
		s.Close()
	}
}

// provides says whether argv0 (a name without a slash) is one of the
// driver's programs the guest finds on PATH: IMAGE need not have it.
func (d *driverFiles) provides(argv0 string) bool {
	return d != nil && d.bin != nil && slices.Contains(d.bin.Names(), argv0)
}

// mounts are the Start message's mounts of the sets, on the ports after
// the binds' (first the index first).
func (d *driverFiles) mounts(first int, msize uint32, cache string) []jobproto.Mount {
	var out []jobproto.Mount
	for i, target := range []string{jobproto.DriverLibDir, jobproto.DriverBinDir}[:len(d.sets())] {
		out = append(out, jobproto.Mount{Port: binds.PortName(first + i), Target: target, ReadOnly: true, MSize: msize, Cache: cache})
	}
	return out
}

// jobDriver opens the host driver's user space for a job with NVIDIA
// GPUs (spec.GPUs), unless GPULibsOff or an --initrd of one's own (no
// image: its initramfs may lack the 9P client) without GPULibsOn. A
// library of another version than the kernel module (gpudriver's
// MismatchError) or no module loaded is the host's fault (Host, exit 3),
// before boot. nbinds is how many binds the job has: both share the
// console's ports. find says where the driver is looked up (Request's
// DriverRoot and DriverCache).
func jobDriver(mode GPULibs, image bool, find gpudriver.Options, spec *job.Spec, nbinds int, log *slog.Logger) (*driverFiles, error) {
	if spec.GPUs == 0 || mode == GPULibsOff || !image && mode != GPULibsOn {
		return nil, nil
	}
	drv, err := gpudriver.Find(find)
	if err != nil {
		var me *gpudriver.MismatchError
		if errors.As(err, &me) {
			return nil, errorf(Host, "--gpu-libs: %w (or run with --gpu-libs=off and the image's own)", err)
		}
		return nil, errorf(Host, "--gpu-libs: the host NVIDIA driver's libraries: %w (--gpu-libs=off runs without them)", err)
	}
	root := find.Root
	if root == "" {
		root = "/"
	}
	host := func(p string) string { return filepath.Join(root, filepath.FromSlash(p)) }
	var files []string
	var links []ninep.SetLink
	seen := map[string]bool{}
	for _, l := range drv.Libraries {
		name := path.Base(l.File)
		if seen[name] {
			continue // the same library in a second directory: the loader's first wins
		}
		seen[name] = true
		files = append(files, host(l.File))
		for _, ln := range l.Links {
			if n := path.Base(ln); !seen[n] {
				seen[n] = true
				links = append(links, ninep.SetLink{Name: n, Target: name})
			}
		}
	}
	d := &driverFiles{version: drv.Version}
	if d.lib, err = ninep.OpenFileSet(files, links); err != nil {
		return nil, errorf(Host, "--gpu-libs: the host NVIDIA driver's libraries: %w", err)
	}
	if len(drv.Binaries) > 0 {
		var bins []string
		for _, b := range drv.Binaries {
			bins = append(bins, host(b))
		}
		if d.bin, err = ninep.OpenFileSet(bins, nil); err != nil {
			d.Close()
			return nil, errorf(Host, "--gpu-libs: the host NVIDIA driver's programs: %w", err)
		}
	}
	if n := nbinds + len(d.sets()); n > binds.MaxBinds {
		d.Close()
		return nil, fmt.Errorf("--gpu-libs: the host driver's libraries and programs take %d of the %d ports binds share, and the job has %d binds (with the defaults): bind fewer (--no-home, --no-cwd) or give --gpu-libs=off",
			len(d.sets()), binds.MaxBinds, nbinds)
	}
	log.Info("job: the host's NVIDIA driver in the guest", "version", drv.Version, "libraries", len(files), "programs", len(drv.Binaries),
		"at", jobproto.DriverLibDir+","+jobproto.DriverBinDir)
	return d, nil
}
