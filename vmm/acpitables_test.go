package vmm

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/pci"
)

// The host bridge's bus range (MCFG and _CRS) ends at the last bus that
// exists: a flat guest declares bus 0 only, one with a root port bus 0-1.
// Declaring 0-255 made Linux probe every slot of 255 empty buses.
func TestACPIBusRangeEndsAtTheLastBus(t *testing.T) {
	var mmio, pio bus.Bus
	vm := &VM{cfg: Config{Memory: 512 << 20}, dev: devices{pci: pci.NewRoot(pci.RootConfig{MMIO: &mmio, PIO: &pio})}}
	require.NoError(t, vm.dev.pci.AssignBuses())
	w, err := addrspace.NewWindows(vm.cfg.Memory, 46)
	require.NoError(t, err)
	p := vm.acpiPlatform(w)
	assert.Equal(t, uint8(0), p.PCI.BusStart)
	assert.Equal(t, uint8(0), p.PCI.BusEnd, "no bridges: bus 0 only")

	port, err := pci.NewBridge(pci.BridgeConfig{Type: pci.RootPort, Link: pci.Link{Speed: 4, Width: 16}})
	require.NoError(t, err)
	require.NoError(t, vm.dev.pci.AddDevice(10, "root port", port))
	require.NoError(t, vm.dev.pci.AssignBuses())
	assert.Equal(t, uint8(1), vm.acpiPlatform(w).PCI.BusEnd, "one root port: buses 0-1")
}
