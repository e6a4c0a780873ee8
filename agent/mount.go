package agent

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// mount is one filesystem the agent mounts.
type mount struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
	required               bool // the agent cannot go on without it
}

// baseMounts are what a command expects of a Linux system: /proc, /sys,
// /dev with its device nodes (devtmpfs: the ports' nodes come from it),
// /dev/pts (ptys), /dev/shm (POSIX shared memory: MPI and NCCL use it) and
// a /tmp in RAM.
var baseMounts = []mount{
	{"proc", "/proc", "proc", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", true},
	{"sysfs", "/sys", "sysfs", unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, "", true},
	{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755", true},
	{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", true},
	{"shm", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", false},
	{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", false},
}

// hugeMounts are the hugetlbfs mounts for the guest's page sizes: the
// first at /dev/hugepages (where libhugetlbfs and DPDK look), each also at
// /dev/hugepages-SIZE.
func hugeMounts(sizes []uint64) []mount {
	var ms []mount
	for i, s := range sizes {
		opt := fmt.Sprintf("pagesize=%d", s)
		if i == 0 {
			ms = append(ms, mount{"hugetlbfs", "/dev/hugepages", "hugetlbfs", unix.MS_NOSUID | unix.MS_NODEV, opt, false})
		}
		ms = append(ms, mount{"hugetlbfs", fmt.Sprintf("/dev/hugepages-%dkB", s>>10), "hugetlbfs", unix.MS_NOSUID | unix.MS_NODEV, opt, false})
	}
	return ms
}

// doMounts mounts ms in order, creating the targets. A required mount's
// failure is returned at once; the others' are returned joined after all
// were tried, as warnings.
func doMounts(ms []mount) (warnings, fatal error) {
	var warn []error
	for _, m := range ms {
		err := os.MkdirAll(m.target, 0o755)
		if err == nil {
			err = unix.Mount(m.source, m.target, m.fstype, m.flags, m.data)
		}
		if errors.Is(err, unix.EBUSY) { // already there (mounted by the kernel)
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("mounting %s on %s: %w", m.fstype, m.target, err)
			if m.required {
				return errors.Join(warn...), err
			}
			warn = append(warn, err)
		}
	}
	return errors.Join(warn...), nil
}
