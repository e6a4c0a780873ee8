package vfio

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// MSI-X capability registers and table layout (PCI Local Bus 3.0 §6.8.2).
const (
	msixCtrlEnable  = 1 << 15
	msixCtrlMaskAll = 1 << 14
	msixVecMasked   = 1 << 0
)

type msixEntry struct{ addrLo, addrHi, data, ctrl uint32 }

// msixState emulates the MSI-X capability, vector table and PBA. The host
// kernel owns the device's real table; guest vectors become VFIO eventfds
// bound to KVM GSIs through target (a *irq.Vectors).
//
// The device's own PBA says nothing about the guest's masking (the host
// kernel keeps the real vectors unmasked), so the PBA is emulated: a vector
// masked by the guest has no irqfd, so when the device fires it VFIO's
// signal stays in the vector's eventfd. A guest read of the PBA drains
// those eventfds into pending, and unmasking a pending vector delivers it
// once (a signal not yet drained is delivered by KVM itself when the irqfd
// is assigned, since KVM checks the eventfd then).
type msixState struct {
	cap              int
	n                int
	tableBAR, pbaBAR int
	tableOff, pbaOff uint64
	entries          []msixEntry
	pending          []uint64 // PBA bits, one per vector
	reported         []irq.MSIMessage
	invalid          []bool // an unmasked vector has an address KVM cannot route; reported once
	enabled, fmask   bool
	vfioOn           bool
	irqfds           *irq.Vectors
	target           msix.Target
	fds              []int32
	vfioCount        uint32
}

// newMSIX validates the device's MSI-X capability at off against its BARs
// and VFIO's MSI-X count; nil (no error) means VFIO offers no MSI-X and the
// capability is hidden.
func (p *PCIDevice) newMSIX(phys []byte, off int) (*msixState, error) {
	ii, err := p.dev.IRQInfo(uapi.VFIOPCIMSIXIRQIndex)
	if err != nil {
		return nil, fmt.Errorf("vfio: %s: %w", p.cfg.Name, err)
	}
	if ii.Count == 0 {
		p.warn(fmt.Sprintf("%s: VFIO offers no MSI-X vectors; the MSI-X capability is hidden", p.cfg.Name))
		return nil, nil
	}
	ctrl := le16(phys[off+2:])
	t, pb := le32(phys[off+4:]), le32(phys[off+8:])
	m := &msixState{
		cap: off, n: int(ctrl&0x7ff) + 1,
		tableBAR: int(t & 7), tableOff: uint64(t &^ 7),
		pbaBAR: int(pb & 7), pbaOff: uint64(pb &^ 7),
		vfioCount: ii.Count,
	}
	check := func(what string, bar int, o, size uint64) error {
		if bar >= pci.NumBARs || p.bars[bar] == nil || p.bars[bar].kind == pci.BARIO {
			return fmt.Errorf("vfio: %s: MSI-X %s in BAR%d, which is not a memory BAR of the device", p.cfg.Name, what, bar)
		}
		if o+size > p.bars[bar].region.Size {
			return fmt.Errorf("vfio: %s: MSI-X %s [%#x, %#x) does not fit BAR%d (%#x bytes)", p.cfg.Name, what, o, o+size, bar, p.bars[bar].region.Size)
		}
		return nil
	}
	if err := check("table", m.tableBAR, m.tableOff, uint64(m.n)*msix.EntrySize); err != nil {
		return nil, err
	}
	if err := check("PBA", m.pbaBAR, m.pbaOff, msix.PBASize(m.n)); err != nil {
		return nil, err
	}
	m.entries = make([]msixEntry, m.n)
	m.pending = make([]uint64, (m.n+63)/64)
	m.reported = make([]irq.MSIMessage, m.n)
	m.invalid = make([]bool, m.n)
	for i := range m.entries {
		m.entries[i].ctrl = msixVecMasked
		m.reported[i].Masked = true
	}
	v := &p.vc
	v.emulate(off, 12)
	v.set16(off+2, ctrl&^(msixCtrlEnable|msixCtrlMaskAll))
	v.wmask[off+3] = 0xc0
	return m, nil
}

// inTable reports whether an access at a BAR offset touches the table.
func (m *msixState) inTable(off uint64, n int) bool {
	end := m.tableOff + uint64(m.n)*msix.EntrySize
	return off < end && off+uint64(n) > m.tableOff
}

// inPBA reports whether an access at a BAR offset of the PBA's BAR touches
// the PBA.
func (m *msixState) inPBA(off uint64, n int) bool {
	return off < m.pbaOff+msix.PBASize(m.n) && off+uint64(n) > m.pbaOff
}

// readPBA serves a PBA read at rel (relative to the PBA): aligned dword or
// qword accesses; anything else reads as zero. The bits read are brought
// up to date first from the eventfds of masked vectors.
func (m *msixState) readPBA(rel uint64, data []byte) {
	msix.ReadPBA(m.pending, m.n, rel, data, m.collectPending)
}

// collectPending sets vector v's pending bit if the device signalled it
// while the guest had it masked.
func (m *msixState) collectPending(v int) {
	if m.vfioOn && m.reported[v].Masked && m.irqfds != nil && m.irqfds.TakePending(v) {
		m.pending[v/64] |= 1 << (v % 64)
	}
}

// read serves a table read at rel (relative to the table): aligned dword or
// qword accesses; anything else reads as zero.
func (m *msixState) read(rel uint64, data []byte) {
	fill(data, 0)
	n := uint64(len(data))
	if (n != 4 && n != 8) || rel%n != 0 || rel+n > uint64(m.n)*msix.EntrySize {
		return
	}
	binary.LittleEndian.PutUint32(data, m.dword(rel))
	if n == 8 {
		binary.LittleEndian.PutUint32(data[4:], m.dword(rel+4))
	}
}

func (m *msixState) dword(rel uint64) uint32 {
	e := &m.entries[rel/msix.EntrySize]
	switch rel % msix.EntrySize {
	case 0:
		return e.addrLo
	case 4:
		return e.addrHi
	case 8:
		return e.data
	}
	return e.ctrl
}

// write serves a table write: only aligned dword/qword writes inside the
// table count; reserved bits (address 1:0, vector control 31:1) are dropped.
func (m *msixState) write(p *PCIDevice, rel uint64, data []byte) {
	n := uint64(len(data))
	if (n != 4 && n != 8) || rel%n != 0 || rel+n > uint64(m.n)*msix.EntrySize {
		return
	}
	m.setDword(rel, binary.LittleEndian.Uint32(data))
	if n == 8 {
		m.setDword(rel+4, binary.LittleEndian.Uint32(data[4:]))
	}
	m.reconcile(p, int(rel/msix.EntrySize))
}

func (m *msixState) setDword(rel uint64, v uint32) {
	e := &m.entries[rel/msix.EntrySize]
	switch rel % msix.EntrySize {
	case 0:
		e.addrLo = v &^ 3
	case 4:
		e.addrHi = v
	case 8:
		e.data = v
	default:
		e.ctrl = v & msixVecMasked
	}
}

// validMSIAddress reports whether a guest MSI address is one KVM can route
// on x86: the 0xFEExxxxx interrupt window, upper half zero.
func validMSIAddress(addr uint64) bool { return addr>>20 == 0xfee }

// reconcile brings vector v's KVM route in line with the table.
func (m *msixState) reconcile(p *PCIDevice, v int) {
	e := &m.entries[v]
	msg := irq.MSIMessage{
		Addr:   uint64(e.addrHi)<<32 | uint64(e.addrLo),
		Data:   e.data,
		Masked: e.ctrl&msixVecMasked != 0 || m.fmask || !m.enabled || v >= int(m.vfioCount),
	}
	if !msg.Masked && !validMSIAddress(msg.Addr) {
		if !m.invalid[v] {
			p.report(fmt.Errorf("vfio: %s: guest unmasked MSI-X vector %d with address %#x outside the MSI window 0xfee00000-0xfeefffff; vector left masked", p.cfg.Name, v, msg.Addr))
		}
		m.invalid[v] = true
		msg.Masked = true
	} else if !msg.Masked {
		m.invalid[v] = false
	}
	if msg != m.reported[v] {
		m.reported[v] = msg
		m.target.VectorChanged(v, msg)
	}
	if !msg.Masked && m.pending[v/64]&(1<<(v%64)) != 0 {
		// Taken from the eventfd while masked: deliver it now, once.
		m.pending[v/64] &^= 1 << (v % 64)
		m.target.Signal(v)
	}
}

// controlWritten applies a write to Message Control: enabling MSI-X turns
// INTx off and hands VFIO one eventfd per vector; disabling reverses it.
func (m *msixState) controlWritten(p *PCIDevice) {
	ctrl := le16(p.vc.val[m.cap+2:])
	en, fm := ctrl&msixCtrlEnable != 0, ctrl&msixCtrlMaskAll != 0
	if en == m.enabled && fm == m.fmask {
		return
	}
	if en && !m.vfioOn {
		p.intxOff()
		if err := p.dev.SetIRQEventFDs(uapi.VFIOPCIMSIXIRQIndex, 0, uapi.VFIOIRQSetActionTrigger, m.fds); err != nil {
			p.report(fmt.Errorf("vfio: %s: enable MSI-X: %w", p.cfg.Name, err))
		} else {
			m.vfioOn = true
		}
	}
	m.enabled, m.fmask = en, fm
	m.target.ControlChanged(en, fm)
	for v := range m.entries {
		m.reconcile(p, v)
	}
	if !en && m.vfioOn {
		// Nothing pending survives MSI-X off: a later enable must not
		// deliver a message from before.
		clear(m.pending)
		if err := p.dev.DisableIRQs(uapi.VFIOPCIMSIXIRQIndex); err != nil {
			p.report(fmt.Errorf("vfio: %s: disable MSI-X: %w", p.cfg.Name, err))
		}
		m.vfioOn = false
		p.intxBack()
	}
}

func (m *msixState) close(p *PCIDevice) error {
	var err error
	if m.vfioOn {
		err = p.dev.DisableIRQs(uapi.VFIOPCIMSIXIRQIndex)
		m.vfioOn = false
	}
	if m.irqfds != nil {
		if cerr := m.irqfds.Close(); err == nil {
			err = cerr
		}
	}
	return err
}
