package vmm

import (
	"fmt"
	"strings"

	"github.com/hpcvmm/hpcvmm/uapi"
)

// recentExitSlots is how many of a vCPU's last userspace exits a triple
// fault report names: enough to see the device accesses that led up to it
// (a guest's last port or MMIO writes before it died), small enough for one
// log line.
const recentExitSlots = 8

// exitNote is one userspace exit: its reason and, for port I/O and MMIO,
// the address and direction.
type exitNote struct {
	reason uapi.ExitReason
	addr   uint64
	write  bool
	size   uint8
}

// recentExits is a ring of a vCPU's last exits. Only the vCPU's own thread
// writes it, once per exit without allocating; it is read when that thread
// stops the VM (a triple fault) or after it has finished.
type recentExits struct {
	notes [recentExitSlots]exitNote
	total uint64 // exits noted so far; the next goes to notes[total%len]
}

// note records one exit.
func (r *recentExits) note(reason uapi.ExitReason, addr uint64, write bool, size int) {
	r.notes[r.total%recentExitSlots] = exitNote{reason: reason, addr: addr, write: write, size: uint8(min(size, 255))}
	r.total++
}

// String lists the exits oldest first, as "IO out 0x3f8/1, MMIO write
// 0xfee000b0/4, KVM_EXIT_SHUTDOWN", after how many exits the vCPU had.
func (r *recentExits) String() string {
	if r.total == 0 {
		return "no userspace exit before it"
	}
	n := min(r.total, recentExitSlots)
	var b strings.Builder
	fmt.Fprintf(&b, "last %d of %d userspace exits: ", n, r.total)
	for i := r.total - n; i < r.total; i++ {
		if i > r.total-n {
			b.WriteString(", ")
		}
		e := r.notes[i%recentExitSlots]
		switch e.reason {
		case uapi.ExitIO:
			dir := "in"
			if e.write {
				dir = "out"
			}
			fmt.Fprintf(&b, "IO %s %#x/%d", dir, e.addr, e.size)
		case uapi.ExitMMIO:
			dir := "read"
			if e.write {
				dir = "write"
			}
			fmt.Fprintf(&b, "MMIO %s %#x/%d", dir, e.addr, e.size)
		default:
			b.WriteString(e.reason.String())
		}
	}
	return b.String()
}
