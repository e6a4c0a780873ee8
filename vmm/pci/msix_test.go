package pci_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/vmm/pci"
	"github.com/hpcvmm/hpcvmm/vmm/pci/pcitest"
)

func w32(m *pci.MSIX, off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	m.Write(off, b[:])
}

func r32(m *pci.MSIX, off uint64) uint32 {
	var b [4]byte
	m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

func enableMSIX(r *rig, ctrl uint16) {
	off := r.dev.msix.Offset()
	r.cfg.Write(3, 0, off+2, 2, uint32(ctrl))
}

func TestMSIXTableValidation(t *testing.T) {
	r := newRig(t)
	m := r.dev.msix
	// Reset state: every vector masked.
	for v := 0; v < 5; v++ {
		assert.Equal(t, uint32(1), r32(m, uint64(16*v+12)))
	}
	w32(m, 16+0, 0xfee00003) // address low: bits 1:0 reserved
	w32(m, 16+4, 0x1)
	w32(m, 16+8, 0x4041)
	w32(m, 16+12, 0xfffffffe) // reserved control bits dropped: unmasks
	assert.Equal(t, uint32(0xfee00000), r32(m, 16))
	assert.Equal(t, uint32(1), r32(m, 20))
	assert.Equal(t, uint32(0x4041), r32(m, 24))
	assert.Equal(t, uint32(0), r32(m, 28))

	// Misaligned, odd-width and out-of-table writes are ignored.
	m.Write(16+2, []byte{1, 2, 3, 4})
	m.Write(16, []byte{1, 2})
	m.Write(16+4, make([]byte, 8)) // qword not 8-aligned
	m.Write(5*16, []byte{1, 2, 3, 4})
	assert.Equal(t, uint32(0xfee00000), r32(m, 16))
	assert.Equal(t, uint32(1), r32(m, 20))
	// Aligned qword write covers two dwords.
	var q [8]byte
	binary.LittleEndian.PutUint64(q[:], 0x1_0000_0000|0xfee01000)
	m.Write(32, q[:])
	assert.Equal(t, uint32(0xfee01000), r32(m, 32))
	assert.Equal(t, uint32(1), r32(m, 36))
	// The PBA is read-only.
	w32(m, 0x1000, 0xffffffff)
	assert.Equal(t, uint32(0), r32(m, 0x1000))
}

func TestMSIXCallbacksAndPending(t *testing.T) {
	r := newRig(t)
	m, s := r.dev.msix, r.dev.sink
	w32(m, 0, 0xfee00000)
	w32(m, 8, 0x30)
	assert.True(t, s.vectors[0].Masked, "written while masked")

	// Disabled: triggers are dropped (no INTx fallback exists).
	m.Trigger(0)
	assert.Empty(t, s.signals)
	assert.False(t, m.Pending(0))

	enableMSIX(r, 0xc000) // enable + function mask
	assert.True(t, s.enabled)
	assert.True(t, s.fmasked)
	w32(m, 12, 0) // entry unmasked, function still masked
	assert.True(t, s.vectors[0].Masked)
	m.Trigger(0)
	assert.Empty(t, s.signals)
	assert.True(t, m.Pending(0))
	assert.Equal(t, uint32(1), r32(m, 0x1000), "PBA shows the pending vector")

	enableMSIX(r, 0x8000) // clear function mask: pending vector delivered
	assert.Equal(t, pci.MSIMessage{Addr: 0xfee00000, Data: 0x30}, s.vectors[0])
	assert.Equal(t, []int{0}, s.signals)
	assert.False(t, m.Pending(0))
	assert.Equal(t, uint32(0), r32(m, 0x1000))

	m.Trigger(0)
	assert.Equal(t, []int{0, 0}, s.signals)
	// Entry mask → pending → unmask delivers.
	w32(m, 12, 1)
	m.Trigger(0)
	m.Trigger(4)
	assert.True(t, m.Pending(0))
	assert.True(t, m.Pending(4))
	assert.Equal(t, uint32(0x11), r32(m, 0x1000))
	w32(m, 12, 0)
	assert.Equal(t, []int{0, 0, 0}, s.signals)
	m.Trigger(99) // out of range: ignored
	m.Trigger(-1)
}

func TestIRQFDOrdering(t *testing.T) {
	router := pcitest.NewRouter()
	fds, err := pci.NewIRQFDs(router, 2, nil)
	require.NoError(t, err)
	defer fds.Close()
	msg := pci.MSIMessage{Addr: 0xfee00000, Data: 0x41}
	fds.VectorChanged(0, pci.MSIMessage{Addr: 0xfee00000, Masked: true})
	assert.Empty(t, router.TakeLog(), "masked vector never routed")

	fds.VectorChanged(0, msg)
	assert.Equal(t, []string{"alloc 24", "route 24 0xfee00000 0x41", "assign 24"}, router.TakeLog(), "unmask: route, then assign")
	route, ok := router.Assigned(fds.EventFD(0))
	require.True(t, ok)
	assert.Equal(t, pcitest.Route{AddrLo: 0xfee00000, Data: 0x41}, route)

	fds.VectorChanged(0, pci.MSIMessage{Addr: 0xfee01000, Data: 0x42, Masked: true})
	assert.Equal(t, []string{"deassign 24"}, router.TakeLog(), "mask: deassign before any route change")
	fds.VectorChanged(0, pci.MSIMessage{Addr: 0xfee01000, Data: 0x42})
	assert.Equal(t, []string{"route 24 0xfee01000 0x42", "assign 24"}, router.TakeLog(), "GSI reused")

	// Signal writes the eventfd KVM listens on.
	fds.Signal(0)
	var b [8]byte
	require.True(t, pci.DrainEventFD(fds.EventFD(0), b[:]))
	assert.Equal(t, uint64(1), binary.LittleEndian.Uint64(b[:]))

	// Failures are reported, never panic.
	var got error
	bad := pcitest.NewRouter()
	bad.Fail = errors.New("boom")
	f2, err := pci.NewIRQFDs(bad, 1, func(e error) { got = e })
	require.NoError(t, err)
	defer f2.Close()
	f2.VectorChanged(0, msg)
	assert.ErrorContains(t, got, "boom")
}
