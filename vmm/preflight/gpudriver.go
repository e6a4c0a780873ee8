package preflight

// The host NVIDIA driver behind each NVIDIA GPU (issue 32): what a job's
// guest gets of it. A plain VM boots without any of it (the guest brings
// its own driver, or none), so nothing here fails; every job (hpcvmm run
// --rootfs) with the GPU needs it, so a problem is a warning that says so
// and how to get out of it.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/kmodules"
)

// vendorNVIDIA is the PCI vendor ID of NVIDIA's GPUs.
const vendorNVIDIA = 0x10de

// jobsNeedIt ends a warning: why a VM still starts and who does not.
const jobsNeedIt = "a VM boots without it, but every job (hpcvmm run --rootfs) with this GPU exits 3 before boot unless run with --gpu-libs=off"

// gpuDriverChecks adds "gpu-driver" and "gpu-firmware" for each NVIDIA
// GPU among the requested --gpu devices (a display or 3D controller of
// vendor 0x10de, as gpudriver.GPUs counts them for a job), when
// Request.GPUDriver asks. The host is read once: a few milliseconds
// (gpudriver.Find, the guest kernel's modules.dep and its nvidia module's
// .modinfo, a stat per firmware file).
func (c *checker) gpuDriverChecks() {
	if !c.req.GPUDriver {
		return
	}
	var gpus []string
	for _, d := range c.devs {
		if !d.isVF && d.d.Vendor == vendorNVIDIA && d.d.BaseClass() == host.ClassDisplay {
			gpus = append(gpus, d.d.BDF.String())
		}
	}
	if len(gpus) == 0 {
		return
	}
	root := c.req.DriverRoot
	if root == "" {
		root = "/"
	}
	mod := guestModule(root, c.req.GuestRelease)
	drv := driverResult(root, c.req.DriverCache, mod)
	fw := firmwareResult(root, mod)
	for _, g := range gpus {
		drv.Subject, fw.Subject = g, g
		c.rep.Results = append(c.rep.Results, drv, fw)
	}
}

// nvidiaModule is the guest kernel's nvidia module as the host has it.
type nvidiaModule struct {
	release string
	info    kmodules.ModInfo
	err     error // the release or the module could not be read
}

// guestModule reads the .modinfo of the nvidia module of the guest
// kernel release (""): the host's running kernel, which a job boots unless
// given --kernel) beneath root.
func guestModule(root, release string) nvidiaModule {
	if release == "" {
		b, err := os.ReadFile(filepath.Join(root, "proc/sys/kernel/osrelease"))
		if err != nil {
			return nvidiaModule{err: fmt.Errorf("the host kernel's release: %w", err)}
		}
		release = strings.TrimSpace(string(b))
	}
	info, err := kmodules.ModuleInfo(filepath.Join(root, kmodules.DefaultHostDir), release, "nvidia")
	return nvidiaModule{release: release, info: info, err: err}
}

// driverResult is the "gpu-driver" check: the libraries and programs of
// the loaded module's version (gpudriver.Find, as a job takes them), and
// the guest kernel's nvidia module of the same version.
func driverResult(root string, cache []gpudriver.CacheEntry, mod nvidiaModule) Result {
	r := Result{Name: "gpu-driver", Status: Warn}
	d, err := gpudriver.Find(gpudriver.Options{Root: root, Cache: cache})
	var me *gpudriver.MismatchError
	switch {
	case errors.As(err, &me):
		r.Detail = fmt.Sprintf("the NVIDIA kernel module is version %s, its libraries version %s (%s is %s): CUDA refuses to run with them; %s",
			me.Module, me.Library, me.Link, filepath.Base(me.File), jobsNeedIt)
		r.Fix = fmt.Sprintf("install the NVIDIA driver's user space of version %s, or load the %s module (reboot after the driver's update); or run jobs with --gpu-libs=off and the image's own libraries", me.Module, me.Library)
	case errors.Is(err, gpudriver.ErrNotLoaded):
		r.Detail = "the NVIDIA kernel module is not loaded on the host: its version chooses the driver libraries jobs get; " + jobsNeedIt
		r.Fix = "modprobe nvidia (it may stay loaded with every GPU on vfio-pci), or run jobs with --gpu-libs=off and the image's own libraries"
	case err != nil:
		r.Detail = strings.TrimPrefix(err.Error(), "gpudriver: ") + "; " + jobsNeedIt
		r.Fix = "install the NVIDIA driver's user space and run ldconfig, or run jobs with --gpu-libs=off and the image's own libraries"
	case mod.err == nil && mod.info.Version != "" && mod.info.Version != d.Version:
		r.Detail = fmt.Sprintf("NVIDIA driver %s on the host, but kernel %s's nvidia module, which jobs' guests load, is version %s: CUDA in the guest fails with a driver/library version mismatch",
			d.Version, mod.release, mod.info.Version)
		r.Fix = fmt.Sprintf("build the driver %s's module for kernel %s (dkms install nvidia/%s -k %s), or run jobs with --gpu-libs=off and the image's own libraries", d.Version, mod.release, d.Version, mod.release)
	default:
		r.Status = Pass
		libs := fmt.Sprintf("%d libraries", len(d.Libraries))
		if len(d.Libraries) == 1 {
			libs = "1 library"
		}
		r.Detail = fmt.Sprintf("NVIDIA driver %s: %s, %s for jobs' guests", d.Version, libs, count(len(d.Binaries), "program"))
	}
	return r
}

// firmwareResult is the "gpu-firmware" check: the GSP firmware the guest
// kernel's nvidia module names, found on the host as the initramfs build
// finds it (kmodules.FindFirmware, the host kernel's loader's directories).
func firmwareResult(root string, mod nvidiaModule) Result {
	r := Result{Name: "gpu-firmware", Status: Warn}
	var unknown *kmodules.UnknownModuleError
	switch {
	case errors.As(mod.err, &unknown):
		r.Detail = fmt.Sprintf("kernel %s (which jobs boot unless given --kernel) has no nvidia module in %s/modules.dep: every job with this GPU exits 3 before boot",
			mod.release, hostPath(root, unknown.Where))
		r.Fix = fmt.Sprintf("install the NVIDIA driver's kernel modules for %s (its DKMS package) and run depmod %s", mod.release, mod.release)
		return r
	case errors.Is(mod.err, fs.ErrNotExist) && mod.release != "":
		r.Detail = fmt.Sprintf("kernel %s (which jobs boot unless given --kernel) has no module tree (%s/modules.dep): every job with this GPU exits 3 before boot",
			mod.release, hostPath(root, filepath.Join(root, kmodules.DefaultHostDir, mod.release)))
		r.Fix = fmt.Sprintf("install kernel %s's modules and the NVIDIA driver's for it, or run jobs with a --kernel whose modules the host has", mod.release)
		return r
	case mod.err != nil:
		r.Detail = fmt.Sprintf("the nvidia module jobs' guests load: %v", mod.err)
		return r
	}
	var refs []kmodules.FirmwareRef
	for _, n := range mod.info.Firmware {
		if kmodules.Match(gpudriver.GSPFirmware, n) {
			refs = append(refs, kmodules.FirmwareRef{Module: "nvidia", Name: n, Version: mod.info.Version})
		}
	}
	which := fmt.Sprintf("kernel %s's nvidia module (%s)", mod.release, orNone(mod.info.Version))
	if len(refs) == 0 {
		r.Status, r.Detail = Pass, which+" names no GSP firmware"
		return r
	}
	dirs := kmodules.FirmwareDirs(root, mod.release)
	files, err := kmodules.FindFirmware(dirs, refs, nil)
	if err != nil {
		r.Detail = err.Error()
		return r
	}
	if len(files.Missing) > 0 {
		var names, shown []string
		for _, m := range files.Missing {
			names = append(names, m.Name)
		}
		for _, d := range dirs {
			shown = append(shown, hostPath(root, d))
		}
		v := mod.info.Version
		if v == "" {
			v = "VERSION"
		}
		r.Detail = fmt.Sprintf("%s names GSP firmware %s, which none of %s holds: the guest's driver cannot bring the GPU up without it; a VM boots, but jobs with this GPU cannot use it",
			which, strings.Join(names, ", "), strings.Join(shown, ", "))
		r.Fix = fmt.Sprintf("install the driver's firmware package (e.g. nvidia-firmware-%s), which puts it under /lib/firmware/nvidia/%s", v, v)
		return r
	}
	var found []string
	for _, f := range files.Found {
		found = append(found, hostPath(root, filepath.Join(f.Dir, f.Path)))
	}
	r.Status = Pass
	r.Detail = fmt.Sprintf("%s: GSP firmware %s, for jobs' guests", which, strings.Join(found, ", "))
	return r
}

// hostPath is p as the host sees it: p less the root it was read beneath.
func hostPath(root, p string) string {
	if root == "/" {
		return p
	}
	if rel, err := filepath.Rel(root, p); err == nil && !strings.HasPrefix(rel, "..") {
		return "/" + rel
	}
	return p
}
