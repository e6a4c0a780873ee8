package acpi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// resourcesVector builds testdata/resources.asl with the Go API.
func resourcesVector() []Term {
	ro := DWordMemory(0x80000000, 0x8fffffff, Cacheable, false)
	wc := QWordMemory(0xb0000000, 0xbfffffff, WriteCombining, true)
	wc.Consumer = true
	return []Term{
		Name("R000", ResourceTemplate(
			WordBusNumber(0, 0xff),
			IO{Decode16: true, Min: 0xcf8, Max: 0xcf8, Alignment: 1, Length: 8},
			IO{Min: 0x60, Max: 0x64, Alignment: 4, Length: 1},
			WordIO(0x1000, 0xffff),
			DWordIO(0x1000, 0xffff),
			DWordMemory(0xc0000000, 0xfebfffff, NonCacheable, true),
			ro,
			QWordMemory(0x8000000000, 0xffffffffff, Cacheable, true),
			QWordMemory(0x10000000000, 0x1ffffffffff, Prefetchable, true),
			wc,
			Memory32Fixed{Writable: true, Base: 0xb0000000, Length: 0x10000000},
			Memory32Fixed{Base: 0xfed00000, Length: 4},
			Interrupt{Consumer: true, EdgeTriggered: true, GSIs: []uint32{5}},
			Interrupt{Consumer: true, ActiveLow: true, Shared: true, GSIs: []uint32{16, 17, 0x100}},
			Interrupt{WakeCapable: true, GSIs: []uint32{0xffffffff}},
			IRQNoFlags{IRQs: []uint8{4}},
			IRQNoFlags{IRQs: []uint8{1, 12}},
		)),
		Name("R001", ResourceTemplate(
			IO{Decode16: true, Min: 0x3f8, Max: 0x3f8, Length: 8},
			IRQNoFlags{IRQs: []uint8{4}},
		)),
	}
}

func TestResourcesMatchIASL(t *testing.T) {
	assert.Equal(t, vectorBody(t, "resources"), mustEncode(t, resourcesVector()...))
}

func TestResourceErrors(t *testing.T) {
	bad := map[string]Resource{
		"IRQ above 15":          IRQNoFlags{IRQs: []uint8{16}},
		"IO min above max":      IO{Min: 2, Max: 1},
		"memory32 past 4 GiB":   Memory32Fixed{Base: 0xffff0000, Length: 0x20000},
		"no interrupts":         Interrupt{},
		"address bits":          AddressSpace{Bits: 8},
		"address min above max": AddressSpace{Bits: 64, Min: 2, Max: 1},
		"word overflow":         AddressSpace{Bits: 16, Max: 0x10000},
		"bad type":              AddressSpace{Bits: 32, Type: 3},
	}
	for name, r := range bad {
		_, err := Encode(ResourceTemplate(r))
		assert.Error(t, err, name)
	}
	_, err := Encode(ResourceTemplate(nil))
	require.Error(t, err)
}
