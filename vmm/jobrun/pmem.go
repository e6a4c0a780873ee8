package jobrun

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/agent"
	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/imagefile"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// A SquashFS, EROFS or SIF IMAGE is not copied into the initramfs: the
// VM maps it read-only as persistent memory (vmm.Config.PMEM) and the
// agent mounts it from /dev/pmem0 (issue 31, docs/job-images.md). The
// initramfs then holds only the agent and the modules.

// pmemModules are the guest kernel's modules the pmem path needs besides a
// job's usual ones: nd_e820 turns the e820 type-12 range into an nvdimm
// region, nd_pmem makes it /dev/pmem0 (kmodules brings libnvdimm, nd_btt
// and dax as modules.dep lists them), the image's file system, and
// overlay for the writable layer over it. Built-in ones are skipped.
//
// EROFS needs libcrc32c, whose init asks the crypto API for "crc32c" and
// fails (ENOENT) without an implementation: modules.dep does not say so,
// only modules.softdep ("softdep libcrc32c pre: crc32c"), which kmodules
// does not read, so the generic implementation goes first by name (the
// first EROFS boot in the test bed failed at exactly this).
func pmemModules(fs imagefile.FSType) []string {
	if fs == imagefile.EROFS {
		return []string{"nd_e820", "nd_pmem", "crc32c_generic", string(fs), "overlay"}
	}
	return []string{"nd_e820", "nd_pmem", string(fs), "overlay"}
}

// openPMEMImage opens IMAGE as the user hpcvmm acts for and recognises a
// SquashFS, EROFS or SIF file. It returns nil, nil for any other IMAGE
// (a directory, a tar or container image: today's initramfs path), and
// an error, one line naming IMAGE, for one of those formats that cannot
// be used (corrupt, truncated, encrypted, ...). The returned file is
// IMAGE, open read-only: the VM maps that file (vmm.PMEMConfig.File).
func openPMEMImage(image string, as *asuser.User) (*os.File, *imagefile.Image, error) {
	f, err := asuser.OpenFile(as, image, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, nil // rootfs.OpenAs says it, for every format
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, nil, nil
	}
	im, err := imagefile.Detect(image, f, st.Size())
	if errors.Is(err, imagefile.ErrNotImage) {
		f.Close()
		return nil, nil, nil
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, &im, nil
}

// prepareImage sets the job's initrd (and for a pmem IMAGE its read-only
// image) from IMAGE: a SquashFS, EROFS or SIF file takes the pmem path
// (preparePMEM), anything else the initramfs of IMAGE's tree
// (prepareRootfs).
func (r *runner) prepareImage(ctx context.Context, check func(*rootfs.Image) error) error {
	image := r.req.Image
	file, im, err := openPMEMImage(image, r.cfg.ActingFor)
	if err != nil {
		return errorf(Input, "--rootfs %s: %s", image, imageError(image, err))
	}
	var initrd string
	if im == nil {
		initrd, err = r.prepareRootfs(ctx, check)
	} else {
		initrd, err = r.preparePMEM(file, im)
	}
	r.cfg.Initrd = initrd
	return err
}

// closePMEMFile closes the caller's descriptor of a pmem IMAGE, if any.
func closePMEMFile(file *os.File) {
	if file != nil {
		file.Close()
	}
}

// preparePMEM sets up the pmem path of a SquashFS, EROFS or SIF IMAGE:
// the VM's read-only image (file, which the caller closes once the VM has
// it), the kernel command line that tells the agent
// (agent.CmdlinePMEMRoot), and the initramfs of the agent and the modules
// (cached per kernel release and module set). COMMAND is looked up in the
// guest: no Go reader of SquashFS or EROFS is at hand, so the agent
// reports 127 or 126 as it does for a command that vanished (the host's
// lookup before boot is the initramfs path's).
func (r *runner) preparePMEM(file *os.File, im *imagefile.Image) (string, error) {
	image, log := r.req.Image, r.log
	if im.Signed {
		log.Info("job: the SIF is signed; hpcvmm does not verify signatures (apptainer verify does)", "image", image)
	}
	mapped := image
	if r.pmemPath != "" {
		mapped = r.pmemPath // IMAGE's conversion (prepareConverted)
	}
	r.cfg.PMEM = vmm.PMEMConfig{Path: mapped, File: file, Offset: im.Offset, Size: im.Size}
	r.cfg.Cmdline = jobCmdline(r.cfg.Cmdline) + " " + agent.CmdlinePMEMRoot + "=" + string(im.FSType)
	tree, cleanup, err := emptyTree()
	if err != nil {
		return "", errorf(VMFailed, "--rootfs %s: the initramfs's empty tree: %v", image, err)
	}
	defer cleanup()
	cfg, err := jobInitrdConfig(tree, r)
	if err != nil {
		return "", &Error{Kind: Input, Err: err}
	}
	cfg.Modules = append(cfg.Modules, pmemModules(im.FSType)...)
	t0 := time.Now()
	res, err := lookupOrBuild(cfg, r.req.Modules, r.cfg.ActingFor, log)
	var me *moduleError
	var ae *agentError
	var unknown *kmodules.UnknownModuleError
	switch {
	case errors.As(err, &me), errors.As(err, &ae):
		return "", &Error{Kind: Input, Err: err}
	case firmwareError(err) != nil:
		return "", firmwareError(err)
	case errors.As(err, &unknown):
		return "", errorf(Input, "--rootfs %s: kernel %s has no module %s (neither in %s/modules.dep nor built in), which a %s IMAGE mapped as persistent memory needs: boot a kernel that has it (--kernel)",
			image, unknown.Release, unknown.Name, unknown.Where, im.FSType)
	case err != nil:
		return "", errorf(VMFailed, "--rootfs %s: the initramfs of the agent and modules: %s", image, imageError(tree.Path(), err))
	}
	if err := checkModuleSource(res, r.req.Modules, cfg.Release); err != nil {
		return "", &Error{Kind: Input, Err: err}
	}
	logInitrd(log, tree, res, time.Since(t0))
	log.Info("job: IMAGE mapped read-only as persistent memory", "image", image, "fs", string(im.FSType),
		"container", string(im.Container), "offset", im.Offset, "size_mib", im.Size>>20)
	return res.Path, nil
}

// emptyTree is the tree of a pmem job's initramfs: an empty private
// temporary directory, which cleanup removes. Its key (no entries) is the
// same for every image, so the initramfs is cached per agent, kernel
// release and module set. The modules then come from the host's
// /lib/modules/RELEASE: IMAGE's tree is not read on the host.
func emptyTree() (*rootfs.Image, func(), error) {
	dir, err := os.MkdirTemp("", "hpcvmm-pmem-")
	if err != nil {
		return nil, func() {}, err
	}
	tree, err := rootfs.Open(dir)
	if err != nil {
		os.Remove(dir)
		return nil, func() {}, err
	}
	return tree, func() { tree.Close(); os.Remove(dir) }, nil
}

// lookupOrBuild returns the cached initramfs of cfg, or builds it
// (buildJobInitrd, which drops the optional modules the kernel lacks).
func lookupOrBuild(cfg initramfs.Config, user []string, acting *asuser.User, log *slog.Logger) (*initramfs.Result, error) {
	res, err := initramfs.Lookup(cfg)
	if err != nil {
		log.Debug("job: initramfs cache lookup", "err", err)
	}
	if res != nil {
		return res, nil
	}
	return buildJobInitrd(cfg, user, acting, log)
}
