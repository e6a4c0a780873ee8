package jobrun

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/vfio"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// powerButtonModules make the ACPI power button a key the agent reads
// (Linux's acpi button driver and the event device); on a kernel that has
// neither as a module nor built in, the job runs without them.
var powerButtonModules = []string{"button", "evdev"}

// jobInitrdConfig is what IMAGE's initramfs is built from: the agent
// (Request.Agent, else this binary), the guest kernel's release, the
// modules of the virtio devices and the power button, and the
// passed-through devices' modaliases (r.modaliases) with the modules they
// need besides.
func jobInitrdConfig(im *rootfs.Image, r *runner) (initramfs.Config, error) {
	self := r.req.Agent
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return initramfs.Config{}, fmt.Errorf("finding hpcvmm's own binary for the agent: %w", err)
		}
	}
	release, err := kernelRelease(r.cfg.Kernel, r.cfg.ActingFor)
	if err != nil {
		return initramfs.Config{}, err
	}
	aliases := r.modaliases
	dev := gpudriver.ForModaliases(aliases)
	return initramfs.Config{
		Image: im, Agent: self, Release: release, Modaliases: aliases,
		Modules:  append(jobModules(r.withBinds, r.req.Modules), dev.Load...),
		Optional: dev.Optional,
		Exclude:  dev.Exclude,
		// An NVIDIA GPU's GSP firmware: without it the guest's driver
		// cannot start the GPU, so a host that lacks it is refused
		// before boot (firmwareError), as `hpcvmm check` warns.
		RequireFirmware: dev.RequireFirmware,
		GuestMemory:     int64(r.cfg.Memory),
		CacheDir:        r.req.InitramfsCache,
	}, nil
}

// deviceModaliases are the modaliases of the passed-through devices
// (--gpu, --vf), sorted: the map's order must not change the initramfs's
// cache key.
func deviceModaliases(cfg *vmm.Config) ([]string, error) {
	devs := map[string]bool{}
	for _, s := range cfg.Passthrough.GPUs {
		devs[s] = false
	}
	for _, s := range cfg.Passthrough.VFs {
		devs[s] = true
	}
	var aliases []string
	for spec, vf := range devs {
		sp, err := vfio.ParseSpec(spec, vf)
		if err != nil {
			continue // vmm.Config.Validate names it
		}
		a, err := kmodules.PCIModalias(cfg.SysfsRoot, sp.BDF.String())
		if err != nil {
			return nil, err
		}
		aliases = append(aliases, a)
	}
	slices.Sort(aliases)
	return aliases, nil
}

// The passed-through devices' own modules (gpudriver.ForModaliases) are
// required, not optional: nvidia and nvidia_uvm for an NVIDIA GPU, the
// RDMA stack for a ConnectX function. Without them the device is there
// and useless (no /dev/nvidia*, CUDA finds no device; MPI falls back to
// TCP), and the guest cannot say why better than the host can now, before
// boot: a kernel without them is refused (deviceModuleError). They are
// usually not in the distribution's tree but in
// /lib/modules/RELEASE/updates/dkms (DKMS) or extra/ (NVIDIA's .run
// installer); kmodules takes any relative modules.dep path, so they are
// found where depmod recorded them. nvidia_modeset (display; not every
// driver build has it) and nvidia_peermem (GPUDirect RDMA, an
// optimisation) stay optional.

// deviceModuleError is a passed-through device's module (an NVIDIA GPU's
// nvidia, a ConnectX function's mlx5_ib...) that the guest kernel lacks:
// the host's fault (exit 3) when the modules come from the host's tree,
// IMAGE's (2) when from its own /lib/modules.
type deviceModuleError struct{ err *kmodules.UnknownModuleError }

func (e *deviceModuleError) Error() string {
	fix := "install the driver's kernel modules for it (the NVIDIA driver's DKMS package, rdma-core's kernel modules) and run depmod " + e.err.Release
	if strings.HasPrefix(e.err.Where, "image:") {
		fix = "add the driver's modules to IMAGE's /lib/modules/" + e.err.Release + " (and run depmod), or remove that directory so the host's modules are used"
	}
	return fmt.Sprintf("--gpu/--vf: the passed-through device needs module %s, which kernel %s lacks (neither in %s/modules.dep nor built in): %s, or boot a kernel that has it (--kernel)",
		e.err.Name, e.err.Release, e.err.Where, fix)
}

// kind is who is at fault: the user for IMAGE's tree, the host for its
// own.
func (e *deviceModuleError) kind() Kind {
	if strings.HasPrefix(e.err.Where, "image:") {
		return Input
	}
	return Host
}

// firmwareError is the error of a required firmware file (an NVIDIA
// GPU's GSP firmware) the host does not have: the host's fault (exit 3),
// found before boot. It is nil for any other error.
func firmwareError(err error) *Error {
	var mf *kmodules.MissingFirmwareError
	if !errors.As(err, &mf) {
		return nil
	}
	return &Error{Kind: Host, Err: fmt.Errorf("--gpu: %w", mf)}
}

// bindModules are the kernel's 9P client over file descriptors, for a
// job's host directories (package binds): 9pnet_fd is a module of its own
// since Linux 6.2 (before, trans=fd is part of 9pnet, which 9p needs).
var bindModules = []string{"9pnet_fd", "9p"}

// jobModules are the modules a job's guest loads besides the devices':
// the defaults, the binds' 9P client, then the user's --module names.
func jobModules(binds bool, user []string) []string {
	m := append(append([]string(nil), kmodules.DefaultModules...), powerButtonModules...)
	if binds {
		m = append(m, bindModules...)
	}
	return append(m, user...)
}

// moduleError is a --module the guest kernel does not have: the user's
// input, refused before boot with exit status 2.
type moduleError struct{ err *kmodules.UnknownModuleError }

func (e *moduleError) Error() string {
	return fmt.Sprintf("--module %s: kernel %s has no module %s (neither in %s/modules.dep nor built in): check the name (lsmod spells it), or boot a kernel that has it (--kernel)",
		e.err.Name, e.err.Release, e.err.Name, e.err.Where)
}

// agentError is an agent that CheckAgent refused: the request's fault.
type agentError struct{ err error }

func (e *agentError) Error() string { return e.err.Error() }
func (e *agentError) Unwrap() error { return e.err }

// buildJobInitrd builds IMAGE's initramfs into the cache (adaptModules),
// once CheckAgent (with the rights of acting, nil: hpcvmm's own) has
// taken the agent it packs: a program that is no agent would boot as a
// PID 1 that never answers (an *agentError). A cache hit skips both: its
// key holds the agent's SHA-256, so the same bytes passed when the entry
// was built.
func buildJobInitrd(cfg initramfs.Config, user []string, acting *asuser.User, log *slog.Logger) (*initramfs.Result, error) {
	if err := CheckAgent(cfg.Agent, acting); err != nil {
		return nil, &agentError{err}
	}
	var res *initramfs.Result
	_, err := adaptModules(cfg, user, log, func(c initramfs.Config) (err error) {
		res, err = initramfs.Build(c)
		return err
	})
	return res, err
}

// adaptModules calls try with cfg and, while it fails for a module the
// kernel lacks, again without it: without the power button's modules
// when the kernel has none, and without 9pnet_fd when its transport is
// built into 9pnet. A module of user (--module) the kernel lacks is a
// *moduleError. It returns the cfg try last ran with.
func adaptModules(cfg initramfs.Config, user []string, log *slog.Logger, try func(initramfs.Config) error) (initramfs.Config, error) {
	for {
		err := try(cfg)
		var unknown *kmodules.UnknownModuleError
		if err == nil || !errors.As(err, &unknown) {
			return cfg, err
		}
		switch n := unknown.Name; {
		case slices.Contains(user, n):
			return cfg, &moduleError{unknown}
		case slices.Contains(gpudriver.ForModaliases(cfg.Modaliases).Load, n):
			return cfg, &deviceModuleError{unknown}
		case slices.Contains(powerButtonModules, n):
			log.Warn("job: no power-button modules for this kernel; the guest ignores the power button", "err", err)
			cfg.Modules = slices.DeleteFunc(slices.Clone(cfg.Modules), func(m string) bool { return slices.Contains(powerButtonModules, m) })
		case n == "9pnet_fd" && slices.Contains(cfg.Modules, n):
			cfg.Modules = slices.DeleteFunc(slices.Clone(cfg.Modules), func(m string) bool { return m == n })
		case n == "9p" && slices.Contains(cfg.Modules, n):
			return cfg, fmt.Errorf("%w (binding host directories and the host's GPU driver libraries needs the kernel's 9P client: --no-home --no-cwd, no --bind and --gpu-libs=off to run without)", err)
		default:
			return cfg, err
		}
	}
}

// checkModuleSource refuses --module when the guest kernel has no modules
// directory at all (neither IMAGE's nor the host's): nothing could load
// the module, and nothing says the kernel has it built in.
func checkModuleSource(res *initramfs.Result, user []string, release string) error {
	if len(user) == 0 || res.ModuleSource != "" {
		return nil
	}
	return fmt.Errorf("--module %s: kernel %s has no modules directory (neither IMAGE's /lib/modules/%s nor the host's): install the kernel's modules, or boot a kernel that has them (--kernel)", user[0], release, release)
}

// checkDeviceModuleSource refuses a job whose passed-through devices need
// modules of their own (gpudriver.ForModaliases) when the guest kernel has
// no modules directory at all: nothing could load them. The host's fault
// (exit 3): a job boots the host's kernel by default.
func checkDeviceModuleSource(res *initramfs.Result, cfg initramfs.Config) error {
	need := gpudriver.ForModaliases(cfg.Modaliases).Load
	if len(need) == 0 || res.ModuleSource != "" {
		return nil
	}
	return errorf(Host, "--gpu/--vf: the passed-through device needs module %s, but kernel %s has no modules directory (neither IMAGE's /lib/modules/%s nor the host's): install the kernel's modules and the driver's, or boot a kernel that has them (--kernel)",
		need[0], cfg.Release, cfg.Release)
}

// logInitrd logs the initramfs a job boots: a cache hit, or what was built.
func logInitrd(log *slog.Logger, im *rootfs.Image, res *initramfs.Result, took time.Duration) {
	if res.Replaced != "" {
		log.Warn("job: initramfs cache entry rebuilt", "why", res.Replaced)
	}
	if len(res.Unmatched) > 0 {
		log.Warn("job: passed-through devices without a driver in the guest kernel", "modaliases", res.Unmatched)
	}
	if res.Hit {
		log.Info("job: initramfs cache hit", "image", im.Path(), "key", res.Key[:16], "took", took.Round(time.Millisecond))
		return
	}
	log.Info("job: initramfs built", "image", im.Path(), "size_mib", res.Size>>20, "unpacked_mib", res.Unpacked>>20,
		"modules", len(res.Modules), "module_source", res.ModuleSource, "took", took.Round(time.Millisecond))
}
