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

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue"
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
	Router irq.Router
	// Notifier binds queue doorbells to ioeventfds.
	Notifier irq.Notifier
	// OnError, if set, hears about errors that have no caller to return to:
	// guest protocol violations (the device is then marked
	// DEVICE_NEEDS_RESET) and failures to program KVM.
	OnError func(error)
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
	msix    *msix.Capability
	irqfds  *irq.Vectors
	offered uint64
	pciCfg  int // offset of the VIRTIO_PCI_CAP_PCI_CFG capability

	mu sync.Mutex
	// +checklocks:mu
	devFeatSel uint32
	// +checklocks:mu
	drvFeatSel uint32
	// +checklocks:mu
	drvFeatures uint64
	// +checklocks:mu
	status uint8
	// +checklocks:mu
	queueSel uint16
	queues   []queueState // the slice is fixed at New; its elements' plain fields are guarded by mu
	// +checklocks:mu
	owned []bool // queues the EventFDOwner took at the last activation
	// +checklocks:mu
	running bool
	// +checklocks:mu
	done chan struct{}

	needsReset   atomic.Bool
	isr          atomic.Uint32
	generation   atomic.Uint32
	configVector atomic.Uint32
	notifyExits  atomic.Uint64
	// badDoorbells counts doorbells for queues the device does not have;
	// only the 1st, 2nd, 4th, 8th... are reported, so a guest looping on
	// one costs no allocation per exit.
	badDoorbells atomic.Uint64

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
		fd, err := irq.NewEventFD()
		if err != nil {
			return fmt.Errorf("virtio-pci: queue %d notify: %w", i, err)
		}
		t.queues[i].notifyFD = fd
	}
	t.configVector.Store(virtio.NoVector)
	fd, err := irq.NewEventFD()
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
	irqfds, err := irq.NewVectors(t.cfg.Router, fmt.Sprintf("virtio device type %d MSI-X", t.dev.Type()), nvec, t.report)
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

	msix, err := msix.New(cs, nvec, MSIXBAR, msixTableOff, msixPBAOff, irqfds)
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

// +checklocks:t.mu
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
func (t *Transport) MSIX() *msix.Capability { return t.msix }

// IRQFDs returns the per-vector interrupt eventfds.
func (t *Transport) IRQFDs() *irq.Vectors { return t.irqfds }

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
