package platform_test

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/bus"
	"github.com/hpcvmm/hpcvmm/platform"
)

type pmRig struct {
	pio               bus.Bus
	pm                *platform.ACPIPM
	poweroffs, resets int
}

func newPMRig(t testing.TB) *pmRig {
	r := &pmRig{}
	r.pm = platform.NewACPIPM(func() { r.poweroffs++ }, func() { r.resets++ })
	require.NoError(t, r.pio.Register(platform.ACPISleepControlPort, platform.ACPIPortsSize, "acpi pm", r.pm))
	return r
}

func TestACPIPMPowerOffAndReset(t *testing.T) {
	r := newPMRig(t)
	// What Linux's acpi_hw_extended_sleep writes for S5: SLP_TYP<<2, then
	// with SLP_EN.
	r.pio.Write(platform.ACPISleepControlPort, []byte{platform.ACPISleepTypeS5 << 2})
	assert.Zero(t, r.poweroffs, "SLP_TYP alone does not sleep")
	r.pio.Write(platform.ACPISleepControlPort, []byte{platform.ACPISleepTypeS5<<2 | 0x20})
	assert.Equal(t, 1, r.poweroffs)

	r.pio.Write(platform.ACPISleepControlPort, []byte{3<<2 | 0x20}) // S3: unsupported
	assert.Equal(t, 1, r.poweroffs)
	assert.Equal(t, uint64(1), r.pm.Ignored())

	r.pio.Write(platform.ACPIResetPort, []byte{0x2})
	assert.Zero(t, r.resets, "wrong reset value")
	r.pio.Write(platform.ACPIResetPort, []byte{platform.ACPIResetValue})
	assert.Equal(t, 1, r.resets)

	b := []byte{0xff}
	require.True(t, r.pio.Read(platform.ACPISleepStatusPort, b))
	assert.Zero(t, b[0], "WAK_STS never set")
}

func TestGEDReadClearsEvents(t *testing.T) {
	raised := 0
	g := platform.NewGED(func() { raised++ })
	var b [4]byte
	g.Read(0, b[:])
	assert.Zero(t, binary.LittleEndian.Uint32(b[:]))
	g.Press(platform.GEDPowerButton)
	g.Press(platform.GEDPowerButton)
	assert.Equal(t, 2, raised, "each press raises the interrupt")
	g.Read(1, b[:]) // misaligned: nothing, and the event stays
	assert.Zero(t, binary.LittleEndian.Uint32(b[:]))
	g.Read(0, b[:])
	assert.Equal(t, uint32(platform.GEDPowerButton), binary.LittleEndian.Uint32(b[:]))
	g.Read(0, b[:])
	assert.Zero(t, binary.LittleEndian.Uint32(b[:]), "read-to-clear")
	g.Write(0, []byte{1, 1, 1, 1})
	g.Read(0, b[:])
	assert.Zero(t, binary.LittleEndian.Uint32(b[:]), "writes are ignored")
}

// FuzzACPIRegisters drives the PM ports and the GED with arbitrary guest
// accesses and asserts the only effects are the defined ones: a power-off
// only after a byte with SLP_EN and SLP_TYP=S5 reached sleep control, a
// reset only after ACPIResetValue reached the reset port, GED reads only
// ever return pressed bits, and nothing panics.
func FuzzACPIRegisters(f *testing.F) {
	f.Add([]byte{0, 0x34, 2, 1, 1, 0})
	r := newPMRig(f)
	g := platform.NewGED(func() {})
	f.Fuzz(func(t *testing.T, ops []byte) {
		r.poweroffs, r.resets = 0, 0
		wantOff, wantReset := 0, 0
		pressed := uint32(0)
		buf := make([]byte, 8)
		for len(ops) >= 3 {
			op, off, v := ops[0], ops[1], ops[2]
			ops = ops[3:]
			width := 1 << (op >> 6) // 1, 2, 4, 8
			data := buf[:width]
			for i := range data {
				data[i] = v
			}
			switch op & 3 {
			case 0:
				port := uint64(platform.ACPISleepControlPort) + uint64(off%4)
				if r.pio.Write(port, data) {
					switch port {
					case platform.ACPISleepControlPort:
						if v&0x20 != 0 && (v&0x1c)>>2 == platform.ACPISleepTypeS5 {
							wantOff++
						}
					case platform.ACPIResetPort:
						if v == platform.ACPIResetValue {
							wantReset++
						}
					}
				}
			case 1:
				if !r.pio.Read(uint64(platform.ACPISleepControlPort)+uint64(off%4), data) {
					continue // 0x603: not ours
				}
				for _, x := range data {
					require.Zero(t, x, "PM registers read 0")
				}
			case 2:
				g.Press(uint32(v) & platform.GEDPowerButton)
				pressed |= uint32(v) & platform.GEDPowerButton
			case 3:
				g.Write(uint64(off), data)
				g.Read(uint64(off%8), data)
				if width == 4 && off%8 == 0 {
					got := binary.LittleEndian.Uint32(data)
					require.Zero(t, got&^pressed, "GED returned an event never pressed")
					pressed = 0
				}
			}
		}
		g.Read(0, buf[:4])
		require.Equal(t, wantOff, r.poweroffs)
		require.Equal(t, wantReset, r.resets)
	})
}
