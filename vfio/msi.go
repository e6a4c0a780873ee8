package vfio

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// MSI capability Message Control bits (PCI Local Bus 3.0 §6.8.1).
const (
	msiCtrlEnable = 1 << 0
	msiCtrl64     = 1 << 7
	msiCtrlPVM    = 1 << 8
)

// msiCapLen is the MSI capability's length for its Message Control.
func msiCapLen(ctrl uint16) int {
	n := 10
	if ctrl&msiCtrl64 != 0 {
		n += 4
	}
	if ctrl&msiCtrlPVM != 0 {
		n += 10 // reserved upper data word, mask and pending bits
	}
	return n
}

// msiState emulates the MSI capability; vectors are VFIO eventfds bound to
// KVM GSIs through target, like MSI-X.
type msiState struct {
	cap, len   int
	is64, pvm  bool
	max        int // vectors the capability advertises (and VFIO offers)
	on         int // vectors enabled in VFIO, 0 = off
	irqfds     *irq.Vectors
	target     msix.Target
	fds        []int32
	reported   []irq.MSIMessage
	invalidRep bool
}

func (m *msiState) dataOff() int {
	if m.is64 {
		return m.cap + 12
	}
	return m.cap + 8
}

func (m *msiState) maskOff() int { return m.dataOff() + 4 }

// newMSI emulates the MSI capability at off; nil means VFIO offers no MSI
// and the capability is hidden.
func (p *PCIDevice) newMSI(phys []byte, off int) (*msiState, error) {
	ii, err := p.dev.IRQInfo(uapi.VFIOPCIMSIIRQIndex)
	if err != nil {
		return nil, fmt.Errorf("vfio: %s: %w", p.cfg.Name, err)
	}
	if ii.Count == 0 {
		p.warn(fmt.Sprintf("%s: VFIO offers no MSI vectors; the MSI capability is hidden", p.cfg.Name))
		return nil, nil
	}
	ctrl := le16(phys[off+2:])
	mmc := 1 << min((ctrl>>1)&7, 5)
	m := &msiState{cap: off, len: msiCapLen(ctrl), is64: ctrl&msiCtrl64 != 0, pvm: ctrl&msiCtrlPVM != 0}
	m.max = min(mmc, int(ii.Count))
	// Advertise no more vectors than VFIO can enable.
	mmcLog := 0
	for 1<<(mmcLog+1) <= m.max {
		mmcLog++
	}
	m.max = 1 << mmcLog
	if off+m.len > pci.LegacyConfigSize {
		return nil, fmt.Errorf("vfio: %s: MSI capability at %#x runs past the standard config space", p.cfg.Name, off)
	}
	m.reported = make([]irq.MSIMessage, m.max)
	for i := range m.reported {
		m.reported[i].Masked = true
	}
	v := &p.vc
	v.emulate(off, m.len)
	for i := off + 2; i < off+m.len; i++ {
		v.val[i] = 0
	}
	v.set16(off+2, ctrl&(msiCtrl64|msiCtrlPVM)|uint16(mmcLog)<<1)
	v.wmask[off+2] = msiCtrlEnable | 0x70 // enable, Multiple Message Enable
	v.wmask[off+4] = 0xfc
	v.wmask[off+5], v.wmask[off+6], v.wmask[off+7] = 0xff, 0xff, 0xff
	if m.is64 {
		copy(v.wmask[off+8:off+12], []byte{0xff, 0xff, 0xff, 0xff})
	}
	d := m.dataOff()
	v.wmask[d], v.wmask[d+1] = 0xff, 0xff
	if m.pvm {
		mask := uint32(1)<<m.max - 1
		for i := 0; i < 4; i++ {
			v.wmask[m.maskOff()+i] = uint8(mask >> (8 * i))
		}
	}
	return m, nil
}

// update applies the capability's state: enabling (or changing the vector
// count) hands VFIO the eventfds, routes follow the message, masking and
// enable; disabling reverses it and gives INTx back.
func (m *msiState) update(p *PCIDevice) {
	v := &p.vc
	ctrl := le16(v.val[m.cap+2:])
	en := ctrl&msiCtrlEnable != 0
	n := min(1<<min((ctrl>>4)&7, 5), m.max)
	if en && m.on != n {
		if m.on == 0 {
			p.intxOff()
		} else if err := p.dev.DisableIRQs(uapi.VFIOPCIMSIIRQIndex); err != nil {
			p.report(fmt.Errorf("vfio: %s: resize MSI: %w", p.cfg.Name, err))
		}
		m.on = 0
		if err := m.vectors(p); err != nil {
			p.report(err)
		} else if err := p.dev.SetIRQEventFDs(uapi.VFIOPCIMSIIRQIndex, 0, uapi.VFIOIRQSetActionTrigger, m.fds[:n]); err != nil {
			p.report(fmt.Errorf("vfio: %s: enable MSI with %d vectors: %w", p.cfg.Name, n, err))
		} else {
			m.on = n
		}
	}
	addr := uint64(le32(v.val[m.cap+4:]))
	if m.is64 {
		addr |= uint64(le32(v.val[m.cap+8:])) << 32
	}
	data := uint32(le16(v.val[m.dataOff():]))
	var mask uint32
	if m.pvm {
		mask = le32(v.val[m.maskOff():])
	}
	valid := validMSIAddress(addr)
	// Address 0 is not worth a warning: Linux parks a vector that way
	// while MSI is still enabled (free_irq deactivates the interrupt and
	// writes a zeroed message before the driver disables MSI).
	bad := en && !valid && addr != 0
	if bad && !m.invalidRep {
		p.report(fmt.Errorf("vfio: %s: guest enabled MSI with address %#x outside the MSI window 0xfee00000-0xfeefffff; vectors left masked", p.cfg.Name, addr))
	}
	m.invalidRep = bad
	for i := 0; i < m.max; i++ {
		msg := irq.MSIMessage{
			Addr:   addr,
			Data:   data&^uint32(n-1) | uint32(i),
			Masked: !en || i >= m.on || mask&(1<<i) != 0 || !valid,
		}
		if msg != m.reported[i] {
			m.reported[i] = msg
			// Without vectors yet MSI was never on: every message is
			// masked, which is what a fresh vector is.
			if m.target != nil {
				m.target.VectorChanged(i, msg)
			}
		}
	}
	if !en && m.on != 0 {
		if err := p.dev.DisableIRQs(uapi.VFIOPCIMSIIRQIndex); err != nil {
			p.report(fmt.Errorf("vfio: %s: disable MSI: %w", p.cfg.Name, err))
		}
		m.on = 0
		p.intxBack()
	}
}

// vectors makes the MSI eventfds and their irqfd bookkeeping, once, when
// the guest first enables MSI; a device whose driver uses MSI-X or INTx
// never holds them.
func (m *msiState) vectors(p *PCIDevice) error {
	if m.irqfds != nil {
		return nil
	}
	t, err := irq.NewVectors(p.cfg.Router, p.cfg.Name+" MSI", m.max, p.cfg.OnError)
	if err != nil {
		return fmt.Errorf("vfio: %s: enable MSI: %w", p.cfg.Name, err)
	}
	m.irqfds, m.target = t, t
	m.fds = make([]int32, m.max)
	for i := range m.fds {
		m.fds[i] = int32(t.EventFD(i))
	}
	return nil
}

func (m *msiState) close(p *PCIDevice) error {
	var err error
	if m.on != 0 {
		err = p.dev.DisableIRQs(uapi.VFIOPCIMSIIRQIndex)
		m.on = 0
	}
	if m.irqfds != nil {
		if cerr := m.irqfds.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
