package uapi

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Memory policy modes and flags for Mbind (linux/mempolicy.h).
const (
	MPolDefault    = 0
	MPolPreferred  = 1
	MPolBind       = 2
	MPolInterleave = 3
	MPolLocal      = 4

	MPolMFStrict  = 1 << 0 // fail if pages already exist off-policy
	MPolMFMove    = 1 << 1 // migrate this process's existing pages
	MPolMFMoveAll = 1 << 2 // migrate all existing pages (CAP_SYS_NICE)
)

// maxNUMANode bounds node ids: the kernel's MAX_NUMNODES is at most 1024
// (CONFIG_NODES_SHIFT <= 10).
const maxNUMANode = 1024

// Mbind is mbind(2) on mem: apply memory policy mode (MPol*) over the NUMA
// nodes in nodes with flags (MPolMF*). mem must be page-aligned (an mmap).
// x/sys/unix has no wrapper, so this issues SYS_MBIND with a nodemask of
// 64-bit words built from nodes.
func Mbind(mem []byte, mode int, nodes []int, flags int) error {
	if len(mem) == 0 {
		return fmt.Errorf("mbind: empty memory range")
	}
	var mask []uint64
	for _, n := range nodes {
		if n < 0 || n >= maxNUMANode {
			return fmt.Errorf("mbind: NUMA node %d out of range [0, %d)", n, maxNUMANode)
		}
		for len(mask) <= n/64 {
			mask = append(mask, 0)
		}
		mask[n/64] |= 1 << (uint(n) % 64)
	}
	var maskPtr unsafe.Pointer
	var maxnode uintptr
	if len(mask) > 0 {
		maskPtr = unsafe.Pointer(&mask[0])
		// The kernel reads maxnode-1 bits (mm/mempolicy.c get_nodes
		// decrements it first), so pass one more than the mask holds.
		maxnode = uintptr(len(mask))*64 + 1
	}
	_, _, errno := unix.Syscall6(unix.SYS_MBIND,
		uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)), uintptr(mode),
		uintptr(maskPtr), maxnode, uintptr(flags))
	if errno != 0 {
		return fmt.Errorf("mbind: %#x+%#x mode %d nodes %v flags %#x: %w",
			uintptr(unsafe.Pointer(&mem[0])), len(mem), mode, nodes, flags, errno)
	}
	return nil
}
