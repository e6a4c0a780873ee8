// Package transport is the virtio 1.x modern PCI transport (virtio spec 4.1):
// a PCI endpoint 1af4:(0x1040+type), revision 1, whose vendor capabilities
// point at the common configuration, notification, ISR and device
// configuration structures in one 64-bit BAR (BAR4), with MSI-X (table and
// PBA) in a 32-bit BAR (BAR1).
//
// The data path never involves hpcvmm's vCPU threads: each queue's notify
// address is bound to an eventfd with KVM ioeventfd, each MSI-X vector to an
// eventfd with KVM irqfd, and the device runs on its own goroutine that
// polls the notify eventfds. A notify write that still exits to hpcvmm (no
// ioeventfd registered, or an unexpected access width) is forwarded to the
// same eventfd and counted in NotifyExits.
package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
	"github.com/hpcvmm/hpcvmm/vmm/bus"
	"github.com/hpcvmm/hpcvmm/vmm/pci"
)

// PCI identity and BAR layout.
const (
	VendorID       = 0x1af4
	DeviceIDBase   = 0x1040
	Revision       = 1
	SubsystemID    = 0x1100
	MSIXBAR        = 1
	MSIXBARSize    = 0x1000
	msixTableOff   = 0x000
	msixPBAOff     = 0x800
	RegsBAR        = 4
	RegsBARSize    = 0x4000
	CommonOffset   = 0x0000
	CommonLength   = 0x38 // struct virtio_pci_common_cfg through queue_device
	ISROffset      = 0x1000
	ISRLength      = 4
	DeviceOffset   = 0x2000
	NotifyOffset   = 0x3000
	regionSize     = 0x1000
	NotifyMultiple = 4 // notify_off_multiplier: queue q's doorbell is NotifyOffset + 4q
	// NotifyWidth is the doorbell write width bound to the ioeventfd: the
	// driver writes the 16-bit queue index (no VIRTIO_F_NOTIFICATION_DATA).
	NotifyWidth = 2
)

// Vendor capability cfg_type values (virtio 4.1.4).
const (
	capCommon = 1
	capNotify = 2
	capISR    = 3
	capDevice = 4
	capPCICfg = 5
)

// common configuration register offsets (virtio 4.1.4.3).
const (
	ccDeviceFeatureSelect = 0
	ccDeviceFeature       = 4
	ccDriverFeatureSelect = 8
	ccDriverFeature       = 12
	ccConfigMSIXVector    = 16
	ccNumQueues           = 18
	ccDeviceStatus        = 20
	ccConfigGeneration    = 21
	ccQueueSelect         = 22
	ccQueueSize           = 24
	ccQueueMSIXVector     = 26
	ccQueueEnable         = 28
	ccQueueNotifyOff      = 30
	ccQueueDescLo         = 32
	ccQueueDescHi         = 36
	ccQueueDriverLo       = 40
	ccQueueDriverHi       = 44
	ccQueueDeviceLo       = 48
	ccQueueDeviceHi       = 52
)

// commonFields lists every field (offset, width) in address order; writes
// are applied field by field so any access width works.
var commonFields = [...][2]int{
	{ccDeviceFeatureSelect, 4}, {ccDeviceFeature, 4}, {ccDriverFeatureSelect, 4}, {ccDriverFeature, 4},
	{ccConfigMSIXVector, 2}, {ccNumQueues, 2}, {ccDeviceStatus, 1}, {ccConfigGeneration, 1},
	{ccQueueSelect, 2}, {ccQueueSize, 2}, {ccQueueMSIXVector, 2}, {ccQueueEnable, 2}, {ccQueueNotifyOff, 2},
	{ccQueueDescLo, 4}, {ccQueueDescHi, 4}, {ccQueueDriverLo, 4}, {ccQueueDriverHi, 4}, {ccQueueDeviceLo, 4}, {ccQueueDeviceHi, 4},
}

// Config wires a transport to the VM.
type Config struct {
	// Memory is guest RAM, for the virtqueues.
	Memory queue.GuestMemory
	// Router binds MSI-X vectors to KVM GSIs and irqfds.
	Router pci.InterruptRouter
	// Notifier binds queue doorbells to ioeventfds.
	Notifier pci.Notifier
	// OnError, if set, hears about errors that have no caller to return to:
	// guest protocol violations (the device is then marked
	// DEVICE_NEEDS_RESET) and failures to program KVM.
	OnError func(error)
}

// QueueFDs describe one queue to a device that implements EventFDOwner.
type QueueFDs struct {
	// Enabled reports whether the driver enabled the queue; the other
	// fields are meaningful only then.
	Enabled bool
	// Config is the ring layout the driver programmed.
	Config queue.Config
	// Kick is the queue's notification eventfd: the KVM ioeventfd on its
	// doorbell signals it (and so does a doorbell write that exits).
	Kick int
	// Call is the irqfd eventfd of the queue's MSI-X vector: a write
	// raises the vector in KVM (held by the eventfd while the vector is
	// masked, delivered when the guest unmasks it), or -1 when the driver
	// gave the queue no vector.
	Call int
}

// EventFDOwner is an optional interface of a virtio.Device that waits on
// some of its queues' doorbells itself instead of through the transport's
// goroutine: it polls them on its own workers (one per queue pair, say) or
// hands them to the kernel (vhost: Kick as the vring's kick, Call as its
// call eventfd, so the data path bypasses hpcvmm entirely).
//
// The transport calls TakeEventFDs after DRIVER_OK, just before Activate,
// with one QueueFDs per queue, and fail, which marks the device
// DEVICE_NEEDS_RESET and is safe from any goroutine. The device returns
// which queues it owns: the transport neither polls their Kick eventfds nor
// calls QueueNotify for them. The eventfds stay the transport's: the device
// must not close them and must stop using them in Reset.
type EventFDOwner interface {
	TakeEventFDs(queues []QueueFDs, fail func(error)) (owned []bool)
}

// CallFDOwner is an optional interface of an EventFDOwner that hands the
// Call eventfds of its queues to someone else (vhost): the driver may move
// a queue to another MSI-X vector after DRIVER_OK, and the interrupt
// eventfd must follow it. The transport calls QueueCallChanged under its lock
// when the driver changes the vector of a queue the device owns while the
// device is running; call is the new vector's irqfd eventfd, or -1 when
// the driver gave the queue no vector (VIRTIO_MSI_NO_VECTOR: no
// interrupts). Like the ones in QueueFDs, the eventfd stays the
// transport's.
type CallFDOwner interface {
	QueueCallChanged(q int, call int)
}

type queueState struct {
	max, size            uint16
	vector               atomic.Uint32
	enabled              bool
	desc, driver, device uint64
	q                    *queue.Queue
	notifyFD             int
	ioevent              bool // ioeventfd registered at ioeventAddr
	ioeventAddr          uint64
}

// Transport is one virtio-pci function. It implements pci.Device (through
// the embedded ConfigSpace) and virtio.Interrupter.
type Transport struct {
	*pci.ConfigSpace
	dev     virtio.Device
	cfg     Config
	msix    *pci.MSIX
	irqfds  *pci.IRQFDs
	offered uint64
	pciCfg  int // offset of the VIRTIO_PCI_CAP_PCI_CFG capability

	mu          sync.Mutex
	devFeatSel  uint32
	drvFeatSel  uint32
	drvFeatures uint64
	status      uint8
	queueSel    uint16
	queues      []queueState
	owned       []bool // queues the EventFDOwner took at the last activation
	running     bool
	done        chan struct{}

	needsReset   atomic.Bool
	isr          atomic.Uint32
	generation   atomic.Uint32
	configVector atomic.Uint32
	notifyExits  atomic.Uint64

	stopFD  int
	pollFDs []unix.PollFd
	devFD   int
	drain   [8]byte // worker only
	cfgBuf  [4]byte // VIRTIO_PCI_CAP_PCI_CFG scratch, under the Root's lock
}

func classFor(t uint16) uint32 {
	switch t {
	case virtio.DeviceNet:
		return 0x020000 // network controller, ethernet
	case virtio.DeviceBlock:
		return 0x018000 // mass storage, other
	case virtio.DeviceConsole:
		return 0x078000 // communication controller, other
	}
	return 0xff0000
}

// New builds the PCI function for dev. Add it to a pci.Root, then let
// Root.AssignBARs place its BARs.
func New(dev virtio.Device, cfg Config) (*Transport, error) {
	if cfg.Memory == nil || cfg.Router == nil || cfg.Notifier == nil {
		return nil, errors.New("virtio-pci: new: Memory, Router and Notifier are required")
	}
	sizes := dev.QueueMaxSizes()
	nq := len(sizes)
	if nq == 0 || nq*NotifyMultiple > regionSize {
		return nil, fmt.Errorf("virtio-pci: new device type %d: %d queues outside 1-%d", dev.Type(), nq, regionSize/NotifyMultiple)
	}
	if dev.ConfigSize() > regionSize {
		return nil, fmt.Errorf("virtio-pci: new device type %d: config size %d exceeds %d", dev.Type(), dev.ConfigSize(), regionSize)
	}
	t := &Transport{
		dev:     dev,
		cfg:     cfg,
		offered: dev.Features() | virtio.FeatureVersion1 | virtio.FeatureEventIdx | virtio.FeatureIndirectDesc,
		queues:  make([]queueState, nq),
		stopFD:  -1,
		devFD:   dev.EventFD(),
	}
	for i := range t.queues {
		t.queues[i].notifyFD = -1
	}
	if err := t.init(sizes); err != nil {
		t.closeFDs()
		return nil, err
	}
	return t, nil
}

func (t *Transport) init(sizes []uint16) error {
	for i, s := range sizes {
		if s == 0 || s > queue.MaxSize || s&(s-1) != 0 {
			return fmt.Errorf("virtio-pci: new device type %d: queue %d max size %d not a power of two <= %d", t.dev.Type(), i, s, queue.MaxSize)
		}
		t.queues[i].max, t.queues[i].size = s, s
		t.queues[i].vector.Store(virtio.NoVector)
		fd, err := pci.NewEventFD()
		if err != nil {
			return fmt.Errorf("virtio-pci: queue %d notify: %w", i, err)
		}
		t.queues[i].notifyFD = fd
	}
	t.configVector.Store(virtio.NoVector)
	fd, err := pci.NewEventFD()
	if err != nil {
		return fmt.Errorf("virtio-pci: stop: %w", err)
	}
	t.stopFD = fd
	for i := range t.queues {
		t.pollFDs = append(t.pollFDs, unix.PollFd{Fd: int32(t.queues[i].notifyFD), Events: unix.POLLIN})
	}
	t.pollFDs = append(t.pollFDs, unix.PollFd{Fd: int32(t.stopFD), Events: unix.POLLIN})
	if t.devFD >= 0 {
		t.pollFDs = append(t.pollFDs, unix.PollFd{Fd: int32(t.devFD), Events: unix.POLLIN})
	}

	typ := t.dev.Type()
	cs := pci.NewConfigSpace(pci.Header{
		VendorID: VendorID, DeviceID: DeviceIDBase + typ, Revision: Revision,
		SubsystemVendorID: VendorID, Subsystem: SubsystemID, Class: classFor(typ),
	})
	t.ConfigSpace = cs
	if err := cs.SetBAR(MSIXBAR, pci.BARSpec{Size: MSIXBARSize, Kind: pci.BARMem32}); err != nil {
		return err
	}
	if err := cs.SetBAR(RegsBAR, pci.BARSpec{Size: RegsBARSize, Kind: pci.BARMem64, Handler: regs{t}}); err != nil {
		return err
	}
	nvec := len(t.queues) + 1
	irqfds, err := pci.NewIRQFDs(t.cfg.Router, nvec, t.report)
	if err != nil {
		return err
	}
	t.irqfds = irqfds
	caps := []struct {
		typ      uint8
		off, len uint32
		extra    []byte
	}{
		{capCommon, CommonOffset, CommonLength, nil},
		{capNotify, NotifyOffset, uint32(len(t.queues) * NotifyMultiple), binary.LittleEndian.AppendUint32(nil, NotifyMultiple)},
		{capISR, ISROffset, ISRLength, nil},
		{capDevice, DeviceOffset, uint32(t.dev.ConfigSize()), nil},
	}
	for _, c := range caps {
		if c.typ == capDevice && c.len == 0 {
			continue
		}
		if _, err := cs.AddCapability(pci.CapIDVendor, vendorCap(c.typ, RegsBAR, c.off, c.len, c.extra)); err != nil {
			return err
		}
	}
	// VIRTIO_PCI_CAP_PCI_CFG: a window into the BARs through configuration
	// space, which the spec requires and firmware-style drivers use.
	off, err := cs.AddCapability(pci.CapIDVendor, vendorCap(capPCICfg, 0, 0, 0, make([]byte, 4)))
	if err != nil {
		return err
	}
	t.pciCfg = off
	cs.SetWriteMask(off+4, []byte{0xff})                                           // bar
	cs.SetWriteMask(off+8, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) // offset, length
	cs.SetWriteMask(off+16, []byte{0xff, 0xff, 0xff, 0xff})                        // pci_cfg_data
	cs.OnWrite(off+16, 4, func(int, int) { t.pciCfgAccess(true) })
	cs.OnRead(off+16, 4, func(int, int) { t.pciCfgAccess(false) })

	msix, err := pci.NewMSIX(cs, nvec, MSIXBAR, msixTableOff, msixPBAOff, irqfds)
	if err != nil {
		return err
	}
	t.msix = msix
	cs.SetBARListener(t.barMapped)
	return nil
}

// vendorCap builds a struct virtio_pci_cap body (after cap_vndr, cap_next).
func vendorCap(typ uint8, bar uint8, off, length uint32, extra []byte) []byte {
	b := make([]byte, 14, 14+len(extra))
	b[0] = byte(16 + len(extra)) // cap_len
	b[1] = typ
	b[2] = bar
	binary.LittleEndian.PutUint32(b[6:], off)
	binary.LittleEndian.PutUint32(b[10:], length)
	return append(b, extra...)
}

// BARHandler implements pci.Device: BAR1 is the MSI-X table and PBA, BAR4
// the virtio registers.
func (t *Transport) BARHandler(bar int) bus.Device {
	switch bar {
	case MSIXBAR:
		return t.msix
	case RegsBAR:
		return regs{t}
	}
	return nil
}

func (t *Transport) report(err error) {
	if t.cfg.OnError != nil {
		t.cfg.OnError(err)
	}
}

// fail marks the device broken after a driver protocol violation: the
// driver sees DEVICE_NEEDS_RESET and a configuration-change interrupt.
func (t *Transport) fail(err error) {
	t.report(fmt.Errorf("virtio-pci type %d: device needs reset: %w", t.dev.Type(), err))
	t.needsReset.Store(true)
	t.ConfigChanged()
}

// SignalQueue implements virtio.Interrupter.
func (t *Transport) SignalQueue(q int) {
	if q < 0 || q >= len(t.queues) {
		return
	}
	t.isr.Or(1)
	if v := t.queues[q].vector.Load(); v != virtio.NoVector {
		t.msix.Trigger(int(v))
	}
}

// ConfigChanged implements virtio.Interrupter.
func (t *Transport) ConfigChanged() {
	t.generation.Add(1)
	t.isr.Or(2)
	if v := t.configVector.Load(); v != virtio.NoVector {
		t.msix.Trigger(int(v))
	}
}

// NotifyExits counts queue notifications that reached hpcvmm as MMIO exits
// instead of being absorbed by a KVM ioeventfd. Zero in steady state.
func (t *Transport) NotifyExits() uint64 { return t.notifyExits.Load() }

// Status returns the device status register as the driver reads it.
func (t *Transport) Status() uint8 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.statusLocked()
}

func (t *Transport) statusLocked() uint8 {
	s := t.status
	if t.needsReset.Load() {
		s |= virtio.StatusNeedsReset
	}
	return s
}

// NotifyEventFD returns queue q's notification eventfd (what the ioeventfd
// signals), for tests and diagnostics.
func (t *Transport) NotifyEventFD(q int) int { return t.queues[q].notifyFD }

// Device returns the virtio device behind the transport, so the VMM can
// release device-specific resources (a TAP) after Close.
func (t *Transport) Device() virtio.Device { return t.dev }

// MSIX returns the function's MSI-X capability.
func (t *Transport) MSIX() *pci.MSIX { return t.msix }

// IRQFDs returns the per-vector interrupt eventfds.
func (t *Transport) IRQFDs() *pci.IRQFDs { return t.irqfds }

// barMapped moves the doorbell ioeventfds with BAR4.
func (t *Transport) barMapped(bar int, addr uint64, mapped bool) {
	if bar != RegsBAR {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for i := range t.queues {
		q := &t.queues[i]
		if q.ioevent {
			if err := t.cfg.Notifier.UnregisterIOEventFD(q.ioeventAddr, NotifyWidth, q.notifyFD, 0, false); err != nil {
				t.report(fmt.Errorf("virtio-pci: queue %d: unregister ioeventfd at %#x: %w", i, q.ioeventAddr, err))
			}
			q.ioevent = false
		}
		if mapped {
			a := addr + NotifyOffset + uint64(i)*NotifyMultiple
			if err := t.cfg.Notifier.RegisterIOEventFD(a, NotifyWidth, q.notifyFD, 0, false); err != nil {
				t.report(fmt.Errorf("virtio-pci: queue %d: register ioeventfd at %#x: %w", i, a, err))
				continue
			}
			q.ioevent, q.ioeventAddr = true, a
		}
	}
}

// pciCfgAccess performs a VIRTIO_PCI_CAP_PCI_CFG window access (under the
// Root's lock, from a configuration access).
func (t *Transport) pciCfgAccess(write bool) {
	cs := t.ConfigSpace
	bar := int(cs.Uint8(t.pciCfg + 4))
	off := uint64(cs.Uint32(t.pciCfg + 8))
	n := cs.Uint32(t.pciCfg + 12)
	if n != 1 && n != 2 && n != 4 || off%uint64(n) != 0 {
		return
	}
	h := t.BARHandler(bar)
	if h == nil {
		return
	}
	size := uint64(RegsBARSize)
	if bar == MSIXBAR {
		size = MSIXBARSize
	}
	if off+uint64(n) > size {
		return
	}
	buf := t.cfgBuf[:n]
	if write {
		for i := range buf {
			buf[i] = cs.Uint8(t.pciCfg + 16 + i)
		}
		h.Write(off, buf)
		return
	}
	h.Read(off, buf)
	for i := range buf {
		cs.SetUint8(t.pciCfg+16+i, buf[i])
	}
}

// regs is BAR4: common configuration, ISR, device configuration, doorbells.
type regs struct{ t *Transport }

func region(offset uint64, n int) (base uint64, ok bool) {
	base = offset &^ (regionSize - 1)
	return base, (offset+uint64(n)-1)&^(regionSize-1) == base
}

// Read implements bus.Device for BAR4.
func (r regs) Read(offset uint64, data []byte) {
	clear(data)
	t := r.t
	base, ok := region(offset, len(data))
	if !ok {
		return
	}
	rel := offset - base
	switch base {
	case CommonOffset:
		t.mu.Lock()
		var img [64]byte
		t.commonImage(&img)
		t.mu.Unlock()
		if rel < uint64(len(img)) {
			copy(data, img[rel:])
		}
	case ISROffset:
		// Reading the ISR acknowledges it (INTx semantics; with MSI-X the
		// driver does not read it, but the value stays meaningful).
		if rel == 0 {
			data[0] = byte(t.isr.Swap(0))
		}
	case DeviceOffset:
		if size := uint64(t.dev.ConfigSize()); rel < size {
			n := min(uint64(len(data)), size-rel)
			t.dev.ReadConfig(int(rel), data[:n])
		}
	}
}

// Write implements bus.Device for BAR4.
func (r regs) Write(offset uint64, data []byte) {
	t := r.t
	base, ok := region(offset, len(data))
	if !ok {
		return
	}
	rel := offset - base
	switch base {
	case CommonOffset:
		t.commonWrite(rel, data)
	case DeviceOffset:
		if size := uint64(t.dev.ConfigSize()); rel < size {
			n := min(uint64(len(data)), size-rel)
			t.dev.WriteConfig(int(rel), data[:n])
		}
	case NotifyOffset:
		q := rel / NotifyMultiple
		if q < uint64(len(t.queues)) {
			// Only reached when KVM did not absorb the doorbell.
			t.notifyExits.Add(1)
			if err := pci.SignalEventFD(t.queues[q].notifyFD); err != nil {
				t.report(fmt.Errorf("virtio-pci: queue %d notify: %w", q, err))
			}
		}
	}
}

func (t *Transport) selected() *queueState {
	if int(t.queueSel) < len(t.queues) {
		return &t.queues[t.queueSel]
	}
	return nil
}

// commonImage renders struct virtio_pci_common_cfg (under t.mu).
func (t *Transport) commonImage(img *[64]byte) {
	le := binary.LittleEndian
	le.PutUint32(img[ccDeviceFeatureSelect:], t.devFeatSel)
	switch t.devFeatSel {
	case 0:
		le.PutUint32(img[ccDeviceFeature:], uint32(t.offered))
	case 1:
		le.PutUint32(img[ccDeviceFeature:], uint32(t.offered>>32))
	}
	le.PutUint32(img[ccDriverFeatureSelect:], t.drvFeatSel)
	switch t.drvFeatSel {
	case 0:
		le.PutUint32(img[ccDriverFeature:], uint32(t.drvFeatures))
	case 1:
		le.PutUint32(img[ccDriverFeature:], uint32(t.drvFeatures>>32))
	}
	le.PutUint16(img[ccConfigMSIXVector:], uint16(t.configVector.Load()))
	le.PutUint16(img[ccNumQueues:], uint16(len(t.queues)))
	img[ccDeviceStatus] = t.statusLocked()
	img[ccConfigGeneration] = byte(t.generation.Load())
	le.PutUint16(img[ccQueueSelect:], t.queueSel)
	if q := t.selected(); q != nil {
		le.PutUint16(img[ccQueueSize:], q.size)
		le.PutUint16(img[ccQueueMSIXVector:], uint16(q.vector.Load()))
		if q.enabled {
			le.PutUint16(img[ccQueueEnable:], 1)
		}
		le.PutUint16(img[ccQueueNotifyOff:], t.queueSel)
		le.PutUint64(img[ccQueueDescLo:], q.desc)
		le.PutUint64(img[ccQueueDriverLo:], q.driver)
		le.PutUint64(img[ccQueueDeviceLo:], q.device)
	} else {
		le.PutUint16(img[ccQueueMSIXVector:], virtio.NoVector)
	}
}

// commonWrite merges a write of any width into the register image and
// applies each field it touched, in address order.
func (t *Transport) commonWrite(rel uint64, data []byte) {
	if rel >= CommonLength {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	var img [64]byte
	t.commonImage(&img)
	n := copy(img[rel:CommonLength], data)
	lo, hi := int(rel), int(rel)+n
	le := binary.LittleEndian
	for _, f := range commonFields {
		off, w := f[0], f[1]
		if off >= hi || off+w <= lo {
			continue
		}
		var v uint32
		switch w {
		case 1:
			v = uint32(img[off])
		case 2:
			v = uint32(le.Uint16(img[off:]))
		case 4:
			v = le.Uint32(img[off:])
		}
		t.setField(off, v)
	}
}

func (t *Transport) validVector(v uint32) uint32 {
	if v < uint32(t.msix.Vectors()) {
		return v
	}
	return virtio.NoVector
}

// setField applies one common-configuration field write (under t.mu).
func (t *Transport) setField(off int, v uint32) {
	q := t.selected()
	// Queue layout is frozen once the queue is enabled (virtio 4.1.4.3.2).
	qWritable := q != nil && !q.enabled
	switch off {
	case ccDeviceFeatureSelect:
		t.devFeatSel = v
	case ccDriverFeatureSelect:
		t.drvFeatSel = v
	case ccDriverFeature:
		if t.status&virtio.StatusFeaturesOK != 0 || t.drvFeatSel > 1 {
			return
		}
		shift := 32 * t.drvFeatSel
		t.drvFeatures = t.drvFeatures&^(uint64(0xffffffff)<<shift) | uint64(v)<<shift
	case ccConfigMSIXVector:
		t.configVector.Store(t.validVector(v))
	case ccDeviceStatus:
		t.setStatus(uint8(v))
	case ccQueueSelect:
		t.queueSel = uint16(v)
	case ccQueueSize:
		if qWritable {
			q.size = uint16(v)
		}
	case ccQueueMSIXVector:
		if q != nil {
			nv := t.validVector(v)
			if q.vector.Swap(nv) != nv {
				t.queueVectorChanged(int(t.queueSel), nv)
			}
		}
	case ccQueueEnable:
		if qWritable && v == 1 {
			t.enableQueue(q)
		}
	case ccQueueDescLo, ccQueueDescHi, ccQueueDriverLo, ccQueueDriverHi, ccQueueDeviceLo, ccQueueDeviceHi:
		if !qWritable {
			return
		}
		p := [...]*uint64{&q.desc, &q.driver, &q.device}[(off-ccQueueDescLo)/8]
		if off%8 == 0 {
			*p = *p&^0xffffffff | uint64(v)
		} else {
			*p = *p&0xffffffff | uint64(v)<<32
		}
	}
}

// queueVectorChanged passes a running owned queue's new interrupt
// eventfd to its owner (under t.mu). Queues the transport serves itself
// need nothing: SignalQueue reads the vector on every interrupt.
func (t *Transport) queueVectorChanged(q int, vector uint32) {
	if !t.running || q >= len(t.owned) || !t.owned[q] {
		return
	}
	owner, ok := t.dev.(CallFDOwner)
	if !ok {
		return
	}
	owner.QueueCallChanged(q, t.callFD(vector))
}

// callFD is vector's irqfd eventfd, or -1 for no vector.
func (t *Transport) callFD(vector uint32) int {
	if vector == virtio.NoVector || int(vector) >= t.msix.Vectors() {
		return -1
	}
	return t.irqfds.EventFD(int(vector))
}

func (t *Transport) enableQueue(q *queueState) {
	if q.size > q.max {
		t.fail(fmt.Errorf("queue %d: size %d exceeds maximum %d", t.queueSel, q.size, q.max))
		return
	}
	vq, err := queue.New(t.cfg.Memory, queue.Config{Size: q.size, Desc: q.desc, Driver: q.driver, Device: q.device}, t.drvFeatures)
	if err != nil {
		t.fail(fmt.Errorf("queue %d: %w", t.queueSel, err))
		return
	}
	q.q, q.enabled = vq, true
}

// setStatus runs the device status state machine (under t.mu). Status bits
// only accumulate; writing 0 resets the device.
func (t *Transport) setStatus(v uint8) {
	if v == 0 {
		t.reset()
		return
	}
	old := t.status
	v |= old
	if v&virtio.StatusFeaturesOK != 0 && old&virtio.StatusFeaturesOK == 0 {
		// Accept only a subset of what was offered, including VERSION_1:
		// this is a modern-only device.
		if t.drvFeatures&^t.offered != 0 || t.drvFeatures&virtio.FeatureVersion1 == 0 {
			v &^= virtio.StatusFeaturesOK
		}
	}
	if v&virtio.StatusDriverOK != 0 && old&virtio.StatusDriverOK == 0 {
		if v&virtio.StatusFeaturesOK == 0 {
			v &^= virtio.StatusDriverOK
		} else {
			t.status = v
			t.activate()
			return
		}
	}
	t.status = v
}

func (t *Transport) activate() {
	if t.running || t.needsReset.Load() {
		return
	}
	qs := make([]*queue.Queue, len(t.queues))
	active := make([]bool, len(t.queues))
	for i := range t.queues {
		if t.queues[i].enabled {
			qs[i], active[i] = t.queues[i].q, true
		}
	}
	t.owned = t.owned[:0]
	if owner, ok := t.dev.(EventFDOwner); ok {
		owned := owner.TakeEventFDs(t.queueFDs(), t.fail)
		for i := range active {
			own := i < len(owned) && owned[i]
			if own {
				active[i] = false
			}
			t.owned = append(t.owned, own)
		}
	}
	if err := t.dev.Activate(t.drvFeatures, qs, t); err != nil {
		t.fail(fmt.Errorf("activate: %w", err))
		return
	}
	t.running = true
	t.done = make(chan struct{})
	go t.run(t.done, active)
}

// queueFDs describes every queue for EventFDOwner (under t.mu).
func (t *Transport) queueFDs() []QueueFDs {
	fds := make([]QueueFDs, len(t.queues))
	for i := range t.queues {
		q := &t.queues[i]
		fds[i] = QueueFDs{Enabled: q.enabled, Kick: q.notifyFD, Call: t.callFD(q.vector.Load()),
			Config: queue.Config{Size: q.size, Desc: q.desc, Driver: q.driver, Device: q.device}}
	}
	return fds
}

// reset stops the device goroutine and returns everything the driver
// programmed to its initial value (under t.mu).
func (t *Transport) reset() {
	t.stopWorker()
	t.dev.Reset()
	for i := range t.queues {
		q := &t.queues[i]
		q.size, q.enabled, q.q = q.max, false, nil
		q.desc, q.driver, q.device = 0, 0, 0
		q.vector.Store(virtio.NoVector)
		pci.DrainEventFD(q.notifyFD, t.drain[:])
	}
	t.configVector.Store(virtio.NoVector)
	t.devFeatSel, t.drvFeatSel, t.drvFeatures, t.queueSel = 0, 0, 0, 0
	t.status = 0
	t.needsReset.Store(false)
	t.isr.Store(0)
}

func (t *Transport) stopWorker() {
	if !t.running {
		return
	}
	if err := pci.SignalEventFD(t.stopFD); err != nil {
		t.report(fmt.Errorf("virtio-pci: stop device goroutine: %w", err))
	}
	<-t.done
	pci.DrainEventFD(t.stopFD, t.drain[:])
	t.running = false
}

// run is the device goroutine: it waits on the queue doorbells, the stop
// eventfd and the device's host-side eventfd, and calls the device. It never
// takes t.mu, so a reset on a vCPU thread can wait for it.
func (t *Transport) run(done chan struct{}, active []bool) {
	defer close(done)
	nq := len(t.queues)
	stopIdx := nq
	var drain [8]byte
	broken := false
	call := func(err error) {
		if err != nil && !broken {
			broken = true
			t.fail(err)
		}
	}
	for i := range nq {
		if active[i] {
			call(t.dev.QueueNotify(i))
		}
	}
	fds := t.pollFDs
	for i := range nq {
		// Queues an EventFDOwner took (inactive here) are not polled: their
		// kicks belong to the device's own workers or to the kernel.
		fds[i].Fd = int32(t.queues[i].notifyFD)
		if !active[i] {
			fds[i].Fd = -1
		}
	}
	if len(fds) > nq+1 {
		fds[nq+1].Fd = int32(t.devFD)
	}
	for {
		if _, err := unix.Poll(fds, -1); err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			t.report(fmt.Errorf("virtio-pci type %d: device goroutine poll: %w", t.dev.Type(), err))
			return
		}
		if fds[stopIdx].Revents != 0 {
			return
		}
		for i := range nq {
			if fds[i].Revents&unix.POLLIN == 0 {
				continue
			}
			pci.DrainEventFD(int(fds[i].Fd), drain[:])
			if active[i] && !broken {
				call(t.dev.QueueNotify(i))
			}
		}
		if len(fds) > nq+1 && fds[nq+1].Revents&unix.POLLIN != 0 {
			if broken {
				// Leave host work queued for after the reset; stop polling
				// the fd so it does not spin (restored on the next run).
				fds[nq+1].Fd = -1
			} else {
				call(t.dev.HandleEvent())
			}
		}
	}
}

// Close stops the device and releases its eventfds and KVM bindings.
func (t *Transport) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopWorker()
	t.dev.Reset()
	for i := range t.queues {
		q := &t.queues[i]
		if q.ioevent {
			if err := t.cfg.Notifier.UnregisterIOEventFD(q.ioeventAddr, NotifyWidth, q.notifyFD, 0, false); err != nil {
				t.report(fmt.Errorf("virtio-pci: close queue %d: %w", i, err))
			}
			q.ioevent = false
		}
	}
	var err error
	if t.irqfds != nil {
		err = t.irqfds.Close()
	}
	t.closeFDs()
	return err
}

func (t *Transport) closeFDs() {
	for i := range t.queues {
		if t.queues[i].notifyFD >= 0 {
			unix.Close(t.queues[i].notifyFD)
			t.queues[i].notifyFD = -1
		}
	}
	if t.stopFD >= 0 {
		unix.Close(t.stopFD)
		t.stopFD = -1
	}
}
