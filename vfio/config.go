package vfio

import (
	"encoding/binary"
	"fmt"

	"github.com/hpcvmm/hpcvmm/host"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/uapi"
)

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }
func le32(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }

// vconfig is the virtualised configuration space: for each bit, emu says
// whether it is served from val (emulated) or from the device; wmask says
// which emulated bits the guest may change. Bytes not wholly emulated are
// also written through to the device, where vfio-pci applies its own
// virtualisation (e.g. of the INTx disable bit) before the hardware.
type vconfig struct {
	size  int // bytes of config space the device has (256 or 4096)
	val   [pci.ConfigSize]byte
	emu   [pci.ConfigSize]byte
	wmask [pci.ConfigSize]byte
}

func (v *vconfig) emulate(off, n int) {
	for i := off; i < off+n; i++ {
		v.emu[i] = 0xff
	}
}

func (v *vconfig) set16(off int, x uint16) { binary.LittleEndian.PutUint16(v.val[off:], x) }
func (v *vconfig) set32(off int, x uint32) { binary.LittleEndian.PutUint32(v.val[off:], x) }

// NVIDIA GPUDirect P2P clique capability: a vendor-specific capability
// (ID 9, length 8) with the signature "P2P" and the clique ID in bits 6:3
// of byte 6; version 0. Hypervisors place it at 0xD4 (0xC8, the original
// recommendation, collides with the MSI-X capability of Turing and later
// GPUs) and at the end of the capability list.
const (
	cliqueCapLen     = 8
	cliqueOffset     = 0xd4
	cliqueOffsetAlt  = 0xc8
	extCapIDHideMask = 0xfff00000 // keep the next pointer, zero ID and version
)

// capLen returns the length of the standard capability at off; nextOff is
// the next higher capability offset (or 0x100), the bound for unknown ones.
func capLen(phys []byte, id uint8, off, nextOff int) int {
	switch id {
	case host.CapPM:
		return 8
	case host.CapMSI:
		return msiCapLen(le16(phys[off+2:]))
	case host.CapMSIX:
		return 12
	case host.CapPCIe:
		if phys[off+2]&0xf >= 2 {
			return 0x3c
		}
		return 0x24
	case host.CapVendor:
		return max(int(phys[off+2]), 3)
	}
	return nextOff - off
}

// setupConfig builds the virtual configuration space from the device's.
func (p *PCIDevice) setupConfig(phys []byte, parsed host.Config) error {
	v := &p.vc
	v.size = len(phys)
	copy(v.val[:], phys)
	v.setupHeader()
	p.emulateBARs()
	p.setupInterruptPin(phys)
	for _, pr := range parsed.Problems {
		p.warn(fmt.Sprintf("%s: config space: %s", p.cfg.Name, pr))
	}
	// Capabilities: the chain is rebuilt (pointers emulated) so MSI/MSI-X
	// can be emulated and the clique capability appended.
	chain, used, err := p.setupCapabilities(phys, parsed)
	if err != nil {
		return err
	}
	if p.cfg.HasClique {
		at, err := p.addCliqueCap(used)
		if err != nil {
			return err
		}
		chain = append(chain, at)
	}
	v.linkCapChain(chain)
	v.hideExtCaps(phys, parsed)
	return nil
}

// setupHeader emulates the header's fixed fields. Identity, header type
// (single function: the guest sees function 0 of its own slot), subsystem,
// min_gnt/max_lat: read-only, served from the snapshot. Command: the
// decode enables are mirrored so the root complex sees exactly what the
// guest wrote; the write also reaches the device.
func (v *vconfig) setupHeader() {
	v.emulate(pci.RegVendorID, 4)
	v.emulate(pci.RegRevision, 4)
	v.emulate(pci.RegHeaderType, 1)
	v.val[pci.RegHeaderType] &^= 0x80
	v.emulate(pci.RegSubsysVendor, 4)
	v.emulate(0x3e, 2)

	v.emu[pci.RegCommand] = pci.CommandIO | pci.CommandMemory
	v.wmask[pci.RegCommand] = pci.CommandIO | pci.CommandMemory
	v.val[pci.RegCommand] &^= pci.CommandIO | pci.CommandMemory
	v.emu[pci.RegStatus] = pci.StatusCapList
}

// emulateBARs emulates the BARs, CardBus CIS, ROM (disabled: reads 0 and
// ignores sizing), capability pointer and reserved bytes, with each BAR's
// type bits and its size as the writable mask.
func (p *PCIDevice) emulateBARs() {
	v := &p.vc
	v.emulate(pci.RegBAR0, 4*pci.NumBARs+4)
	v.emulate(pci.RegROM, 0x3c-pci.RegROM)
	for i := pci.RegBAR0; i < pci.RegInterruptLine; i++ {
		if i < pci.RegSubsysVendor || i >= pci.RegSubsysVendor+4 {
			v.val[i] = 0
		}
	}
	for _, b := range p.bars {
		if b == nil {
			continue
		}
		off := pci.RegBAR0 + 4*b.index
		mask := ^(b.size - 1)
		switch b.kind {
		case pci.BARIO:
			v.set32(off, 1)
			binary.LittleEndian.PutUint32(v.wmask[off:], uint32(mask)&^3)
		case pci.BARMem32:
			v.set32(off, prefetch(b.prefet))
			binary.LittleEndian.PutUint32(v.wmask[off:], uint32(mask)&^0xf)
		case pci.BARMem64:
			v.set32(off, 0x4|prefetch(b.prefet))
			binary.LittleEndian.PutUint32(v.wmask[off:], uint32(mask)&^0xf)
			binary.LittleEndian.PutUint32(v.wmask[off+4:], uint32(mask>>32))
		}
	}
}

// setupInterruptPin emulates the interrupt line (guest scratch) and pin
// (only when INTx is wired and VFIO offers it).
func (p *PCIDevice) setupInterruptPin(phys []byte) {
	v := &p.vc
	v.emulate(pci.RegInterruptLine, 2)
	v.wmask[pci.RegInterruptLine] = 0xff
	v.val[pci.RegInterruptLine] = 0xff
	pin := phys[pci.RegInterruptPin]
	v.val[pci.RegInterruptPin] = 0
	if p.cfg.INTx != nil && pin >= 1 && pin <= 4 {
		if ii, err := p.dev.IRQInfo(uapi.VFIOPCIINTxIRQIndex); err == nil && ii.Count > 0 {
			v.val[pci.RegInterruptPin] = pin
			v.val[pci.RegInterruptLine] = uint8(p.cfg.INTxGSI)
		}
	}
}

// capRange is the bytes [lo, hi) a capability takes in config space.
type capRange struct{ lo, hi int }

// setupCapabilities walks the device's capabilities, one step each: MSI-X
// and MSI get their emulation (or are hidden where VFIO cannot deliver
// them), the others pass through. It returns the offsets to chain, in
// order, and the ranges every capability takes (hidden ones included).
func (p *PCIDevice) setupCapabilities(phys []byte, parsed host.Config) (chain []int, used []capRange, err error) {
	for _, c := range parsed.Caps {
		off := int(c.Offset)
		if off+2 > len(phys) {
			continue
		}
		next := pci.LegacyConfigSize
		for _, o := range parsed.Caps {
			if int(o.Offset) > off && int(o.Offset) < next {
				next = int(o.Offset)
			}
		}
		n := min(capLen(phys, c.ID, off, next), pci.LegacyConfigSize-off)
		used = append(used, capRange{off, off + n})
		switch c.ID {
		case host.CapMSIX:
			m, err := p.newMSIX(phys, off)
			if err != nil {
				return nil, nil, err
			}
			if m == nil {
				continue // VFIO cannot deliver MSI-X: hide the capability
			}
			p.msix = m
		case host.CapMSI:
			m, err := p.newMSI(phys, off)
			if err != nil {
				return nil, nil, err
			}
			if m == nil {
				continue
			}
			p.msi = m
		}
		chain = append(chain, off)
	}
	return chain, used, nil
}

// addCliqueCap writes the NVIDIA P2P clique vendor capability at the first
// of its two customary offsets that no device capability overlaps, and
// returns that offset.
func (p *PCIDevice) addCliqueCap(used []capRange) (int, error) {
	v := &p.vc
	if p.cfg.Clique > 15 {
		return 0, fmt.Errorf("vfio: %s: clique %d outside 0-15", p.cfg.Name, p.cfg.Clique)
	}
	at := 0
	for _, cand := range []int{cliqueOffset, cliqueOffsetAlt} {
		free := true
		for _, u := range used {
			if cand < u.hi && u.lo < cand+cliqueCapLen {
				free = false
			}
		}
		if free {
			at = cand
			break
		}
	}
	if at == 0 {
		return 0, fmt.Errorf("vfio: %s: no room for the NVIDIA P2P clique capability at 0xd4 or 0xc8: both overlap the device's own capabilities", p.cfg.Name)
	}
	v.emulate(at, cliqueCapLen)
	copy(v.val[at:], []byte{host.CapVendor, 0, cliqueCapLen, 'P', '2', 'P', p.cfg.Clique << 3, 0})
	return at, nil
}

// linkCapChain emulates the capability pointer and every next pointer so
// the guest walks exactly chain, and the status bit that says there is one.
func (v *vconfig) linkCapChain(chain []int) {
	v.emu[pci.RegCapPtr] = 0xff
	v.val[pci.RegCapPtr] = 0
	v.val[pci.RegStatus] &^= pci.StatusCapList
	prev := pci.RegCapPtr
	for _, off := range chain {
		v.val[prev] = uint8(off)
		v.emu[off+1] = 0xff
		v.val[off+1] = 0
		prev = off + 1
	}
	if len(chain) > 0 {
		v.val[pci.RegStatus] |= pci.StatusCapList
	}
}

// hideExtCaps hides the extended capabilities the guest must not drive:
// resizable BAR (the BAR sizes are fixed by the mmaps and memslots) and
// SR-IOV (a PF's VFs belong to the host). Their headers read as ID 0 with
// the chain kept.
func (v *vconfig) hideExtCaps(phys []byte, parsed host.Config) {
	for _, c := range parsed.ExtCaps {
		if c.ID != host.ExtCapReBAR && c.ID != host.ExtCapSRIOV {
			continue
		}
		off := int(c.Offset)
		v.emulate(off, 4)
		v.set32(off, le32(phys[off:])&extCapIDHideMask)
	}
}

func prefetch(p bool) uint32 {
	if p {
		return 0x8
	}
	return 0
}

// ConfigRead implements pci.Device. Emulated bits come from the virtual
// space, the rest from the device (one pread per access); a failed read or
// an offset beyond the device's space reads as all ones.
func (p *PCIDevice) ConfigRead(offset uint32, data []byte) {
	fill(data, 0xff)
	if offset >= pci.ConfigSize || len(data) == 0 || len(data) > 4 || uint32(len(data)) > pci.ConfigSize-offset {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	off, n := int(offset), len(data)
	v := &p.vc
	var dev [4]byte
	fill(dev[:n], 0xff)
	need := false
	for i := 0; i < n; i++ {
		if v.emu[off+i] != 0xff {
			need = true
		}
	}
	if need && off+n <= v.size && !p.closed {
		if _, err := p.dev.ReadAt(dev[:n], int64(p.cfgReg.Offset)+int64(off)); err != nil {
			fill(dev[:n], 0xff)
		}
	}
	for i := 0; i < n; i++ {
		e := v.emu[off+i]
		data[i] = dev[i]&^e | v.val[off+i]&e
	}
}

// ConfigWrite implements pci.Device: emulated bits change as their write
// mask allows, bytes not wholly emulated are written to the device, then
// MSI/MSI-X react to changes of their capabilities.
func (p *PCIDevice) ConfigWrite(offset uint32, data []byte) {
	if offset >= pci.ConfigSize || len(data) == 0 || len(data) > 4 || uint32(len(data)) > pci.ConfigSize-offset {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	off, n := int(offset), len(data)
	v := &p.vc
	for i := 0; i < n; i++ {
		o := off + i
		v.val[o] = v.val[o]&^v.wmask[o] | data[i]&v.wmask[o]
	}
	// Write through each run of bytes the device owns at least in part.
	for i := 0; i < n; {
		if v.emu[off+i] == 0xff || off+i >= v.size {
			i++
			continue
		}
		j := i
		for j < n && v.emu[off+j] != 0xff && off+j < v.size {
			j++
		}
		if _, err := p.dev.WriteAt(data[i:j], int64(p.cfgReg.Offset)+int64(off+i)); err != nil {
			p.report(fmt.Errorf("vfio: %s: config write at %#x: %w", p.cfg.Name, off+i, err))
		}
		i = j
	}
	if m := p.msix; m != nil && off < m.cap+4 && off+n > m.cap+2 {
		m.controlWritten(p)
	}
	if m := p.msi; m != nil && off < m.cap+m.len && off+n > m.cap {
		m.update(p)
	}
}
