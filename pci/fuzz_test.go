package pci_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/pci"
)

// FuzzConfigWrite drives a root complex with an endpoint that has every BAR
// kind and MSI-X through arbitrary configuration writes (conf1 at any port
// offset and width, ECAM at any offset), MSI-X table/PBA accesses and
// vector triggers. Nothing may panic, and the read-only parts of the BAR
// registers must keep their meaning.
func FuzzConfigWrite(f *testing.F) {
	op := func(kind byte, reg uint16, width byte, v uint32) []byte {
		b := make([]byte, 8)
		b[0], b[3] = kind, width
		binary.LittleEndian.PutUint16(b[1:], reg)
		binary.LittleEndian.PutUint32(b[4:], v)
		return b
	}
	var seed []byte
	seed = append(seed, op(0, pci.RegBAR0, 4, 0xffffffff)...)
	seed = append(seed, op(0, pci.RegCommand, 2, 7)...)
	seed = append(seed, op(0, 0x50+2, 2, 0xc000)...)
	seed = append(seed, op(2, 12, 4, 0)...)
	seed = append(seed, op(1, 0x100, 4, 0xffffffff)...)
	f.Add(seed)
	f.Add(op(5, 0, 4, 0x80001810))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := newRig(t)
		for len(data) >= 8 {
			kind, reg, width, v := data[0], binary.LittleEndian.Uint16(data[1:]), int(data[3]%9), binary.LittleEndian.Uint32(data[4:])
			data = data[8:]
			var buf [8]byte
			binary.LittleEndian.PutUint32(buf[:], v)
			binary.LittleEndian.PutUint32(buf[4:], ^v)
			switch kind % 7 {
			case 0: // conf1 write to the test device, register from the fuzzer
				w := []int{1, 2, 4}[width%3]
				r.cfg.Write(3, 0, int(reg&0xfff), w, v)
			case 1: // ECAM write, any device/offset/width
				r.mmio.Write(addrspace.ECAMBase+uint64(reg)<<4+uint64(v>>28), buf[:width])
			case 2: // MSI-X table/PBA write, any offset/width
				r.dev.msix.Write(uint64(reg&0x1fff), buf[:width])
			case 3: // reads
				r.dev.msix.Read(uint64(reg&0x1fff), buf[:width])
				r.mmio.Read(addrspace.ECAMBase+uint64(reg)<<4, buf[:width])
			case 4:
				r.dev.msix.Trigger(int(reg % 8))
			case 5: // raw port accesses anywhere in 0xcf8-0xcff
				off := uint64(reg % 8)
				if off+uint64(width) <= 8 {
					r.pio.Write(pci.ConfigIOPort+off, buf[:width])
					r.pio.Read(pci.ConfigIOPort+off, buf[:width])
				}
			case 6: // BAR-space access wherever the guest put the BARs
				for bar := 0; bar < pci.NumBARs; bar++ {
					if a, ok := r.root.BARAddress(3, bar); ok {
						r.mmio.Write(a+uint64(reg), buf[:width])
						r.mmio.Read(a+uint64(reg), buf[:width])
					}
				}
			}
			require.Zero(t, r.cfg.Read(3, 0, pci.RegBAR0, 4)&0xf, "BAR0 type bits")
			require.Equal(t, uint32(1), r.cfg.Read(3, 0, pci.RegBAR0+4, 4)&3, "BAR1 is I/O")
			require.Equal(t, uint32(0xc), r.cfg.Read(3, 0, pci.RegBAR0+8, 4)&0xf, "BAR2 64-bit prefetchable")
			require.Equal(t, uint32(0x56781234), r.cfg.Read(3, 0, 0, 4))
		}
	})
}

// FuzzBridgeConfig lets a guest write anything anywhere in a switch
// hierarchy (bus numbers, windows, command and bridge control registers of
// every port, endpoint BARs and commands; conf1 and ECAM, any bus), after
// AssignBuses and AssignBARs set it up as firmware would. Nothing may
// panic, the ports' read-only identity (header type, port type, link
// capabilities, ACS capabilities) must hold, and the property real
// hardware guarantees must too: an endpoint BAR decodes only if every
// bridge above it has the space enabled and the BAR inside one of its
// windows, as the guest reads those registers back.
func FuzzBridgeConfig(f *testing.F) {
	op := func(bus, dev byte, reg uint16, width byte, v uint32) []byte {
		b := make([]byte, 10)
		b[0], b[1], b[4] = bus, dev, width
		binary.LittleEndian.PutUint16(b[2:], reg)
		binary.LittleEndian.PutUint32(b[5:], v)
		b[9] = 0
		return b
	}
	var seed []byte
	seed = append(seed, op(0, 5, pci.RegPrimaryBus, 4, 0x00201000)...)
	seed = append(seed, op(0x10, 0, pci.RegMemBase, 4, 0x0000fff0)...)
	seed = append(seed, op(2, 0, pci.RegCommand, 2, 0)...)
	seed = append(seed, op(3, 0, pci.RegBAR0, 4, 0xffffffff)...)
	seed = append(seed, op(0, 6, pci.RegBridgeControl, 2, 0x44)...)
	f.Add(seed)
	f.Fuzz(bridgeFuzzBody)
}

func bridgeFuzzBody(t *testing.T, data []byte) {
	{
		r := newSwitchRig(t)
		require.NoError(t, r.root.AssignBuses())
		w, err := addrspace.NewWindows(addrspace.PCIHoleStart, 46)
		require.NoError(t, err)
		require.NoError(t, r.root.AssignBARs(w))
		bridges := []*pci.Bridge{r.rp, r.usp, r.dsp0, r.dsp1, r.rp2}
		parents := map[*testDev][]*pci.Bridge{r.a: {r.dsp0, r.usp, r.rp}, r.b: {r.dsp1, r.usp, r.rp}, r.c: {r.rp2}}
		for len(data) >= 10 {
			busNum, dev, reg, width, v, kind := int(data[0]), int(data[1]%32), int(binary.LittleEndian.Uint16(data[2:])&0xfff), int(data[4]), binary.LittleEndian.Uint32(data[5:]), data[9]
			data = data[10:]
			var buf [4]byte
			binary.LittleEndian.PutUint32(buf[:], v)
			if kind%2 == 0 {
				r.cfg.WriteBus(busNum, dev, 0, reg, []int{1, 2, 4}[width%3], v)
			} else {
				off := uint64(busNum)<<20 | uint64(dev)<<15 | uint64(reg)
				r.mmio.Write(addrspace.ECAMBase+off, buf[:width%5])
				r.mmio.Read(addrspace.ECAMBase+off, buf[:width%5])
			}
			r.cfg.ReadBus(busNum, dev, 0, reg, 4)
			for _, b := range bridges {
				require.Equal(t, uint8(1), b.Uint8(pci.RegHeaderType))
				p := b.PCIeCapOffset()
				require.Equal(t, uint16(b.Type())<<4, b.Uint16(p+pci.PCIeCapFlags)&0xf0)
				require.Equal(t, uint32(0x104), b.Uint32(p+pci.PCIeLinkCap)&0x3ff, "16 GT/s x16")
				if a := b.ACSCapOffset(); a != 0 {
					require.Equal(t, uint16(0x203d), b.Uint16(a+4))
				}
			}
			for d, above := range parents {
				cmd := d.Uint16(pci.RegCommand)
				for bar, size := range map[int]uint64{0: 4096, 1: 32, 2: 1 << 20, 4: 8192} {
					addr, mapped := r.root.DeviceBAR(d, bar)
					if !mapped {
						continue
					}
					io := bar == 1
					if io {
						require.NotZero(t, cmd&pci.CommandIO)
					} else {
						require.NotZero(t, cmd&pci.CommandMemory)
					}
					for _, b := range above {
						bcmd := b.Uint16(pci.RegCommand)
						if io {
							require.NotZero(t, bcmd&pci.CommandIO, "I/O BAR decodes below a bridge with I/O off")
							lo, hi, ok := b.IOWindow()
							require.True(t, ok && addr >= lo && addr+size-1 <= hi, "I/O BAR %#x outside [%#x, %#x]", addr, lo, hi)
							continue
						}
						require.NotZero(t, bcmd&pci.CommandMemory, "memory BAR decodes below a bridge with memory off")
						lo, hi, ok := b.MemWindow()
						plo, phi, pok := b.PrefWindow()
						require.True(t, (ok && addr >= lo && addr+size-1 <= hi) || (pok && addr >= plo && addr+size-1 <= phi),
							"BAR%d at %#x outside [%#x, %#x] and [%#x, %#x]", bar, addr, lo, hi, plo, phi)
					}
				}
			}
		}
	}
}
