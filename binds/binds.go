// Package binds is a job's host directories in its VM: `hpcvmm run
// -B/--bind SRC[:DST[:ro|rw]]` as Apptainer's `-B` takes it, the defaults
// `apptainer exec` has (the working directory and $HOME at the same paths,
// /tmp left in guest RAM), and their checks before anything on the host
// changes.
//
// Each bind becomes one 9P2000.L connection on a virtio-console port of its
// own (PortName): hpcvmm's file server (package ninep) serves SRC on the
// host, and the guest agent mounts the kernel's 9P client on DST (Mounts
// gives the jobproto.Mount for the Start message). SRC is opened here,
// once, with the rights of the user hpcvmm acts for (package asuser), and
// the server resolves everything the guest names beneath that descriptor.
package binds

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/rootfs"
)

// Bind is one host directory in the guest.
type Bind struct {
	// Source is the host directory (absolute, clean).
	Source string
	// Target is where the guest sees it (absolute, clean).
	Target string
	// ReadOnly refuses every change, in the guest and in the server.
	ReadOnly bool
	// Default says the bind is one of hpcvmm's defaults (the working
	// directory, $HOME), not the user's: a default that cannot be made
	// is left out with a log line instead of failing the job.
	Default string
}

// MaxBinds is how many binds a job takes: a virtio-console has 16 named
// ports, of which the job's control, streams and PMI take 6 (and the host
// GPU driver's two directories, with an NVIDIA GPU, two of these 10).
const MaxBinds = 10

// PortPrefix names the binds' ports: PortPrefix + index.
const PortPrefix = "org.hpcvmm.9p."

// PortName is the virtio-console port of the i-th bind.
func PortName(i int) string { return fmt.Sprintf("%s%d", PortPrefix, i) }

// Parse parses one -B/--bind value: a comma-separated list of
// SRC[:DST[:ro|rw]]. DST defaults to SRC. Relative sources are taken from
// cwd. Sources and targets are cleaned; a target must be absolute.
func Parse(value, cwd string) ([]Bind, error) {
	if value == "" {
		return nil, errors.New("--bind: empty: give SRC[:DST[:ro|rw]]")
	}
	if value == "true" || value == "false" || strings.HasPrefix(value, "-") {
		return nil, fmt.Errorf("--bind %s: --bind binds a host directory (SRC[:DST[:ro|rw]]); to rebind passed-through devices to vfio-pci use --bind-devices", value)
	}
	var out []Bind
	for _, spec := range strings.Split(value, ",") {
		parts := strings.Split(spec, ":")
		if len(parts) > 3 || parts[0] == "" {
			return nil, fmt.Errorf("--bind %q: want SRC[:DST[:ro|rw]] (paths with ':' or ',' cannot be bound)", spec)
		}
		b := Bind{Source: parts[0]}
		if !filepath.IsAbs(b.Source) {
			b.Source = filepath.Join(cwd, b.Source)
		}
		b.Source = filepath.Clean(b.Source)
		b.Target = b.Source // DST defaults to SRC, as the host sees it
		if len(parts) >= 2 && parts[1] != "" {
			b.Target = parts[1]
		}
		if len(parts) == 3 {
			switch parts[2] {
			case "ro":
				b.ReadOnly = true
			case "rw":
			default:
				return nil, fmt.Errorf("--bind %q: option %q: want ro or rw", spec, parts[2])
			}
		}
		if !filepath.IsAbs(b.Target) {
			return nil, fmt.Errorf("--bind %q: the guest path %q is relative: give an absolute DST", spec, b.Target)
		}
		b.Target = filepath.Clean(b.Target)
		if r := jobproto.ReservedBy(b.Target); r != "" {
			return nil, fmt.Errorf("--bind %q: the guest path %s covers %s, which the job's VM needs: choose another DST", spec, b.Target, r)
		}
		out = append(out, b)
	}
	return out, nil
}

// Defaults are the binds `apptainer exec` makes without being asked.
type Defaults struct {
	// Cwd is the working directory, bound at the same path (unless
	// NoCwd, or it is a system directory: SystemDirs).
	Cwd   string
	NoCwd bool
	// Home is the user's home directory, bound at the same path (unless
	// NoHome). Empty: no home.
	Home   string
	NoHome bool
}

// SystemDirs are host directories never bound by default: the working
// directory may be one of them (a job started from /usr/src), and binding it
// would replace the image's own.
var SystemDirs = []string{"/bin", "/boot", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt", "/root", "/run",
	"/sbin", "/srv", "/usr", "/var"}

// WithDefaults returns the user's binds followed by the defaults that apply:
// $HOME, then the working directory, each left out when NoHome/NoCwd says so,
// when it is a reserved or system path, when a user bind already has that
// target, or when an earlier bind already shows it at the same path (the
// working directory inside $HOME).
func WithDefaults(user []Bind, d Defaults) []Bind {
	out := slices.Clone(user)
	add := func(p, why string) {
		if p == "" || !filepath.IsAbs(p) {
			return
		}
		p = filepath.Clean(p)
		if jobproto.ReservedBy(p) != "" || isSystemDir(p) {
			return
		}
		for _, b := range out {
			// Already there: bound at p, or inside a bind that shows
			// its host directory at the same path.
			if b.Target == p || (b.Source == b.Target && within(p, b.Source)) {
				return
			}
		}
		out = append(out, Bind{Source: p, Target: p, Default: why})
	}
	if !d.NoHome {
		add(d.Home, "$HOME")
	}
	if !d.NoCwd {
		add(d.Cwd, "the working directory")
	}
	return out
}

func isSystemDir(p string) bool {
	for _, s := range SystemDirs {
		if p == s || strings.HasPrefix(p, s+"/") {
			return true
		}
	}
	return false
}

// within says whether p is dir or beneath it.
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// Image is what Check asks of the job's IMAGE: the entry at a path, its
// symbolic links resolved inside the image (*rootfs.Image).
type Image interface {
	Stat(name string) (string, *rootfs.Entry, error)
}

// Check refuses a bind list the agent could not mount: more than MaxBinds,
// two binds on one target, and a target that IMAGE has as something other
// than a directory. image may be nil (an --initrd of one's own: the agent
// reports what it cannot mount).
func Check(bs []Bind, image Image) error {
	if len(bs) > MaxBinds {
		return fmt.Errorf("--bind: %d binds (with the defaults), at most %d: bind a common parent, or leave out $HOME or the working directory with --no-home/--no-cwd", len(bs), MaxBinds)
	}
	seen := map[string]Bind{}
	for _, b := range bs {
		if o, dup := seen[b.Target]; dup {
			return fmt.Errorf("--bind: %s and %s both bound at %s: give each its own DST", describe(o), describe(b), b.Target)
		}
		seen[b.Target] = b
		if image != nil {
			if _, e, err := image.Stat(b.Target); err == nil && !e.IsDir() {
				return fmt.Errorf("--bind %s: the image has a file at %s, not a directory: choose another DST", describe(b), b.Target)
			}
		}
	}
	return nil
}

func describe(b Bind) string {
	if b.Default != "" {
		return b.Default + " " + b.Source
	}
	if b.Source == b.Target {
		return b.Source
	}
	return b.Source + ":" + b.Target
}

// Opened is a bind with its source opened.
type Opened struct {
	Bind
	// Root is SRC opened O_PATH|O_DIRECTORY, close-on-exec: the file
	// server resolves everything beneath it.
	Root *os.File
}

// Open opens each bind's source as u (nil: hpcvmm itself): a directory
// that u can reach. A default bind whose source is missing or not a
// directory is left out and named in skipped; a user's is an error naming
// SRC. On error nothing stays open.
func Open(bs []Bind, u *asuser.User) (opened []Opened, skipped []string, err error) {
	for _, b := range bs {
		var f *os.File
		oerr := asuser.Do(u, func() error {
			fd, err := unix.Open(b.Source, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			f = os.NewFile(uintptr(fd), b.Source)
			return nil
		})
		if oerr != nil {
			if b.Default != "" {
				skipped = append(skipped, fmt.Sprintf("%s %s: %v", b.Default, b.Source, oerr))
				continue
			}
			Close(opened)
			return nil, nil, fmt.Errorf("--bind %s: %s: %v", describe(b), b.Source, explain(oerr, u))
		}
		opened = append(opened, Opened{Bind: b, Root: f})
	}
	return opened, skipped, nil
}

func explain(err error, u *asuser.User) string {
	who := "hpcvmm's user"
	if u != nil {
		who = u.String()
	}
	switch {
	case errors.Is(err, unix.ENOENT):
		return "no such directory on the host: create it or fix the path"
	case errors.Is(err, unix.ENOTDIR):
		return "not a directory: binds take directories (bind the file's directory)"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "permission denied for " + who
	}
	return err.Error()
}

// Close closes the opened sources.
func Close(opened []Opened) {
	for _, o := range opened {
		o.Root.Close()
	}
}

// Mounts are the Start message's mounts for the opened binds, in order,
// parents before what is mounted beneath them (shorter targets first), on
// the ports PortName(i) of their index i in opened.
func Mounts(opened []Opened, msize uint32, cache string) []jobproto.Mount {
	out := make([]jobproto.Mount, len(opened))
	for i, o := range opened {
		out[i] = jobproto.Mount{Port: PortName(i), Target: o.Target, ReadOnly: o.ReadOnly, MSize: msize, Cache: cache}
	}
	slices.SortStableFunc(out, func(a, b jobproto.Mount) int {
		return strings.Count(a.Target, "/") - strings.Count(b.Target, "/")
	})
	return out
}
