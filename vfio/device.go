package vfio

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// DeviceFile is the VFIO device fd as the passthrough model uses it.
// *uapi.VFIODevice implements it; tests use a fake.
type DeviceFile interface {
	Info() (uapi.VFIODeviceInfo, error)
	RegionInfo(index uint32) (uapi.VFIORegionInfo, error)
	IRQInfo(index uint32) (uapi.VFIOIRQInfo, error)
	SetIRQEventFDs(index, start, action uint32, fds []int32) error
	SetIRQs(index, start, count, action uint32) error
	DisableIRQs(index uint32) error
	Reset() error
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Mmap maps size bytes at fd offset off shared; the model gives the
	// mapping back with Munmap.
	Mmap(off int64, size int, prot int) ([]byte, error)
	// Munmap unmaps what Mmap returned.
	Munmap(mem []byte) error
	Close() error
}

// Memslots is what the VM provides to make host memory (a BAR's mmap)
// guest-physical memory: a KVM memslot, so guest accesses never exit.
type Memslots interface {
	AddMemslot(gpa uint64, mem []byte) (slot uint32, err error)
	RemoveMemslot(slot uint32) error
}

// INTxRouter is what the VM provides for level-triggered INTx: an irqfd
// (KVM_IRQFD with KVM_IRQFD_FLAG_RESAMPLE) that raises gsi when eventFD is
// signalled and signals resampleFD when the guest EOIs it.
type INTxRouter interface {
	AssignResampleIRQFD(eventFD, resampleFD int, gsi uint32) error
	DeassignIRQFD(eventFD int, gsi uint32) error
}

// P2PMapper DMA-maps BARs into the container for peer-to-peer;
// *iommu.Container implements it.
type P2PMapper interface {
	MapBAR(iova uint64, mem []byte, name string) error
	Unmap(iova uint64) error
}

// Config configures NewPCIDevice.
type Config struct {
	// Name labels the device in errors and memslot names, e.g. the BDF.
	Name string
	// Router routes MSI and MSI-X vectors (required when the device has
	// either).
	Router irq.Router
	// INTx, when non-nil, wires the device's INTx pin to INTxGSI with a
	// resampling irqfd; nil hides the pin from the guest.
	INTx    INTxRouter
	INTxGSI uint32
	// Memslots, when non-nil, receives the BARs' mmapped pages; nil traps
	// every BAR access (slow; for tests and hosts that cannot mmap).
	Memslots Memslots
	// P2P, when non-nil, DMA-maps the BARs at their guest address.
	P2P P2PMapper
	// HasClique adds the NVIDIA GPUDirect P2P clique capability with
	// Clique (0-15).
	HasClique bool
	Clique    uint8
	// OnError hears about failures that happen during guest accesses and
	// so cannot be returned (a VFIO or KVM call refused); may be nil.
	OnError func(error)
}

// pageSize is the host page size for BAR mmaps and memslots.
var pageSize = uint64(unix.Getpagesize())

// piece is a page-aligned part of a BAR backed by an mmap.
type piece struct {
	off uint64
	mem []byte
}

type barState struct {
	index  int
	kind   pci.BARKind
	prefet bool
	size   uint64 // guest-visible size (power of two)
	region uapi.VFIORegionInfo
	maps   [][]byte
	direct []piece
	trap   bool // some part is served by the handler
	name   string

	slots   []uint32
	p2pAt   uint64
	p2pIOVA []uint64

	// Guest accesses that reached hpcvmm (guarded by PCIDevice.mu).
	msixAccesses, otherAccesses uint64
}

// PCIDevice is a passed-through PCI function as a pci endpoint.
type PCIDevice struct {
	mu       sync.Mutex
	dev      DeviceFile
	cfg      Config
	info     uapi.VFIODeviceInfo
	cfgReg   uapi.VFIORegionInfo
	bars     [pci.NumBARs]*barState
	vc       vconfig
	msix     *msixState
	msi      *msiState
	intx     *intxState
	canReset bool
	warnings []string
	closed   bool
}

var _ pci.Device = (*PCIDevice)(nil)

// NewPCIDevice builds the passthrough model over an open VFIO device: it
// resets the device (before the guest sees it), reads its configuration
// space and regions, mmaps the BARs and prepares interrupts. The PCIDevice
// owns dev from then on (Close closes it), also when NewPCIDevice fails.
func NewPCIDevice(dev DeviceFile, cfg Config) (_ *PCIDevice, err error) {
	p := &PCIDevice{dev: dev, cfg: cfg}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.info, err = dev.Info(); err != nil {
		return nil, fmt.Errorf("vfio: %s: %w", cfg.Name, err)
	}
	if p.info.Flags&uapi.VFIODeviceFlagsPCI == 0 {
		return nil, fmt.Errorf("vfio: %s: not a vfio-pci device (flags %#x)", cfg.Name, p.info.Flags)
	}
	if p.info.NumRegions <= uapi.VFIOPCIConfigRegionIndex {
		return nil, fmt.Errorf("vfio: %s: device reports %d regions, no config region", cfg.Name, p.info.NumRegions)
	}
	p.canReset = p.info.Flags&uapi.VFIODeviceFlagsReset != 0
	if p.canReset {
		if err := dev.Reset(); err != nil {
			p.warn(fmt.Sprintf("%s: reset before start failed (%v); the guest may see state left by the previous user", cfg.Name, err))
		}
	} else {
		p.warn(fmt.Sprintf("%s: the device has no reset method (no FLR, PM or bus reset); the guest sees whatever state the previous user left", cfg.Name))
	}
	if p.cfgReg, err = dev.RegionInfo(uapi.VFIOPCIConfigRegionIndex); err != nil {
		return nil, fmt.Errorf("vfio: %s: %w", cfg.Name, err)
	}
	if p.cfgReg.Size < pci.LegacyConfigSize {
		return nil, fmt.Errorf("vfio: %s: config region is %d bytes, want at least 256", cfg.Name, p.cfgReg.Size)
	}
	phys := make([]byte, min(p.cfgReg.Size, pci.ConfigSize))
	if _, err := dev.ReadAt(phys, int64(p.cfgReg.Offset)); err != nil {
		return nil, fmt.Errorf("vfio: %s: read config space: %w", cfg.Name, err)
	}
	parsed := host.ParseConfig(phys)
	if err := p.setupBARs(phys); err != nil {
		return nil, err
	}
	if err := p.setupConfig(phys, parsed); err != nil {
		return nil, err
	}
	if err := p.setupInterrupts(); err != nil {
		return nil, err
	}
	if err := p.mapBARs(); err != nil {
		return nil, err
	}
	return p, nil
}

func (p *PCIDevice) warn(s string) { p.warnings = append(p.warnings, s) }

func (p *PCIDevice) report(err error) {
	if p.cfg.OnError != nil {
		p.cfg.OnError(err)
	}
}

// Warnings lists what the VMM should tell the user (no reset method, a BAR
// that could not be mmapped and is trapped, ...).
func (p *PCIDevice) Warnings() []string { return append([]string(nil), p.warnings...) }

// Name returns the device's label (Config.Name, e.g. its BDF).
func (p *PCIDevice) Name() string { return p.cfg.Name }

// CanReset reports whether VFIO offers a reset for the device.
func (p *PCIDevice) CanReset() bool { return p.canReset }

// BARInfo describes one guest-visible BAR.
type BARInfo struct {
	Index        int
	Kind         pci.BARKind
	Prefetchable bool
	Size         uint64
	// Direct is the number of bytes installed as memslots (no exits);
	// Trapped is whether some part is served by hpcvmm.
	Direct  uint64
	Trapped bool
}

// BARs lists the device's BARs, e.g. to size the 64-bit window before
// Root.AssignBARs or to report trapped pages.
func (p *PCIDevice) BARs() []BARInfo {
	var out []BARInfo
	for _, b := range p.bars {
		if b == nil {
			continue
		}
		bi := BARInfo{Index: b.index, Kind: b.kind, Prefetchable: b.prefet, Size: b.size, Trapped: b.trap}
		for _, pc := range b.direct {
			bi.Direct += uint64(len(pc.mem))
		}
		out = append(out, bi)
	}
	return out
}

// TrapStats counts the guest accesses to one BAR that exited to hpcvmm
// instead of reaching the device through a memslot.
type TrapStats struct {
	Index int
	// MSIX counts accesses to the MSI-X table and PBA, which are trapped
	// by design.
	MSIX uint64
	// Other counts every other trapped access: registers sharing a page
	// with the MSI-X structures, unmappable BARs or parts of them.
	Other uint64
}

// TrapStats returns the trapped-access counts of every BAR; a BAR whose
// Other count is zero cost the guest no exits beyond its MSI-X pages.
func (p *PCIDevice) TrapStats() []TrapStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []TrapStats
	for _, b := range p.bars {
		if b != nil {
			out = append(out, TrapStats{Index: b.index, MSIX: b.msixAccesses, Other: b.otherAccesses})
		}
	}
	return out
}

// isMSIX reports whether [offset, offset+n) of BAR b touches the MSI-X
// table or PBA.
func (p *PCIDevice) isMSIX(b *barState, offset uint64, n int) bool {
	m := p.msix
	if m == nil {
		return false
	}
	if m.tableBAR == b.index && m.inTable(offset, n) {
		return true
	}
	return m.pbaBAR == b.index && m.inPBA(offset, n)
}

func (p *PCIDevice) countTrap(b *barState, offset uint64, n int) {
	if p.isMSIX(b, offset, n) {
		b.msixAccesses++
	} else {
		b.otherAccesses++
	}
}

func pow2(n uint64) uint64 {
	if n <= 1 {
		return 1
	}
	return 1 << bits.Len64(n-1)
}

// setupBARs reads each BAR's kind from the device's (kernel-virtualised)
// BAR register and its size from the VFIO region.
func (p *PCIDevice) setupBARs(phys []byte) error {
	for i := 0; i < pci.NumBARs; i++ {
		reg, err := p.dev.RegionInfo(uint32(i))
		if err != nil {
			return fmt.Errorf("vfio: %s: %w", p.cfg.Name, err)
		}
		if reg.Size == 0 {
			continue
		}
		v := le32(phys[pci.RegBAR0+4*i:])
		b := &barState{index: i, region: reg, name: fmt.Sprintf("%s BAR%d", p.cfg.Name, i)}
		switch {
		case v&1 != 0:
			b.kind = pci.BARIO
			b.size = max(pow2(reg.Size), 4)
		case v&0x6 == 0x4:
			if i == pci.NumBARs-1 {
				return fmt.Errorf("vfio: %s: BAR%d claims 64 bits but is the last BAR", p.cfg.Name, i)
			}
			b.kind = pci.BARMem64
			b.size = max(pow2(reg.Size), 16)
		default:
			b.kind = pci.BARMem32
			b.size = max(pow2(reg.Size), 16)
		}
		b.prefet = b.kind != pci.BARIO && v&0x8 != 0
		p.bars[i] = b
		if b.kind == pci.BARMem64 {
			i++ // the upper half has no region of its own
		}
	}
	return nil
}

// trapRanges returns the page-aligned ranges of BAR i that must stay trapped:
// the MSI-X table and PBA pages.
func (p *PCIDevice) trapRanges(i int) [][2]uint64 {
	var out [][2]uint64
	m := p.msix
	if m == nil {
		return nil
	}
	add := func(off, n uint64) {
		lo := off &^ (pageSize - 1)
		hi := (off + n + pageSize - 1) &^ (pageSize - 1)
		out = append(out, [2]uint64{lo, hi})
	}
	if m.tableBAR == i {
		add(m.tableOff, uint64(m.n)*msix.EntrySize)
	}
	if m.pbaBAR == i {
		add(m.pbaOff, msix.PBASize(m.n))
	}
	return out
}

// mapBARs mmaps the mappable areas of every memory BAR and cuts them into
// the pieces that become memslots, leaving the MSI-X pages out.
func (p *PCIDevice) mapBARs() error {
	for _, b := range p.bars {
		if b == nil {
			continue
		}
		b.trap = true
		if b.kind == pci.BARIO || p.cfg.Memslots == nil || b.region.Size < pageSize || b.region.Size%pageSize != 0 {
			continue
		}
		areas := b.region.MmapAreas()
		if len(areas) == 0 {
			p.warn(fmt.Sprintf("%s: VFIO does not allow mmapping this BAR; every access traps to hpcvmm", b.name))
			continue
		}
		traps := p.trapRanges(b.index)
		covered := uint64(0)
		for _, a := range areas {
			lo := (a.Offset + pageSize - 1) &^ (pageSize - 1)
			hi := (a.Offset + a.Size) &^ (pageSize - 1)
			if hi <= lo {
				continue
			}
			mem, err := p.dev.Mmap(int64(b.region.Offset+lo), int(hi-lo), unix.PROT_READ|unix.PROT_WRITE)
			if err != nil {
				p.warn(fmt.Sprintf("%s: mmap of [%#x, %#x) failed (%v); that part traps to hpcvmm", b.name, lo, hi, err))
				continue
			}
			b.maps = append(b.maps, mem)
			for _, r := range subtract([2]uint64{lo, hi}, traps) {
				b.direct = append(b.direct, piece{off: r[0], mem: mem[r[0]-lo : r[1]-lo : r[1]-lo]})
				covered += r[1] - r[0]
			}
		}
		b.trap = covered < b.size
	}
	return nil
}

// subtract returns r minus the holes, in order.
func subtract(r [2]uint64, holes [][2]uint64) [][2]uint64 {
	out := [][2]uint64{r}
	for _, h := range holes {
		var next [][2]uint64
		for _, x := range out {
			if h[1] <= x[0] || h[0] >= x[1] {
				next = append(next, x)
				continue
			}
			if x[0] < h[0] {
				next = append(next, [2]uint64{x[0], h[0]})
			}
			if h[1] < x[1] {
				next = append(next, [2]uint64{h[1], x[1]})
			}
		}
		out = next
	}
	return out
}

// BARHandler implements pci.Device: BARs with trapped parts get a handler
// (the memslots installed over the direct parts take precedence in KVM, so
// only trapped addresses reach it); fully mapped BARs get none.
func (p *PCIDevice) BARHandler(bar int) bus.Device {
	if bar < 0 || bar >= pci.NumBARs || p.bars[bar] == nil || !p.bars[bar].trap {
		return nil
	}
	return barHandler{p: p, b: p.bars[bar]}
}

// BARMapped implements pci.Device: install (or remove) the BAR's memslots
// at addr and, with P2P, DMA-map it there. The DMA mapping is kept while
// the guest merely toggles decode, since remapping a large BAR is slow.
func (p *PCIDevice) BARMapped(bar int, addr uint64, mapped bool) {
	if bar < 0 || bar >= pci.NumBARs || p.bars[bar] == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b := p.bars[bar]
	if p.closed {
		return
	}
	p.removeSlots(b)
	if !mapped || p.cfg.Memslots == nil {
		return
	}
	for _, pc := range b.direct {
		s, err := p.cfg.Memslots.AddMemslot(addr+pc.off, pc.mem)
		if err != nil {
			p.report(fmt.Errorf("vfio: %s: memslot for [%#x, %#x): %w", b.name, addr+pc.off, addr+pc.off+uint64(len(pc.mem)), err))
			continue
		}
		b.slots = append(b.slots, s)
	}
	if p.cfg.P2P != nil && (len(b.p2pIOVA) == 0 || b.p2pAt != addr) {
		p.unmapP2P(b)
		for _, pc := range b.direct {
			iova := addr + pc.off
			if err := p.cfg.P2P.MapBAR(iova, pc.mem, b.name); err != nil {
				p.report(fmt.Errorf("vfio: %s: peer-to-peer DMA mapping: %w", b.name, err))
				continue
			}
			b.p2pIOVA = append(b.p2pIOVA, iova)
		}
		b.p2pAt = addr
	}
}

func (p *PCIDevice) removeSlots(b *barState) {
	for _, s := range b.slots {
		if err := p.cfg.Memslots.RemoveMemslot(s); err != nil {
			p.report(fmt.Errorf("vfio: %s: remove memslot %d: %w", b.name, s, err))
		}
	}
	b.slots = b.slots[:0]
}

func (p *PCIDevice) unmapP2P(b *barState) {
	for _, iova := range b.p2pIOVA {
		if err := p.cfg.P2P.Unmap(iova); err != nil {
			p.report(fmt.Errorf("vfio: %s: %w", b.name, err))
		}
	}
	b.p2pIOVA = b.p2pIOVA[:0]
}

// barHandler serves trapped BAR accesses: the MSI-X table is emulated,
// everything else (PBA, registers sharing the MSI-X pages, unmappable BARs)
// is forwarded to the device with pread/pwrite at the access's width.
type barHandler struct {
	p *PCIDevice
	b *barState
}

func (h barHandler) Read(offset uint64, data []byte) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.countTrap(h.b, offset, len(data))
	if m := p.msix; m != nil && m.tableBAR == h.b.index && m.inTable(offset, len(data)) {
		m.read(offset-m.tableOff, data)
		return
	}
	if m := p.msix; m != nil && m.pbaBAR == h.b.index && m.inPBA(offset, len(data)) {
		if offset < m.pbaOff {
			fill(data, 0) // straddles the PBA's start: not an aligned PBA access
			return
		}
		m.readPBA(offset-m.pbaOff, data)
		return
	}
	if offset >= h.b.region.Size || uint64(len(data)) > h.b.region.Size-offset || h.b.region.Flags&uapi.VFIORegionInfoFlagRead == 0 {
		fill(data, 0xff)
		return
	}
	if _, err := p.dev.ReadAt(data, int64(h.b.region.Offset+offset)); err != nil {
		fill(data, 0xff)
	}
}

func (h barHandler) Write(offset uint64, data []byte) {
	p := h.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.countTrap(h.b, offset, len(data))
	if m := p.msix; m != nil && m.tableBAR == h.b.index && m.inTable(offset, len(data)) {
		m.write(p, offset-m.tableOff, data)
		return
	}
	if m := p.msix; m != nil && m.pbaBAR == h.b.index && m.inPBA(offset, len(data)) {
		return // the PBA is read-only
	}
	if offset >= h.b.region.Size || uint64(len(data)) > h.b.region.Size-offset || h.b.region.Flags&uapi.VFIORegionInfoFlagWrite == 0 {
		return
	}
	p.dev.WriteAt(data, int64(h.b.region.Offset+offset))
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

// Close stops interrupts, removes memslots and DMA mappings, unmaps the
// BARs, resets the device (after the guest is gone) and closes it.
func (p *PCIDevice) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	if p.msix != nil {
		errs = append(errs, p.msix.close(p))
	}
	if p.msi != nil {
		errs = append(errs, p.msi.close(p))
	}
	if p.intx != nil {
		errs = append(errs, p.intx.close(p))
	}
	for _, b := range p.bars {
		if b == nil {
			continue
		}
		if p.cfg.Memslots != nil {
			p.removeSlots(b)
		}
		if p.cfg.P2P != nil {
			p.unmapP2P(b)
		}
		for _, m := range b.maps {
			if err := p.dev.Munmap(m); err != nil {
				errs = append(errs, fmt.Errorf("vfio: %s: munmap: %w", b.name, err))
			}
		}
		b.maps, b.direct = nil, nil
	}
	if p.canReset {
		if err := p.dev.Reset(); err != nil {
			errs = append(errs, fmt.Errorf("vfio: %s: reset after use: %w", p.cfg.Name, err))
		}
	}
	if err := p.dev.Close(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func closeFD(fd int) error { return unix.Close(fd) }
