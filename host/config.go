package host

import (
	"encoding/binary"
	"fmt"
)

// Standard and extended capability IDs hpcvmm cares about (PCI Local Bus 3.0
// §6.7, PCIe Base §7.6; include/uapi/linux/pci_regs.h).
const (
	CapPM       = 0x01
	CapMSI      = 0x05
	CapVendor   = 0x09
	CapPCIe     = 0x10
	CapMSIX     = 0x11
	ExtCapAER   = 0x0001
	ExtCapSRIOV = 0x0010 // SR-IOV
	ExtCapARI   = 0x000e
	ExtCapATS   = 0x000f
	ExtCapLTR   = 0x0018
	ExtCapReBAR = 0x0015
)

// Capability is one entry of the standard capability list.
type Capability struct {
	ID     uint8  `json:"id"`
	Offset uint16 `json:"offset"`
}

// ExtCapability is one entry of the PCIe extended capability list.
type ExtCapability struct {
	ID      uint16 `json:"id"`
	Version uint8  `json:"version"`
	Offset  uint16 `json:"offset"`
}

// MSIX is a parsed MSI-X capability. The table and PBA live in a BAR at an
// offset; VFIO traps the table so the VMM can route vectors.
type MSIX struct {
	// Offset is the capability's position in config space.
	Offset uint16 `json:"offset"`
	// TableSize is the number of vectors (Message Control bits 10:0 + 1).
	TableSize int `json:"table_size"`
	// TableBIR and TableOffset locate the vector table: BAR register
	// index and byte offset within it.
	TableBIR    uint8  `json:"table_bir"`
	TableOffset uint32 `json:"table_offset"`
	// PBABIR and PBAOffset locate the pending-bit array.
	PBABIR    uint8  `json:"pba_bir"`
	PBAOffset uint32 `json:"pba_offset"`
	// Enabled and FunctionMask are Message Control bits 15 and 14.
	Enabled      bool `json:"enabled"`
	FunctionMask bool `json:"function_mask"`
}

// TableBytes is the vector table's length (16 bytes per entry).
func (m MSIX) TableBytes() uint64 { return uint64(m.TableSize) * 16 }

// PBABytes is the pending-bit array's length (one bit per vector, in
// quadwords).
func (m MSIX) PBABytes() uint64 { return uint64((m.TableSize+63)/64) * 8 }

// MSI is a parsed MSI capability.
type MSI struct {
	Offset uint16 `json:"offset"`
	// Vectors is the Multiple Message Capable count (1-32).
	Vectors int `json:"vectors"`
	// Addr64 is the 64-bit address capable bit.
	Addr64 bool `json:"addr64"`
	// PerVectorMask is the per-vector masking capable bit.
	PerVectorMask bool `json:"per_vector_mask"`
	// Enabled is the MSI Enable bit.
	Enabled bool `json:"enabled"`
}

// Config is a device's parsed configuration space.
type Config struct {
	// Length is how many bytes were available (64 for unprivileged sysfs
	// reads, 256 for conventional PCI, 4096 for PCIe).
	Length int `json:"length"`
	// Caps and ExtCaps are the capability lists in chain order. Extended
	// entries with ID 0 (hidden by a hypervisor, which keeps the chain) are
	// followed but not listed.
	Caps    []Capability    `json:"caps"`
	ExtCaps []ExtCapability `json:"ext_caps"`
	// MSIX and MSI are the parsed interrupt capabilities, nil if absent.
	MSIX *MSIX `json:"msix,omitempty"`
	MSI  *MSI  `json:"msi,omitempty"`
	// Problems describe malformed chains (loops, pointers out of range):
	// parsing stops at the first problem in each list.
	Problems []string `json:"problems,omitempty"`
}

// Cap returns the first standard capability with the given ID.
func (c Config) Cap(id uint8) (Capability, bool) {
	for _, x := range c.Caps {
		if x.ID == id {
			return x, true
		}
	}
	return Capability{}, false
}

// ExtCap returns the first extended capability with the given ID.
func (c Config) ExtCap(id uint16) (ExtCapability, bool) {
	for _, x := range c.ExtCaps {
		if x.ID == id {
			return x, true
		}
	}
	return ExtCapability{}, false
}

const (
	cfgStatus       = 0x06
	cfgStatusCapLst = 0x10
	cfgCapPtr       = 0x34
	cfgStdEnd       = 0x100
	cfgExtStart     = 0x100
)

// ParseConfig parses raw configuration space bytes of any length. It never
// panics: every read is bounds-checked and chains are cut at a repeated or
// out-of-range pointer (recorded in Problems).
func ParseConfig(raw []byte) Config {
	c := Config{Length: len(raw)}
	if len(raw) < 0x40 {
		return c
	}
	le := binary.LittleEndian
	if le.Uint16(raw[cfgStatus:])&cfgStatusCapLst != 0 {
		stdEnd := min(len(raw), cfgStdEnd)
		seen := map[int]bool{}
		for p := int(raw[cfgCapPtr]) &^ 3; p != 0; {
			if p < 0x40 || p+2 > stdEnd {
				c.Problems = append(c.Problems, fmt.Sprintf("capability pointer %#x outside [0x40, %#x)", p, stdEnd))
				break
			}
			if seen[p] {
				c.Problems = append(c.Problems, fmt.Sprintf("capability list loops at %#x", p))
				break
			}
			seen[p] = true
			id := raw[p]
			c.Caps = append(c.Caps, Capability{ID: id, Offset: uint16(p)})
			switch id {
			case CapMSIX:
				if p+12 <= stdEnd {
					ctrl := le.Uint16(raw[p+2:])
					t := le.Uint32(raw[p+4:])
					pba := le.Uint32(raw[p+8:])
					c.MSIX = &MSIX{
						Offset: uint16(p), TableSize: int(ctrl&0x7ff) + 1,
						TableBIR: uint8(t & 7), TableOffset: t &^ 7,
						PBABIR: uint8(pba & 7), PBAOffset: pba &^ 7,
						Enabled: ctrl&0x8000 != 0, FunctionMask: ctrl&0x4000 != 0,
					}
				}
			case CapMSI:
				if p+4 <= stdEnd {
					ctrl := le.Uint16(raw[p+2:])
					c.MSI = &MSI{
						Offset: uint16(p), Vectors: 1 << min((ctrl>>1)&7, 5),
						Addr64: ctrl&0x80 != 0, PerVectorMask: ctrl&0x100 != 0,
						Enabled: ctrl&1 != 0,
					}
				}
			}
			p = int(raw[p+1]) &^ 3
		}
	}
	if len(raw) <= cfgExtStart {
		return c
	}
	seen := map[int]bool{}
	for p := cfgExtStart; ; {
		if p+4 > len(raw) {
			c.Problems = append(c.Problems, fmt.Sprintf("extended capability pointer %#x outside config space (%d bytes)", p, len(raw)))
			break
		}
		if seen[p] {
			c.Problems = append(c.Problems, fmt.Sprintf("extended capability list loops at %#x", p))
			break
		}
		seen[p] = true
		h := le.Uint32(raw[p:])
		// All-zero at 0x100 means no extended capabilities; all-ones means
		// the space is not implemented (conventional PCI device).
		if h == 0 || h == 0xffffffff {
			break
		}
		if id := uint16(h); id != 0 {
			c.ExtCaps = append(c.ExtCaps, ExtCapability{ID: id, Version: uint8(h>>16) & 0xf, Offset: uint16(p)})
		}
		next := int(h>>20) &^ 3
		if next == 0 {
			break
		}
		if next < cfgExtStart {
			c.Problems = append(c.Problems, fmt.Sprintf("extended capability pointer %#x below 0x100", next))
			break
		}
		p = next
	}
	return c
}
