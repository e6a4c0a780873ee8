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

func FuzzRTC(f *testing.F) {
	f.Add(uint8(0), uint8(1), uint8(0x0b), uint8(0x06))
	f.Fuzz(func(t *testing.T, off, width, idx, val uint8) {
		r := NewRTC(nil)
		data := make([]byte, 1+int(width)%8)
		r.Write(uint64(off), []byte{idx})
		r.Write(uint64(off%2), data)
		r.Read(uint64(off), data)
		_ = val
	})
}
