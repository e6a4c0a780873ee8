package agent

import (
	"errors"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/jobproto"
	"github.com/hpcvmm/hpcvmm/pmi"
)

// A job's host directories (Start.Mounts) are 9P2000.L connections, each on
// a virtio-console port of its own, served by hpcvmm on the host. The
// kernel's 9P client takes its connection as file descriptors (trans=fd),
// but not a port's: virtio-console ports have no iter operations, so the
// kernel's write to one fails ("kernel write not supported") and the mount
// with EINVAL. So the kernel gets one end of a socket pair, and the agent
// relays between the other end and the port, one goroutine a direction,
// each with one buffer of the connection's message size (no allocation per
// message), for as long as the guest runs.

// DefaultMSize is the 9P message size when a Mount gives none.
const DefaultMSize = 512 << 10

// mountOptions is the 9P mount's data for a connection on fd.
func mountOptions(m jobproto.Mount, fd int) string {
	msize := m.MSize
	if msize == 0 {
		msize = DefaultMSize
	}
	opts := fmt.Sprintf("trans=fd,rfdno=%d,wfdno=%d,version=9p2000.L,msize=%d", fd, fd, msize)
	if m.Cache != "" {
		opts += ",cache=" + m.Cache
	}
	return opts
}

// validMount refuses what the host should never send: a relative or
// unclean target, one the agent itself needs (but the driver's two
// directories, read-only), a cache mode with characters that would add
// mount options.
func validMount(m jobproto.Mount) error {
	t := m.Target
	if !path.IsAbs(t) || t != path.Clean(t) {
		return fmt.Errorf("mount target %q: not an absolute clean path", t)
	}
	if t == jobproto.DriverLibDir || t == jobproto.DriverBinDir {
		if !m.ReadOnly {
			return fmt.Errorf("mount target %s: the host driver's files are mounted read-only", t)
		}
	} else if r := jobproto.ReservedBy(t); r != "" {
		return fmt.Errorf("mount target %s: covers %s", t, r)
	}
	if strings.ContainsAny(m.Cache, ",= \x00") {
		return fmt.Errorf("mount %s: cache mode %q", t, m.Cache)
	}
	return nil
}

// mountBinds mounts each of s.Mounts on its port, in order; the first
// failure fails the job (its reason names the target).
func (a *Agent) mountBinds(s *jobproto.Start) *jobproto.Failed {
	if len(s.Mounts) == 0 {
		return nil
	}
	if a.OpenPort == nil || a.Mount == nil {
		return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: "the job binds host directories but this agent cannot mount them"}
	}
	for _, m := range s.Mounts {
		if err := validMount(m); err != nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: err.Error()}
		}
		if err := a.mountBind(m); err != nil {
			return &jobproto.Failed{Kind: jobproto.FailAgent, Reason: fmt.Sprintf("binding the host directory at %s: %v", m.Target, err)}
		}
		a.mounted = append(a.mounted, m.Target)
	}
	return nil
}

// mountBind relays m's port to a socket pair and mounts 9P on the
// kernel's end.
func (a *Agent) mountBind(m jobproto.Mount) error {
	port, err := a.OpenPort(m.Port)
	if err != nil {
		return fmt.Errorf("opening port %s: %w", m.Port, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		port.Close()
		return fmt.Errorf("socketpair: %w", err)
	}
	kernel := os.NewFile(uintptr(fds[0]), "9p-kernel")
	local := os.NewFile(uintptr(fds[1]), "9p-relay")
	msize := int(m.MSize)
	if msize == 0 {
		msize = DefaultMSize
	}
	go func() { _, _ = pmi.Splice(pmi.SocketWriter{File: local}, port, make([]byte, msize)) }()
	go func() { _, _ = pmi.Splice(closeWriter{port}, local, make([]byte, msize)) }()
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
	if m.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	err = a.Mount("hpcvmm", m.Target, "9p", flags, mountOptions(m, int(kernel.Fd())))
	// The kernel holds its own references to the descriptor now (or
	// failed); the agent's copy is not needed either way.
	kernel.Close()
	if err != nil {
		local.Close() // ends the relay
		return err
	}
	return nil
}

// closeWriter ends a port's stream by closing it: the host reads end of
// file once the guest's end of the connection is gone.
type closeWriter struct{ *os.File }

func (c closeWriter) CloseWrite() error { return c.Close() }

// unmountBinds flushes and unmounts the binds, innermost first, once
// COMMAND and what it left are gone and before the host hears the status:
// whatever COMMAND wrote is on the host when hpcvmm reports the end.
func (a *Agent) unmountBinds() {
	if len(a.mounted) == 0 {
		return
	}
	unix.Sync()
	var errs []error
	for _, t := range slices.Backward(a.mounted) {
		if a.Unmount == nil {
			break
		}
		if err := a.Unmount(t); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t, err))
		}
	}
	a.mounted = nil
	if err := errors.Join(errs...); err != nil {
		a.Logf("unmounting the host directories: %v", err)
	}
}
