// Package vmm builds and runs one virtual machine: it validates a Config,
// places the VM on the host (NUMA node, pinned CPUs), allocates guest RAM,
// creates the KVM VM with its in-kernel LAPIC/IOAPIC/PIT, loads the kernel,
// wires the platform devices and runs one pinned OS thread per vCPU until
// the guest resets, powers off or fails.
//
// Use it as a library:
//
//	cfg := vmm.DefaultConfig()
//	cfg.Kernel, cfg.Initrd = "/boot/vmlinuz", "initrd.img"
//	cfg.Cmdline = "console=ttyS0 reboot=k panic=-1"
//	cfg.CPUs, cfg.Memory = 4, 2<<30
//	vm, err := vmm.New(cfg)
//	if err != nil { ... }
//	defer vm.Close()
//	err = vm.Run(ctx) // nil when the guest rebooted or powered off
package vmm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/boot"
	"github.com/hpcvmm/hpcvmm/cputopo"
	"github.com/hpcvmm/hpcvmm/guestmem"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/platform"
	"github.com/hpcvmm/hpcvmm/uapi"
	"github.com/hpcvmm/hpcvmm/vmm/preflight"
)

// Fixed platform addresses (see docs/architecture.md).
const (
	tssAddr         = 0xfffbd000
	identityMapAddr = 0xfffbc000
	serialBase      = 0x3f8
	serialIRQ       = 4
	i8042DataPort   = 0x60
	i8042CmdPort    = 0x64
)

// RequiredKVMCaps are the KVM capabilities hpcvmm cannot run without; New
// and `hpcvmm check` test for each.
var RequiredKVMCaps = []uapi.Cap{
	uapi.CapUserMemory, uapi.CapIRQChip, uapi.CapPIT2, uapi.CapExtCPUID,
	uapi.CapIRQFD, uapi.CapIOEventFD, uapi.CapIRQRouting, uapi.CapSignalMSI,
	uapi.CapSetTSSAddr, uapi.CapImmediateExit,
}

// VM is one virtual machine. Create it with New, run it once with Run,
// and always Close it.
type VM struct {
	cfg   Config
	log   *slog.Logger
	place placement
	// topology is the guest's CPU topology: each vCPU's APIC ID and the
	// CPUID that describes it.
	topology cputopo.Topology
	windows  addrspace.Windows // the guest's BAR windows (addPCI)
	// cpuMode is the mode decideCPUMode chose; exitsKept the
	// KVM_CAP_X86_DISABLE_EXITS bits KVM accepted and haltPollOff whether
	// it took KVM_CAP_HALT_POLL 0 (dedicated mode, applyCPUMode).
	cpuMode     CPUMode
	exitsKept   int
	haltPollOff bool

	kvm *uapi.System
	// supported is the CPUID KVM supports on this host (openKVM).
	supported []uapi.CPUIDEntry
	vm        *uapi.VM
	mem       *guestmem.Memory
	cpus      []*vcpu

	// refusals logs what devices report with no caller to return it to
	// (chiefly guest actions they refused), rate-limited per device.
	refusals *platform.Refusals
	// dev holds every device model and the host resources behind them
	// (devices.go); its close releases them.
	dev devices

	stopping atomic.Bool
	stopped  chan struct{} // closed by the first stop
	stopOnce sync.Once
	reason   error // first reason the VM stopped; guarded by stopOnce

	// prefaultCPUs and prefaultWorkers are where and by how many threads
	// guest RAM is prefaulted (prefaultPlan, checked before the host
	// changes).
	prefaultCPUs    []int
	prefaultWorkers int

	start      time.Time
	firstRun   atomic.Int64 // ns since start of the BSP's first KVM_RUN
	closeOnce  sync.Once
	closeErr   error
	ranAlready atomic.Bool
}

// New validates cfg, checks the host, and builds the VM without running
// it. After Config.Validate and checkHostFirst (the sizes against what
// this host could ever give), it runs three steps: checkInput (the kernel
// and initrd files and whether they fit the guest), checkHost (placement,
// CPU mode, topology, the preflight checks) and build (KVM, vCPUs, guest
// RAM, devices, the kernel). Every check that can fail on user input
// happens before guest RAM is reserved or a KVM VM exists; on any error
// everything acquired so far is released.
func New(cfg Config) (_ *VM, err error) {
	start := cfg.StartTime
	if start.IsZero() {
		start = time.Now()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkHostFirst(&cfg); err != nil {
		return nil, err
	}
	if cfg.Stdout == nil {
		cfg.Stdout = os.Stdout
	}
	if cfg.Console == "" {
		cfg.Console = ConsoleVirtio
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	vm := &VM{cfg: cfg, log: log, start: start, dev: devices{serialEvent: -1}, stopped: make(chan struct{}),
		refusals: platform.NewRefusals(log, 0)}
	defer func() {
		if err != nil {
			vm.Close()
		}
	}()

	tl := &timeline{start: start, log: log}
	in, err := vm.checkInput(tl)
	// The mapped or decompressed vmlinux and the mapped initrd, once they
	// are in guest RAM (or New failed).
	defer in.release()
	if err != nil {
		return nil, err
	}
	roots, err := vm.checkHost(tl)
	if err != nil {
		return nil, err
	}
	if err := vm.build(tl, roots, in); err != nil {
		return nil, err
	}
	tl.summary()
	log.Debug("VM built", "elapsed", time.Since(start).Round(time.Microsecond))
	return vm, nil
}

// bootInput is what checkInput read for build's "load kernel" step.
type bootInput struct {
	kernel   *kernelImage
	initrd   []byte
	ram      []boot.RAMRange
	releases []func()
}

// release gives back the kernel image and the initrd mapping.
func (in *bootInput) release() {
	for i := len(in.releases) - 1; i >= 0; i-- {
		in.releases[i]()
	}
	in.releases = nil
}

// checkInput is New's first step: it reads the kernel and initrd and
// checks they fit the guest's RAM layout with the command line and
// firmware tables (boot.Check), before anything on the host changes.
func (vm *VM) checkInput(tl *timeline) (*bootInput, error) {
	cfg := &vm.cfg
	in := &bootInput{}
	readStart := time.Now()
	// On a kernel-cache miss the decompression runs from here on,
	// alongside guest RAM's prefault and the devices' setup; the
	// "load kernel" step waits for it.
	ki, err := vm.openKernel()
	if err != nil {
		return in, err
	}
	in.kernel = ki
	in.releases = append(in.releases, ki.release)
	if cfg.Initrd != "" {
		initrd, releaseInitrd, err := mapFile(cfg.openFile, cfg.Initrd)
		in.releases = append(in.releases, releaseInitrd)
		if err != nil {
			return in, fieldErr("Initrd", "%v", err)
		}
		in.initrd = initrd
	}
	if cfg.PMEM.Path != "" {
		if vm.dev.pmem, err = openPMEM(cfg.openFile, cfg.PMEM); err != nil {
			return in, err
		}
	}
	tl.mark("read kernel and initrd", readStart)
	for _, r := range addrspace.RAM(cfg.Memory) {
		in.ram = append(in.ram, boot.RAMRange{GPA: r.GPA, Size: r.Size})
	}
	var pmem []boot.RAMRange
	if r := addrspace.PMEM(cfg.Memory, uint64(cfg.PMEM.Size)); r.Size > 0 {
		pmem = []boot.RAMRange{{GPA: r.GPA, Size: r.Size}}
	}
	var acpiCheck *boot.ACPI
	if !cfg.NoACPI {
		acpiCheck = &boot.ACPI{RSDPAddr: boot.ACPIAreaStart} // the tables themselves come once the devices exist
	}
	if err := boot.Check(boot.Params{Kernel: ki.check, Cmdline: cfg.Cmdline, RAM: in.ram, CPUs: cfg.CPUs, MP: vm.mpOptions(), ACPI: acpiCheck, PMEM: pmem}, uint64(len(in.initrd))); err != nil {
		return in, bootCheckError(err)
	}
	return in, nil
}

// bootCheckError names the Config field behind boot.Check's refusal: the
// initrd or the command line by name, the rest (a kernel, ACPI or MP
// tables that do not fit) being a matter of Memory.
func bootCheckError(err error) error {
	field := "Memory"
	var ce *boot.CheckError
	if errors.As(err, &ce) {
		switch ce.Input {
		case boot.InputInitrd:
			field = "Initrd"
		case boot.InputCmdline:
			field = "Cmdline"
		case boot.InputPMEM:
			field = "PMEM"
		}
	}
	return fieldErr(field, "%v", err)
}

// hostRoots is the host checkHost looked at, for build's steps that change it.
type hostRoots struct {
	sysRoot, procRoot string
}

// checkHost is New's second step: it places the VM (NUMA node, vCPU
// CPUs), chooses the CPU mode, the prefault plan and the guest's CPU
// topology, and runs the preflight checks, all before anything on the host
// changes.
func (vm *VM) checkHost(tl *timeline) (hostRoots, error) {
	cfg, log := &vm.cfg, vm.log
	roots := hostRoots{sysRoot: cfg.SysfsRoot, procRoot: cfg.ProcfsRoot}
	if roots.sysRoot == "" {
		roots.sysRoot = "/sys"
	}
	if roots.procRoot == "" {
		roots.procRoot = "/proc"
	}
	checkStart := time.Now()
	h := host.New(roots.sysRoot, roots.procRoot)
	devNode, err := vm.checkPassthrough(h)
	if err != nil {
		return roots, err
	}
	if vm.place, err = choosePlacement(cfg, h, devNode); err != nil {
		return roots, err
	}
	switch {
	case vm.place.claimErr != nil:
		log.Warn("CPUs not claimed: another hpcvmm VM may be placed on them", "err", vm.place.claimErr)
	case vm.place.claimNote != "":
		log.Debug(vm.place.claimNote)
	}
	mode, why, warn, err := decideCPUMode(cfg.CPUMode, vm.place)
	if err != nil {
		return roots, err
	}
	vm.cpuMode = mode
	if warn {
		log.Warn("shared CPU mode: vCPUs share host CPUs, so idle vCPUs exit to the host and a busy one waits for its CPU", "why", why)
	} else {
		log.Info("CPU mode", "mode", string(mode), "why", why)
	}
	// Checked here, with the placement, before anything on the host changes.
	if vm.prefaultCPUs, vm.prefaultWorkers, err = prefaultPlan(vm.place, cfg.PrefaultWorkers, affinity); err != nil {
		return roots, err
	}
	if vm.topology, err = vm.chooseTopology(h); err != nil {
		return roots, fieldErr("CPUs", "%v", err)
	}
	cfg.Cmdline = vm.withIRQAffinity(cfg.Cmdline)
	// The checks `hpcvmm check` runs, with the same messages, before
	// anything on the host changes.
	if rep := preflight.Run(h, vm.preflightRequest()); !rep.OK() {
		return roots, &PreflightError{Report: rep}
	}
	if devNode >= 0 && devNode != vm.place.node {
		log.Warn("guest RAM and vCPUs are on another NUMA node than the first passthrough device: its DMA and interrupts cross the interconnect",
			"vm_node", vm.place.node, "device_node", devNode)
	}
	log.Info("placement", "numa_node", vm.place.node, "why", vm.place.why,
		"vcpu_host_cpus", host.FormatCPUList(vm.place.vcpuCPUs), "hugepages", cfg.pageSize().String())
	if on, _ := h.NUMABalancing(); on && cfg.pageSize() == guestmem.Page4K {
		log.Warn("automatic NUMA balancing is on and guest RAM is on 4 KiB pages: the guest will take hinting faults; use hugepages, or echo 0 > /proc/sys/kernel/numa_balancing")
	}
	if cfg.pageSize() == guestmem.Page4K {
		log.Warn("guest RAM on 4 KiB pages: for development only; HPC guests lose TLB reach and VFIO needs many more DMA mappings (use --hugepages 1G)")
	}
	tl.mark("host checks", checkStart)
	return roots, nil
}

// newVCPU creates vCPU index with its CPUID, MSRs and local interrupt
// pins. Only the BSP gets boot registers; the APs wait for INIT/SIPI from
// the guest in the in-kernel LAPIC. On error the vCPU is closed here (its
// fd and kvm_run mapping would otherwise keep the KVM VM alive after
// New's unwinding closed everything else).
func (vm *VM) newVCPU(index int, supported []uapi.CPUIDEntry) (_ *vcpu, err error) {
	// KVM's vCPU id is the initial APIC ID.
	c, err := vm.vm.CreateVCPU(int(vm.topology.VCPUs[index].APICID))
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	v := &vcpu{index: index, hostCPU: vm.place.vcpuCPUs[index], cpu: c, run: c.RunData(), vm: vm}
	if err := setupFault(fmt.Sprintf("create vCPU %d", index)); err != nil {
		return nil, err
	}
	cpuid := guestCPUID(supported, vm.topology, index, cpuidOptions{extDestID: vm.needsX2APIC(), realtime: vm.cpuMode == CPUModeDedicated})
	if err := c.SetCPUID2(cpuid); err != nil {
		return nil, fmt.Errorf("vCPU %d: %w", index, err)
	}
	// After SetCPUID2: KVM checks XCR0 against the vCPU's leaf 0xD. A
	// refusal costs only the nested test bed's XSAVE (see guestXCR0), so
	// it is logged, not fatal.
	if xcr0 := guestXCR0(cpuid); xcr0 != 0 {
		if err := c.SetXCR0(xcr0); err != nil {
			vm.log.Warn("initial XCR0 not set; the guest starts with XCR0 = 1", "vcpu", index, "err", err)
		}
	}
	msrs := bootMSRs()
	if vm.needsX2APIC() {
		msrs = append(msrs, x2APICBaseMSR(index == 0))
	}
	if err := c.SetMSRs(msrs); err != nil {
		return nil, fmt.Errorf("vCPU %d: %w", index, err)
	}
	if err := setLocalInterruptPins(c); err != nil {
		return nil, fmt.Errorf("vCPU %d: %w", index, err)
	}
	if err := setupFault(fmt.Sprintf("set up vCPU %d", index)); err != nil {
		return nil, err
	}
	return v, nil
}

// setBootRegisters puts the BSP at the kernel's 64-bit entry point.
func setBootRegisters(c *uapi.VCPU, st boot.CPUState) error {
	sregs, err := c.GetSregs()
	if err != nil {
		return err
	}
	seg := func(s boot.Segment) uapi.Segment {
		return uapi.Segment{Base: s.Base, Limit: s.Limit, Selector: s.Selector, Type: s.Type,
			Present: s.Present, DPL: s.DPL, DB: s.DB, S: s.S, L: s.L, G: s.G}
	}
	sregs.CS, sregs.DS, sregs.ES, sregs.FS = seg(st.CS), seg(st.DS), seg(st.ES), seg(st.FS)
	sregs.GS, sregs.SS, sregs.TR, sregs.LDT = seg(st.GS), seg(st.SS), seg(st.TR), seg(st.LDT)
	sregs.GDT = uapi.DTable{Base: st.GDTBase, Limit: st.GDTLimit}
	sregs.IDT = uapi.DTable{Base: st.IDTBase, Limit: st.IDTLimit}
	sregs.CR0, sregs.CR3, sregs.CR4, sregs.EFER = st.CR0, st.CR3, st.CR4, st.EFER
	if err := c.SetSregs(sregs); err != nil {
		return err
	}
	if err := c.SetRegs(uapi.Regs{RIP: st.RIP, RSP: st.RSP, RSI: st.RSI, RFLAGS: st.RFLAGS}); err != nil {
		return err
	}
	return c.SetFPU(uapi.FPU{FCW: 0x37f, MXCSR: 0x1f80})
}

// Run runs the guest until it resets or powers off (nil), fails (an error
// naming the reason), or ctx is done (ctx's error). A VM runs once.
func (vm *VM) Run(ctx context.Context) error {
	if vm.ranAlready.Swap(true) {
		return errors.New("vmm: VM already ran; create a new one")
	}
	if err := vm.installProcessFilter(); err != nil {
		return err
	}
	var wg sync.WaitGroup
	for _, c := range vm.cpus {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.loop(); err != nil {
				vm.stop(err)
			}
		}()
	}
	if vm.cfg.Console == ConsoleSerial && vm.cfg.Stdin != nil {
		go vm.feedSerial(vm.cfg.Stdin)
	}
	// What setup allocated and dropped (device models' scratch, the
	// preflight report, sysfs reads) goes back to the host now, while
	// the guest boots, rather than when the runtime's background
	// scavenger gets to it: the VMM's resident memory is overhead on the
	// node for the guest's whole life, and the running VM allocates
	// almost nothing after this.
	debug.FreeOSMemory()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		vm.stop(fmt.Errorf("%w: %w", errStopped, context.Cause(ctx)))
		<-done
	}
	if vm.dev.serial != nil {
		vm.dev.serial.CloseInput() // a feeder blocked on a full line returns
	}
	vm.logExits()
	if !errors.Is(vm.reason, errGuestReset) && !errors.Is(vm.reason, errGuestPoweroff) {
		vm.logVCPUState()
	}
	switch {
	case errors.Is(vm.reason, errGuestReset):
		vm.log.Info("guest reset: VM finished")
		return nil
	case errors.Is(vm.reason, errGuestPoweroff):
		vm.log.Info("guest powered off: VM finished")
		return nil
	case errors.Is(vm.reason, errStopped):
		return context.Cause(ctx)
	case isGuestMemoryFault(vm.reason):
		return vm.guestMemoryFault(vm.reason)
	}
	return vm.reason
}

// stop records the first reason and kicks every vCPU out of the guest.
func (vm *VM) stop(reason error) {
	vm.stopOnce.Do(func() {
		vm.reason = reason
		vm.stopping.Store(true)
		if vm.stopped != nil {
			close(vm.stopped)
		}
		for _, c := range vm.cpus {
			c.kick()
		}
	})
}

// noteFirstRun logs the time from process start to the BSP's first KVM_RUN.
func (vm *VM) noteFirstRun() {
	d := time.Since(vm.start)
	vm.firstRun.Store(int64(d))
	vm.log.Info("first KVM_RUN", "since_start", d.Round(time.Microsecond))
}

// CPUMode is the CPU mode New chose (never CPUModeAuto).
func (vm *VM) CPUMode() CPUMode { return vm.cpuMode }

// FirstRunLatency is the time from Config.StartTime to the BSP's first
// KVM_RUN; zero before Run got there.
func (vm *VM) FirstRunLatency() time.Duration { return time.Duration(vm.firstRun.Load()) }

// feedSerial feeds console input to the UART until the reader ends or the
// VM stops. The UART's ReadFrom holds input on its side of the line until
// the guest's driver takes it and stops reading r while that is full
// (backpressure, nothing dropped); at r's end of file what is still queued
// stays there for the guest.
func (vm *VM) feedSerial(r io.Reader) {
	if _, err := vm.dev.serial.ReadFrom(r); err != nil && !errors.Is(err, platform.ErrInputClosed) {
		vm.log.Warn("serial console: reading input", "err", err)
	}
}

// ExitCounts returns the number of exits to userspace by KVM exit reason,
// summed over all vCPUs. Call it after Run returned.
func (vm *VM) ExitCounts() map[string]uint64 {
	out := map[string]uint64{}
	for _, c := range vm.cpus {
		for r, n := range c.exits {
			if n > 0 {
				out[uapi.ExitReason(r).String()] += n
			}
		}
	}
	return out
}

// logVCPUState logs where each vCPU was when the VM stopped abnormally:
// the first thing to look at when a guest hangs or fails.
func (vm *VM) logVCPUState() {
	for _, c := range vm.cpus {
		regs, err := c.cpu.GetRegs()
		if err != nil {
			continue
		}
		sregs, _ := c.cpu.GetSregs()
		vm.log.Info("vCPU state at stop", "vcpu", c.index, "rip", fmt.Sprintf("%#x", regs.RIP),
			"rsp", fmt.Sprintf("%#x", regs.RSP), "rflags", fmt.Sprintf("%#x", regs.RFLAGS),
			"cr0", fmt.Sprintf("%#x", sregs.CR0), "cr2", fmt.Sprintf("%#x", sregs.CR2), "cr3", fmt.Sprintf("%#x", sregs.CR3),
			"cr4", fmt.Sprintf("%#x", sregs.CR4), "efer", fmt.Sprintf("%#x", sregs.EFER))
	}
}

func (vm *VM) logExits() {
	attrs := []any{}
	for k, v := range vm.ExitCounts() {
		attrs = append(attrs, k, v)
	}
	vm.log.Info("userspace exits by reason", attrs...)
	vm.log.Info("virtqueue doorbells that exited to hpcvmm instead of their ioeventfd", "notify_exits", vm.NotifyExits())
}

// Close releases everything the VM holds: vCPUs, the KVM VM, guest RAM
// (and with it the hugepages), eventfds. It is safe to call more than once
// and on a partly built VM.
func (vm *VM) Close() error {
	vm.closeOnce.Do(func() {
		var errs []error
		errs = append(errs, vm.dev.close(vm.log))
		for _, c := range vm.cpus {
			errs = append(errs, c.cpu.Close())
		}
		if vm.vm != nil {
			errs = append(errs, vm.vm.Close())
		}
		if vm.dev.pmem != nil {
			errs = append(errs, vm.dev.pmem.close())
		}
		if vm.mem != nil {
			errs = append(errs, vm.mem.Close())
		}
		if vm.kvm != nil {
			errs = append(errs, vm.kvm.Close())
		}
		vm.place.claim.Release()
		// Last: vfio-pci lets a device go only once every fd is closed.
		errs = append(errs, vm.restoreHost())
		vm.refusals.Flush()
		vm.closeErr = errors.Join(errs...)
	})
	return vm.closeErr
}

// faultHook, when non-nil, is called by setupFault after each step of New
// that took a host resource (an fd, a mapping, a KVM object, a TAP, a
// driver binding), with the step's name. Tests set it to fail New at each
// step in turn and check that New's unwinding gives every resource back;
// nothing else sets it. A package variable rather than a Config field: it
// is not an API, and New reads it without locking, so a test sets it only
// while no other New runs.
var faultHook func(step string) error

// setupFault reports the end of a setup step to faultHook and returns the
// failure the hook injects there, if any.
func setupFault(step string) error {
	if faultHook == nil {
		return nil
	}
	if err := faultHook(step); err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	return nil
}
