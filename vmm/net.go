package vmm

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/uapi"
	virtionet "github.com/hpcvmm/hpcvmm/virtio/net"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
)

// Vhost settings of a NetConfig.
const (
	// VhostAuto uses the kernel's vhost-net when /dev/vhost-net works.
	VhostAuto = ""
	// VhostOn requires vhost-net.
	VhostOn = "on"
	// VhostOff forces hpcvmm's userspace data path.
	VhostOff = "off"
)

// NetConfig is one virtio-net interface backed by a host TAP interface.
type NetConfig struct {
	// TAP is the host interface name. An existing TAP is attached to (it
	// must allow this user and, for Queues > 1, be multi_queue); a missing
	// one is created, brought up, and removed when the VM closes.
	TAP string
	// MAC is the guest's address ("02:68:70:00:00:01"); empty derives a
	// stable, locally administered one from the TAP name.
	MAC string
	// Queues is the number of queue pairs (0 means 1), each with its own
	// TAP queue and worker (or vhost thread).
	Queues int
	// Vhost is VhostAuto, VhostOn or VhostOff.
	Vhost string
	// Bridge, when set, is an existing host bridge the TAP is attached
	// to. Only a TAP hpcvmm creates is attached (the kernel removes it,
	// and its bridge port, when hpcvmm exits or is killed); an existing
	// TAP must already be on the bridge.
	Bridge string
}

// netSlot0 is the PCI slot of the first virtio-net function; interfaces
// take consecutive slots, up to maxNets, below firstPassthroughSlot.
const (
	netSlot0 = 2
	maxNets  = 8
)

func (c *Config) validateNets() []error {
	var errs []error
	if len(c.Nets) > maxNets {
		errs = append(errs, fieldErr("Nets", "%d interfaces: hpcvmm supports at most %d", len(c.Nets), maxNets))
	}
	seen := map[string]bool{}
	for i, n := range c.Nets {
		where := fmt.Sprintf("interface %d (tap=%s)", i, n.TAP)
		if err := virtionet.ValidateTAPName(n.TAP); err != nil {
			errs = append(errs, fieldErr("Nets", "%s: %v", where, err))
		}
		if seen[n.TAP] {
			errs = append(errs, fieldErr("Nets", "%s: TAP %s is given twice: each interface needs its own TAP", where, n.TAP))
		}
		seen[n.TAP] = true
		if n.MAC != "" {
			if _, err := virtionet.ParseMAC(n.MAC); err != nil {
				errs = append(errs, fieldErr("Nets", "%s: %v", where, err))
			}
		}
		if n.Queues < 0 || n.Queues > virtionet.MaxPairs {
			errs = append(errs, fieldErr("Nets", "%s: queues=%d outside 1-%d", where, n.Queues, virtionet.MaxPairs))
		}
		switch n.Vhost {
		case VhostAuto, VhostOn, VhostOff:
		default:
			errs = append(errs, fieldErr("Nets", "%s: vhost=%q: use on or off", where, n.Vhost))
		}
		if n.Bridge != "" {
			if err := virtionet.ValidateTAPName(n.Bridge); err != nil {
				errs = append(errs, fieldErr("Nets", "%s: bridge=%s: %v", where, n.Bridge, err))
			}
		}
	}
	return errs
}

// addNets opens each TAP and puts a virtio-net function for it on the PCI
// root. The TAPs close in devices.close, after the transports.
func (vm *VM) addNets() error {
	var regions []uapi.VhostRegion
	for _, r := range vm.mem.Regions() {
		regions = append(regions, uapi.VhostRegion{GPA: r.GPA, Data: r.Data})
	}
	// Every bridge is checked before the first TAP is created.
	for i, n := range vm.cfg.Nets {
		if n.Bridge != "" {
			if err := virtionet.CheckBridge(n.TAP, n.Bridge); err != nil {
				return fieldErr("Nets", "interface %d: %v", i, err)
			}
		}
	}
	for i, n := range vm.cfg.Nets {
		queues := max(n.Queues, 1)
		tap, err := virtionet.OpenVMTAP(n.TAP, queues, n.Bridge)
		if err != nil {
			return fieldErr("Nets", "interface %d: %v", i, err)
		}
		mtu, err := tap.MTU()
		if err != nil {
			tap.Close()
			return fmt.Errorf("virtio-net %s: %w", n.TAP, err)
		}
		opts := virtionet.Options{
			Name: n.TAP, MTU: mtu, Pairs: queues, Memory: vm.mem, Regions: regions,
			WorkerCPUs: workerCPUs(vm.place, allowedCPUs(vm.place)),
			OnError:    func(err error) { vm.refusals.Refuse("virtio-net "+n.TAP, err) },
		}
		if n.MAC != "" {
			opts.MAC, _ = virtionet.ParseMAC(n.MAC) // validated
		}
		switch n.Vhost {
		case VhostOn:
			opts.Vhost = virtionet.VhostOn
		case VhostOff:
			opts.Vhost = virtionet.VhostOff
		}
		dev, err := virtionet.New(tap, opts)
		if err != nil {
			tap.Close()
			return fieldErr("Nets", "interface %d: %v", i, err)
		}
		tr, err := transport.New(dev, transport.Config{
			Memory: vm.mem, Router: vm.dev.irq, Notifier: vm.dev.irq,
			OnError: func(err error) { vm.refusals.Refuse("virtio-net "+n.TAP, err) },
		})
		if err != nil {
			dev.Close()
			return fmt.Errorf("virtio-net %s: %w", n.TAP, err)
		}
		vm.dev.transports = append(vm.dev.transports, tr)
		if err := setupFault("virtio-net " + n.TAP); err != nil {
			return err
		}
		if err := vm.dev.pci.AddDevice(netSlot0+i, "virtio-net "+n.TAP, tr); err != nil {
			return err
		}
		vhost, why := dev.Vhost()
		vm.log.Info("virtio-net", "tap", n.TAP, "created", tap.Created(), "bridge", n.Bridge, "mac", dev.MAC().String(),
			"queues", queues, "mtu", mtu, "vhost", vhost, "why_not_vhost", why,
			"vhost_worker_cpus", host.FormatCPUList(opts.WorkerCPUs))
	}
	return nil
}

// workerCPUs are the host CPUs for the kernel's vhost-net workers: the
// VM's node's CPUs that this process may use (its cpuset: under Slurm only
// the step's CPUs, and placing a worker outside them fails with EINVAL)
// and that run no vCPU, so a worker never queues behind the pinned vCPU
// whose packets it moves (and the vCPU is not preempted by it), while
// staying next to guest RAM. When every such CPU runs a vCPU, all of them;
// when the process may use none of the node's CPUs, none (nil: the
// kernel's placement stays).
func workerCPUs(p placement, allowed unix.CPUSet) []int {
	busy := map[int]bool{}
	for _, c := range p.vcpuCPUs {
		busy[c] = true
	}
	var usable, free []int
	for _, c := range p.nodeCPUs {
		if c < 0 || c >= 1024 || !allowed.IsSet(c) {
			continue
		}
		usable = append(usable, c)
		if !busy[c] {
			free = append(free, c)
		}
	}
	if len(free) == 0 {
		return usable
	}
	return free
}

// allowedCPUs is this process's CPU set for workerCPUs; when it cannot be
// read, every CPU of the node counts as allowed (the worker placement is
// then tried and its failure reported, as before).
func allowedCPUs(p placement) unix.CPUSet {
	set, err := affinity()
	if err != nil {
		set.Zero()
		for _, c := range p.nodeCPUs {
			if c >= 0 && c < 1024 {
				set.Set(c)
			}
		}
	}
	return set
}

// closeNet releases what a virtio-net transport's device holds (its TAP)
// once the transport is closed; other devices are left alone.
func closeNet(t *transport.Transport) error {
	if d, ok := t.Device().(*virtionet.Device); ok {
		return d.Close()
	}
	return nil
}
