package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/hpcvmm/hpcvmm/uapi"
)

func TestRecentExits(t *testing.T) {
	var r recentExits
	assert.Equal(t, "no userspace exit before it", r.String())

	r.note(uapi.ExitIO, 0x3f8, true, 1)
	r.note(uapi.ExitMMIO, 0xfee000b0, false, 4)
	r.note(uapi.ExitShutdown, 0, false, 0)
	assert.Equal(t, "last 3 of 3 userspace exits: IO out 0x3f8/1, MMIO read 0xfee000b0/4, KVM_EXIT_SHUTDOWN", r.String())

	// Past the ring's size only the newest recentExitSlots remain, oldest
	// first.
	for i := range 20 {
		r.note(uapi.ExitIO, uint64(0x70+i), i%2 == 0, 1)
	}
	r.note(uapi.ExitShutdown, 0, false, 0)
	want := "last 8 of 24 userspace exits: IO in 0x7d/1, IO out 0x7e/1, IO in 0x7f/1, IO out 0x80/1, IO in 0x81/1, IO out 0x82/1, IO in 0x83/1, KVM_EXIT_SHUTDOWN"
	assert.Equal(t, want, r.String())
}

// BenchmarkNoteExit: noting an exit on the vCPU's exit path allocates
// nothing.
func BenchmarkNoteExit(b *testing.B) {
	var r recentExits
	b.ReportAllocs()
	for i := range b.N {
		r.note(uapi.ExitIO, uint64(i&0xffff), true, 1)
	}
	if testing.AllocsPerRun(100, func() { r.note(uapi.ExitMMIO, 0xfee00000, true, 4) }) != 0 {
		b.Fatal("note allocates")
	}
}
