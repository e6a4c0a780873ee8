// Package slurm turns what Slurm gave a job step into concrete host
// resources for hpcvmm: the PCI functions of its GPUs and NICs, the host
// CPUs it may run on, and the guest RAM it may use. It is a leaf: it reads
// gres.conf, the environment Slurm sets, the IOMMU groups through package
// host (rooted at a sysfs directory, so tests run on synthetic trees), and
// opens /dev/vfio/<group> to learn whether the job's device cgroup lets it.
//
// # How a step's devices are found
//
// On a node that passes devices through, gres.conf declares each device by
// its VFIO group file, e.g.
//
//	Name=gpu File=/dev/vfio/[12-15]
//	Name=nic File=/dev/vfio/40,/dev/vfio/41
//
// (AutoDetect=nvml cannot see GPUs bound to vfio-pci). Slurm then tells the
// step which of these it got, and the two GRES are reported differently;
// the rules below are read from Slurm 22.05's source
// (src/plugins/gres/common/gres_common.c, common_gres_set_env; gres_gpu.c
// and gres_nic.c), which is what Debian bookworm ships:
//
//   - gpu: SLURM_STEP_GPUS (in a step), else SLURM_JOB_GPUS (in the batch
//     script, and in the Prolog/Epilog, which get it from
//     gres_common_epilog_set_env) hold the device INDEX: the position of
//     the device file among the node's gpu files in gres.conf order, ranges
//     expanded ("File=/dev/vfio/[12-15]" is indices 0-3). They are not
//     device or group numbers.
//   - nic: gres_nic.c sets SLURM_STEP_NICS, else SLURM_JOB_NICS, calling
//     common_gres_set_env with use_dev_num=true, so each value is the
//     number at the END of the device file's name ("/dev/vfio/40" is 40),
//     i.e. the VFIO group itself, written after the prefix "mlx4_" the
//     plugin passes ("/dev/vfio/40" gives SLURM_STEP_NICS=mlx4_40, seen in
//     the L1 cluster); Slurm's comment: "NICs want env to match
//     the dev_num parsed from the file name". This is the documented,
//     per-step mechanism, so hpcvmm uses it rather than counts such as
//     SLURM_STEP_GRES=gpu:1,nic:1 (counts, not devices), the cgroup's
//     device list (cgroup v1 and v2 differ, and v2 keeps it in a BPF
//     program) or `scontrol show job -d` (a controller round trip per
//     step). The nic plugin sets nothing for the Prolog/Epilog, so there
//     the job's nic indices come from `squeue --json` (the job's
//     gres_detail entry for this node, "nic:1(IDX:0)", indices in
//     gres.conf order like the gpu ones), not from `scontrol show job -d`,
//     whose text a job name with newlines can forge; see JobGRESIndices.
//
// Each resulting /dev/vfio/<group> is opened once, read-write, and closed:
// with ConstrainDevices=yes in cgroup.conf a device the job was not given
// answers EPERM, which is reported as such (with what Slurm gave), before
// anything on the host changes.
//
// # CPUs and memory
//
// The step's CPUs are the ones sched_getaffinity allows (Slurm's task
// plugins set them). hpcvmm pins its vCPUs to those of them on the VM's
// NUMA node (see NodeCPUs). Guest RAM defaults to the job's memory on the
// node, SLURM_MEM_PER_NODE MiB, or SLURM_MEM_PER_CPU MiB times the step's
// CPUs, or, in a step of a bare srun (which exports neither), the job's
// memory_per_node/memory_per_cpu from `squeue --json` (what scontrol prints
// as MinMemoryNode/MinMemoryCPU, read from the job's JSON record because
// scontrol's text carries the job's name verbatim and a name with newlines
// can forge those fields; see JobMemory), less Headroom for hpcvmm itself
// (see GuestMemory).
package slurm
