package vmm

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/hoststate"
	"github.com/hpcvmm/hpcvmm/ibvf"
	"github.com/hpcvmm/hpcvmm/iommu"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vfio"
)

// PassthroughConfig lists the host PCI devices given to the guest whole,
// through VFIO: their BARs mapped into guest memory, their DMA reaching
// guest RAM through the IOMMU, their MSI/MSI-X delivered by KVM.
type PassthroughConfig struct {
	// GPUs are "BDF" or "BDF,clique=N" (NVIDIA GPUDirect P2P clique).
	GPUs []string
	// VFs are SR-IOV virtual functions ("BDF"); each must have a physfn.
	// An InfiniBand VF may carry its identity:
	// "BDF,node-guid=G,port-guid=G[,link=auto|enable|disable]" or
	// "BDF,guid=auto" (GUIDs derived from GUIDSeed); it is set on the PF
	// after binding and before the device is reset and opened, journaled,
	// and restored when the VM ends.
	VFs []string
	// GUIDSeed makes guid=auto's GUIDs unique in the cluster (the Slurm
	// cluster, job and node); see package ibvf.
	GUIDSeed ibvf.Seed
	// Bind rebinds devices held by a host driver to vfio-pci for the VM's
	// lifetime and gives them back afterwards (journaled, so `hpcvmm
	// unbind` can restore them after a crash).
	Bind bool
	// NoP2P skips DMA-mapping the BARs into the IOMMU, which otherwise lets
	// the devices reach each other's BARs (GPU<->GPU, GPU<->NIC RDMA).
	NoP2P bool
	// StateDir holds the host-state journals; "" means the default.
	StateDir string
}

// specs parses the device strings; errors name the flag.
func (p PassthroughConfig) specs() ([]vfio.Spec, error) {
	var out []vfio.Spec
	var errs []error
	seen := map[host.BDF]bool{}
	add := func(list []string, vf bool) {
		for _, s := range list {
			sp, err := vfio.ParseSpec(s, vf)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if seen[sp.BDF] {
				errs = append(errs, fmt.Errorf("device %s is given twice", sp.BDF))
				continue
			}
			seen[sp.BDF] = true
			out = append(out, sp)
		}
	}
	add(p.GPUs, false)
	add(p.VFs, true)
	return out, errors.Join(errs...)
}

// firstPassthroughSlot is the PCI slot of the first passed-through device;
// hpcvmm's own devices (console at 1, nets at netSlot0..) sit below it, and
// the passed-through devices take the slots up to 31.
const (
	firstPassthroughSlot = netSlot0 + maxNets
	maxPassthrough       = pci.NumSlots - firstPassthroughSlot
)

// intxPin returns the IOAPIC pin for slot's INTA#: the PCI pins 16-23 of
// the IOAPIC, rotated by slot like a PC's interrupt swizzle so devices do
// not all share one line.
func intxPin(slot int) uint8 { return uint8(16 + slot%8) }

// passthrough is the VM's VFIO state.
type passthrough struct {
	specs   []vfio.Spec
	devs    []*host.Device
	bound   []bool
	ib      []*ibvf.Target // the VF's PF and netdev where specs[i].IB is set
	journal *hoststate.Journal
	// writes makes the journal's sysfs writes through files opened
	// before the seccomp filter (hostwrites.go); sysRoot is its sysfs.
	writes  sysfsWrites
	sysRoot string
	// rtnl is the rtnetlink socket that sets the InfiniBand VFs'
	// identities and restores them at teardown, under the seccomp filter
	// (which has no socket(2)); nil without such a VF.
	rtnl    *ibvf.Conn
	ctr     *iommu.Container
	kv      *vfio.KVMVFIO
	pcidevs []*vfio.PCIDevice
	// files are the devices opened by openPassthrough and not yet handed
	// to a PCIDevice (addPassthroughDevices); Close closes them.
	files []vfio.DeviceFile
	// topo is where the devices sit in the guest's PCI tree (topology.go).
	topo ptTopology
}

// checkPassthrough runs the host-side checks for every device before
// anything on the host changes, and returns the NUMA node of the first
// device (-1 when unknown).
func (vm *VM) checkPassthrough(h *host.Host) (node int, err error) {
	specs, err := vm.cfg.Passthrough.specs()
	if err != nil {
		return -1, fieldErr("Passthrough", "%v", err)
	}
	if len(specs) == 0 {
		return -1, nil
	}
	if len(specs) > maxPassthrough {
		return -1, fieldErr("Passthrough", "%d devices: the guest's PCI bus has slots for %d; pass fewer devices", len(specs), maxPassthrough)
	}
	pt := &passthrough{specs: specs}
	for _, sp := range specs {
		dev, bound, err := vfio.CheckDevice(h, sp, vm.cfg.Passthrough.Bind)
		if err != nil {
			return -1, fieldErr("Passthrough", "%v", err)
		}
		if sp.VF && dev.PhysFn != nil {
			vm.log.Info("SR-IOV virtual function", "vf", sp.BDF.String(), "pf", dev.PhysFn.String())
		}
		var target *ibvf.Target
		if !sp.IB.Empty() {
			if err := sp.IB.Resolve(vm.cfg.Passthrough.GUIDSeed, sp.BDF); err != nil {
				return -1, fieldErr("Passthrough", "VF %s: %v", sp.BDF, err)
			}
			t, err := ibvf.Locate(h, sp.BDF)
			if err != nil {
				return -1, fieldErr("Passthrough", "VF %s,%s: %v", sp.BDF, sp.IB, err)
			}
			target = &t
			pt.specs[len(pt.devs)] = sp // with the GUIDs guid=auto resolved to
		}
		pt.ib = append(pt.ib, target)
		pt.devs = append(pt.devs, dev)
		pt.bound = append(pt.bound, bound)
	}
	vm.dev.pt = pt
	if err := vm.planPCITopology(h); err != nil {
		return -1, err
	}
	return pt.devs[0].NUMANode, nil
}

// bindDevices rebinds the devices that need it to vfio-pci, journaling
// each change first.
func (vm *VM) bindDevices(sysRoot, procRoot string) error {
	pt := vm.dev.pt
	if pt == nil {
		return nil
	}
	for i, dev := range pt.devs {
		if pt.bound[i] {
			continue
		}
		if pt.journal == nil {
			if err := pt.openJournal(vm.cfg.Passthrough.StateDir, sysRoot, procRoot); err != nil {
				return err
			}
		}
		if err := pt.journal.Bind(dev.BDF); err != nil {
			return fmt.Errorf("binding %s to vfio-pci: %w", dev.BDF, err)
		}
		vm.log.Info("rebound to vfio-pci for this VM", "device", dev.BDF.String(), "was", dev.Driver, "journal", pt.journal.Path())
		// The group node appears once vfio-pci owns the device.
		refreshed, err := host.New(sysRoot, procRoot).Device(dev.BDF)
		if err != nil {
			return fmt.Errorf("binding %s to vfio-pci: %w", dev.BDF, err)
		}
		pt.devs[i] = refreshed
	}
	return nil
}

// setVFIdentities gives InfiniBand VFs the GUIDs and link state their
// --vf asked for, after they are bound to vfio-pci and before VFIO opens
// (and resets) them, so the guest's driver finds a VF whose port the
// subnet manager can bring up. Each change is journaled with the values it
// replaces; Close restores them.
func (vm *VM) setVFIdentities(sysRoot, procRoot string) error {
	pt := vm.dev.pt
	if pt == nil {
		return nil
	}
	for i, t := range pt.ib {
		if t == nil {
			continue
		}
		if pt.journal == nil {
			if err := pt.openJournal(vm.cfg.Passthrough.StateDir, sysRoot, procRoot); err != nil {
				return err
			}
		}
		sp := pt.specs[i]
		if err := pt.journal.SetVFIdentity(*t, sp.IB); err != nil {
			return fmt.Errorf("VF %s: setting its InfiniBand identity: %w", sp.BDF, err)
		}
		vm.log.Info("InfiniBand VF identity set for this VM", "vf", sp.BDF.String(), "pf_netdev", t.Netdev, "vf_index", t.Index,
			"set", sp.IB.String(), "journal", pt.journal.Path())
	}
	return nil
}

// mpInterrupts describes the passed-through devices' INTx lines in the MP
// table, so the guest routes INTA# of each to its IOAPIC pin (level,
// active low, as PCI wants).
func (vm *VM) mpOptions() boot.MPOptions {
	if vm.dev.pt == nil {
		return boot.MPOptions{}
	}
	// Linux matches a device's PCI bus number against the MP bus ID, so
	// PCI bus 0 must be MP bus 0 and ISA moves to 1 (as SeaBIOS does).
	const pciBusID, isaBusID = 0, 1
	opts := boot.MPOptions{ISABus: isaBusID, Buses: []boot.MPBus{{ID: pciBusID, Type: "PCI"}}}
	for i := range vm.dev.pt.devs {
		// A device behind a port interrupts through its root port's slot:
		// Linux swizzles INTx up to bus 0 when the MP table has no entry
		// for the secondary bus.
		slot := vm.dev.pt.topo.rootSlot[i]
		opts.Interrupts = append(opts.Interrupts, boot.MPInterrupt{
			Type: boot.MPIntINT, Flags: boot.MPPolarityActiveLow | boot.MPTriggerLevel,
			SrcBus: pciBusID, SrcIRQ: uint8(slot << 2), DstPin: intxPin(slot),
		})
	}
	return opts
}

// openPassthrough opens the VFIO container shared by every device, the
// KVM-VFIO device, and each device's file. Opening a device resets it
// (seconds on a real GPU), so the devices are opened concurrently, each a
// step of the timeline. The files wait in pt.files for
// addPassthroughDevices; Close closes those still there.
func (vm *VM) openPassthrough(tl *timeline) error {
	pt := vm.dev.pt
	if pt == nil {
		return nil
	}
	err := tl.run("VFIO container", func() error {
		var err error
		if pt.ctr, err = iommu.Open(iommu.Options{}); err != nil {
			return err
		}
		if err := setupFault("VFIO container"); err != nil {
			return err
		}
		if pt.kv, err = vfio.NewKVMVFIO(vm.vm); err != nil {
			return err
		}
		if err := setupFault("KVM-VFIO device"); err != nil {
			return err
		}
		// Groups join the container and KVM one at a time (the first
		// one sets the IOMMU type; KVMVFIO is not safe for concurrent
		// use), before any device of theirs opens.
		for _, dev := range pt.devs {
			g, err := pt.ctr.AddGroup(dev.IOMMUGroup)
			if err != nil {
				return fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
			}
			if err := pt.kv.AddGroup(g); err != nil {
				return fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	files := make([]vfio.DeviceFile, len(pt.devs))
	opens := make([]func() error, len(pt.devs))
	for i, dev := range pt.devs {
		opens[i] = func() error {
			return tl.run("VFIO open and reset "+dev.BDF.String(), func() error {
				// The group is in the container already: AddGroup
				// only looks it up (under the container's lock).
				g, err := pt.ctr.AddGroup(dev.IOMMUGroup)
				if err != nil {
					return fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
				}
				f, err := g.DeviceFD(dev.BDF.String())
				if err != nil {
					return fmt.Errorf("vfio: open %s: %w", dev.BDF, err)
				}
				files[i] = f
				return setupFault("open " + dev.BDF.String())
			})
		}
	}
	err = tl.concurrently(opens...)
	// Every file opened, also beside a failure, goes where Close finds it.
	for _, f := range files {
		if f != nil {
			pt.files = append(pt.files, f)
		}
	}
	return err
}

// mapGuestRAM DMA-maps guest RAM into the container, once per region for
// all devices. The IOMMU type is set when the first group joins the
// container, so this follows openPassthrough.
func (vm *VM) mapGuestRAM() error {
	pt := vm.dev.pt
	if pt == nil {
		return nil
	}
	if err := pt.ctr.MapGuestRAM(vm.mem.Regions()); err != nil {
		return err
	}
	if err := setupFault("DMA-map guest RAM"); err != nil {
		return err
	}
	var took time.Duration
	for _, m := range pt.ctr.Mappings() {
		if m.Kind == iommu.GuestRAM {
			vm.log.Info("DMA mapping", "kind", m.Kind.String(), "name", m.Name, "iova", fmt.Sprintf("%#x", m.IOVA),
				"size", m.Size, "took", m.Took.Round(time.Microsecond))
			took += m.Took
		}
	}
	vm.log.Info("guest RAM DMA-mapped", "map_dma_calls", pt.ctr.MapCalls(), "regions", len(vm.mem.Regions()),
		"took", took.Round(time.Microsecond))
	vm.log.Info("VFIO container shared by all passed-through devices", "containers", 1, "devices", len(pt.devs))
	return nil
}

// addPassthroughDevices puts the devices openPassthrough opened on the PCI
// bus, handing their files to addPassthroughFiles.
func (vm *VM) addPassthroughDevices() error {
	pt := vm.dev.pt
	if pt == nil {
		return nil
	}
	files := pt.files
	pt.files = nil
	var p2p vfio.P2PMapper
	if !vm.cfg.Passthrough.NoP2P {
		p2p = p2pLogger{ctr: pt.ctr, log: vm.log, slow: slowP2PMap}
	}
	return vm.addPassthroughFiles(files, p2p)
}

// addPassthroughFiles makes a passthrough PCI function of each open VFIO
// device file (files[i] is pt.devs[i]) and puts it on the bus. It owns the
// files: each is closed by its PCIDevice (in pt.pcidevs, which Close
// releases) or, when a step fails before its PCIDevice exists, here, so
// a failure half-way leaves no device fd open (an open fd keeps vfio-pci
// from giving the device back to its driver).
func (vm *VM) addPassthroughFiles(files []vfio.DeviceFile, p2p vfio.P2PMapper) error {
	pt := vm.dev.pt
	if err := vm.addPorts(); err != nil {
		closeDeviceFiles(files)
		return err
	}
	for i, f := range files {
		dev, sp := pt.devs[i], pt.specs[i]
		slot := pt.topo.rootSlot[i]
		pd, err := vfio.NewPCIDevice(f, vfio.Config{
			Name:   dev.BDF.String(),
			Router: vm.dev.irq, INTx: vm.dev.irq, INTxGSI: uint32(intxPin(slot)),
			Memslots: vm.dev.slots, P2P: p2p,
			HasClique: sp.Clique >= 0, Clique: uint8(max(sp.Clique, 0)),
			OnError: func(err error) { vm.refusals.Refuse("passthrough "+dev.BDF.String(), err) },
		})
		if err != nil { // NewPCIDevice closed f
			closeDeviceFiles(files[i+1:])
			return err
		}
		pt.pcidevs = append(pt.pcidevs, pd)
		for _, w := range pd.Warnings() {
			vm.log.Warn(w)
		}
		for _, b := range pd.BARs() {
			vm.log.Info("passthrough BAR", "device", dev.BDF.String(), "bar", b.Index, "kind", b.Kind.String(),
				"size", b.Size, "direct_bytes", b.Direct, "trapped", b.Trapped)
		}
		if err := setupFault("passthrough device " + dev.BDF.String()); err != nil {
			closeDeviceFiles(files[i+1:])
			return err
		}
		if err := vm.attachPassthrough(i, dev.BDF.String(), pd); err != nil {
			closeDeviceFiles(files[i+1:])
			return err
		}
	}
	return nil
}

// closeDeviceFiles closes VFIO device files no PCIDevice owns yet. Their
// close errors are dropped: the setup error that got here is the one to
// report.
func closeDeviceFiles(files []vfio.DeviceFile) {
	for _, f := range files {
		f.Close()
	}
}

// p2pLogger DMA-maps BARs into the container and logs every mapping with
// the time its VFIO_IOMMU_MAP_DMA took. That time is the launch cost of
// peer-to-peer: before Linux 6.15, vfio type1 looks up a BAR's pfns one
// 4 KiB page at a time (about 1 s per 32 GiB on bare metal, per the
// kernel commit that fixed it), and the guest waits for it.
type p2pLogger struct {
	ctr *iommu.Container
	log *slog.Logger
	// slow is the mapping time from which a warning explains the cost.
	slow time.Duration
}

func (p p2pLogger) MapBAR(iova uint64, mem []byte, name string) error {
	start := time.Now()
	err := p.ctr.MapBAR(iova, mem, name)
	if err != nil {
		p.log.Warn("peer-to-peer DMA mapping failed", "bar", name, "iova", fmt.Sprintf("%#x", iova), "size", len(mem),
			"took", time.Since(start).Round(time.Microsecond), "err", err)
		return err
	}
	took := time.Since(start)
	if m, ok := p.ctr.Mapping(iova); ok {
		took = m.Took
	}
	p.log.Info("DMA mapping", "kind", iommu.BAR.String(), "name", name, "iova", fmt.Sprintf("%#x", iova),
		"size", len(mem), "took", took.Round(time.Microsecond))
	if took >= p.slow {
		p.log.Warn("peer-to-peer DMA mapping of a BAR was slow and delayed the guest's start: "+
			"Linux before 6.15 looks up a BAR's pages one by one; use --p2p=false if the devices need not reach each other's BARs",
			"bar", name, "size", guestmem.FormatSize(uint64(len(mem))), "took", took.Round(time.Millisecond))
	}
	return nil
}

// slowP2PMap is the BAR mapping time above which the log says why and what
// to do: on bare metal with Linux 6.1 a 128 GiB GPU BAR takes seconds.
const slowP2PMap = time.Second

// Unmap removes a BAR's mapping and logs how long that took: the kernel
// walks the IOMMU page tables page by page there too.
func (p p2pLogger) Unmap(iova uint64) error {
	m, _ := p.ctr.Mapping(iova)
	start := time.Now()
	err := p.ctr.Unmap(iova)
	p.log.Info("DMA unmapping", "kind", iommu.BAR.String(), "name", m.Name, "iova", fmt.Sprintf("%#x", iova), "size", m.Size,
		"took", time.Since(start).Round(time.Microsecond), "ok", err == nil)
	return err
}

// openJournal starts this VM's host-state journal, its sysfs writes going
// through pt.writes and, when a VF has identity settings, its netlink
// messages through an rtnetlink socket opened now, in hpcvmm's network
// namespace (the PF's netdev is there), and kept until restoreHost.
func (pt *passthrough) openJournal(stateDir, sysRoot, procRoot string) error {
	pt.sysRoot = sysRoot
	opts := hoststate.Options{StateDir: stateDir, SysfsRoot: sysRoot, ProcRoot: procRoot, WriteFile: pt.writes.write}
	for _, t := range pt.ib {
		if t != nil {
			c, err := ibvf.Open()
			if err != nil {
				return fmt.Errorf("InfiniBand VF %s: %w", t.VF, err)
			}
			pt.rtnl, opts.Netlink = c, c
			break
		}
	}
	pt.journal = hoststate.Open(opts)
	return nil
}

// prepareRestore opens, before the seccomp filter goes on, the sysfs
// attributes restoreHost will write and the journal file its restore may
// rewrite: the filter refuses opens for writing and file creation.
func (vm *VM) prepareRestore() error {
	if vm.dev.pt == nil || vm.dev.pt.journal == nil {
		return nil
	}
	return errors.Join(vm.dev.pt.writes.prepare(vm.dev.pt.sysRoot, vm.dev.pt.journal.Changes()), vm.dev.pt.journal.PrepareRestore())
}

// filterSockets are the sockets the seccomp filter lets the process use
// after setup: the rtnetlink socket of the VFs' restore.
func (vm *VM) filterSockets() []int {
	if vm.dev.pt == nil || vm.dev.pt.rtnl == nil {
		return nil
	}
	return []int{vm.dev.pt.rtnl.FD()}
}

// restoreHost gives rebound devices back to their drivers and InfiniBand
// VFs their identities. It runs after the VM and its fds are gone:
// vfio-pci will not release a device that is still open.
func (vm *VM) restoreHost() error {
	if vm.dev.pt == nil {
		return nil
	}
	if vm.dev.pt.rtnl != nil {
		defer func() { vm.dev.pt.rtnl.Close(); vm.dev.pt.rtnl = nil }()
	}
	if vm.dev.pt.journal == nil {
		return nil
	}
	defer vm.dev.pt.writes.close()
	return vm.dev.pt.journal.Restore()
}

// slotVM is the part of a KVM VM memslots drive; *uapi.VM implements it,
// and tests record the calls.
type slotVM interface {
	SetUserMemoryRegion(r uapi.UserspaceMemoryRegion) error
}

// memslots hands out KVM memory slots above the guest RAM slots, for BAR
// mappings installed and removed as the guest moves BARs, and for the
// read-only image (pmem.go).
type memslots struct {
	vm slotVM
	mu sync.Mutex
	// +checklocks:mu
	next uint32
	// +checklocks:mu
	free []uint32
}

// AddMemslot maps host memory mem at guest-physical gpa.
func (m *memslots) AddMemslot(gpa uint64, mem []byte) (uint32, error) {
	return m.add(gpa, mem, 0)
}

// add maps host memory mem at guest-physical gpa with the slot flags
// (uapi.MemReadonly).
func (m *memslots) add(gpa uint64, mem []byte, flags uint32) (uint32, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var slot uint32
	if n := len(m.free); n > 0 {
		slot, m.free = m.free[n-1], m.free[:n-1]
	} else {
		slot = m.next
		m.next++
	}
	if err := m.vm.SetUserMemoryRegion(uapi.UserspaceMemoryRegion{Slot: slot, Flags: flags, GuestPhysAddr: gpa, Memory: mem}); err != nil {
		m.free = append(m.free, slot)
		return 0, err
	}
	return slot, nil
}

// RemoveMemslot deletes a slot made by AddMemslot.
func (m *memslots) RemoveMemslot(slot uint32) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.vm.SetUserMemoryRegion(uapi.UserspaceMemoryRegion{Slot: slot}); err != nil {
		return err
	}
	m.free = append(m.free, slot)
	return nil
}

// AssignResampleIRQFD wires a level-triggered INTx line: eventFD raises
// gsi, and KVM signals resampleFD when the guest EOIs it so the device
// model can re-check the line.
func (r *irqRouter) AssignResampleIRQFD(eventFD, resampleFD int, gsi uint32) error {
	return r.vm.IRQFD(eventFD, gsi, resampleFD)
}
