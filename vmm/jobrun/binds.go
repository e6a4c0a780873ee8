package jobrun

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/binds"
	"github.com/hpcvmm/hpcvmm/job"
	"github.com/hpcvmm/hpcvmm/ninep"
	"github.com/hpcvmm/hpcvmm/rootfs"
	"github.com/hpcvmm/hpcvmm/virtio/console"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// jobIdentity gives COMMAND the user hpcvmm runs as (or acts for under
// Slurm), as `apptainer exec` does, unless --user chose one: the ids, the
// groups and the names for the guest's passwd and group files. hpcvmm run
// as root for itself keeps COMMAND root. acting is whom hpcvmm acts for
// (acting, nil: itself) and the user's home directory ("" when unknown).
func jobIdentity(spec *job.Spec, userGiven bool, acting *asuser.User) (home string) {
	who := acting
	switch {
	case who != nil:
		home = asuser.Home(who.UID)
	case os.Geteuid() != 0:
		who = asuser.Self()
		home = os.Getenv("HOME")
		if home == "" {
			home = asuser.Home(who.UID)
		}
	}
	if userGiven || who == nil {
		return home
	}
	spec.SetUser, spec.UID, spec.GID = true, who.UID, who.GID
	spec.Groups = append([]uint32{}, who.Groups...)
	spec.UserName, spec.GroupName, spec.Home = who.Name, asuser.GroupName(who.GID), home
	return home
}

// openJobBinds parses the job's binds, adds the defaults, and opens each
// source as acting (nil: hpcvmm itself); COMMAND's working directory
// becomes the host's when it is bound and --workdir is not given. The
// defaults that could not be bound are logged.
func openJobBinds(r *runner, acting *asuser.User, home string) ([]binds.Opened, error) {
	req := &r.req
	cwd, err := os.Getwd()
	if err != nil {
		cwd = ""
	}
	var list []binds.Bind
	for _, v := range req.Binds {
		bs, err := binds.Parse(v, cwd)
		if err != nil {
			return nil, err
		}
		list = append(list, bs...)
	}
	// An --initrd of one's own gets the explicit binds only: its
	// initramfs may not have the kernel's 9P client.
	none := req.Contain || req.Image == ""
	list = binds.WithDefaults(list, binds.Defaults{Cwd: cwd, NoCwd: req.NoCwd || none, Home: home, NoHome: req.NoHome || none})
	if err := binds.Check(list, nil); err != nil {
		return nil, err
	}
	opened, skipped, err := binds.Open(list, acting)
	if err != nil {
		return nil, err
	}
	for _, s := range skipped {
		r.log.Debug("job: a default bind is left out", "why", s)
	}
	r.withBinds = len(opened) > 0
	if spec := &r.spec; spec.Workdir == "" && cwd != "" {
		for _, o := range opened {
			if rel, err := filepath.Rel(o.Source, cwd); err == nil && filepath.IsLocal(rel) {
				spec.Workdir = filepath.Join(o.Target, rel)
				break
			}
		}
	}
	return opened, nil
}

// describeBinds is the log line's list of binds.
func describeBinds(opened []binds.Opened) []string {
	var out []string
	for _, o := range opened {
		s := o.Source + ":" + o.Target
		if o.ReadOnly {
			s += ":ro"
		}
		out = append(out, s)
	}
	return out
}

// checkBindsInImage refuses a bind whose target IMAGE has as a file.
func checkBindsInImage(opened []binds.Opened) func(im *rootfs.Image) error {
	return func(im *rootfs.Image) error {
		list := make([]binds.Bind, len(opened))
		for i, o := range opened {
			list[i] = o.Bind
		}
		return binds.Check(list, im)
	}
}

// The binds' 9P settings (docs/jobs.md "Host directories") unless
// Request.BindMSize and BindCache say otherwise: the message size the
// guest asks for and the kernel 9P client's cache mode, the measured
// choice (docs/benchmarks.md, "9P binds").
const (
	DefaultBindMSize = 512 << 10
	DefaultBindCache = "mmap"
)

// bindCacheModes are the cache modes of the guest kernel's 9P client
// (Linux 6.1: Documentation/filesystems/9p.rst) Request.BindCache
// (--bind-cache) may name.
var bindCacheModes = []string{"none", "loose", "fscache", "mmap"}

// tuning returns the binds' message size and cache mode, checked: the
// request's values or the defaults.
func tuning(req *Request) (msize uint32, cache string, err error) {
	msize, cache = DefaultBindMSize, DefaultBindCache
	if req.BindMSize != 0 {
		if req.BindMSize < uint64(ninep.MinMessageSize) || req.BindMSize > uint64(ninep.MaxMessageSizeLimit) {
			return 0, "", fmt.Errorf("--bind-msize %d: want %d to %d bytes (a K or M suffix is fine)", req.BindMSize, ninep.MinMessageSize, ninep.MaxMessageSizeLimit)
		}
		msize = uint32(req.BindMSize)
	}
	if req.BindCache != "" {
		if !slices.Contains(bindCacheModes, req.BindCache) {
			return 0, "", fmt.Errorf("--bind-cache %q: want one of %s", req.BindCache, strings.Join(bindCacheModes, ", "))
		}
		cache = req.BindCache
	}
	return msize, cache, nil
}

// bindServer is hpcvmm's 9P file server process for a job's binds, and the
// console ports that carry its connections.
type bindServer struct {
	Ports   []console.Port
	proc    *ninep.Process
	closing atomic.Bool
}

// Close stops the server (after the VM is gone); a server of no binds
// has nothing to stop.
func (s *bindServer) Close() error {
	if s.proc == nil {
		return nil
	}
	s.closing.Store(true)
	return s.proc.Close()
}

// jobUserAndBinds settles whom COMMAND runs as (jobIdentity) and opens the
// job's binds as that user; the defaults apply to a job with an Image.
func jobUserAndBinds(r *runner, acting *asuser.User) ([]binds.Opened, error) {
	var err error
	if r.mountMSize, r.mountCache, err = tuning(&r.req); err != nil {
		return nil, err
	}
	home := jobIdentity(&r.spec, r.req.User != nil, acting)
	return openJobBinds(r, acting, home)
}

// serveJobBinds starts the file server on the opened sources and the file
// sets (the host driver's, after the binds, on the ports that follow
// theirs): a process of its own (the agent's binary, self, "" hpcvmm's
// own, as hpcvmm-9p), with acting's rights when hpcvmm acts for a user,
// under a seccomp list of its own unless --seccomp off; its refusals go to
// logOut (nil: nowhere).
func serveJobBinds(opened []binds.Opened, sets []*ninep.FileSet, msize uint32, self string, acting *asuser.User, sc vmm.SeccompMode, logOut io.Writer, log *slog.Logger) (*bindServer, error) {
	if len(opened)+len(sets) == 0 {
		return &bindServer{}, nil
	}
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("finding hpcvmm's own binary for the file server: %w", err)
		}
	}
	if logOut == nil {
		logOut = io.Discard
	}
	exports := make([]ninep.Export, len(opened))
	for i, o := range opened {
		exports[i] = ninep.Export{Root: o.Root, ReadOnly: o.ReadOnly}
	}
	for _, s := range sets {
		exports = append(exports, ninep.Export{Files: s})
	}
	opts := ninep.SpawnOptions{Log: logOut, MaxMessageSize: msize, Seccomp: sc != vmm.SeccompOff}
	if acting != nil {
		opts.Credential = &syscall.Credential{Uid: acting.UID, Gid: acting.GID, Groups: append([]uint32{}, acting.Groups...)}
	}
	p, err := ninep.Spawn(self, exports, opts)
	if err != nil {
		return nil, fmt.Errorf("starting the file server for --bind: %w", err)
	}
	s := &bindServer{proc: p}
	for i, c := range p.Conns {
		s.Ports = append(s.Ports, console.Port{Name: binds.PortName(i), FromHost: c.Replies, ToHost: c.Requests})
	}
	if len(opened) > 0 {
		log.Info("job: host directories bound", "binds", describeBinds(opened))
	}
	go func() {
		<-p.Done()
		if !s.closing.Load() {
			log.Error("job: the file server of the binds ended while the job ran; the guest's file operations on them fail with EIO", "binds", describeBinds(opened))
		}
	}()
	return s, nil
}
