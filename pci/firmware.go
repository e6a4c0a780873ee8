package pci

// What firmware does before the guest runs: bus numbering and BAR and window placement.

import (
	"fmt"

	"github.com/hpcvmm/hpcvmm/addrspace"
)

// AssignBuses numbers the buses below every bridge depth-first in slot
// order, as firmware does (each bridge's secondary bus is the next free
// number, its subordinate the highest number below it), so Linux finds a
// consistent hierarchy and keeps it. Call it once after adding devices,
// before AssignBARs and before the guest runs.
func (r *Root) AssignBuses() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := 1
	var walk func(table *[NumSlots]*slot, busNum int) error
	walk = func(table *[NumSlots]*slot, busNum int) error {
		for _, s := range table {
			if s == nil || s.bridge == nil {
				continue
			}
			if next > 0xff {
				return fmt.Errorf("pci: assign buses: %s needs bus %d, beyond 255", s.name, next)
			}
			sec := next
			next++
			// Open the range while numbering below, as firmware does, so the
			// bridge routes to its subtree's buses from the start.
			s.bridge.SetBusNumbers(uint8(busNum), uint8(sec), 0xff)
			if err := walk(&s.children, sec); err != nil {
				return err
			}
			s.bridge.SetBusNumbers(uint8(busNum), uint8(sec), uint8(next-1))
		}
		return nil
	}
	if err := walk(&r.slots, 0); err != nil {
		return err
	}
	r.lastBus = uint8(next - 1)
	return nil
}

// LastBus returns the highest bus number in use after AssignBuses: the end
// of the bus range the firmware tables (MCFG, the host bridge's _CRS)
// declare. Declaring only the buses that exist matters: Linux sets its
// last PCI bus from MCFG's end bus and probes all 32 slots of every bus up
// to it that it has not found (pcibios_fixup_peer_bridges), which for
// 0-255 costs over 16,000 configuration accesses, each a VM exit.
func (r *Root) LastBus() uint8 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastBus
}

// AssignBARs places BARs in the guest's windows by addrspace.PlanHierarchy
// and enables decode, as firmware does; Linux keeps these assignments. On
// bus 0, every unassigned BAR is placed as addrspace.Plan places it
// (largest first, each at the lowest free naturally aligned address: the
// rule preflight predicts with). Below bridges every BAR is placed, inside
// windows sized to hold them (64-bit prefetchable BARs in the 64-bit
// prefetchable window, other memory BARs in the 32-bit window), and every
// bridge's windows are programmed and its memory/I/O decode and bus
// mastering enabled, so a guest kernel never needs pci=realloc. Call it once
// after adding devices and AssignBuses, before the guest runs.
func (r *Root) AssignBARs(w addrspace.Windows) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	type ref struct {
		s   *slot
		bar int
	}
	var refs []ref
	var reqs []addrspace.BAR
	var bridges []*addrspace.Bridge
	var bslots []*slot
	var walk func(table *[NumSlots]*slot, behind *addrspace.Bridge)
	walk = func(table *[NumSlots]*slot, behind *addrspace.Bridge) {
		for n, s := range table {
			if s == nil || (behind == nil && n == 0) { // the host bridge
				continue
			}
			for i, st := range s.bars {
				if st.kind == BARNone || st.kind == barMem64Upper || (behind == nil && barAddr(s, i) != 0) {
					continue
				}
				kind := addrspace.Mem32
				switch st.kind {
				case BARMem64:
					kind = addrspace.Mem64
				case BARIO:
					kind = addrspace.IO
				}
				refs = append(refs, ref{s, i})
				reqs = append(reqs, addrspace.BAR{Owner: s.name, Index: i, Kind: kind, Size: st.size, Prefetchable: st.prefetch, Behind: behind})
			}
			if s.bridge != nil {
				ab := &addrspace.Bridge{Name: s.name, Parent: behind}
				bridges = append(bridges, ab)
				bslots = append(bslots, s)
				walk(&s.children, ab)
			}
		}
	}
	walk(&r.slots, nil)
	layout, err := addrspace.PlanHierarchy(w, bridges, reqs)
	if err != nil {
		return fmt.Errorf("pci: assign BARs: %w", err)
	}
	for i, ab := range bridges {
		bw := layout.Windows[ab]
		b := bslots[i].bridge
		b.SetWindows(bw)
		cmd := b.Uint16(RegCommand) | CommandBusMaster
		if bw.Mem.Size != 0 || bw.Pref.Size != 0 {
			cmd |= CommandMemory
		}
		if bw.IO.Size != 0 {
			cmd |= CommandIO
		}
		b.SetUint16(RegCommand, cmd)
	}
	touched := map[*slot]uint16{}
	for i, q := range refs {
		off := uint32(RegBAR0 + 4*q.bar)
		cfgWrite32(q.s.dev, off, uint32(layout.BARs[i]))
		bit := uint16(CommandMemory)
		switch reqs[i].Kind {
		case addrspace.Mem64:
			cfgWrite32(q.s.dev, off+4, uint32(layout.BARs[i]>>32))
		case addrspace.IO:
			bit = CommandIO
		}
		touched[q.s] |= bit
	}
	for s, bits := range touched {
		cmd := cfgRead16(s.dev, RegCommand)
		cfgWrite16(s.dev, RegCommand, cmd|bits)
	}
	for _, s := range r.slots {
		if s != nil {
			r.update(s)
			if s.bridge != nil {
				r.updateBelow(s)
			}
		}
	}
	return nil
}
