package jobrun

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/agent"
	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// prepareRootfs checks IMAGE and COMMAND before boot and returns the job's
// initramfs. A cached initramfs is looked up first: on a hit the checks
// read nothing of an archive or container IMAGE, and nothing is built.
func (r *runner) prepareRootfs(ctx context.Context, check func(*rootfs.Image) error) (string, error) {
	image, log := r.req.Image, r.log
	im, err := rootfs.OpenAs(image, func(p string) (*os.File, error) {
		return asuser.OpenFile(r.cfg.ActingFor, p, os.O_RDONLY|unix.O_NONBLOCK, 0)
	})
	if err != nil {
		return "", errorf(Input, "--rootfs %s: %s", image, imageError(image, err))
	}
	defer im.Close()
	if err := check(im); err != nil {
		return "", &Error{Kind: Input, Err: err}
	}
	t0 := time.Now()
	cfg, cfgErr := jobInitrdConfig(im, r)
	var hit *initramfs.Result
	if cfgErr == nil {
		if hit, err = initramfs.Lookup(cfg); err != nil {
			log.Debug("job: initramfs cache lookup", "err", err)
		}
	}
	if r.req.ImageMode == ImageSquashFS || hit == nil && r.req.ImageMode == ImageAuto {
		cache, conv, err := r.squashFSPlan(im)
		if err != nil {
			return "", err
		}
		if cache != nil {
			if err := r.lookCommand(im); err != nil {
				return "", err
			}
			return r.prepareConverted(ctx, im, cache, conv)
		}
	}
	if err := r.lookCommand(im); err != nil {
		return "", err
	}
	if hit == nil {
		u, err := im.Usage()
		if err != nil {
			return "", errorf(Input, "--rootfs %s: %s", image, imageError(image, err))
		}
		// Checked before the build, from IMAGE's index (the archive's
		// estimate counts names and synthesized parents too) and what the
		// build adds (the agent, the modules), so this minimum is the one
		// the build accepts.
		if cfgErr == nil {
			var a, m int64
			var err error
			cfg, err = adaptModules(cfg, r.req.Modules, log, func(c initramfs.Config) (err error) {
				a, m, err = initramfs.Extra(c)
				return err
			})
			if err == nil {
				u.Archive, u.Memory = u.Archive+a, u.Memory+m
			} else {
				log.Debug("job: the initramfs's modules", "err", err) // the build says it again
			}
		}
		if err := initramfs.Fits(u.Archive, u.Memory, int64(r.cfg.Memory)); err != nil {
			return "", errorf(Input, "--rootfs %s: --memory: %v", image, err)
		}
	}
	if cfgErr != nil {
		return "", &Error{Kind: Input, Err: cfgErr}
	}
	res := hit
	if res == nil {
		if res, err = buildJobInitrd(cfg, r.req.Modules, r.cfg.ActingFor, log); err != nil {
			var me *moduleError
			var ae *agentError
			if errors.As(err, &me) || errors.As(err, &ae) {
				return "", &Error{Kind: Input, Err: err}
			}
			var de *deviceModuleError
			if errors.As(err, &de) {
				return "", &Error{Kind: de.kind(), Err: err}
			}
			if fe := firmwareError(err); fe != nil {
				return "", fe
			}
			return "", errorf(VMFailed, "--rootfs %s: %s", image, imageError(image, err))
		}
	}
	if err := checkModuleSource(res, r.req.Modules, cfg.Release); err != nil {
		return "", &Error{Kind: Input, Err: err}
	}
	if err := checkDeviceModuleSource(res, cfg); err != nil {
		return "", classify(err, Input)
	}
	logInitrd(log, im, res, time.Since(t0))
	return res.Path, nil
}

// lookCommand looks COMMAND up in IMAGE as the guest will, in the PATH of
// its environment, and a dynamic COMMAND's ELF interpreter as the kernel
// will: not found (127) or not executable (126) before boot. One of the
// host driver's programs (--gpu-libs) need not be in IMAGE.
func (r *runner) lookCommand(im *rootfs.Image) error {
	image, argv0 := r.req.Image, r.spec.Argv[0]
	path := agent.DefaultPath
	for _, kv := range agent.Env((*jobproto.Start)(&r.spec)) {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	found, err := im.LookPath(argv0, path)
	if err != nil {
		if r.driver.provides(argv0) {
			return nil
		}
		return errorf(lookupKind(err), "--rootfs %s: %s", image, imageError(image, err))
	}
	interp, err := im.Interp(found)
	if err != nil || !strings.HasPrefix(interp, "/") {
		// None (a static COMMAND, a script), or one the kernel looks up
		// relative to the working directory: the guest says.
		if err != nil {
			r.log.Debug("job: COMMAND's ELF interpreter not read; the guest reports a missing one", "command", found, "err", err)
		}
		return nil
	}
	// execve fails with ENOENT without the interpreter, as for a missing
	// COMMAND; the kernel opens it as it opens COMMAND (a regular file
	// with an execute bit, symbolic links followed in the guest's root).
	if _, err := im.LookPath(interp, ""); err != nil {
		kind := lookupKind(err)
		what := "is not in the image"
		switch kind {
		case NotExecutable:
			what = "is in the image but not executable (not a regular file with an execute bit)"
		case Input:
			what = "cannot be looked up: " + imageError(image, err)
		}
		return errorf(kind, "--rootfs %s: command %s is dynamically linked and its ELF interpreter %s %s: add the C library it was built against to IMAGE, or build %s static",
			image, commandName(argv0, found), interp, what, argv0)
	}
	return nil
}

// lookupKind is who is at fault when rootfs.LookPath fails.
func lookupKind(err error) Kind {
	switch {
	case errors.Is(err, rootfs.ErrNotExecutable):
		return NotExecutable
	case errors.Is(err, rootfs.ErrNotFound):
		return NotFound
	}
	return Input
}

// commandName is COMMAND as the user gave it and, when looked up in PATH,
// where it was found: "sh (/bin/sh)".
func commandName(argv0, found string) string {
	if argv0 == found || strings.Contains(argv0, "/") {
		return argv0
	}
	return argv0 + " (" + found + ")"
}

// imageError is err about IMAGE without the package and IMAGE it names
// itself ("rootfs: image IMAGE: ", "initramfs: image IMAGE "): the line
// names --rootfs IMAGE once (issue 35: "--rootfs: rootfs: image").
func imageError(image string, err error) string {
	msg := err.Error()
	for _, p := range []string{"IMAGE " + image + ": ", "rootfs: image " + image + ": ", "rootfs: image " + image + " ", "initramfs: image " + image + ": ", "initramfs: image " + image + " "} {
		if rest, ok := strings.CutPrefix(msg, p); ok {
			return rest
		}
	}
	return msg
}
