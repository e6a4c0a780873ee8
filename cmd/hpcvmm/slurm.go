package main

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/spf13/pflag"

	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/slurm"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// slurmWord is the --gpu/--vf value that takes the devices from Slurm.
const slurmWord = "slurm"

// isSlurmSpec reports whether a --gpu/--vf value is "slurm" or
// "slurm,OPTIONS" and returns the options ("" or ",guid=auto").
func isSlurmSpec(s string) (opts string, ok bool) {
	if s == slurmWord {
		return "", true
	}
	if rest, found := strings.CutPrefix(s, slurmWord+","); found {
		return "," + rest, true
	}
	return "", false
}

// applySlurm completes cfg from Slurm before vmm.New, so vmm sees concrete
// BDFs, a CPU list and a memory size:
//
//   - --gpu slurm / --vf slurm[,OPTIONS] become the PCI functions of the
//     step's gpu / nic GRES (see package slurm); a nic group's VFs become
//     --vf BDF,OPTIONS, any other function in it a --gpu BDF;
//   - inside a job, without --cpu-list, the vCPUs go on the CPUs the step may
//     use (sched_getaffinity) on the VM's NUMA node, and --cpus defaults to
//     their number;
//   - inside a job, without --memory, guest RAM is the job's memory less
//     slurm.Headroom;
//   - guid=auto's seed is the Slurm cluster, job and node.
//
// fs says which flags were given. Nothing on the host changes here.
func applySlurm(cfg *vmm.Config, fs *pflag.FlagSet, env *slurm.Env, allowed func() ([]int, error), log *slog.Logger) error {
	p := &cfg.Passthrough
	if env.InSlurm() {
		node, err := env.NodeName()
		if err != nil {
			return err
		}
		p.GUIDSeed = ibvf.Seed{Cluster: env.Getenv("SLURM_CLUSTER_NAME"), Job: env.Getenv("SLURM_JOB_ID"), Node: node}
	}
	if err := expandSlurmDevices(p, env, false, log); err != nil {
		return err
	}
	if !env.InSlurm() {
		return nil
	}
	return applySlurmPlacement(cfg, fs, env, allowed, log)
}

// expandSlurmDevices replaces --gpu slurm and --vf slurm[,OPTIONS] by the
// PCI functions of the step's (or, in a Prolog, the job's) GRES. With
// ifAny (hpcvmm bind --if-any, a Prolog under set -e) a job that holds
// none of a GRES on this node gets none of its devices, not an error.
func expandSlurmDevices(p *vmm.PassthroughConfig, env *slurm.Env, ifAny bool, log *slog.Logger) error {
	var gpus, vfs []string
	for _, s := range p.GPUs {
		opts, ok := isSlurmSpec(s)
		if !ok {
			gpus = append(gpus, s)
			continue
		}
		if opts != "" {
			return fmt.Errorf("--gpu %q: --gpu slurm takes no options (clique= would apply to every GPU; name the GPUs to give them cliques)", s)
		}
		sel, err := env.Resolve(slurm.GPU)
		if ifAny && errors.Is(err, slurm.ErrNoGRES) {
			log.Info("no GPUs in this job on this node: none to bind", "slurm", err.Error())
			continue
		}
		if err != nil {
			return fmt.Errorf("--gpu slurm: %w", err)
		}
		for _, b := range sel.Functions {
			gpus = append(gpus, b.String())
		}
		log.Info("GPUs from Slurm", "slurm", sel.Source, "vfio_groups", host.FormatCPUList(sel.Groups), "functions", len(sel.Functions))
	}
	for _, s := range p.VFs {
		opts, ok := isSlurmSpec(s)
		if !ok {
			vfs = append(vfs, s)
			continue
		}
		sel, err := env.Resolve(slurm.NIC)
		if ifAny && errors.Is(err, slurm.ErrNoGRES) {
			log.Info("no NICs in this job on this node: none to bind", "slurm", err.Error())
			continue
		}
		if err != nil {
			return fmt.Errorf("--vf %s: %w", s, err)
		}
		for _, b := range sel.Functions {
			d, err := env.Host.Device(b)
			if err != nil {
				return fmt.Errorf("--vf %s: %w", s, err)
			}
			if d.PhysFn != nil {
				vfs = append(vfs, b.String()+opts)
			} else if opts != "" {
				return fmt.Errorf("--vf %s: Slurm's nic %s is not an SR-IOV VF, so %s cannot apply to it", s, b, strings.TrimPrefix(opts, ","))
			} else {
				gpus = append(gpus, b.String())
			}
		}
		log.Info("NICs from Slurm", "slurm", sel.Source, "vfio_groups", host.FormatCPUList(sel.Groups), "functions", len(sel.Functions))
	}
	p.GPUs, p.VFs = gpus, vfs
	return nil
}

// applySlurmPlacement takes the vCPUs' CPUs and guest RAM from Slurm where
// the flags leave them open (see applySlurm).
func applySlurmPlacement(cfg *vmm.Config, fs *pflag.FlagSet, env *slurm.Env, allowed func() ([]int, error), log *slog.Logger) error {
	p := &cfg.Passthrough
	if !fs.Changed("cpu-list") {
		cpus, err := allowed()
		if err != nil {
			return err
		}
		list := cpus
		if !cfg.AllowCrossNUMA {
			node := cfg.NUMANode
			if node == vmm.NUMANodeAuto {
				node = firstDeviceNode(env.Host, p)
			}
			// Without devices the node holding most of the step's CPUs;
			// vmm then places guest RAM on the node of the first CPU.
			if list, _, err = slurm.NodeCPUs(cpus, env.Host, node); err != nil {
				return fmt.Errorf("--cpu-list (from Slurm): %w", err)
			}
		}
		if !fs.Changed("cpus") {
			cfg.CPUs = len(list)
		} else if cfg.CPUs > len(list) {
			return fmt.Errorf("--cpus %d: the step may use %d CPUs here (%s, sched_getaffinity on the VM's node): ask Slurm for more (srun -c %d), or lower --cpus", cfg.CPUs, len(list), host.FormatCPUList(list), cfg.CPUs)
		} else {
			list = list[:cfg.CPUs]
		}
		cfg.CPUList = list
		log.Info("vCPUs on the CPUs Slurm gave the step", "cpus", host.FormatCPUList(list))
	}
	if !fs.Changed("memory") {
		b, src, ok, err := env.GuestMemory(len(cfg.CPUList), uint64(cfg.HugePages))
		if err != nil {
			return fmt.Errorf("--memory (from Slurm): %w", err)
		}
		if ok {
			cfg.Memory = b
			log.Info("guest RAM from Slurm", "slurm", src, "memory", guestmem.FormatSize(b),
				"headroom", fmt.Sprintf("%d%% + %d MiB", slurm.HeadroomPercent, slurm.HeadroomFixed>>20))
		} else {
			log.Info("Slurm gave no memory size (SLURM_MEM_PER_NODE, SLURM_MEM_PER_CPU unset): guest RAM is the --memory default", "memory", guestmem.FormatSize(cfg.Memory))
		}
	}
	return nil
}

// firstDeviceNode is the NUMA node of the first passthrough device, -1
// when none or unknown: the node vmm will place the VM on.
func firstDeviceNode(h *host.Host, p *vmm.PassthroughConfig) int {
	all := append(append([]string(nil), p.GPUs...), p.VFs...)
	if len(all) == 0 {
		return -1
	}
	bdf, _, _ := strings.Cut(all[0], ",")
	b, err := host.ParseBDF(bdf)
	if err != nil {
		return -1
	}
	d, err := h.Device(b)
	if err != nil {
		return -1
	}
	return d.NUMANode
}
