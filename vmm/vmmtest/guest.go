// Package vmmtest drives whole VMs through the vmm Go API for tests: a tiny
// guest that needs no Linux (a synthetic bzImage whose 64-bit entry point
// scans PCI bus 0 through port I/O, reads a passed-through edu device's
// registers through its BAR and resets the VM), snapshots of what a process
// holds on the host (fds, mappings, hugepages, TAPs, VFIO files, driver
// bindings, Go heap), and the create/run/destroy soak built from both. The
// unit tests of package vmm (on any usable /dev/kvm, kvm_pvm included: the
// guest is raw 64-bit code) and the integration scenarios in tests/ (with a
// passed-through device inside the nested test bed) share it.
package vmmtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/hpcvmm/hpcvmm/boot/boottest"
)

// guestCode is the soak guest, entered in 64-bit mode at the kernel's load
// address + 0x200 with the boot protocol's identity map of the first 4 GiB.
// Assembled with GNU as (.code64, .intel_syntax noprefix):
//
//	start:  xor ecx, ecx                ; slot = 0
//	scan:   mov eax, ecx ; shl eax, 11 ; or eax, 0x80000000
//	        mov r8d, eax                ; conf1 address of slot.0
//	        mov dx, 0xcf8 ; out dx, eax ; mov dx, 0xcfc ; in eax, dx
//	        cmp ax, 0xffff ; je next    ; empty slot
//	        mov r9d, eax ; mov dx, 0x3f8
//	        mov al, 'D' ; out dx, al ; mov eax, ecx ; out dx, al
//	        mov eax, r9d ; out dx, al ; (shr eax, 8 ; out dx, al) x3
//	        cmp r9d, 0x11e81234 ; jne next   ; edu?
//	        (conf1 write 0x00000006 to register 0x04: memory and bus master on)
//	        (conf1 read of BAR0) ; and eax, 0xfffffff0 ; mov ebx, eax
//	        mov r9d, [rbx]              ; identification register
//	        mov dword ptr [rbx+4], 0x5a5aa5a5
//	        mov r10d, [rbx+4]           ; liveness: reads back inverted
//	        'E', r9d, r10d to the UART, low byte first
//	next:   inc ecx ; cmp ecx, 32 ; jb scan
//	        'Z' to the UART ; mov al, 0xfe ; out 0x64, al (i8042 reset) ; hlt
var guestCode = []byte{
	0x31, 0xc9, 0x89, 0xc8, 0xc1, 0xe0, 0x0b, 0x0d, 0x00, 0x00, 0x00, 0x80,
	0x41, 0x89, 0xc0, 0x66, 0xba, 0xf8, 0x0c, 0xef, 0x66, 0xba, 0xfc, 0x0c,
	0xed, 0x66, 0x83, 0xf8, 0xff, 0x0f, 0x84, 0x85, 0x00, 0x00, 0x00, 0x41,
	0x89, 0xc1, 0x66, 0xba, 0xf8, 0x03, 0xb0, 0x44, 0xee, 0x89, 0xc8, 0xee,
	0x44, 0x89, 0xc8, 0xee, 0xc1, 0xe8, 0x08, 0xee, 0xc1, 0xe8, 0x08, 0xee,
	0xc1, 0xe8, 0x08, 0xee, 0x41, 0x81, 0xf9, 0x34, 0x12, 0xe8, 0x11, 0x75,
	0x5f, 0x44, 0x89, 0xc0, 0x83, 0xc8, 0x04, 0x66, 0xba, 0xf8, 0x0c, 0xef,
	0x66, 0xba, 0xfc, 0x0c, 0xb8, 0x06, 0x00, 0x00, 0x00, 0xef, 0x44, 0x89,
	0xc0, 0x83, 0xc8, 0x10, 0x66, 0xba, 0xf8, 0x0c, 0xef, 0x66, 0xba, 0xfc,
	0x0c, 0xed, 0x83, 0xe0, 0xf0, 0x89, 0xc3, 0x44, 0x8b, 0x0b, 0xc7, 0x43,
	0x04, 0xa5, 0xa5, 0x5a, 0x5a, 0x44, 0x8b, 0x53, 0x04, 0x66, 0xba, 0xf8,
	0x03, 0xb0, 0x45, 0xee, 0x44, 0x89, 0xc8, 0xee, 0xc1, 0xe8, 0x08, 0xee,
	0xc1, 0xe8, 0x08, 0xee, 0xc1, 0xe8, 0x08, 0xee, 0x44, 0x89, 0xd0, 0xee,
	0xc1, 0xe8, 0x08, 0xee, 0xc1, 0xe8, 0x08, 0xee, 0xc1, 0xe8, 0x08, 0xee,
	0xff, 0xc1, 0x83, 0xf9, 0x20, 0x0f, 0x82, 0x4f, 0xff, 0xff, 0xff, 0xb0,
	0x5a, 0x66, 0xba, 0xf8, 0x03, 0xee, 0xb0, 0xfe, 0xe6, 0x64, 0xf4,
}

// EduID is what edu's identification register reads (QEMU's
// docs/specs/edu.txt: major 1, minor 0, 0xed).
const EduID = 0x010000ed

// eduLiveness is the value the guest writes to edu's liveness register,
// which reads back as its complement.
const eduLiveness = 0x5a5aa5a5

// EduLivenessReadback is what the guest must read back from edu's
// liveness register.
const EduLivenessReadback = ^uint32(eduLiveness)

// Kernel writes a bzImage (boot protocol 2.15, 64-bit entry, loadable at
// 16 MiB) carrying the soak guest into dir and returns its path. vmm.New
// parses and loads it like a Linux kernel; a VM needs 64 MiB of RAM for it.
func Kernel(dir string) (string, error) {
	// The protected-mode part starts after the setup sectors; startup_64
	// is 0x200 into it.
	protected := make([]byte, 0x200+len(guestCode))
	copy(protected[0x200:], guestCode)
	img := boottest.BzImage(protected, 0, 0)
	p := filepath.Join(dir, "soak-guest.bzImage")
	if err := os.WriteFile(p, img, 0o644); err != nil {
		return "", fmt.Errorf("vmmtest: writing the guest kernel: %w", err)
	}
	return p, nil
}

// GuestReport is what the soak guest printed.
type GuestReport struct {
	// Devices maps each bus-0 slot that answered to its vendor (low 16
	// bits) and device ID (high 16 bits).
	Devices map[int]uint32
	// EduID and EduLiveness are what edu's registers read through its BAR
	// (zero without an edu).
	EduID, EduLiveness uint32
	// Edu reports whether the guest found an edu and read its registers.
	Edu bool
}

// ParseGuestOutput decodes the soak guest's UART output: a record per
// device ('D', slot, ID as 4 bytes), one for edu ('E', ID, liveness), then
// 'Z'. Anything else, or no 'Z', is an error naming the offset.
func ParseGuestOutput(out []byte) (GuestReport, error) {
	r := GuestReport{Devices: map[int]uint32{}}
	le := binary.LittleEndian
	for i := 0; i < len(out); {
		switch out[i] {
		case 'D':
			if i+6 > len(out) {
				return r, fmt.Errorf("vmmtest: guest output truncated in a device record at byte %d of %d", i, len(out))
			}
			r.Devices[int(out[i+1])] = le.Uint32(out[i+2:])
			i += 6
		case 'E':
			if i+9 > len(out) {
				return r, fmt.Errorf("vmmtest: guest output truncated in the edu record at byte %d of %d", i, len(out))
			}
			r.Edu, r.EduID, r.EduLiveness = true, le.Uint32(out[i+1:]), le.Uint32(out[i+5:])
			i += 9
		case 'Z':
			if i != len(out)-1 {
				return r, fmt.Errorf("vmmtest: %d bytes after the guest's end mark", len(out)-1-i)
			}
			return r, nil
		default:
			return r, fmt.Errorf("vmmtest: unexpected byte %#x at %d of the guest's output", out[i], i)
		}
	}
	return r, errors.New("vmmtest: the guest never printed its end mark: it did not finish")
}
