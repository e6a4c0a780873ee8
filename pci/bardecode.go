package pci

// BAR decoding: what each device's BARs decode as the guest programs them, refused over reserved ranges or another BAR, and registered on the buses.

import (
	"fmt"
)

// probeBARs sizes every BAR through the device's own configuration space
// (decode off, write all ones, read back, restore), so endpoints that
// emulate BARs differently (passthrough) are handled alike.
func probeBARs(s *slot) {
	d := s.dev
	cmd := cfgRead16(d, RegCommand)
	cfgWrite16(d, RegCommand, cmd&^(CommandIO|CommandMemory))
	for i := 0; i < numBARs(s); i++ {
		off := uint32(RegBAR0 + 4*i)
		orig := cfgRead32(d, off)
		cfgWrite32(d, off, 0xffffffff)
		v := cfgRead32(d, off)
		cfgWrite32(d, off, orig)
		if v == 0 || v == 0xffffffff {
			continue
		}
		st := &s.bars[i]
		st.handler = d.BARHandler(i)
		if v&1 != 0 {
			st.kind = BARIO
			st.size = uint64(^(v &^ 3) + 1)
			if v&0xffff0000 == 0 { // 16-bit I/O decoder
				st.size = uint64((^(v &^ 3) + 1) & 0xffff)
			}
			continue
		}
		if v&0x6 == 0x4 && i+1 < NumBARs {
			hiOff := off + 4
			hiOrig := cfgRead32(d, hiOff)
			cfgWrite32(d, hiOff, 0xffffffff)
			hi := cfgRead32(d, hiOff)
			cfgWrite32(d, hiOff, hiOrig)
			mask := uint64(hi)<<32 | uint64(v&^0xf)
			st.kind = BARMem64
			st.size = ^mask + 1
			st.prefetch = v&0x8 != 0
			s.bars[i+1].kind = barMem64Upper
			i++
			continue
		}
		st.kind = BARMem32
		st.size = uint64(^(v &^ 0xf) + 1)
		st.prefetch = v&0x8 != 0
	}
	cfgWrite16(d, RegCommand, cmd)
}

// numBARs is 2 for a bridge, whose registers from 0x18 on are bus numbers
// and windows, 6 for an endpoint.
func numBARs(s *slot) int {
	if s.bridge != nil {
		return 2
	}
	return NumBARs
}

// barAddr returns the address BAR i of s is programmed to.
func barAddr(s *slot, i int) uint64 {
	off := uint32(RegBAR0 + 4*i)
	v := cfgRead32(s.dev, off)
	switch s.bars[i].kind {
	case BARIO:
		return uint64(v &^ 3)
	case BARMem64:
		return uint64(cfgRead32(s.dev, off+4))<<32 | uint64(v&^0xf)
	}
	return uint64(v &^ 0xf)
}

// update brings the bus registrations of s in line with its BAR registers and
// command register. A BAR decodes when its space is enabled and it holds a
// non-zero address (zero is "unassigned"; a BAR never legitimately sits on
// the bottom of RAM).
func (r *Root) update(s *slot) {
	cmd := cfgRead16(s.dev, RegCommand)
	for i := 0; i < NumBARs; i++ {
		st := &s.bars[i]
		if st.kind == BARNone || st.kind == barMem64Upper {
			continue
		}
		as := r.cfg.MMIO
		enabled := cmd&CommandMemory != 0
		if st.kind == BARIO {
			as = r.cfg.PIO
			enabled = cmd&CommandIO != 0
		}
		addr := barAddr(s, i)
		want := enabled && addr != 0 && addr+st.size > addr && r.forwarded(s, st.kind == BARIO, addr, st.size)
		if want == st.mapped && (!want || addr == st.base) {
			continue
		}
		if st.mapped {
			if st.handler != nil && as != nil {
				as.Unregister(st.base)
			}
			st.mapped = false
			s.dev.BARMapped(i, st.base, false)
		}
		if !want {
			continue
		}
		// Refused placements leave the BAR off until the guest moves it
		// somewhere valid, as a bus registration conflict does.
		if st.kind != BARIO {
			if what, bad := r.overReserved(addr, st.size); bad {
				r.report(fmt.Errorf("pci: %s BAR%d at %#x (%#x bytes) over %s: refused, BAR left off", s.name, i, addr, st.size, what))
				continue
			}
		}
		if other, bad := r.overMappedBAR(s, i, st.kind == BARIO, addr, st.size); bad {
			r.report(fmt.Errorf("pci: %s BAR%d at %#x (%#x bytes) over %s: refused, BAR left off", s.name, i, addr, st.size, other))
			continue
		}
		if st.handler != nil {
			if as == nil {
				r.report(fmt.Errorf("pci: %s BAR%d (%s): no address space for this BAR kind", s.name, i, st.kind))
				continue
			}
			// Guests do program BARs on top of other ranges transiently (the
			// sizing all-ones value with decode still on); the BAR then stays
			// unmapped until the next configuration write makes it valid.
			if err := as.Register(addr, st.size, fmt.Sprintf("%s BAR%d", s.name, i), st.handler); err != nil {
				r.report(fmt.Errorf("pci: %s BAR%d at %#x: %w", s.name, i, addr, err))
				continue
			}
		}
		st.mapped = true
		st.base = addr
		s.dev.BARMapped(i, addr, true)
	}
}

// overReserved reports which reserved range [addr, addr+size) overlaps.
func (r *Root) overReserved(addr, size uint64) (string, bool) {
	for _, res := range r.cfg.Reserved {
		if addr < res.Base+res.Size && res.Base < addr+size {
			return fmt.Sprintf("%s [%#x, %#x)", res.Name, res.Base, res.Base+res.Size), true
		}
	}
	return "", false
}

// overMappedBAR reports which decoding BAR of the same space (other than
// BAR bar of s) overlaps [addr, addr+size). The bus registration catches
// this for BARs with a handler; BARs that are only memslots (passthrough
// BARs mapped onto the device) need it here, or two memslots would overlap.
func (r *Root) overMappedBAR(s *slot, bar int, io bool, addr, size uint64) (string, bool) {
	var found string
	var walk func(table *[NumSlots]*slot) bool
	walk = func(table *[NumSlots]*slot) bool {
		for _, o := range table {
			if o == nil {
				continue
			}
			for j := range o.bars {
				st := &o.bars[j]
				if !st.mapped || (o == s && j == bar) || (st.kind == BARIO) != io {
					continue
				}
				if addr < st.base+st.size && st.base < addr+size {
					found = fmt.Sprintf("%s BAR%d [%#x, %#x)", o.name, j, st.base, st.base+st.size)
					return true
				}
			}
			if walk(&o.children) {
				return true
			}
		}
		return false
	}
	return found, walk(&r.slots)
}

// forwarded reports whether every bridge above s passes accesses to [addr,
// addr+size) down to it: real hardware forwards only inside the windows of
// a bridge with the space enabled, so a BAR outside them does not decode
// (the guest sees all ones), and this Root does the same.
func (r *Root) forwarded(s *slot, io bool, addr, size uint64) bool {
	for p := s.parent; p != nil; p = p.parent {
		if !p.bridge.forwards(io, addr, size) {
			return false
		}
	}
	return true
}

// updateBelow re-evaluates the BAR decode of everything below bridge slot
// s, after the guest changed its windows or command register.
func (r *Root) updateBelow(s *slot) {
	for _, c := range s.children {
		if c == nil {
			continue
		}
		r.update(c)
		if c.bridge != nil {
			r.updateBelow(c)
		}
	}
}
