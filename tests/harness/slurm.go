package harness

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The loopback Slurm cluster of ProfileSlurm inside L1.
const (
	// SlurmBridge is the L1 bridge the TAPs of the cluster's VMs join (one
	// per node), so guests on the two nodes reach each other.
	SlurmBridge = "hpvbr0"
	// SlurmBridgeAddr is L1's address on SlurmBridge (with its prefix).
	SlurmBridgeAddr = "10.78.0.1/24"
	// SlurmNodes are the two slurmd node names, both on L1's 127.0.0.1.
	SlurmNodes = "n[1-2]"
	// SlurmNodeMemMiB is each node's RealMemory in slurm.conf.
	SlurmNodeMemMiB = 2048
	// SlurmUser is the unprivileged user of the cluster's jobs, with
	// SlurmUID as its uid and (its own group) gid, in L1's /etc/passwd and
	// /etc/group, and a member of the kvm group (SlurmKVMGID), which
	// /dev/kvm is given to (rw for the group).
	SlurmUser   = "hpcuser"
	SlurmUID    = 4250
	SlurmKVMGID = 4251
)

// l1SlurmCluster is where the cluster start script is in the L1 image.
const l1SlurmCluster = "/hpcvmm/slurm/cluster.sh"

// ProfileSlurm is ProfilePassthrough's L1 (the same QEMU devices, IOMMU,
// hugepages and NVMe VF setup) with a real Slurm cluster on loopback:
// Debian's munged, slurmctld and two slurmd (-N n1, -N n2 on 127.0.0.1,
// ports 17011-17012) with proctrack/cgroup, task/cgroup, select/cons_tres
// and ConstrainDevices=yes on cgroup v1, and a gres.conf declaring edu
// (EduBDF) as gpu and the NVMe VF (NVMeVFBDF) as nic by their
// /dev/vfio/<group> files (tests/l1/slurm-cluster.sh). Both devices are on
// vfio-pci from the setup on and stay there: slurmd reads each GRES file's
// device number when it starts, which is what a job's device cgroup
// denies. The bridge module (SlurmBridge) comes with it. slurm.conf's
// Prolog and Epilog are docs/slurm.md's (SlurmDocScripts), and the jobs'
// unprivileged user SlurmUser is in the kvm group /dev/kvm is given to.
//
// Slurm's programs, their plugins and shared libraries are packed only
// into this profile's initramfs (Files), about 11 MiB, with the job guest's
// modules and the MPI scenarios' rootfs (MPIRoot, about 47 MiB).
var ProfileSlurm = func() Profile {
	p := ProfilePassthrough
	p.Name = "slurm"
	// Two vCPUs, one per slurmd node (tests/l1/slurm-cluster.sh gives
	// each node a CPU of its own then). With one, both ranks of an MPI job
	// shared it, and one rank's guest busy-polling in L2 took the whole
	// L1 with it when the emulator stopped delivering L1's interrupts
	// (docs/testbed.md, "Dedicated CPU mode in the test bed").
	p.CPUs = 2
	p.Setup = passthroughSetup + "\n" + slurmSetup
	p.Modules = []string{"bridge"}
	p.Files = func(im *Image) error {
		if err := addSlurm(im); err != nil {
			return err
		}
		// The MPI scenarios run jobs (hpcvmm run --rootfs) on both nodes.
		if err := AddJobModules(im); err != nil {
			return err
		}
		return addMPIFiles(im)
	}
	p.HostReady = func() error {
		return errors.New("the slurm profile's cluster and stand-in devices exist only in its L1 (its setup starts them)")
	}
	return p
}()

// slurmSetup binds the two GRES devices to vfio-pci and starts the
// cluster (after passthroughSetup has created the VF).
var slurmSetup = `for d in ` + EduBDF + ` ` + NVMeVFBDF + `; do
	dev=/sys/bus/pci/devices/$d
	[ -e $dev/driver ] && echo $d >$dev/driver/unbind
	echo vfio-pci >$dev/driver_override
	echo $d >/sys/bus/pci/drivers_probe
	drv=$(readlink $dev/driver) || drv=none
	[ "${drv##*/}" = vfio-pci ] || { echo "$d did not bind to vfio-pci (driver: $drv)"; exit 1; }
done
g=$(readlink /sys/bus/pci/devices/` + EduBDF + `/iommu_group); GPU_GROUP=${g##*/}
g=$(readlink /sys/bus/pci/devices/` + NVMeVFBDF + `/iommu_group); NIC_GROUP=${g##*/}
[ -c /dev/vfio/$GPU_GROUP ] && [ -c /dev/vfio/$NIC_GROUP ] || { echo "no /dev/vfio/$GPU_GROUP or /dev/vfio/$NIC_GROUP"; exit 1; }
SLURM_BRIDGE=` + SlurmBridge + ` SLURM_BRIDGE_ADDR=` + SlurmBridgeAddr + `
SLURM_TEST_USER=` + SlurmUser + ` SLURM_TEST_UID=` + strconv.Itoa(SlurmUID) + ` SLURM_KVM_GID=` + strconv.Itoa(SlurmKVMGID) + `
. ` + l1SlurmCluster

// Slurm's and munge's programs the cluster and the scenarios run; slurmd
// starts slurmstepd from its compiled-in path.
var slurmPrograms = []string{
	"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/slurmstepd", "/usr/sbin/munged",
	"/usr/bin/srun", "/usr/bin/sbatch", "/usr/bin/scontrol", "/usr/bin/sinfo", "/usr/bin/squeue",
	"/usr/bin/scancel", "/usr/bin/munge", "/usr/bin/unmunge",
}

// slurmPluginDir is Debian's compiled-in PluginDir.
const slurmPluginDir = "/usr/lib/x86_64-linux-gnu/slurm-wlm"

// addSlurm puts the Debian packages' programs, every plugin (Slurm loads
// them by name from slurm.conf and cgroup.conf, and some pull others in),
// their shared libraries and the cluster script into im.
func addSlurm(im *Image) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	for _, p := range slurmPrograms {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing: run tests/testbed-packages.sh (installs slurmctld, slurmd, slurm-client, munge): %w", p, err)
		}
		if err := addDynamicProgram(im, p); err != nil {
			return err
		}
	}
	plugins, err := filepath.Glob(filepath.Join(slurmPluginDir, "*.so"))
	if err != nil || len(plugins) == 0 {
		return fmt.Errorf("no Slurm plugins in %s: run tests/testbed-packages.sh (installs slurmctld, slurmd): %v", slurmPluginDir, err)
	}
	for _, p := range plugins {
		if err := addDynamicProgram(im, p); err != nil {
			return err
		}
	}
	im.AddFile(l1SlurmCluster, filepath.Join(root, "tests", "l1", "slurm-cluster.sh"), 0o644)
	return addSlurmDocScripts(im, root)
}
