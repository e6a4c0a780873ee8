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
