package msix_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/irq/irqtest"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/msix"
)

// sink records Target calls.
type sink struct {
	vectors  map[int]irq.MSIMessage
	signals  []int
	enabled  bool
	fmasked  bool
	controls int
}

func (s *sink) VectorChanged(v int, m irq.MSIMessage) {
	if s.vectors == nil {
		s.vectors = map[int]irq.MSIMessage{}
	}
	s.vectors[v] = m
}
func (s *sink) ControlChanged(en, fm bool) { s.enabled, s.fmasked = en, fm; s.controls++ }
func (s *sink) Signal(v int)               { s.signals = append(s.signals, v) }

// rig is a device config space with 5 MSI-X vectors in BAR4 (table at 0,
// PBA at 0x1000), the way the guest sees it.
type rig struct {
	cs   *pci.ConfigSpace
	m    *msix.Capability
	sink *sink
}

func newRig(t testing.TB) *rig {
	r := &rig{sink: &sink{}}
	r.cs = pci.NewConfigSpace(pci.Header{VendorID: 0x1234, DeviceID: 0x5678, Class: 0x020000})
	require.NoError(t, r.cs.SetBAR(4, pci.BARSpec{Size: 8192, Kind: pci.BARMem64}))
	_, err := r.cs.AddCapability(0x09, []byte{4, 0xaa}) // a vendor capability before MSI-X
	require.NoError(t, err)
	r.m, err = msix.New(r.cs, 5, 4, 0, 0x1000, r.sink)
	require.NoError(t, err)
	return r
}

func w32(m *msix.Capability, off uint64, v uint32) {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	m.Write(off, b[:])
}

func r32(m *msix.Capability, off uint64) uint32 {
	var b [4]byte
	m.Read(off, b[:])
	return binary.LittleEndian.Uint32(b[:])
}

// enableMSIX writes the message control word as the guest does.
func enableMSIX(r *rig, ctrl uint16) {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], ctrl)
	r.cs.ConfigWrite(uint32(r.m.Offset()+2), b[:])
}

func TestMSIXTableValidation(t *testing.T) {
	r := newRig(t)
	m := r.m
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
	m, s := r.m, r.sink
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
	assert.Equal(t, irq.MSIMessage{Addr: 0xfee00000, Data: 0x30}, s.vectors[0])
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

// TestMSIXPBAShowsSignalsBehindTheCapability: with an irq.Vectors target,
// a vector signalled straight through its eventfd (vhost-net does that)
// while masked reads as pending in the PBA, and unmasking delivers it
// once.
func TestMSIXPBAShowsSignalsBehindTheCapability(t *testing.T) {
	router := irqtest.NewRouter()
	vecs, err := irq.NewVectors(router, "test MSI-X", 5, nil)
	require.NoError(t, err)
	defer vecs.Close()
	cs := pci.NewConfigSpace(pci.Header{VendorID: 0x1234, DeviceID: 0x5678, Class: 0x020000})
	require.NoError(t, cs.SetBAR(4, pci.BARSpec{Size: 8192, Kind: pci.BARMem64}))
	m, err := msix.New(cs, 5, 4, 0, 0x1000, vecs)
	require.NoError(t, err)
	enable := func(ctrl uint16) {
		var b [2]byte
		binary.LittleEndian.PutUint16(b[:], ctrl)
		cs.ConfigWrite(uint32(m.Offset()+2), b[:])
	}
	enable(0x8000)
	w32(m, 3*16, 0xfee00000)
	w32(m, 3*16+8, 0x33)
	w32(m, 3*16+12, 0)
	require.NoError(t, irq.SignalEventFD(vecs.EventFD(3)))
	assert.Equal(t, uint32(0), r32(m, 0x1000), "unmasked: KVM's to deliver")
	var b [8]byte
	require.True(t, irq.DrainEventFD(vecs.EventFD(3), b[:]))

	w32(m, 3*16+12, 1)
	require.NoError(t, irq.SignalEventFD(vecs.EventFD(3)))
	assert.Equal(t, uint32(1<<3), r32(m, 0x1000), "fired while masked: pending")
	assert.True(t, m.Pending(3))
	router.TakeLog()
	w32(m, 3*16+12, 0)
	assert.Equal(t, []string{"assign 24"}, router.TakeLog())
	assert.False(t, m.Pending(3))
	require.True(t, irq.DrainEventFD(vecs.EventFD(3), b[:]), "delivered on unmask")
	assert.Equal(t, uint64(1), binary.LittleEndian.Uint64(b[:]))
}
