package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/irq"
	"github.com/hpcvmm/hpcvmm/uapi"
)

// recordingVM is a routingVM that keeps every routing table pushed.
type recordingVM struct {
	pushes [][]uapi.IRQRoutingEntry
}

func (v *recordingVM) SetGSIRouting(e []uapi.IRQRoutingEntry) error {
	v.pushes = append(v.pushes, append([]uapi.IRQRoutingEntry(nil), e...))
	return nil
}
func (v *recordingVM) IRQFD(int, uint32, int) error     { return nil }
func (v *recordingVM) IRQFDDeassign(int, uint32) error  { return nil }
func (v *recordingVM) IOEventFD(e uapi.IOEventFD) error { return nil }

// TestGSIBudgetCountsDefaultRoutes: KVM's table holds 4096 entries in all,
// the 40 default PIC/IOAPIC entries among them, so 4056 MSI routes fit and
// the next allocation is an error that says why; the full table is exactly
// KVM_MAX_IRQ_ROUTES entries.
func TestGSIBudgetCountsDefaultRoutes(t *testing.T) {
	vm := &recordingVM{}
	r := newIRQRouter(vm)
	var last uint32
	for i := 0; i < maxMSIRoutes; i++ {
		g, err := r.AllocGSI()
		require.NoError(t, err, "MSI route %d of %d", i+1, maxMSIRoutes)
		last = g
	}
	_, err := r.AllocGSI()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "4056 MSI routes")
	assert.Contains(t, err.Error(), "4096 entries (KVM_MAX_IRQ_ROUTES)")
	assert.Less(t, last, uint32(maxRoutes), "GSIs stay below KVM_MAX_IRQ_ROUTES")

	// Fill the table (every route but the last set directly, to push once).
	r.mu.Lock()
	for g := uint32(ioapicPins); g < last; g++ {
		e := uapi.IRQRoutingEntry{GSI: g, Type: uapi.IRQRoutingMSI}
		e.MSI.AddressLo, e.MSI.Data = 0xfee00000, g
		r.msi[g] = e
	}
	r.mu.Unlock()
	require.NoError(t, r.SetMSIRoute(last, 0xfee00000, 0, 0x41))
	require.Len(t, vm.pushes, 1)
	assert.Len(t, vm.pushes[0], maxRoutes, "defaults plus every MSI route is KVM_MAX_IRQ_ROUTES entries")

	// A vector that runs out names its device and vector count.
	var got error
	v, err := irq.NewVectors(r, "0000:41:00.0 MSI-X", 64, func(e error) { got = e })
	require.NoError(t, err)
	defer v.Close()
	v.VectorChanged(3, irq.MSIMessage{Addr: 0xfee00000, Data: 0x42})
	require.Error(t, got)
	assert.Contains(t, got.Error(), "0000:41:00.0 MSI-X: vector 3 of 64: allocate GSI")
	assert.Contains(t, got.Error(), "all 4056 MSI routes are in use")
}

// TestFullGSITableFitsKVM pushes the largest table the router can build to
// the running kernel: KVM must accept it (it would refuse one entry more).
func TestFullGSITableFitsKVM(t *testing.T) {
	sys, err := uapi.OpenKVM()
	if err != nil {
		testenv.SkipOrFail(t, "no usable /dev/kvm: %v", err)
	}
	defer sys.Close()
	kvm, err := sys.CreateVM()
	require.NoError(t, err)
	defer kvm.Close()
	require.NoError(t, kvm.CreateIRQChip())
	r := newIRQRouter(kvm)
	var gsis []uint32
	for {
		g, err := r.AllocGSI()
		if err != nil {
			break
		}
		gsis = append(gsis, g)
	}
	last := gsis[len(gsis)-1]
	r.mu.Lock()
	for _, g := range gsis[:len(gsis)-1] {
		e := uapi.IRQRoutingEntry{GSI: g, Type: uapi.IRQRoutingMSI}
		e.MSI.AddressLo, e.MSI.Data = 0xfee00000, g&0xff
		r.msi[g] = e
	}
	r.mu.Unlock()
	require.NoError(t, r.SetMSIRoute(last, 0xfee00000, 0, 0x41), "%d MSI routes after the defaults", len(gsis))
}

// TestUnchangedRouteIsNotPushed: KVM_SET_GSI_ROUTING replaces the whole
// table, so a route KVM already has is not sent again; a refused push
// leaves the router's table as KVM's.
func TestUnchangedRouteIsNotPushed(t *testing.T) {
	vm := &recordingVM{}
	r := newIRQRouter(vm)
	g, err := r.AllocGSI()
	require.NoError(t, err)
	require.NoError(t, r.SetMSIRoute(g, 0xfee00000, 0, 0x41))
	require.NoError(t, r.SetMSIRoute(g, 0xfee00000, 0, 0x41))
	assert.Len(t, vm.pushes, 1, "same route twice: one push")
	require.NoError(t, r.SetMSIRoute(g, 0xfee01000, 0, 0x41))
	assert.Len(t, vm.pushes, 2, "changed route: pushed")
	assert.Len(t, vm.pushes[1], 41)

	assert.Error(t, r.SetMSIRoute(g+1, 0xfee00000, 0, 0x41), "a GSI AllocGSI never gave out")
	assert.Error(t, r.SetMSIRoute(5, 0xfee00000, 0, 0x41), "an IOAPIC pin")

	// Through irq.Vectors: masking and unmasking with the same message
	// needs no new table.
	v, err := irq.NewVectors(r, "test MSI-X", 2, nil)
	require.NoError(t, err)
	defer v.Close()
	vm.pushes = nil
	msg := irq.MSIMessage{Addr: 0xfee00000, Data: 0x51}
	v.VectorChanged(0, msg)
	assert.Len(t, vm.pushes, 1)
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x51, Masked: true})
	v.VectorChanged(0, msg)
	assert.Len(t, vm.pushes, 1, "mask and unmask with the same message: no push")
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x52, Masked: true})
	assert.Len(t, vm.pushes, 1, "a masked vector's new message is not pushed while nothing uses it")
	v.VectorChanged(0, irq.MSIMessage{Addr: 0xfee00000, Data: 0x52})
	assert.Len(t, vm.pushes, 2, "unmasked with a new message: pushed")
}
