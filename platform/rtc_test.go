package platform

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func rtcRead(r *RTC, reg byte) byte {
	r.Write(0, []byte{reg})
	b := []byte{0}
	r.Read(1, b)
	return b[0]
}

func TestRTCReportsHostTimeInBCDAndBinary(t *testing.T) {
	at := time.Date(2026, time.November, 23, 19, 4, 59, 0, time.UTC)
	r := NewRTC(func() time.Time { return at })
	assert.Equal(t, byte(0x59), rtcRead(r, rtcSeconds))
	assert.Equal(t, byte(0x04), rtcRead(r, rtcMinutes))
	assert.Equal(t, byte(0x19), rtcRead(r, rtcHours))
	assert.Equal(t, byte(0x23), rtcRead(r, rtcDayOfMonth))
	assert.Equal(t, byte(0x11), rtcRead(r, rtcMonth))
	assert.Equal(t, byte(0x26), rtcRead(r, rtcYear))
	assert.Equal(t, byte(0x20), rtcRead(r, rtcCentury))
	assert.Equal(t, byte(0x02), rtcRead(r, rtcWeekday), "Monday is day 2")

	r.Write(0, []byte{rtcRegB})
	r.Write(1, []byte{rtcRegB24h | rtcRegBBinary})
	assert.Equal(t, byte(59), rtcRead(r, rtcSeconds))
	assert.Equal(t, byte(19), rtcRead(r, rtcHours))

	r.Write(0, []byte{rtcRegB})
	r.Write(1, []byte{rtcRegBBinary}) // 12-hour mode
	assert.Equal(t, byte(7|rtcHourPM), rtcRead(r, rtcHours))
}

func TestRTCNeverShowsUpdateInProgress(t *testing.T) {
	r := NewRTC(nil)
	r.Write(0, []byte{rtcRegA})
	r.Write(1, []byte{0xff})
	assert.Zero(t, rtcRead(r, rtcRegA)&0x80, "UIP must stay clear or Linux's mc146818_avoid_UIP spins")
	assert.Equal(t, byte(rtcRegDValid), rtcRead(r, rtcRegD))
}

func TestRTCCMOSMemoryAndNMIBit(t *testing.T) {
	r := NewRTC(nil)
	r.Write(0, []byte{0x80 | 0x40}) // NMI-disable bit set, register 0x40
	r.Write(1, []byte{0xab})
	assert.Equal(t, byte(0xab), rtcRead(r, 0x40))
	b := []byte{0, 0}
	r.Read(0, b) // a 2-byte read covers index and data
	assert.Equal(t, byte(0x40), b[0])
	assert.Equal(t, byte(0xab), b[1])
}

// FuzzRTC drives the RTC with a fuzzer-chosen clock and arbitrary port
// accesses (index and data port, any offset and width, any value) against a
// model of the MC146818 as Linux uses it. It asserts: the index port reads
// back the last index written; data reads return the clock in the encoding
// register B selects (BCD or binary, 12 or 24 hours with the PM bit),
// register C reads 0, register D reads "valid" whatever was written, register
// A never shows update-in-progress and keeps the guest's other bits; the
// time registers ignore writes; every other CMOS byte reads back what the
// guest last wrote there; bytes outside the two ports read 0xff.
func FuzzRTC(f *testing.F) {
	f.Add(int64(1795460699), []byte{0, 1, rtcRegB, 1, 1, rtcRegBBinary, 0x80, 1, rtcHours, 0x81, 1, 0})
	f.Add(int64(0), []byte{0, 2, 0x40, 0x81, 1, 0x55, 0xc0, 4, 0x0a})
	f.Fuzz(func(t *testing.T, now int64, ops []byte) {
		at := time.Unix(now%(1<<40), 0).UTC()
		r := NewRTC(func() time.Time { return at })
		var index byte
		cmos := [128]byte{rtcRegA: rtcRegADiv, rtcRegB: rtcRegB24h, rtcRegD: rtcRegDValid}
		reg := func(i byte) byte {
			bin := cmos[rtcRegB]&rtcRegBBinary != 0
			enc := func(v int) byte {
				if bin {
					return byte(v)
				}
				return byte(v/10*16 + v%10)
			}
			switch i {
			case rtcSeconds:
				return enc(at.Second())
			case rtcMinutes:
				return enc(at.Minute())
			case rtcHours:
				if cmos[rtcRegB]&rtcRegB24h != 0 {
					return enc(at.Hour())
				}
				h12 := at.Hour() % 12
				if h12 == 0 {
					h12 = 12
				}
				if at.Hour() >= 12 {
					return enc(h12) | rtcHourPM
				}
				return enc(h12)
			case rtcWeekday:
				return enc(int(at.Weekday()) + 1)
			case rtcDayOfMonth:
				return enc(at.Day())
			case rtcMonth:
				return enc(int(at.Month()))
			case rtcYear:
				return enc(at.Year() % 100)
			case rtcCentury:
				return enc(at.Year() / 100)
			case rtcRegC:
				return 0
			}
			return cmos[i]
		}
		var buf [8]byte
		for len(ops) >= 3 {
			// op: bit 7 read, bits 0-2 offset (0-1 are the ports), bits 3-6 width.
			op, v := ops[0], ops[1:3]
			ops = ops[3:]
			off, w := uint64(op&7), int(op>>3&7)
			if op&0x40 != 0 {
				off = ^uint64(0) - uint64(op&7) // offsets near the top of the range
			}
			if op&0x80 == 0 {
				for k := range buf[:w] {
					buf[k] = v[k%2]
				}
				r.Write(off, buf[:w])
				for k := 0; k < w; k++ {
					switch off + uint64(k) {
					case 0:
						index = buf[k]
					case 1:
						switch i := index & 0x7f; i {
						case rtcSeconds, rtcMinutes, rtcHours, rtcWeekday, rtcDayOfMonth, rtcMonth, rtcYear, rtcCentury, rtcRegC, rtcRegD:
						case rtcRegA:
							cmos[i] = buf[k] & 0x7f
						default:
							cmos[i] = buf[k]
						}
					}
				}
				continue
			}
			r.Read(off, buf[:w])
			for k := 0; k < w; k++ {
				want := byte(0xff)
				switch off + uint64(k) {
				case 0:
					want = index
				case 1:
					want = reg(index & 0x7f)
				}
				if buf[k] != want {
					t.Fatalf("read of %d bytes at %#x: byte %d = %#x, want %#x (index %#x, register B %#x)", w, off, k, buf[k], want, index, cmos[rtcRegB])
				}
			}
		}
		if a := rtcRead(r, rtcRegA); a&0x80 != 0 {
			t.Fatalf("register A %#x shows update in progress", a)
		}
		if d := rtcRead(r, rtcRegD); d != rtcRegDValid {
			t.Fatalf("register D %#x", d)
		}
	})
}
