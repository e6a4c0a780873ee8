// Package pcitest provides a guest-side accessor for PCI configuration
// mechanism #1, as a guest kernel uses it, for tests of devices behind the
// root complex.
package pcitest

import (
	"encoding/binary"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/pci"
)

// Conf1 performs configuration accesses through ports 0xcf8/0xcfc on a
// port-I/O bus, the way Linux's pci_conf1_read/write do.
type Conf1 struct{ PIO *bus.Bus }

func conf1Addr(dev, fn, reg int) uint32 {
	return 0x80000000 | uint32(dev)<<11 | uint32(fn)<<8 | uint32(reg&0xfc) | uint32(reg&0xf00)<<16
}

// Read reads n (1, 2, 4) bytes at reg of 00:dev.fn.
func (c Conf1) Read(dev, fn, reg, n int) uint32 { return c.ReadBus(0, dev, fn, reg, n) }

// Write writes the low n bytes of v at reg of 00:dev.fn.
func (c Conf1) Write(dev, fn, reg, n int, v uint32) { c.WriteBus(0, dev, fn, reg, n, v) }

// ReadBus reads n (1, 2, 4) bytes at reg of bus:dev.fn: a type-1 cycle
// when bus is not 0, routed through the bridges as the guest numbered them.
func (c Conf1) ReadBus(bus, dev, fn, reg, n int) uint32 {
	var a [4]byte
	binary.LittleEndian.PutUint32(a[:], conf1Addr(dev, fn, reg)|uint32(bus&0xff)<<16)
	c.PIO.Write(pci.ConfigIOPort, a[:])
	var d [4]byte
	c.PIO.Read(pci.ConfigIOPort+4+uint64(reg&3), d[:n])
	return binary.LittleEndian.Uint32(d[:])
}

// WriteBus writes the low n bytes of v at reg of bus:dev.fn.
func (c Conf1) WriteBus(bus, dev, fn, reg, n int, v uint32) {
	var a [4]byte
	binary.LittleEndian.PutUint32(a[:], conf1Addr(dev, fn, reg)|uint32(bus&0xff)<<16)
	c.PIO.Write(pci.ConfigIOPort, a[:])
	var d [4]byte
	binary.LittleEndian.PutUint32(d[:], v)
	c.PIO.Write(pci.ConfigIOPort+4+uint64(reg&3), d[:n])
}

// FindCapabilities walks the capability list as Linux's
// __pci_find_next_cap_ttl does (status bit, pointer at 0x34, low two bits
// masked, at most 48 hops, stop below 0x40) and returns the offsets of the
// capabilities with ID id.
func (c Conf1) FindCapabilities(dev, id int) []int {
	var out []int
	if c.Read(dev, 0, pci.RegStatus, 2)&pci.StatusCapList == 0 {
		return nil
	}
	pos := int(c.Read(dev, 0, pci.RegCapPtr, 1))
	for ttl := 48; ttl > 0; ttl-- {
		if pos < 0x40 {
			break
		}
		pos &^= 3
		ent := c.Read(dev, 0, pos, 2)
		if ent&0xff == 0xff {
			break
		}
		if int(ent&0xff) == id {
			out = append(out, pos)
		}
		pos = int(ent >> 8)
	}
	return out
}
