package pci_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/addrspace"
	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/pci"
	"github.com/hpcvmm/hpcvmm/pci/pcitest"
	"github.com/hpcvmm/hpcvmm/platform"
)

// memslotDev is a testDev whose 64-bit prefetchable BAR2 has no handler:
// like a passed-through BAR, it is only a memslot, so no bus registration
// can catch an overlap.
type memslotDev struct{ *testDev }

func (d memslotDev) BARHandler(bar int) bus.Device {
	if bar == 2 {
		return nil
	}
	return d.testDev.BARHandler(bar)
}

// TestGuestMovesBARsOverRAMAndOtherBARs plays a guest that programs BARs
// over guest RAM, over the LAPIC/MSI window and over another device's BARs
// (one with a bus handler, one that is only a memslot), a thousand times
// each: every placement is refused, the BAR stays off, the other device's
// BARs keep decoding, the refusals are logged once per interval (the VMM's
// wiring: platform.Refusals), and a valid placement afterwards decodes.
func TestGuestMovesBARsOverRAMAndOtherBARs(t *testing.T) {
	var logBuf bytes.Buffer
	ref := platform.NewRefusals(slog.New(slog.NewTextHandler(&logBuf, nil)), time.Hour)
	pio, mmio := &bus.Bus{}, &bus.Bus{}
	const ram = 256 << 20
	root := pci.NewRoot(pci.RootConfig{MMIO: mmio, PIO: pio, OnError: func(err error) { ref.Refuse("pci", err) },
		Reserved: []pci.Reserved{{Name: "guest RAM", Base: 0, Size: ram}, {Name: "the LAPIC and MSI window", Base: 0xfee00000, Size: 1 << 20}}})
	require.NoError(t, pio.Register(pci.ConfigIOPort, pci.ConfigIOSize, "conf1", root.ConfigIO()))
	a, b := newTestDev(t), memslotDev{newTestDev(t)}
	require.NoError(t, root.AddDevice(3, "a", a))
	require.NoError(t, root.AddDevice(4, "b", b))
	w, err := addrspace.NewWindows(ram, 46)
	require.NoError(t, err)
	require.NoError(t, root.AssignBARs(w))
	cfg := pcitest.Conf1{PIO: pio}
	a0, a2 := a.mapped[0], a.mapped[2]
	b0, b2 := b.mapped[0], b.mapped[2]
	require.NotZero(t, a0)
	require.NotZero(t, b2)

	moves := []struct {
		name       string
		bar        int
		addr       uint64
		want       string
		restoreBAR uint64
	}{
		{"BAR0 over guest RAM", 0, 0x100000, "over guest RAM", b0},
		{"BAR0 over the MSI window", 0, 0xfee00000, "over the LAPIC and MSI window", b0},
		{"BAR0 over the other device's BAR0", 0, a0, "over 00:03.0 a BAR0", b0},
		{"memslot-only BAR2 over guest RAM", 2, 0x200000, "over guest RAM", b2},
		{"memslot-only BAR2 over the other device's BAR2", 2, a2, "over 00:03.0 a BAR2", b2},
	}
	write := func(bar int, addr uint64) {
		cfg.Write(4, 0, pci.RegBAR0+4*bar, 4, uint32(addr))
		if bar == 2 {
			cfg.Write(4, 0, pci.RegBAR0+4*bar+4, 4, uint32(addr>>32))
		}
	}
	for _, m := range moves {
		logBuf.Reset()
		before := ref.Count("pci")
		for i := 0; i < 1000; i++ {
			write(m.bar, m.addr)
			_, on := b.mapped[m.bar]
			require.False(t, on, "%s: the BAR decodes at %#x", m.name, m.addr)
		}
		// A 64-bit BAR is written as two dwords, each a placement.
		assert.GreaterOrEqual(t, ref.Count("pci")-before, uint64(1000), "%s: every placement refused", m.name)
		assert.LessOrEqual(t, strings.Count(logBuf.String(), "device error"), 1, "%s: at most one line per interval:\n%s", m.name, logBuf.String())
		// The other device is untouched and still reached through its BARs.
		assert.Equal(t, a0, a.mapped[0])
		assert.Equal(t, a2, a.mapped[2])
		writes := a.mem32.writes
		mmio.Write(a0, []byte{1, 2, 3, 4})
		assert.Equal(t, writes+1, a.mem32.writes, "%s: device a's BAR0 still decodes", m.name)
		// A valid placement decodes again.
		write(m.bar, m.restoreBAR)
		assert.Equal(t, m.restoreBAR, b.mapped[m.bar], "%s: back at a valid address", m.name)
	}
}
