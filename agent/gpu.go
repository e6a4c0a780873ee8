package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/gpudriver"
)

// GPUNodes creates the device nodes of a job's NVIDIA GPUs in the guest
// (jobproto.Start.GPUs), as nvidia-modprobe does on a host: no udev rule
// makes them, and devtmpfs has none (the driver registers plain character
// majors). The majors are the guest's own (its /proc/devices: nvidia-uvm's
// and nvidia-caps' are dynamic and differ from the host's), the minors and
// modes gpudriver.Nodes's.
type GPUNodes struct {
	// Root is the guest's root directory ("/"; a directory in tests):
	// its proc/devices and proc/driver/nvidia are read, its dev written.
	Root string
	// Mknod makes a node (unix.Mknod as PID 1; a fake in tests, which
	// need not be root).
	Mknod func(path string, mode uint32, dev int) error
}

// procDevicesMax bounds the guest's /proc/devices (a few hundred bytes).
const procDevicesMax = 64 << 10

// Make creates the nodes of gpus GPUs, the control and UVM nodes, the
// capability nodes the driver offers and /dev/nvidia-caps; a node already
// there is replaced. A /proc/devices without the driver's majors is an
// error naming the missing one.
func (g GPUNodes) Make(gpus int) error {
	b, err := readAtMost(filepath.Join(g.Root, "proc/devices"), procDevicesMax)
	if err != nil {
		return fmt.Errorf("NVIDIA GPUs: reading the guest's /proc/devices: %w", err)
	}
	majors, err := gpudriver.ParseProcDevices(b)
	if err != nil {
		return fmt.Errorf("NVIDIA GPUs: the guest's %w", err)
	}
	caps, err := gpudriver.Capabilities(g.Root)
	if err != nil {
		return fmt.Errorf("NVIDIA GPUs: %s", strings.TrimPrefix(err.Error(), "gpudriver: "))
	}
	nodes, err := gpudriver.Nodes(majors, gpus, caps)
	if err != nil {
		return fmt.Errorf("NVIDIA GPUs: the guest's %s (a module that failed to load is in hpcvmm's log)", strings.TrimPrefix(err.Error(), "gpudriver: "))
	}
	if err := os.MkdirAll(filepath.Join(g.Root, "dev/nvidia-caps"), 0o755); err != nil {
		return fmt.Errorf("NVIDIA GPUs: %w", err)
	}
	for _, n := range nodes {
		p := filepath.Join(g.Root, n.Path)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("NVIDIA GPUs: replacing %s: %w", n.Path, err)
		}
		if err := g.Mknod(p, unix.S_IFCHR|uint32(n.Mode.Perm()), int(unix.Mkdev(n.Major, n.Minor))); err != nil {
			return fmt.Errorf("NVIDIA GPUs: creating %s (%d, %d): %w", n.Path, n.Major, n.Minor, err)
		}
		// The umask took bits off mknod's mode; the node gets the
		// driver's own (0666, a capability's 0400/0444).
		if err := os.Chmod(p, n.Mode.Perm()); err != nil {
			return fmt.Errorf("NVIDIA GPUs: %w", err)
		}
	}
	return nil
}

// readAtMost reads the file p, refusing more than limit bytes.
func readAtMost(p string, limit int) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(limit)+1))
	if err == nil && len(b) > limit {
		err = fmt.Errorf("%s is larger than %d bytes", p, limit)
	}
	return b, err
}
