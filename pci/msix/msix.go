// Package msix emulates a PCI MSI-X capability whose vector table and
// pending-bit array live in one BAR of a device: it adds the capability to a
// pci.ConfigSpace, serves guest accesses to the table and PBA (validated:
// the guest controls every byte), keeps the pending bits, and reports
// message and mask changes to a Target (usually an irq.Vectors, which turns
// them into KVM routes and irqfds).
package msix

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/pci"
)

// MSI-X constants (PCI Local Bus 3.0 / PCIe base spec, MSI-X capability).
const (
	EntrySize        = 16
	MaxVectors       = 2048
	msixCtrlEnable   = 1 << 15
	msixCtrlMaskAll  = 1 << 14
	msixEntryMasked  = 1 << 0
	msixCapLen       = 12
	msixEntryAddrLo  = 0
	msixEntryAddrHi  = 4
	msixEntryData    = 8
	msixEntryControl = 12
)

// Target receives MSI-X state changes and signals. Calls are made with
// the Capability's lock held, so a target sees them in order and never concurrently.
type Target interface {
	// VectorChanged reports a change of a vector's message or effective mask.
	VectorChanged(vector int, msg irq.MSIMessage)
	// ControlChanged reports the capability's enable and function-mask bits.
	ControlChanged(enabled, functionMasked bool)
	// Signal delivers vector (unmasked, MSI-X enabled).
	Signal(vector int)
}

// PendingSource is an optional interface of a Target whose vectors can be
// signalled without Trigger: irq.Vectors, whose eventfds a vhost worker
// writes directly. A signal sent while the vector is masked stays in the
// eventfd, and TakePending reports and clears it, so the PBA the guest
// reads shows it pending (MSI-X requires that of a masked vector that
// fired).
type PendingSource interface {
	TakePending(vector int) bool
}

type msixEntry struct {
	addrLo, addrHi, data, ctrl uint32
}

// Capability is an MSI-X capability whose table and PBA live in one BAR of the
// device: it adds the capability to a ConfigSpace, serves the table/PBA as
// the BAR's bus.Device (or part of it), validates guest table accesses, keeps
// the pending bits, and turns everything into Target calls.
type Capability struct {
	mu       sync.Mutex
	cs       *pci.ConfigSpace
	cap      int
	n        int
	tableOff uint64
	pbaOff   uint64
	entries  []msixEntry
	pending  []uint64
	reported []irq.MSIMessage
	enabled  bool
	fmask    bool
	target   Target
	source   PendingSource // target's, if it is one
}

// PBASize returns the PBA's size in bytes for n vectors (whole qwords).
func PBASize(n int) uint64 { return uint64((n + 63) / 64 * 8) }

// New adds an MSI-X capability with vectors entries to cs, with the table
// at tableOffset and the PBA at pbaOffset of BAR bar (offsets 8-byte aligned,
// regions inside the BAR and not overlapping).
func New(cs *pci.ConfigSpace, vectors, bar int, tableOffset, pbaOffset uint32, target Target) (*Capability, error) {
	if vectors < 1 || vectors > MaxVectors {
		return nil, fmt.Errorf("msix: MSI-X: %d vectors outside 1-%d", vectors, MaxVectors)
	}
	spec := cs.BAR(bar)
	if spec.Kind != pci.BARMem32 && spec.Kind != pci.BARMem64 {
		return nil, fmt.Errorf("msix: MSI-X: BAR%d is not a memory BAR", bar)
	}
	tEnd := uint64(tableOffset) + uint64(vectors)*EntrySize
	pEnd := uint64(pbaOffset) + PBASize(vectors)
	if tableOffset%8 != 0 || pbaOffset%8 != 0 || tEnd > spec.Size || pEnd > spec.Size ||
		(uint64(tableOffset) < pEnd && uint64(pbaOffset) < tEnd) {
		return nil, fmt.Errorf("msix: MSI-X: table %#x+%#x / PBA %#x+%#x do not fit BAR%d (%#x bytes) without overlap",
			tableOffset, tEnd-uint64(tableOffset), pbaOffset, pEnd-uint64(pbaOffset), bar, spec.Size)
	}
	var body [msixCapLen - 2]byte
	binary.LittleEndian.PutUint16(body[0:], uint16(vectors-1))
	binary.LittleEndian.PutUint32(body[2:], tableOffset|uint32(bar))
	binary.LittleEndian.PutUint32(body[6:], pbaOffset|uint32(bar))
	off, err := cs.AddCapability(pci.CapIDMSIX, body[:])
	if err != nil {
		return nil, err
	}
	cs.SetWriteMask(off+2, []byte{0, 0xc0}) // only enable and function mask
	m := &Capability{
		cs: cs, cap: off, n: vectors, tableOff: uint64(tableOffset), pbaOff: uint64(pbaOffset),
		entries:  make([]msixEntry, vectors),
		pending:  make([]uint64, (vectors+63)/64),
		reported: make([]irq.MSIMessage, vectors),
		target:   target,
	}
	m.source, _ = target.(PendingSource)
	for i := range m.entries {
		m.entries[i].ctrl = msixEntryMasked // reset state: every vector masked
		m.reported[i].Masked = true
	}
	cs.OnWrite(off+2, 2, func(int, int) { m.controlWritten() })
	return m, nil
}

// Offset returns the capability's configuration-space offset.
func (m *Capability) Offset() int { return m.cap }

// Vectors returns the table size.
func (m *Capability) Vectors() int { return m.n }

// controlWritten runs under the Root's lock after the guest wrote the
// message control word.
func (m *Capability) controlWritten() {
	ctrl := m.cs.Uint16(m.cap + 2)
	m.mu.Lock()
	defer m.mu.Unlock()
	en, fm := ctrl&msixCtrlEnable != 0, ctrl&msixCtrlMaskAll != 0
	if en == m.enabled && fm == m.fmask {
		return
	}
	m.enabled, m.fmask = en, fm
	m.target.ControlChanged(en, fm)
	for v := range m.entries {
		m.reconcile(v)
	}
}

// reconcile reports vector v's effective state if it changed and delivers a
// pending message once the vector is deliverable.
func (m *Capability) reconcile(v int) {
	e := &m.entries[v]
	msg := irq.MSIMessage{
		Addr:   uint64(e.addrHi)<<32 | uint64(e.addrLo),
		Data:   e.data,
		Masked: e.ctrl&msixEntryMasked != 0 || m.fmask || !m.enabled,
	}
	if msg != m.reported[v] {
		m.reported[v] = msg
		m.target.VectorChanged(v, msg)
	}
	if !msg.Masked && m.pending[v/64]&(1<<(v%64)) != 0 {
		m.pending[v/64] &^= 1 << (v % 64)
		m.target.Signal(v)
	}
}

// Trigger raises vector: delivered now if deliverable, else its pending bit
// is set (masked) or it is dropped (MSI-X disabled; there is no INTx here).
// Safe from any goroutine; allocation-free.
func (m *Capability) Trigger(vector int) {
	if vector < 0 || vector >= m.n {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.enabled {
		return
	}
	if m.fmask || m.entries[vector].ctrl&msixEntryMasked != 0 {
		m.pending[vector/64] |= 1 << (vector % 64)
		return
	}
	m.target.Signal(vector)
}

// Read serves a guest read at a BAR offset: table and PBA accept aligned
// dword and qword accesses; everything else reads as zero.
func (m *Capability) Read(offset uint64, data []byte) {
	for i := range data {
		data[i] = 0
	}
	n := uint64(len(data))
	if (n != 4 && n != 8) || offset%n != 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case offset >= m.tableOff && offset-m.tableOff < uint64(m.n)*EntrySize:
		rel := offset - m.tableOff
		m.readDword(rel, data[:4])
		if n == 8 {
			m.readDword(rel+4, data[4:])
		}
	case offset >= m.pbaOff && offset-m.pbaOff < PBASize(m.n):
		ReadPBA(m.pending, m.n, offset-m.pbaOff, data, m.collectPending)
	}
}

// ReadPBA serves a guest read of a pending-bit array of vectors entries at
// rel bytes into it: an aligned dword or qword inside the array, else zeros.
// collect(v) runs first for every vector the read covers, so a caller can
// fold in signals that arrived while the vector was masked. It is shared by
// emulated devices and passed-through ones, whose PBA hpcvmm emulates too.
func ReadPBA(pending []uint64, vectors int, rel uint64, data []byte, collect func(v int)) {
	clear(data)
	n := uint64(len(data))
	if (n != 4 && n != 8) || rel%n != 0 || rel+n > PBASize(vectors) {
		return
	}
	for v := int(rel * 8); v < min(int((rel+n)*8), vectors); v++ {
		collect(v)
	}
	q := pending[rel/8]
	if n == 8 {
		binary.LittleEndian.PutUint64(data, q)
	} else {
		binary.LittleEndian.PutUint32(data, uint32(q>>(8*(rel%8))))
	}
}

// collectPending sets vector v's pending bit if its target holds a signal
// that arrived while v was masked.
func (m *Capability) collectPending(v int) {
	if m.source != nil && m.enabled && m.reported[v].Masked && m.source.TakePending(v) {
		m.pending[v/64] |= 1 << (v % 64)
	}
}

func (m *Capability) readDword(rel uint64, out []byte) {
	e := &m.entries[rel/EntrySize]
	var v uint32
	switch rel % EntrySize {
	case msixEntryAddrLo:
		v = e.addrLo
	case msixEntryAddrHi:
		v = e.addrHi
	case msixEntryData:
		v = e.data
	case msixEntryControl:
		v = e.ctrl
	}
	binary.LittleEndian.PutUint32(out, v)
}

// Write serves a guest write at a BAR offset. Only aligned dword and qword
// writes inside the table take effect; reserved bits (address bits 1:0,
// vector control bits 31:1) are dropped; the PBA is read-only.
func (m *Capability) Write(offset uint64, data []byte) {
	n := uint64(len(data))
	if (n != 4 && n != 8) || offset%n != 0 || offset < m.tableOff || offset-m.tableOff >= uint64(m.n)*EntrySize {
		return
	}
	rel := offset - m.tableOff
	m.mu.Lock()
	defer m.mu.Unlock()
	m.writeDword(rel, binary.LittleEndian.Uint32(data))
	if n == 8 {
		m.writeDword(rel+4, binary.LittleEndian.Uint32(data[4:]))
	}
	m.reconcile(int(rel / EntrySize))
}

func (m *Capability) writeDword(rel uint64, v uint32) {
	e := &m.entries[rel/EntrySize]
	switch rel % EntrySize {
	case msixEntryAddrLo:
		e.addrLo = v &^ 3
	case msixEntryAddrHi:
		e.addrHi = v
	case msixEntryData:
		e.data = v
	case msixEntryControl:
		e.ctrl = v & msixEntryMasked
	}
}

// Pending reports whether vector's pending bit is set, counting a signal
// the target holds for the masked vector (see PendingSource).
func (m *Capability) Pending(vector int) bool {
	if vector < 0 || vector >= m.n {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.collectPending(vector)
	return m.pending[vector/64]&(1<<(vector%64)) != 0
}
