package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/hpcvmm/hpcvmm/agent"
	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/gpudriver"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/pmi"
	"github.com/hpcvmm/hpcvmm/vmm"
	"github.com/hpcvmm/hpcvmm/vmm/jobrun"
)

// jobFlags are the flags of `hpcvmm run ... -- COMMAND` (docs/jobs.md).
type jobFlags struct {
	rootfs   string
	env      []string
	envFiles []string
	workdir  string
	user     string
	quiet    bool
	hostname string
	// initrdCache is the hidden --initramfs-cache: the initramfs cache
	// directory ("" the user's own, cachedir.Default), for tests.
	initrdCache string
	// modules are --module's names, normalized (kmodules.Normalize).
	modules []string
	// gpuLibs is --gpu-libs (on, off; "" not given).
	gpuLibs string
	// rootfsMode is --rootfs-mode; imageCache the hidden --image-cache.
	rootfsMode jobrun.ImageMode
	imageCache string
	bindFlags
}

// bindFlags are the host-directory flags of a job (package binds).
type bindFlags struct {
	binds         []string
	noHome, noCwd bool
	contain       bool
	// msize and cache are the hidden bench/test knobs --bind-msize and
	// --bind-cache (addBindTuningFlags); zero values mean the defaults
	// (jobrun.DefaultBindMSize, DefaultBindCache).
	msize uint64
	cache string
}

// agentPath is where a job's initramfs holds hpcvmm as its agent.
const agentPath = initramfs.AgentPath

// gpuDriverRoot is the host root beneath which jobs
// (jobrun.Request.DriverRoot) and check (preflight.Request.DriverRoot)
// find an NVIDIA GPU's driver ("/"; a fixture tree in tests), and
// gpuDriverCache the loader cache's entries (nil: the root's
// /etc/ld.so.cache): one place, so check reports what a job gets.
var (
	gpuDriverRoot  = "/"
	gpuDriverCache []gpudriver.CacheEntry
)

// jobAgent is the agent a job's initramfs holds: "" hpcvmm's own binary
// (tests give a static stand-in: a test binary may be dynamically
// linked).
var jobAgent string

// addJobFlags defines the Job group of `hpcvmm run`.
func addJobFlags(c *command, rf *runFlags) {
	f := &rf.job
	g := c.group("Job")
	g.StringVar(&f.rootfs, "rootfs", "", "`IMAGE`: the job's files: a SquashFS, EROFS or Apptainer/Singularity SIF file (mapped read-only into the guest as persistent memory, never copied), or a directory, a tar archive (plain, gzip, zstd), an OCI image layout or a docker/podman save archive (hpcvmm builds and caches the initramfs of its tree); the initramfs holds hpcvmm's agent and the guest's modules. Not with --initrd")
	g.StringArrayVar(&f.env, "env", nil, "`KEY=VALUE`: COMMAND's environment (repeatable; KEY alone takes hpcvmm's value). PATH defaults to "+agent.DefaultPath)
	g.StringArrayVar(&f.envFiles, "env-file", nil, "`FILE`: KEY=VALUE lines for COMMAND's environment (# comments and blank lines skipped), before --env (repeatable)")
	g.StringVar(&f.workdir, "workdir", "", "`DIR`: COMMAND's working directory in the guest (default: the host's working directory when it is bound, else /)")
	g.StringVar(&f.user, "user", "", "`UID[:GID]`: run COMMAND as this numeric user and group (GID defaults to UID; default: hpcvmm's own user and groups, or the job's user when root runs hpcvmm for a Slurm job; root when root runs it for itself)")
	g.BoolVar(&f.quiet, "quiet", false, "print nothing of hpcvmm's own (no log, no guest console) on stderr: COMMAND's stderr and a one-line failure reason only")
	g.Func("dns", "`ADDRESS`: a name server for the job's /etc/resolv.conf in the guest (repeatable; default: with ip=dhcp the DHCP server's, else the host's /etc/resolv.conf name servers that are not loopback addresses)", func(s string) error {
		if net.ParseIP(s) == nil {
			return fmt.Errorf("%q: want an IP address", s)
		}
		rf.dns = append(rf.dns, s)
		return nil
	})
	g.StringVar(&f.hostname, "hostname", "", "`NAME`: the guest's hostname (default the host's, as for a job run directly)")
	g.Func("module", "`NAME`: a kernel module of the guest kernel's module tree (IMAGE's /lib/modules/RELEASE, else the host's) loaded with its dependencies before COMMAND: a file system client, rdma_rxe, ... (repeatable)", func(s string) error {
		if err := kmodules.ValidateName(s); err != nil {
			return err
		}
		if n := kmodules.Normalize(s); !slices.Contains(f.modules, n) {
			f.modules = append(f.modules, n)
		}
		return nil
	})
	g.Func("gpu-libs", "`on|off`: with an NVIDIA GPU passed through, the host driver's libraries and programs (of the loaded kernel module's version, as Apptainer's --nv gives them) read-only in the guest at "+jobproto.DriverLibDir+" and "+jobproto.DriverBinDir+", appended to COMMAND's LD_LIBRARY_PATH and PATH (default on; with --initrd only when on is given)", func(s string) error {
		if s != "on" && s != "off" {
			return fmt.Errorf("%q: give on or off", s)
		}
		f.gpuLibs = s
		return nil
	})
	g.Func("rootfs-mode", "`auto|initramfs|squashfs`: how a directory, tar or container IMAGE reaches the guest: packed into the initramfs (unpacked in guest RAM), or converted once to a cached SquashFS file mapped read-only as persistent memory (needs squashfs-tools' mksquashfs; only the pages read are ever loaded); auto packs IMAGE up to 256 MiB of files and converts a larger one or one converted before (default auto)", func(s string) error {
		m, ok := jobrun.ImageModes[s]
		if !ok {
			return fmt.Errorf("%q: give auto, initramfs or squashfs", s)
		}
		f.rootfsMode = m
		return nil
	})
	addBindFlags(g, &f.bindFlags)
}

// addBindFlags defines -B/--bind, --no-home, --no-cwd and --contain.
func addBindFlags(g *pflag.FlagSet, f *bindFlags) {
	g.StringArrayVarP(&f.binds, "bind", "B", nil, "`SRC[:DST[:ro|rw]][,...]`: a host directory in the guest at DST (default SRC), read-write unless :ro, as Apptainer's -B; served by hpcvmm over 9P with hpcvmm's (or the job user's) rights (repeatable). $HOME and the working directory are bound by default")
	g.BoolVar(&f.noHome, "no-home", false, "do not bind $HOME at its host path")
	g.BoolVar(&f.noCwd, "no-cwd", false, "do not bind the working directory at its host path (COMMAND then starts in / unless --workdir)")
	g.BoolVar(&f.contain, "contain", false, "bind nothing by default: --no-home and --no-cwd")
}

// addBindTuningFlags defines the hidden --bind-msize and --bind-cache: the
// knobs docs/benchmarks.md's "9P binds" measurement varies (tests/bench
// -cases binds). They are not for users: the defaults are the measured
// choice.
func addBindTuningFlags(fs *pflag.FlagSet, f *bindFlags) {
	fs.Var(sizeValue{&f.msize}, "bind-msize", "9P message size of the binds, with a K or M suffix (bench and tests; default 512K)")
	fs.StringVar(&f.cache, "bind-cache", "", "cache mode of the guest's 9P client for the binds: none, loose, fscache or mmap (bench and tests; default mmap)")
}

// jobCommand is COMMAND: the arguments after "--", nil when there are none
// (arguments before "--" are the caller's error to report).
func jobCommand(fs *pflag.FlagSet) []string {
	if fs.NArg() == 0 || fs.ArgsLenAtDash() != 0 {
		return nil
	}
	return fs.Args()
}

// jobEnv builds COMMAND's environment from --env-file and --env, in order.
// Each --env-file is opened with the rights of the user hpcvmm acts for
// (as; nil for itself).
func jobEnv(f *jobFlags, lookup func(string) (string, bool), as *asuser.User) ([]string, error) {
	var env []string
	add := func(kv, where string) error {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" || strings.ContainsAny(k, " \t\x00") || strings.Contains(v, "\x00") {
			return fmt.Errorf("%s %q: want KEY=VALUE with a KEY of no spaces", where, kv)
		}
		if !ok {
			hv, set := lookup(k)
			if !set {
				return nil // as docker does: KEY alone, unset on the host, is left out
			}
			v = hv
		}
		env = append(env, k+"="+v)
		return nil
	}
	for _, file := range f.envFiles {
		fh, err := asuser.Open(as, file)
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", file, errors.Unwrap(err))
		}
		s := bufio.NewScanner(fh)
		for n := 1; s.Scan(); n++ {
			line := strings.TrimSpace(s.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			if err := add(line, fmt.Sprintf("--env-file %s line %d:", file, n)); err != nil {
				fh.Close()
				return nil, err
			}
		}
		err = s.Err()
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("--env-file %s: %w", file, err)
		}
	}
	for _, kv := range f.env {
		if err := add(kv, "--env"); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// parseUser parses --user UID[:GID].
func parseUser(s string) (uid, gid uint32, err error) {
	u, g, hasG := strings.Cut(s, ":")
	parse := func(v string) (uint32, error) {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("--user %s: %q is not a numeric id (names are not looked up: give UID[:GID] numbers)", s, v)
		}
		return uint32(n), nil
	}
	if uid, err = parse(u); err != nil {
		return 0, 0, err
	}
	gid = uid
	if hasG {
		if gid, err = parse(g); err != nil {
			return 0, 0, err
		}
	}
	return uid, gid, nil
}

// runJob is `hpcvmm run ... -- COMMAND`: the flags become a
// jobrun.Request, jobrun.Run runs it, and hpcvmm exits with COMMAND's
// status or the one the failure's kind gives (exitCode).
func runJob(c *command, f *runFlags, jf *jobFlags, argv []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if code := checkJobFiles(c, f, jf, stderr); code >= 0 {
		return code
	}
	req, err := jobRequest(c, f, jf, argv)
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %v\n", err)
		return exitInput
	}
	// The log and the guest's console go to stderr (through termsafe on a
	// terminal: jobStderr); COMMAND's streams are the caller's, byte for
	// byte.
	logOut, consoleOut := jobStderr(stderr, jf.quiet)
	req.Log = slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: f.logLevel}))
	req.Console, req.Progress = consoleOut, logOut
	req.Stdin, req.Stdout, req.Stderr = stdin, stdout, stderr
	req.RelaySignals = true
	res, err := jobrun.Run(context.Background(), req)
	if err != nil {
		fmt.Fprintf(stderr, "hpcvmm run: %s\n", jobErrorText(err))
		return exitCode(err, jobproto.CodeAgentFailed)
	}
	if res.Failure != 0 {
		printJobReason(stderr, res.Reason)
	}
	return res.ExitCode()
}

// jobErrorText is a job's error as one line: package vmm's errors about
// the VM's config name the flags (describeError), the others name them
// already.
func jobErrorText(err error) string {
	var je *jobrun.Error
	if errors.As(err, &je) && je.FromVMM {
		return describeError(je.Err)
	}
	return err.Error()
}

// checkJobFiles refuses a job without its files (or with two sources of
// them), with a --console it cannot have, or with --module and no IMAGE;
// a code >= 0 is the exit status.
func checkJobFiles(c *command, f *runFlags, jf *jobFlags, stderr io.Writer) int {
	if jf.rootfs != "" && f.cfg.Initrd != "" {
		return c.usageError(stderr, "--rootfs and --initrd: give one (--rootfs IMAGE builds the initramfs; --initrd FILE must hold hpcvmm at %s)", agentPath)
	}
	if jf.rootfs == "" && f.cfg.Initrd == "" {
		return c.usageError(stderr, "COMMAND needs its files: give --rootfs IMAGE")
	}
	if c.fs.Changed("console") && f.cfg.Console != vmm.ConsoleVirtio {
		// A job's streams are its own ports; the kernel's console goes
		// to stderr. Said rather than ignored (issue 35).
		return c.usageError(stderr, "--console %s: a job's stdin, stdout and stderr are COMMAND's (virtio-console ports) and the kernel's console goes to stderr (--quiet drops it): leave --console out", f.cfg.Console)
	}
	if jf.rootfs == "" && len(jf.modules) > 0 {
		return c.usageError(stderr, "--module %s needs --rootfs IMAGE: hpcvmm puts the modules into the initramfs it builds (an --initrd of one's own lists its modules in %s)", jf.modules[0], initramfs.ModulesList)
	}
	return -1
}

// jobRequest is the jobrun.Request of `hpcvmm run ... -- COMMAND` from
// the flags and the environment, with srun's PMI step when there is one;
// an error names the flag or variable at fault.
func jobRequest(c *command, f *runFlags, jf *jobFlags, argv []string) (jobrun.Request, error) {
	env, err := jobEnv(jf, os.LookupEnv, f.cfg.ActingFor)
	if err != nil {
		return jobrun.Request{}, err
	}
	var user *jobrun.User
	if jf.user != "" {
		uid, gid, err := parseUser(jf.user)
		if err != nil {
			return jobrun.Request{}, err
		}
		user = &jobrun.User{UID: uid, GID: gid}
	}
	// Under srun, COMMAND learns its place in the job as a native task
	// does: every SLURM_* and PMI_* variable first, so --env-file and
	// --env override them; with srun --mpi=pmi2, PMI_FD's socket is
	// relayed into the guest (package pmi; last: nothing else can fail
	// with the step open, and jobrun.Run closes it).
	step, err := pmi.FromEnv(os.Environ())
	if err != nil {
		return jobrun.Request{}, err
	}
	env = append(pmi.JobEnv(os.Environ()), env...)
	cfg := f.cfg
	cfg.StartTime = processStart
	req := jobrun.Request{
		Image: jf.rootfs, Argv: argv, Env: env, Workdir: jf.workdir, User: user, Hostname: jf.hostname, PMI: step, VM: cfg,
		Binds: jf.binds, NoHome: jf.noHome, NoCwd: jf.noCwd, Contain: jf.contain, BindMSize: jf.msize, BindCache: jf.cache,
		Modules: jf.modules, Agent: jobAgent, InitramfsCache: jf.initrdCache, ImageMode: jf.rootfsMode, ImageCache: jf.imageCache, ShutdownTimeout: f.shutdownTimeout,
		DriverRoot: gpuDriverRoot, DriverCache: gpuDriverCache,
	}
	if c.fs.Changed("gpu-libs") {
		req.GPULibs = map[string]jobrun.GPULibs{"on": jobrun.GPULibsOn, "off": jobrun.GPULibsOff}[jf.gpuLibs]
	}
	for _, g := range f.guestNets {
		req.Interfaces = append(req.Interfaces, jobproto.Interface{MAC: g.MAC, Address: g.Address, Gateway: g.Gateway, DHCP: g.DHCP})
	}
	if len(f.cfg.Nets) > 0 {
		for _, s := range f.jobDNS() {
			ip := net.ParseIP(s)
			if ip4 := ip.To4(); ip4 != nil {
				ip = ip4
			}
			req.DNS = append(req.DNS, ip)
		}
	}
	return req, nil
}
