package pci

// Configuration access: mechanism #1 (ports 0xcf8-0xcff) and ECAM, routed to a slot by bus number.

import (
	"github.com/hpcvmm/hpcvmm/bus"
)

// lookup returns the slot for bus/device/function, or nil when nothing is
// there (reads as all ones, as an absent function does on real hardware).
// Buses other than 0 are found the way type-1 cycles travel: from bus 0
// into the bridge whose [secondary, subordinate] range holds the bus, down
// until a bridge's secondary bus is the target, where the cycle becomes a
// type-0 access to device dev. Siblings with overlapping ranges (a guest
// programming error) resolve to the lowest device number. Each step goes
// one level down a finite tree, so the walk ends.
func (r *Root) lookup(busNum, dev, fn uint32) *slot {
	if fn != 0 || dev >= NumSlots || busNum > 0xff {
		return nil
	}
	if busNum == 0 {
		return r.slots[dev]
	}
	b := uint8(busNum)
	table := &r.slots
	for {
		var next *slot
		for _, s := range table {
			if s != nil && s.bridge != nil && s.bridge.routes(b) {
				next = s
				break
			}
		}
		if next == nil {
			return nil
		}
		if next.bridge.SecondaryBus() == b {
			return next.children[dev]
		}
		table = &next.children
	}
}

func (r *Root) configRead(busNum, dev, fn, reg uint32, data []byte) {
	s := r.lookup(busNum, dev, fn)
	if s == nil {
		for i := range data {
			data[i] = 0xff
		}
		return
	}
	s.dev.ConfigRead(reg, data)
}

func (r *Root) configWrite(busNum, dev, fn, reg uint32, data []byte) {
	s := r.lookup(busNum, dev, fn)
	if s == nil {
		return
	}
	s.dev.ConfigWrite(reg, data)
	r.update(s)
	if s.bridge != nil {
		r.updateBelow(s)
	}
}

// ConfigIO returns the mechanism #1 device for the port-I/O bus at
// ConfigIOPort, size ConfigIOSize.
func (r *Root) ConfigIO() bus.Device { return conf1{r} }

// ECAM returns the memory-mapped configuration device for an MMIO window of
// ECAMSize bytes (or a multiple of ECAMBusSize for fewer buses) at ECAMBase.
func (r *Root) ECAM() bus.Device { return ecam{r} }

type conf1 struct{ r *Root }

type ecam struct{ r *Root }

func ecamDecode(offset uint64, n int) (busNum, dev, fn, reg uint32, ok bool) {
	reg = uint32(offset & 0xfff)
	if n == 0 || n > 4 || reg+uint32(n) > ConfigSize || offset >= ECAMSize {
		return 0, 0, 0, 0, false
	}
	return uint32(offset>>20) & 0xff, uint32(offset>>15) & 0x1f, uint32(offset>>12) & 0x7, reg, true
}
