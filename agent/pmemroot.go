package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// CmdlinePMEMRoot is the kernel command-line parameter that tells the agent
// IMAGE is the read-only image on /dev/pmem0, and its file system:
// hpcvmm.pmem=squashfs or hpcvmm.pmem=erofs (issue 31). On the command
// line, not in the Start message: the agent switches root before it opens
// the ports (so the whole job, its binds' mount points included, lives in
// IMAGE's tree), and the initramfs, which holds only the agent and the
// modules, is the same for every image and cached per kernel release and
// module set, so the one thing that differs per launch goes where hpcvmm
// writes per launch anyway.
const CmdlinePMEMRoot = "hpcvmm.pmem"

// PMEMDevice is the block device the guest's nd_pmem makes of the e820
// persistent-memory range hpcvmm gives it: there is one, so pmem0.
const PMEMDevice = "/dev/pmem0"

// pmemWait bounds the wait for PMEMDevice: libnvdimm probes the region
// asynchronously after nd_e820 is loaded.
const pmemWait = 10 * time.Second

// The directories of the switch, in the initramfs (the new root hides
// them afterwards; the mounts stay, the overlay holds them).
const (
	pmemLower   = "/.hpcvmm/image"   // the image, read-only
	pmemRW      = "/.hpcvmm/rw"      // a tmpfs for the overlay's upper and work directories
	pmemNewRoot = "/.hpcvmm/newroot" // the overlay: the job's root
)

// The firmware the initramfs carries (/lib/firmware: the GSP firmware of
// a passed-through NVIDIA GPU, package kmodules) stays visible after the
// switch: the kernel's firmware loader reads files from init_task's root,
// which PID 1 shares (it is started with CLONE_FS) and so changes with
// its chroot, and the NVIDIA driver asks for its GSP firmware when the GPU
// is first opened, long after the switch. The initramfs's directory is
// bind-mounted read-only at pmemFirmware in the new root and that path
// given to the loader as its custom path (firmware_class.path, searched
// before /lib/firmware), so the image's own /lib/firmware is left as it is.
const (
	initramfsFirmware = "/lib/firmware"
	pmemFirmware      = "/.hpcvmm/firmware"
	firmwarePathParam = "/sys/module/firmware_class/parameters/path"
)

// pmemMoved are the mounts the agent made in the initramfs that move into
// the new root whole (their submounts, /dev/pts and /dev/shm, with them).
var pmemMoved = []string{"/proc", "/sys", "/dev", "/tmp"}

// pmemFSType reads CmdlinePMEMRoot from a kernel command line: "" when it
// is absent, else squashfs or erofs; anything else is an error.
func pmemFSType(cmdline string) (string, error) {
	for _, f := range strings.Fields(cmdline) {
		v, ok := strings.CutPrefix(f, CmdlinePMEMRoot+"=")
		if !ok {
			continue
		}
		switch v {
		case "squashfs", "erofs":
			return v, nil
		}
		return "", fmt.Errorf("%s=%q: want squashfs or erofs", CmdlinePMEMRoot, v)
	}
	return "", nil
}

// overlayOptions are the overlay's mount options over the image.
func overlayOptions() string {
	return "lowerdir=" + pmemLower + ",upperdir=" + pmemRW + "/upper,workdir=" + pmemRW + "/work"
}

// rootSwitch is what switching to the image's root needs of the system,
// so the sequence is tested with fakes; sysRootSwitch is the real one.
type rootSwitch struct {
	Mount    func(source, target, fstype string, flags uintptr, data string) error
	MkdirAll func(path string) error
	// WaitFor waits until path exists, up to timeout.
	WaitFor func(path string, timeout time.Duration) error
	Chdir   func(path string) error
	Chroot  func(path string) error
	// IsDir says whether path is a directory.
	IsDir func(path string) bool
	// WriteFile writes data to the existing file path (a sysfs parameter).
	WriteFile func(path string, data []byte) error
}

// switchToPMEM makes the image on PMEMDevice, file system fstype, the
// guest's root: mounted read-only, under an overlay whose upper layer is a
// tmpfs (COMMAND can write anywhere, as in the initramfs, and nothing
// reaches the image), with /proc, /sys, /dev and /tmp moved into it, then
// the overlay moved onto / and chroot'ed into, as switch_root does on an
// initramfs (which cannot be pivot_root'ed away). Its error names the step
// and what the guest lacked.
func switchToPMEM(s rootSwitch, fstype string) error {
	if err := s.WaitFor(PMEMDevice, pmemWait); err != nil {
		return fmt.Errorf("the image's device %s did not appear (the guest kernel needs nd_e820 and nd_pmem): %w", PMEMDevice, err)
	}
	steps := []struct {
		what                   string
		source, target, fstype string
		flags                  uintptr
		data                   string
	}{
		{"mounting the image", PMEMDevice, pmemLower, fstype, unix.MS_RDONLY | unix.MS_NODEV, ""},
		{"mounting the overlay's tmpfs", "tmpfs", pmemRW, "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
	}
	for _, st := range steps {
		if err := s.MkdirAll(st.target); err != nil {
			return fmt.Errorf("%s: %w", st.what, err)
		}
		if err := s.Mount(st.source, st.target, st.fstype, st.flags, st.data); err != nil {
			return fmt.Errorf("%s (%s on %s, %s): %w", st.what, st.fstype, st.source, st.target, err)
		}
	}
	for _, d := range []string{pmemRW + "/upper", pmemRW + "/work", pmemNewRoot} {
		if err := s.MkdirAll(d); err != nil {
			return fmt.Errorf("making %s: %w", d, err)
		}
	}
	if err := s.Mount("overlay", pmemNewRoot, "overlay", 0, overlayOptions()); err != nil {
		return fmt.Errorf("mounting the overlay over the image (%s): %w", overlayOptions(), err)
	}
	firmware := s.IsDir(initramfsFirmware)
	if firmware {
		target := pmemNewRoot + pmemFirmware
		if err := s.MkdirAll(target); err != nil {
			return fmt.Errorf("making %s in the image: %w", pmemFirmware, err)
		}
		if err := s.Mount(initramfsFirmware, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("keeping the initramfs's firmware at %s: %w", pmemFirmware, err)
		}
		if err := s.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("keeping the initramfs's firmware at %s read-only: %w", pmemFirmware, err)
		}
	}
	for _, m := range pmemMoved {
		target := pmemNewRoot + m
		if err := s.MkdirAll(target); err != nil {
			return fmt.Errorf("making %s in the image: %w", m, err)
		}
		if err := s.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("moving %s into the image: %w", m, err)
		}
	}
	if err := s.Chdir(pmemNewRoot); err != nil {
		return fmt.Errorf("switching to the image's root: %w", err)
	}
	if err := s.Mount(pmemNewRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the image's root onto /: %w", err)
	}
	if err := s.Chroot("."); err != nil {
		return fmt.Errorf("switching to the image's root: chroot: %w", err)
	}
	if err := s.Chdir("/"); err != nil {
		return fmt.Errorf("switching to the image's root: %w", err)
	}
	if firmware {
		if err := s.WriteFile(firmwarePathParam, []byte(pmemFirmware)); err != nil {
			return fmt.Errorf("pointing the kernel's firmware loader at %s (%s): %w", pmemFirmware, firmwarePathParam, err)
		}
	}
	return nil
}

// sysRootSwitch is rootSwitch on the running system (PID 1).
func sysRootSwitch() rootSwitch {
	return rootSwitch{
		Mount:    unix.Mount,
		MkdirAll: func(p string) error { return os.MkdirAll(p, 0o755) },
		WaitFor:  waitFor,
		Chdir:    unix.Chdir,
		Chroot:   unix.Chroot,
		IsDir: func(p string) bool {
			fi, err := os.Stat(p)
			return err == nil && fi.IsDir()
		},
		WriteFile: func(p string, data []byte) error { return os.WriteFile(p, data, 0) },
	}
}

// waitFor polls for path until it exists or timeout passes.
func waitFor(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		_, err := os.Stat(path)
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not there after %v", timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pmemRootFromCmdline switches to the image's root when the kernel's
// command line asks for it (/proc/cmdline, mounted by then).
func pmemRootFromCmdline(s rootSwitch, cmdlinePath string) error {
	b, err := os.ReadFile(cmdlinePath)
	if err != nil {
		return fmt.Errorf("reading the kernel command line: %w", err)
	}
	fstype, err := pmemFSType(string(b))
	if err != nil || fstype == "" {
		return err
	}
	return switchToPMEM(s, fstype)
}
