package platform

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/hpcvmm/hpcvmm/bus"
)

type kbcRig struct {
	k      *I8042
	data   bus.Device
	cmd    bus.Device
	resets int
}

func newKBC() *kbcRig {
	r := &kbcRig{}
	r.k = NewI8042(func() { r.resets++ })
	r.data, r.cmd = r.k.DataPort(), r.k.CommandPort()
	return r
}

func (r *kbcRig) status() byte   { b := []byte{0}; r.cmd.Read(0, b); return b[0] }
func (r *kbcRig) readData() byte { b := []byte{0}; r.data.Read(0, b); return b[0] }
func (r *kbcRig) command(c byte) { r.cmd.Write(0, []byte{c}) }
func (r *kbcRig) writeData(v byte) {
	r.data.Write(0, []byte{v})
}

// i8042Command mirrors Linux's __i8042_command: send the command, its
// parameters, then collect the answers, failing where Linux would time out
// (no OBF) or reject an AUX loop answer lacking the AUX flag.
func (r *kbcRig) linuxCommand(t *testing.T, c byte, params []byte, nresp int) ([]byte, bool) {
	t.Helper()
	require.Zero(t, r.status()&0x02, "input buffer must never be full")
	r.command(c)
	for _, p := range params {
		r.writeData(p)
	}
	var resp []byte
	for i := 0; i < nresp; i++ {
		st := r.status()
		if st&i8042StrOBF == 0 {
			return resp, false // Linux would wait 500 ms, then fail
		}
		if c == i8042CmdWriteAux && st&0x20 == 0 {
			return resp, false // "auxerr", immediately
		}
		resp = append(resp, r.readData())
	}
	return resp, true
}

func TestI8042Reset(t *testing.T) {
	r := newKBC()
	r.command(0xfe)
	assert.Equal(t, 1, r.resets, "0xFE pulses the reset line")

	for _, c := range []byte{0x20, 0xaa, 0xab, 0xad, 0xae, 0xa7, 0xa8, 0xd0, 0xff, 0xfd, 0x00, 0xed} {
		r.command(c)
	}
	r.writeData(0xfe) // a keyboard byte, not a command
	assert.Equal(t, 1, r.resets, "no other command resets")

	// Writing the output port with the reset bit clear also resets, as on
	// the real controller.
	r.command(i8042CmdWriteOut)
	r.writeData(i8042OutA20 | i8042OutReset)
	assert.Equal(t, 1, r.resets)
	r.command(i8042CmdWriteOut)
	r.writeData(i8042OutA20)
	assert.Equal(t, 2, r.resets)
}

func TestI8042StatusIdle(t *testing.T) {
	r := newKBC()
	st := r.status()
	assert.Zero(t, st&i8042StrOBF, "nothing to read: Linux's flush finds an empty controller")
	assert.Zero(t, st&0x02, "input buffer empty: kb_wait() before reboot does not spin")
	assert.NotZero(t, st&i8042StrKeylock, "keylock off")
	assert.NotZero(t, st&i8042StrSysFlag)
}

func TestI8042CTR(t *testing.T) {
	r := newKBC()
	r.command(i8042CmdReadCTR)
	assert.NotZero(t, r.status()&i8042StrOBF)
	assert.NotZero(t, r.status()&i8042StrCmdDat)
	ctr := r.readData()
	assert.Zero(t, r.status()&i8042StrOBF, "reading the data port empties the buffer")

	r.command(i8042CmdWriteCTR)
	r.writeData(ctr ^ 0x40)
	assert.Zero(t, r.status()&i8042StrCmdDat)
	got, ok := r.linuxCommand(t, i8042CmdReadCTR, nil, 1)
	require.True(t, ok)
	assert.Equal(t, []byte{ctr ^ 0x40}, got)
}

// TestI8042LinuxProbe walks the i8042 driver's probe: flush, stable CTR
// reads, CTR write-back, self-test, and the AUX check, which must reject
// the AUX port at once and leave nothing behind in the output buffer.
func TestI8042LinuxProbe(t *testing.T) {
	r := newKBC()
	for n := 0; n < 16 && r.status()&i8042StrOBF != 0; n++ {
		r.readData()
	}
	assert.Zero(t, r.status()&i8042StrOBF)

	c1, ok := r.linuxCommand(t, i8042CmdReadCTR, nil, 1)
	require.True(t, ok)
	c2, ok := r.linuxCommand(t, i8042CmdReadCTR, nil, 1)
	require.True(t, ok)
	require.Equal(t, c1, c2, "stable CTR")

	resp, ok := r.linuxCommand(t, i8042CmdSelfTest, nil, 1)
	require.True(t, ok)
	assert.Equal(t, []byte{0x55}, resp)

	ctr := (c1[0] | i8042CtrKbdDis) &^ 0x01
	_, ok = r.linuxCommand(t, i8042CmdWriteCTR, []byte{ctr}, 0)
	require.True(t, ok)

	// i8042_check_aux: the loop fails fast (no AUX flag), then the AUX
	// test answer is an error code, so no AUX port is registered.
	_, ok = r.linuxCommand(t, i8042CmdWriteAux, []byte{0x5a}, 1)
	assert.False(t, ok, "AUX loop rejected")
	resp, ok = r.linuxCommand(t, i8042CmdAuxTest, nil, 1)
	require.True(t, ok, "AUX test answers without a timeout")
	require.Len(t, resp, 1)
	assert.True(t, resp[0] != 0 && resp[0] != 0xfa && resp[0] != 0xff, "AUX test reports no device, got %#x", resp[0])
	assert.Zero(t, r.status()&i8042StrOBF, "no stale byte left for the next command")

	// Keyboard enable and the CTR write-back still work afterwards.
	_, ok = r.linuxCommand(t, i8042CmdKbdEn, nil, 0)
	require.True(t, ok)
	got, ok := r.linuxCommand(t, i8042CmdReadCTR, nil, 1)
	require.True(t, ok)
	assert.Equal(t, ctr&^i8042CtrKbdDis, got[0])
	assert.Zero(t, r.resets)
}

func TestI8042UnknownReads(t *testing.T) {
	r := newKBC()
	b := []byte{0, 0, 0, 0}
	r.data.Read(0, b)
	assert.Equal(t, []byte{0, 0xff, 0xff, 0xff}, b, "empty buffer reads the stale latch, extra bytes all ones")
	b = []byte{0}
	r.cmd.Read(3, b)
	assert.Equal(t, byte(0xff), b[0])
	r.cmd.Write(3, []byte{0xfe})
	r.data.Write(0, nil)
	r.cmd.Write(0, nil)
	r.data.Read(0, nil)
	r.cmd.Read(0, nil)
	assert.Zero(t, r.resets, "writes outside the register are ignored")
}

// FuzzI8042 drives both ports with arbitrary accesses (any offset, width,
// value, read or write). It asserts that the CPU reset line pulses exactly
// when the guest asks for it, as Linux's reboot=k does (command 0xd1 then an
// output-port byte with bit 0 clear, or a pulse command 0xf0-0xfe with bit 0
// clear), never otherwise; and that reading the data port empties the
// output buffer (OBF clear afterwards).
func FuzzI8042(f *testing.F) {
	f.Add([]byte{0x64, 0x20, 0x60, 0x00, 0x64, 0x60, 0x60, 0x47, 0x64, 0xd1, 0x60, 0x00})
	f.Add([]byte{0x64, 0xd3, 0x60, 0x5a, 0xe4, 0x00, 0xe0, 0x00})
	f.Add([]byte{0x24, 0xfe, 0x20, 0xd1, 0x20, 0x02})
	f.Fuzz(func(t *testing.T, ops []byte) {
		resets := 0
		k := NewI8042(func() { resets++ }) // a few bytes: cheaper than any reset
		want, pending := 0, byte(0)
		devs := []bus.Device{k.DataPort(), k.CommandPort()}
		var data [8]byte
		for i := 0; i+1 < len(ops); i += 2 {
			isCmd := ops[i]>>2&1 == 1
			off := uint64(ops[i] & 0x03)
			if ops[i]&0x10 != 0 {
				off = ^uint64(0) - off
			}
			w := int(ops[i] >> 5)
			for j := range data[:w] {
				data[j] = ops[i+1]
			}
			read := ops[i]&0x80 != 0
			dev := devs[ops[i]>>2&1]
			if read {
				dev.Read(off, data[:w])
			} else {
				dev.Write(off, data[:w])
			}
			if off != 0 || w == 0 {
				continue
			}
			switch {
			case read && !isCmd:
				var st [1]byte
				devs[1].Read(0, st[:])
				if st[0]&i8042StrOBF != 0 {
					t.Fatalf("status %#x: output buffer still full after the data port was read", st[0])
				}
			case !read && isCmd:
				v := data[0]
				pending = 0
				switch v {
				case i8042CmdWriteCTR, i8042CmdWriteOut, i8042CmdWriteKbd, i8042CmdWriteAux, i8042CmdToAux:
					pending = v
				}
				if v >= i8042CmdPulseBase && v&i8042OutReset == 0 {
					want++
				}
			case !read && !isCmd:
				if pending == i8042CmdWriteOut && data[0]&i8042OutReset == 0 {
					want++
				}
				pending = 0
			}
			if resets != want {
				t.Fatalf("after op %d: %d resets, the guest asked for %d", i/2, resets, want)
			}
		}
	})
}
