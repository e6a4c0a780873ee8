package boot

import (
	"encoding/binary"
	"fmt"
)

// fakeMem is guest RAM [0, len(ram)) backed by one byte slice, with the same
// bounds checking contract as guestmem.Memory.
type fakeMem struct{ ram []byte }

func newFakeMem(size uint64) *fakeMem { return &fakeMem{ram: make([]byte, size)} }

func (m *fakeMem) Slice(gpa, n uint64) ([]byte, error) {
	size := uint64(len(m.ram))
	if gpa > size || n > size-gpa {
		return nil, fmt.Errorf("fakeMem: [0x%x, +0x%x) outside RAM [0, 0x%x)", gpa, n, size)
	}
	return m.ram[gpa : gpa+n : gpa+n], nil
}

func (m *fakeMem) u8(gpa uint64) uint8   { return m.ram[gpa] }
func (m *fakeMem) u16(gpa uint64) uint16 { return binary.LittleEndian.Uint16(m.ram[gpa:]) }
func (m *fakeMem) u32(gpa uint64) uint32 { return binary.LittleEndian.Uint32(m.ram[gpa:]) }
func (m *fakeMem) u64(gpa uint64) uint64 { return binary.LittleEndian.Uint64(m.ram[gpa:]) }

const (
	synthSetupSects = 4
	synthPayloadLen = 64 << 10
	synthInitSize   = 4 << 20
	synthPref       = 0x1000000
	synthVersion    = "6.1.0-synthetic (test@example) #1 SMP"
)

// synthImage builds a minimal bzImage that satisfies the 64-bit boot
// protocol (protocol 2.15, relocatable, XLF_KERNEL_64), then lets mod change
// it. Offsets are written as literals from bootparam.h so that a wrong
// package constant cannot hide itself in the test.
func synthImage(mod func(img []byte)) []byte {
	le := binary.LittleEndian
	img := make([]byte, (synthSetupSects+1)*512+synthPayloadLen)
	img[0x1f1] = synthSetupSects
	le.PutUint16(img[0x1fe:], 0xaa55)
	img[0x200] = 0xeb // jmp short
	img[0x201] = 0x6a // header ends at 0x202+0x6a = 0x26c
	copy(img[0x202:], "HdrS")
	le.PutUint16(img[0x206:], 0x020f)
	le.PutUint16(img[0x20e:], 0x100) // version string at 0x300
	copy(img[0x300:], synthVersion+"\x00")
	img[0x211] = 0x01 // LOADED_HIGH
	le.PutUint32(img[0x214:], 0x100000)
	le.PutUint32(img[0x22c:], 0x7fffffff)
	le.PutUint32(img[0x230:], 0x200000)
	img[0x234] = 1
	img[0x235] = 21
	le.PutUint16(img[0x236:], 0x3) // XLF_KERNEL_64 | XLF_CAN_BE_LOADED_ABOVE_4G
	le.PutUint32(img[0x238:], 0x7ff)
	le.PutUint64(img[0x258:], synthPref)
	le.PutUint32(img[0x260:], synthInitSize)
	for i := (synthSetupSects + 1) * 512; i < len(img); i++ {
		img[i] = byte(i*7 + 3)
	}
	if mod != nil {
		mod(img)
	}
	return img
}
