// Package transporttest plays a guest's virtio_pci_modern driver against a
// Transport on a pci.Root: it enumerates through configuration mechanism #1,
// finds the virtio vendor capabilities the way Linux does, programs MSI-X
// and the common configuration through MMIO, and sets up queues laid out by
// queuetest.Driver. KVM's role is played by pcitest fakes: a doorbell write
// becomes a write to the ioeventfd the transport registered, and an
// interrupt is a readable irqfd.
package transporttest

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/irq/irqtest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/pcitest"
	"github.com/hpcvmm/hpcvmm/virtio"
	"github.com/hpcvmm/hpcvmm/virtio/queue/queuetest"
	"github.com/hpcvmm/hpcvmm/virtio/transport"
)

// Slot is where Rig puts the device.
const Slot = 2

// Rig is a VM in miniature: buses, root complex, the transport and fakes.
type Rig struct {
	PIO, MMIO *bus.Bus
	Root      *pci.Root
	T         *transport.Transport
	Router    *irqtest.Router
	Notifier  *irqtest.Notifier
	Mem       queuetest.Memory
	Cfg       pcitest.Conf1
	Errors    chan error

	Common, ISR, DevCfg, Notify uint64 // absolute MMIO addresses of the regions
	NotifyMul                   uint32
	MSIXTable                   uint64
}

// NewRig builds the transport for dev over mem, adds it at Slot, places its
// BARs like the VMM does, and locates the virtio regions like Linux does.
func NewRig(dev virtio.Device, mem queuetest.Memory) (*Rig, error) {
	return NewRigReporting(dev, mem, nil)
}

// NewRigReporting is NewRig with the transport's and root's errors going to
// onError (as the VMM's rate-limited log gets them) instead of Errors.
func NewRigReporting(dev virtio.Device, mem queuetest.Memory, onError func(error)) (*Rig, error) {
	r := &Rig{PIO: &bus.Bus{}, MMIO: &bus.Bus{}, Router: irqtest.NewRouter(), Notifier: irqtest.NewNotifier(), Mem: mem, Errors: make(chan error, 64)}
	report := func(err error) {
		select {
		case r.Errors <- err:
		default:
		}
	}
	if onError != nil {
		report = onError
	}
	r.Root = pci.NewRoot(pci.RootConfig{MMIO: r.MMIO, PIO: r.PIO, OnError: report})
	if err := r.PIO.Register(pci.ConfigIOPort, pci.ConfigIOSize, "pci-conf1", r.Root.ConfigIO()); err != nil {
		return nil, err
	}
	t, err := transport.New(dev, transport.Config{Memory: mem, Router: r.Router, Notifier: r.Notifier, OnError: report})
	if err != nil {
		return nil, err
	}
	r.T = t
	if err := r.Root.AddDevice(Slot, "virtio", t); err != nil {
		return nil, err
	}
	w := addrspace.Windows{Mem32: addrspace.Range{GPA: addrspace.Window32Base, Size: addrspace.Window32Size},
		Mem64: addrspace.Range{GPA: 1 << 36, Size: 1 << 36}}
	if err := r.Root.AssignBARs(w); err != nil {
		return nil, err
	}
	r.Cfg = pcitest.Conf1{PIO: r.PIO}
	if err := r.locate(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *Rig) barAddr(bar int) uint64 {
	lo := r.Cfg.Read(Slot, 0, pci.RegBAR0+4*bar, 4)
	if lo&0x6 == 0x4 {
		return uint64(r.Cfg.Read(Slot, 0, pci.RegBAR0+4*bar+4, 4))<<32 | uint64(lo&^0xf)
	}
	return uint64(lo &^ 0xf)
}

// locate follows virtio_pci_find_capability and the MSI-X capability.
func (r *Rig) locate() error {
	found := 0
	for _, off := range r.Cfg.FindCapabilities(Slot, pci.CapIDVendor) {
		typ := r.Cfg.Read(Slot, 0, off+3, 1)
		bar := int(r.Cfg.Read(Slot, 0, off+4, 1))
		rel := uint64(r.Cfg.Read(Slot, 0, off+8, 4))
		if bar >= pci.NumBARs {
			continue
		}
		addr := r.barAddr(bar) + rel
		switch typ {
		case 1:
			r.Common = addr
		case 2:
			r.Notify = addr
			r.NotifyMul = r.Cfg.Read(Slot, 0, off+16, 4)
		case 3:
			r.ISR = addr
		case 4:
			r.DevCfg = addr
		default:
			continue
		}
		found++
	}
	if r.Common == 0 || r.Notify == 0 || r.ISR == 0 {
		return fmt.Errorf("transporttest: virtio capabilities missing (found %d)", found)
	}
	caps := r.Cfg.FindCapabilities(Slot, pci.CapIDMSIX)
	if len(caps) != 1 {
		return fmt.Errorf("transporttest: %d MSI-X capabilities", len(caps))
	}
	tbl := r.Cfg.Read(Slot, 0, caps[0]+4, 4)
	r.MSIXTable = r.barAddr(int(tbl&7)) + uint64(tbl&^7)
	return nil
}

// Read reads n bytes of MMIO at addr (little endian).
func (r *Rig) Read(addr uint64, n int) uint64 {
	var b [8]byte
	if !r.MMIO.Read(addr, b[:n]) {
		return ^uint64(0)
	}
	return binary.LittleEndian.Uint64(b[:])
}

// Write writes the low n bytes of v at addr.
func (r *Rig) Write(addr uint64, n int, v uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], v)
	r.MMIO.Write(addr, b[:n])
}

// Status reads device_status.
func (r *Rig) Status() uint8 { return uint8(r.Read(r.Common+20, 1)) }

// SetStatus writes device_status.
func (r *Rig) SetStatus(s uint8) { r.Write(r.Common+20, 1, uint64(s)) }

// EnableMSIX programs every vector (address 0xfee00000, data 0x30+v),
// unmasks it and enables MSI-X, as pci_alloc_irq_vectors + request_irq do.
func (r *Rig) EnableMSIX(vectors int) {
	off := r.Cfg.FindCapabilities(Slot, pci.CapIDMSIX)[0]
	r.Cfg.Write(Slot, 0, pci.RegCommand, 2, r.Cfg.Read(Slot, 0, pci.RegCommand, 2)|pci.CommandBusMaster)
	r.Cfg.Write(Slot, 0, off+2, 2, 0xc000)
	for v := 0; v < vectors; v++ {
		e := r.MSIXTable + 16*uint64(v)
		r.Write(e, 4, 0xfee00000)
		r.Write(e+4, 4, 0)
		r.Write(e+8, 4, uint64(0x30+v))
		r.Write(e+12, 4, 0)
	}
	r.Cfg.Write(Slot, 0, off+2, 2, 0x8000)
}

// Negotiate runs reset, ACKNOWLEDGE, DRIVER, feature exchange and
// FEATURES_OK, returning the device features offered and the status read
// back (FEATURES_OK set if the device accepted).
func (r *Rig) Negotiate(want uint64) (offered uint64, status uint8) {
	r.SetStatus(0)
	r.SetStatus(virtio.StatusAcknowledge)
	r.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver)
	for sel := uint64(0); sel < 2; sel++ {
		r.Write(r.Common+0, 4, sel)
		offered |= r.Read(r.Common+4, 4) << (32 * sel)
	}
	for sel := uint64(0); sel < 2; sel++ {
		r.Write(r.Common+8, 4, sel)
		r.Write(r.Common+12, 4, (want>>(32*sel))&0xffffffff)
	}
	r.SetStatus(virtio.StatusAcknowledge | virtio.StatusDriver | virtio.StatusFeaturesOK)
	return offered, r.Status()
}

// SetupQueue programs queue q from d with MSI-X vector vec and enables it.
// It returns the vector read back (NoVector if refused).
func (r *Rig) SetupQueue(q int, d *queuetest.Driver, vec uint16) uint16 {
	r.Write(r.Common+22, 2, uint64(q))
	r.Write(r.Common+24, 2, uint64(d.Size))
	c := d.Config()
	// 64-bit fields as two dword writes, as vp_iowrite64_twopart does.
	for i, a := range []uint64{c.Desc, c.Driver, c.Device} {
		r.Write(r.Common+32+8*uint64(i), 4, a&0xffffffff)
		r.Write(r.Common+36+8*uint64(i), 4, a>>32)
	}
	r.Write(r.Common+26, 2, uint64(vec))
	got := uint16(r.Read(r.Common+26, 2))
	r.Write(r.Common+28, 2, 1)
	return got
}

// SetConfigVector writes config_msix_vector and returns the value read back.
func (r *Rig) SetConfigVector(vec uint16) uint16 {
	r.Write(r.Common+16, 2, uint64(vec))
	return uint16(r.Read(r.Common+16, 2))
}

// DriverOK sets DRIVER_OK on top of the current status.
func (r *Rig) DriverOK() { r.SetStatus(r.Status() | virtio.StatusDriverOK) }

// Kick notifies queue q the way KVM would with the ioeventfd registered at
// the queue's doorbell: by signalling that eventfd, no MMIO exit.
func (r *Rig) Kick(q int) error {
	addr := r.Notify + uint64(q)*uint64(r.NotifyMul)
	ev, ok := r.Notifier.Lookup(addr)
	if !ok {
		return fmt.Errorf("transporttest: no ioeventfd at queue %d doorbell %#x", q, addr)
	}
	return irq.SignalEventFD(ev.FD)
}

// KickMMIO notifies queue q with a doorbell write that exits to the VMM.
func (r *Rig) KickMMIO(q int) {
	r.Write(r.Notify+uint64(q)*uint64(r.NotifyMul), 2, uint64(q))
}

// WaitInterrupt waits up to timeout for MSI-X vector vec's irqfd to fire
// and consumes it. It fails if the irqfd is not bound to a GSI (vector
// masked in KVM).
func (r *Rig) WaitInterrupt(vec int, timeout time.Duration) error {
	fd := r.T.IRQFDs().EventFD(vec)
	if _, ok := r.Router.Assigned(fd); !ok {
		return fmt.Errorf("transporttest: vector %d irqfd not assigned", vec)
	}
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	deadline := time.Now().Add(timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("transporttest: no interrupt on vector %d within %v", vec, timeout)
		}
		n, err := unix.Poll(pfd, int(left/time.Millisecond)+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n > 0 {
			var b [8]byte
			irq.DrainEventFD(fd, b[:])
			return nil
		}
	}
}

// Interrupted reports (and consumes) a pending interrupt on vec without
// waiting.
func (r *Rig) Interrupted(vec int) bool {
	var b [8]byte
	return irq.DrainEventFD(r.T.IRQFDs().EventFD(vec), b[:])
}
