package jobrun

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/asuser"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/initramfs"
	"github.com/hpcvmm/hpcvmm/kmodules"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// agentPath is where a job's initramfs holds the agent.
const agentPath = initramfs.AgentPath

// hostKernel is the default kernel of a job: the host's own, so the guest
// runs the host's drivers (an HPC node's GPU and InfiniBand modules).
func hostKernel() (string, error) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "", err
	}
	return "/boot/vmlinuz-" + unix.ByteSliceToString(u.Release[:]), nil
}

// defaultJobKernel sets cfg.Kernel, when none is given, to the running
// kernel's image in /boot: a job boots the host's kernel unless told
// otherwise.
func defaultJobKernel(cfg *vmm.Config) error {
	if cfg.Kernel != "" {
		return nil
	}
	k, err := hostKernel()
	if err != nil {
		return fmt.Errorf("--kernel: none given and the running kernel's release is unknown (%v): pass --kernel", err)
	}
	if _, err := os.Stat(k); err != nil {
		return fmt.Errorf("--kernel: none given and the host's kernel %s is not readable (%v): pass --kernel", k, errors.Unwrap(err))
	}
	cfg.Kernel = k
	return nil
}

// jobCmdline is the kernel command line of a job: the serial console only
// (the kernel's messages go to Request.Console), quiet (each console byte
// is an exit), the agent as init, and the guest's end ending the VM.
func jobCmdline(user string) string {
	if user == "" {
		return "console=ttyS0 quiet reboot=k panic=-1 rdinit=" + agentPath
	}
	if !strings.Contains(user, "rdinit=") {
		user += " rdinit=" + agentPath
	}
	return user
}

// kernelRelease is the guest kernel's release, naming its modules
// directory: from the bzImage's version string, or uname -r when the
// kernel is the host's own. The kernel is read with the rights of the user
// hpcvmm acts for (as, nil for itself), and the release, chosen by whoever
// built the image, must be one directory name under /lib/modules.
func kernelRelease(kernel string, as *asuser.User) (string, error) {
	b, err := asuser.ReadFile(as, kernel)
	if err != nil {
		return "", fmt.Errorf("--kernel %s: %w", kernel, err)
	}
	r := ""
	if k, err := boot.ParseBzImage(b); err == nil {
		r = k.Release()
	} else {
		r = boot.ReleaseOfVmlinux(b)
	}
	if r != "" {
		if err := kmodules.ValidateRelease(r); err != nil {
			return "", fmt.Errorf("--kernel %s: %v", kernel, err)
		}
		return r, nil
	}
	if hk, err := hostKernel(); err == nil && hk == kernel {
		return strings.TrimPrefix(hk, "/boot/vmlinuz-"), nil
	}
	return "", fmt.Errorf("--kernel %s: its release (which /lib/modules to take) is unknown: pass a distribution bzImage", kernel)
}
