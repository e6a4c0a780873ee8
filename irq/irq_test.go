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
	fds, err := irq.NewVectors(router, 2, nil)
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
	f2, err := irq.NewVectors(bad, 1, func(e error) { got = e })
	require.NoError(t, err)
	defer f2.Close()
	f2.VectorChanged(0, msg)
	assert.ErrorContains(t, got, "boom")
}
