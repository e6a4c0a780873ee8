// Package boottest builds synthetic kernels for tests that need
// boot.ParseBzImage to accept a file without a real kernel on the host: the
// soak guest of vmm/vmmtest, the setup-unwinding tests of vmm and the CLI's
// tests. The header fields are literals from the kernel's bootparam.h, so a
// wrong constant in package boot cannot hide itself in the tests that use
// it.
package boottest

import "encoding/binary"

// SetupSects is the synthetic bzImage's number of setup sectors: its
// protected-mode part starts at (SetupSects+1)*512.
const SetupSects = 4

// ProtectedModeSize is the size of the protected-mode part BzImage makes.
const ProtectedModeSize = 64 << 10

// BzImage returns a minimal bzImage (boot protocol 2.15, 64-bit entry,
// relocatable, loadable above 4 GiB, 2 MiB alignment, 16 MiB preferred
// address, 4 MiB init size) whose protected-mode part holds protected at
// its start (the 64-bit entry point is 0x200 into it). payloadOffset and
// payloadLen, when payloadLen is not zero, are written to the header's
// payload_offset and payload_length, as a bzImage locates its compressed
// kernel. protected must fit in ProtectedModeSize bytes.
func BzImage(protected []byte, payloadOffset, payloadLen uint32) []byte {
	le := binary.LittleEndian
	img := make([]byte, (SetupSects+1)*512+ProtectedModeSize)
	img[0x1f1] = SetupSects
	le.PutUint16(img[0x1fe:], 0xaa55)
	img[0x200], img[0x201] = 0xeb, 0x6a // jmp over the header
	copy(img[0x202:], "HdrS")
	le.PutUint16(img[0x206:], 0x020f)
	img[0x211] = 0x01 // LOADED_HIGH
	le.PutUint32(img[0x214:], 0x100000)
	le.PutUint32(img[0x22c:], 0x7fffffff)
	le.PutUint32(img[0x230:], 0x200000)
	img[0x234] = 1
	le.PutUint16(img[0x236:], 0x3) // XLF_KERNEL_64 | XLF_CAN_BE_LOADED_ABOVE_4G
	le.PutUint32(img[0x238:], 0x7ff)
	if payloadLen != 0 {
		le.PutUint32(img[0x248:], payloadOffset)
		le.PutUint32(img[0x24c:], payloadLen)
	}
	le.PutUint64(img[0x258:], 0x1000000)
	le.PutUint32(img[0x260:], 4<<20)
	copy(img[(SetupSects+1)*512:], protected)
	return img
}
