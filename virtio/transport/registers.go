// The register file of BAR4 (common configuration, ISR, device
// configuration, doorbells) and the PCI configuration access window: every
// byte the guest writes here is untrusted and validated.

package transport

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/virtio"
)

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
			if err := irq.SignalEventFD(t.queues[q].notifyFD); err != nil {
				t.report(fmt.Errorf("virtio-pci: queue %d notify: %w", q, err))
			}
		} else if n := t.badDoorbells.Add(1); n&(n-1) == 0 {
			t.report(fmt.Errorf("virtio-pci type %d: doorbell for queue %d, the device has %d: ignored (%d such doorbells so far)", t.dev.Type(), q, len(t.queues), n))
		}
	}
}

// +checklocks:t.mu
func (t *Transport) selected() *queueState {
	if int(t.queueSel) < len(t.queues) {
		return &t.queues[t.queueSel]
	}
	return nil
}

// commonImage renders struct virtio_pci_common_cfg (under t.mu).
// +checklocks:t.mu
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
// +checklocks:t.mu
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
