package vfio

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/irq/irqtest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/pcitest"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// regionShift places region i at fd offset i<<40, as vfio-pci does.
const regionShift = 40

var irqNames = []string{"intx", "msi", "msix", "err", "req"}

// fakeDev is a VFIO device: config space bytes, BAR backing memory, and a
// log of interrupt and reset calls.
type fakeDev struct {
	mu       sync.Mutex
	flags    uint32
	cfg      []byte
	regions  [uapi.VFIOPCINumRegions]uapi.VFIORegionInfo
	bars     [pci.NumBARs][]byte
	irqs     [5]uint32
	log      []string
	cfgW     []string
	trigger  map[string][]int32 // "msix" -> eventfds given for trigger
	resetErr error
	closed   bool
	mmaps    int
	// pool, when set, hands out mappings kept from earlier fake devices
	// instead of mapping and unmapping address space for every device: the
	// fuzz harness builds a device per input, and those syscalls were a
	// quarter of its time. Nothing writes the mappings (the fake's BAR
	// contents live in bars), so a reused one is as good as a fresh one.
	pool *mmapPool
}

// mmapPool keeps anonymous address-space mappings by size for reuse.
type mmapPool struct {
	mu   sync.Mutex
	free map[int][][]byte
	ours map[*byte]bool
}

func (p *mmapPool) get(size, prot int) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[size]; len(l) > 0 {
		m := l[len(l)-1]
		p.free[size] = l[:len(l)-1]
		return m, nil
	}
	m, err := unix.Mmap(-1, 0, size, prot, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err == nil {
		if p.ours == nil {
			p.free, p.ours = map[int][][]byte{}, map[*byte]bool{}
		}
		p.ours[&m[0]] = true
	}
	return m, err
}

// put takes a mapping back; it reports false for one it did not hand out.
func (p *mmapPool) put(m []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(m) == 0 || !p.ours[&m[0]] {
		return false
	}
	p.free[len(m)] = append(p.free[len(m)], m)
	return true
}

func newFakeDev(cfg []byte) *fakeDev {
	f := &fakeDev{flags: uapi.VFIODeviceFlagsPCI | uapi.VFIODeviceFlagsReset, cfg: cfg, trigger: map[string][]int32{}}
	for i := range f.regions {
		f.regions[i] = uapi.VFIORegionInfo{Index: uint32(i), Offset: uint64(i) << regionShift}
	}
	f.regions[uapi.VFIOPCIConfigRegionIndex].Size = uint64(len(cfg))
	f.regions[uapi.VFIOPCIConfigRegionIndex].Flags = uapi.VFIORegionInfoFlagRead | uapi.VFIORegionInfoFlagWrite
	return f
}

// addBAR defines region i; backing gives it memory for pread/pwrite
// (sizes too large for a test keep it nil and read as ones).
func (f *fakeDev) addBAR(i int, size uint64, mmap, backing bool) *uapi.VFIORegionInfo {
	r := &f.regions[i]
	r.Size = size
	r.Flags = uapi.VFIORegionInfoFlagRead | uapi.VFIORegionInfoFlagWrite
	if mmap {
		r.Flags |= uapi.VFIORegionInfoFlagMmap
	}
	if backing {
		f.bars[i] = make([]byte, size)
	}
	return r
}

func (f *fakeDev) takeLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.log
	f.log = nil
	return l
}

func (f *fakeDev) Info() (uapi.VFIODeviceInfo, error) {
	return uapi.VFIODeviceInfo{Flags: f.flags, NumRegions: uapi.VFIOPCINumRegions, NumIRQs: 5}, nil
}

func (f *fakeDev) RegionInfo(i uint32) (uapi.VFIORegionInfo, error) {
	if int(i) >= len(f.regions) {
		return uapi.VFIORegionInfo{}, unix.EINVAL
	}
	return f.regions[i], nil
}

func (f *fakeDev) IRQInfo(i uint32) (uapi.VFIOIRQInfo, error) {
	if int(i) >= len(f.irqs) {
		return uapi.VFIOIRQInfo{}, unix.EINVAL
	}
	return uapi.VFIOIRQInfo{Index: i, Flags: uapi.VFIOIRQInfoEventFD, Count: f.irqs[i]}, nil
}

func actionName(a uint32) string {
	switch a {
	case uapi.VFIOIRQSetActionTrigger:
		return "trigger"
	case uapi.VFIOIRQSetActionUnmask:
		return "unmask"
	case uapi.VFIOIRQSetActionMask:
		return "mask"
	}
	return fmt.Sprint(a)
}

func (f *fakeDev) SetIRQEventFDs(index, start, action uint32, fds []int32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if int(index) >= len(f.irqs) || start+uint32(len(fds)) > f.irqs[index] {
		return unix.EINVAL
	}
	// VFIO allows one interrupt type at a time.
	for k, v := range f.trigger {
		if k != irqNames[index] && len(v) > 0 && action == uapi.VFIOIRQSetActionTrigger {
			return fmt.Errorf("EINVAL: %s still enabled", k)
		}
	}
	if action == uapi.VFIOIRQSetActionTrigger {
		f.trigger[irqNames[index]] = append([]int32(nil), fds...)
	}
	f.log = append(f.log, fmt.Sprintf("set %s %d+%d %s", irqNames[index], start, len(fds), actionName(action)))
	return nil
}

func (f *fakeDev) SetIRQs(index, start, count, action uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, fmt.Sprintf("irqs %s %d+%d %s", irqNames[index], start, count, actionName(action)))
	return nil
}

func (f *fakeDev) DisableIRQs(index uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.trigger, irqNames[index])
	f.log = append(f.log, "disable "+irqNames[index])
	return nil
}

func (f *fakeDev) Reset() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.log = append(f.log, "reset")
	return f.resetErr
}

func (f *fakeDev) locate(n int, off int64) ([]byte, error) {
	idx, inner := uint64(off)>>regionShift, uint64(off)&(1<<regionShift-1)
	var mem []byte
	switch {
	case idx == uapi.VFIOPCIConfigRegionIndex:
		mem = f.cfg
	case idx < pci.NumBARs:
		mem = f.bars[idx]
	}
	if mem == nil || inner+uint64(n) > uint64(len(mem)) {
		return nil, unix.EINVAL
	}
	return mem[inner : inner+uint64(n)], nil
}

func (f *fakeDev) ReadAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.locate(len(p), off)
	if err != nil {
		return 0, err
	}
	return copy(p, m), nil
}

func (f *fakeDev) WriteAt(p []byte, off int64) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m, err := f.locate(len(p), off)
	if err != nil {
		return 0, err
	}
	if uint64(off)>>regionShift == uapi.VFIOPCIConfigRegionIndex {
		f.cfgW = append(f.cfgW, fmt.Sprintf("%#x=%x", uint64(off)&0xfff, p))
	}
	return copy(m, p), nil
}

func (f *fakeDev) Mmap(off int64, size int, prot int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mmaps++
	if f.pool != nil {
		return f.pool.get(size, prot)
	}
	// Address space only: even a 128 GiB BAR costs nothing until touched.
	return unix.Mmap(-1, 0, size, prot, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
}

func (f *fakeDev) Munmap(mem []byte) error {
	if f.pool != nil && f.pool.put(mem) {
		return nil
	}
	return unix.Munmap(mem)
}

func (f *fakeDev) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return errors.New("closed twice")
	}
	f.closed = true
	return nil
}

// fakeSlots records memslots by slot number.
type fakeSlots struct {
	mu    sync.Mutex
	next  uint32
	slots map[uint32][2]uint64 // gpa, size
	fail  error
}

func newFakeSlots() *fakeSlots { return &fakeSlots{slots: map[uint32][2]uint64{}} }

func (s *fakeSlots) AddMemslot(gpa uint64, mem []byte) (uint32, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return 0, s.fail
	}
	s.next++
	s.slots[s.next] = [2]uint64{gpa, uint64(len(mem))}
	return s.next, nil
}

func (s *fakeSlots) RemoveMemslot(slot uint32) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.slots[slot]; !ok {
		return fmt.Errorf("slot %d not installed", slot)
	}
	delete(s.slots, slot)
	return nil
}

// ranges returns the installed [gpa, gpa+size) ranges sorted.
func (s *fakeSlots) ranges() [][2]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out [][2]uint64
	for _, r := range s.slots {
		out = append(out, [2]uint64{r[0], r[0] + r[1]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// fakeP2P records BAR DMA mappings.
type fakeP2P struct {
	maps  map[uint64]uint64
	calls int
}

func (m *fakeP2P) MapBAR(iova uint64, mem []byte, name string) error {
	m.calls++
	m.maps[iova] = uint64(len(mem))
	return nil
}

func (m *fakeP2P) Unmap(iova uint64) error {
	if _, ok := m.maps[iova]; !ok {
		return fmt.Errorf("no mapping at %#x", iova)
	}
	delete(m.maps, iova)
	return nil
}

// fakeINTx records the resampling irqfd.
type fakeINTx struct {
	log []string
}

func (x *fakeINTx) AssignResampleIRQFD(fd, resample int, gsi uint32) error {
	x.log = append(x.log, fmt.Sprintf("assign gsi %d resample", gsi))
	return nil
}

func (x *fakeINTx) DeassignIRQFD(fd int, gsi uint32) error {
	x.log = append(x.log, fmt.Sprintf("deassign gsi %d", gsi))
	return nil
}

const h100Config = "../testdata/gpu-host-sysfs/0000:00:06.0/config"

// h100 returns a fake VFIO device with the H100 capture's configuration
// space and BARs: BAR0 16 MiB, BAR2 128 GiB, BAR4 32 MiB (64-bit each),
// MSI (16 vectors) and MSI-X (9 vectors, table and PBA in BAR0).
func h100(t testing.TB, msixMappable bool) *fakeDev {
	cfg, err := os.ReadFile(h100Config)
	if err != nil {
		t.Fatalf("H100 fixture missing (it is part of the module, under testdata/): %v", err)
	}
	f := newFakeDev(cfg)
	r0 := f.addBAR(0, 16<<20, true, true)
	if msixMappable {
		r0.MSIXMappable = true
	} else {
		// What older kernels report: everything but the MSI-X table page.
		r0.Sparse = true
		r0.Areas = []uapi.VFIOSparseArea{{Offset: 0, Size: 0xb90000}, {Offset: 0xb91000, Size: 16<<20 - 0xb91000}}
	}
	f.addBAR(2, 128<<30, true, false)
	f.addBAR(4, 32<<20, true, false)
	f.irqs = [5]uint32{1, 16, 9, 1, 1}
	return f
}

// rig is a root complex with a passthrough device in slot 4 and guest-side
// access to configuration space and MMIO.
type rig struct {
	root   *pci.Root
	mmio   *bus.Bus
	conf   pcitest.Conf1
	dev    *PCIDevice
	fake   *fakeDev
	router *irqtest.Router
	slots  *fakeSlots
	p2p    *fakeP2P
	intx   *fakeINTx
	errs   []error
}

const testSlot = 4

// newBareRig returns the root complex and the fake VM services, no device.
func newBareRig(t testing.TB) *rig {
	r := &rig{router: irqtest.NewRouter(), slots: newFakeSlots(), p2p: &fakeP2P{maps: map[uint64]uint64{}}, intx: &fakeINTx{}}
	r.mmio = &bus.Bus{}
	pio := &bus.Bus{}
	r.root = pci.NewRoot(pci.RootConfig{MMIO: r.mmio, PIO: pio})
	require.NoError(t, pio.Register(pci.ConfigIOPort, pci.ConfigIOSize, "conf1", r.root.ConfigIO()))
	r.conf = pcitest.Conf1{PIO: pio}
	return r
}

func newRig(t testing.TB, f *fakeDev, mod func(*Config)) *rig {
	r := newBareRig(t)
	r.fake = f
	cfg := Config{
		Name: "0000:00:06.0", Router: r.router, INTx: r.intx, INTxGSI: 11,
		Memslots: r.slots, P2P: r.p2p,
		OnError: func(err error) { r.errs = append(r.errs, err) },
	}
	if mod != nil {
		mod(&cfg)
	}
	d, err := NewPCIDevice(f, cfg)
	require.NoError(t, err)
	r.dev = d
	require.NoError(t, r.root.AddDevice(testSlot, "gpu", d))
	return r
}

func (r *rig) assign(t testing.TB) {
	w, err := addrspace.NewWindows(5<<30, 46) // RAM ends at 6 GiB: the 64-bit window starts at 6 GiB
	require.NoError(t, err)
	require.NoError(t, r.root.AssignBARs(w))
}

func (r *rig) cfgRead(off, n int) uint32     { return r.conf.Read(testSlot, 0, off, n) }
func (r *rig) cfgWrite(off, n int, v uint32) { r.conf.Write(testSlot, 0, off, n, v) }

func (r *rig) barAddr(t testing.TB, bar int) uint64 {
	a, ok := r.root.BARAddress(testSlot, bar)
	require.True(t, ok, "BAR%d not decoding", bar)
	return a
}

func (r *rig) mmioWrite32(addr uint64, v uint32) {
	var b [4]byte
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
	r.mmio.Write(addr, b[:])
}

func (r *rig) mmioRead32(addr uint64) uint32 {
	var b [4]byte
	r.mmio.Read(addr, b[:])
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func joined(ss []string) string { return strings.Join(ss, "; ") }
