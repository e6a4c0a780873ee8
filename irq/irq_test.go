package irq_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/irq/irqtest"
)

func TestVectorsOrdering(t *testing.T) {
	router := irqtest.NewRouter()
	fds, err := irq.NewVectors(router, "test MSI-X", 2, nil)
	require.NoError(t, err)
	defer fds.Close()
	msg := irq.MSIMessage{Addr: 0xfee00000, Data: 0x41}
	fds.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Masked: true})
	assert.Empty(t, router.TakeLog(), "masked vector never routed")

	fds.VectorChanged(0, msg)
	assert.Equal(t, []string{"alloc 24", "route 24 0xfee00000 0x41", "assign 24"}, router.TakeLog(), "unmask: route, then assign")
	route, ok := router.Assigned(fds.EventFD(0))
	require.True(t, ok)
	assert.Equal(t, irqtest.Route{AddrLo: 0xfee00000, Data: 0x41}, route)

	fds.VectorChanged(0, irq.MSIMessage{Addr: 0xfee01000, Data: 0x42, Masked: true})
	assert.Equal(t, []string{"deassign 24"}, router.TakeLog(), "mask: deassign before any route change")
	fds.VectorChanged(0, irq.MSIMessage{Addr: 0xfee01000, Data: 0x42})
	assert.Equal(t, []string{"route 24 0xfee01000 0x42", "assign 24"}, router.TakeLog(), "GSI reused")

	// Signal writes the eventfd KVM listens on.
	fds.Signal(0)
	var b [8]byte
	require.True(t, irq.DrainEventFD(fds.EventFD(0), b[:]))
	assert.Equal(t, uint64(1), binary.LittleEndian.Uint64(b[:]))

	// Failures are reported, never panic.
	var got error
	bad := irqtest.NewRouter()
	bad.Fail = errors.New("boom")
	f2, err := irq.NewVectors(bad, "test MSI-X", 1, func(e error) { got = e })
	require.NoError(t, err)
	defer f2.Close()
	f2.VectorChanged(0, msg)
	assert.ErrorContains(t, got, "boom")
}

// TestVectorsRouteOnlyWhatChanged: unmasking with the message KVM already
// routes needs only the irqfd; a masked vector's new message is routed
// only when it is unmasked.
func TestVectorsRouteOnlyWhatChanged(t *testing.T) {
	router := irqtest.NewRouter()
	v, err := irq.NewVectors(router, "test MSI-X", 1, nil)
	require.NoError(t, err)
	defer v.Close()
	msg := irq.MSIMessage{Addr: 0xfee00000, Data: 0x41}
	v.VectorChanged(0, msg)
	assert.Equal(t, []string{"alloc 24", "route 24 0xfee00000 0x41", "assign 24"}, router.TakeLog())
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x41, Masked: true})
	v.VectorChanged(0, msg)
	assert.Equal(t, []string{"deassign 24", "assign 24"}, router.TakeLog(), "same message: no route call")
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x42, Masked: true})
	assert.Equal(t, []string{"deassign 24"}, router.TakeLog(), "masked: the new message waits")
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x42})
	assert.Equal(t, []string{"route 24 0xfee00000 0x42", "assign 24"}, router.TakeLog())

	// A refused route is tried again on the next unmask.
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x43, Masked: true})
	router.Fail = errors.New("refused")
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x43})
	router.Fail = nil
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x43, Masked: true})
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x43})
	assert.Equal(t, []string{"deassign 24", "route 24 0xfee00000 0x43", "assign 24"}, router.TakeLog())
}

// TestVectorsTakePending: a signal sent while a vector has no irqfd waits
// in its eventfd, and TakePending reports it once; an assigned vector's
// signals are KVM's.
func TestVectorsTakePending(t *testing.T) {
	router := irqtest.NewRouter()
	v, err := irq.NewVectors(router, "test MSI-X", 2, nil)
	require.NoError(t, err)
	defer v.Close()
	assert.False(t, v.TakePending(0))
	v.Signal(0)
	assert.True(t, v.TakePending(0), "fired before it was ever unmasked")
	assert.False(t, v.TakePending(0), "taken")

	v.VectorChanged(1, irq.MSIMessage{Addr: 0xfee00000, Data: 0x41})
	v.Signal(1)
	assert.False(t, v.TakePending(1), "assigned: KVM delivers it")
	var b [8]byte
	require.True(t, irq.DrainEventFD(v.EventFD(1), b[:]), "and TakePending left it alone")
	v.VectorChanged(1, irq.MSIMessage{Addr: 0xfee00000, Data: 0x41, Masked: true})
	v.Signal(1)
	v.Signal(1)
	assert.True(t, v.TakePending(1), "masked: pending")
	assert.False(t, v.TakePending(1))
	assert.False(t, v.TakePending(-1))
	assert.False(t, v.TakePending(2))
}
