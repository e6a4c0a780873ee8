package platform

import (
	"sync"
	"time"
)

// Ports of the MC146818 CMOS real-time clock.
const (
	RTCIndexPort = 0x70 // write: register index (bit 7 = NMI disable)
	RTCDataPort  = 0x71 // read/write: the selected register
	RTCSize      = 2
)

// MC146818 registers and bits Linux reads (include/linux/mc146818rtc.h).
const (
	rtcSeconds    = 0x00
	rtcMinutes    = 0x02
	rtcHours      = 0x04
	rtcWeekday    = 0x06
	rtcDayOfMonth = 0x07
	rtcMonth      = 0x08
	rtcYear       = 0x09
	rtcRegA       = 0x0a
	rtcRegB       = 0x0b
	rtcRegC       = 0x0c
	rtcRegD       = 0x0d
	rtcCentury    = 0x32

	rtcRegBBinary = 0x04 // DM: values in binary, not BCD
	rtcRegB24h    = 0x02
	rtcRegDValid  = 0x80 // VRT: battery good, time valid
	rtcRegADiv    = 0x26 // 32.768 kHz time base, 1024 Hz rate; UIP (bit 7) never set
	rtcHourPM     = 0x80
)

// RTC is the CMOS clock and its 128 bytes of CMOS memory. Linux reads the
// wall-clock time from it at boot and its rtc_cmos driver probes it; a
// missing RTC (all-ones reads) shows the "update in progress" bit forever
// and stalls that probe. The time registers always read the host's clock
// (guest writes to them are ignored: the host's time is authoritative for
// a VM whose job logs are correlated with the cluster's), there are no
// alarm or periodic interrupts, and the update-in-progress bit is never
// set, so a reader never waits.
type RTC struct {
	mu  sync.Mutex
	now func() time.Time
	// +checklocks:mu
	index byte
	// +checklocks:mu
	cmos [128]byte
}

// NewRTC returns a clock that reads now (time.Now when nil), in UTC as PC
// guests expect.
func NewRTC(now func() time.Time) *RTC {
	if now == nil {
		now = time.Now
	}
	r := &RTC{now: now}
	r.cmos[rtcRegA] = rtcRegADiv
	r.cmos[rtcRegB] = rtcRegB24h
	r.cmos[rtcRegD] = rtcRegDValid
	return r
}

// Read implements bus.Device for the two ports at RTCIndexPort.
func (r *RTC) Read(offset uint64, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range data {
		switch offset + uint64(i) {
		case 0:
			data[i] = r.index
		case 1:
			data[i] = r.readReg(r.index & 0x7f)
		default:
			data[i] = 0xff
		}
	}
}

// Write implements bus.Device for the two ports at RTCIndexPort.
func (r *RTC) Write(offset uint64, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, v := range data {
		switch offset + uint64(i) {
		case 0:
			r.index = v
		case 1:
			r.writeReg(r.index&0x7f, v)
		}
	}
}

// +checklocks:r.mu
func (r *RTC) readReg(reg byte) byte {
	binary := r.cmos[rtcRegB]&rtcRegBBinary != 0
	t := r.now().UTC()
	switch reg {
	case rtcSeconds:
		return rtcEncode(t.Second(), binary)
	case rtcMinutes:
		return rtcEncode(t.Minute(), binary)
	case rtcHours:
		h := t.Hour()
		if r.cmos[rtcRegB]&rtcRegB24h != 0 {
			return rtcEncode(h, binary)
		}
		pm := byte(0)
		if h >= 12 {
			pm = rtcHourPM
		}
		if h = h % 12; h == 0 {
			h = 12
		}
		return rtcEncode(h, binary) | pm
	case rtcWeekday:
		return rtcEncode(int(t.Weekday())+1, binary)
	case rtcDayOfMonth:
		return rtcEncode(t.Day(), binary)
	case rtcMonth:
		return rtcEncode(int(t.Month()), binary)
	case rtcYear:
		return rtcEncode(t.Year()%100, binary)
	case rtcCentury:
		return rtcEncode(t.Year()/100, binary)
	case rtcRegC:
		return 0 // no interrupt flags: no alarm or periodic interrupts
	}
	return r.cmos[reg]
}

// rtcEncode is a time field as the guest asked for it: binary, or BCD.
func rtcEncode(v int, binary bool) byte {
	if binary {
		return byte(v)
	}
	return byte(v/10<<4 | v%10)
}

// +checklocks:r.mu
func (r *RTC) writeReg(reg, v byte) {
	switch reg {
	case rtcSeconds, rtcMinutes, rtcHours, rtcWeekday, rtcDayOfMonth, rtcMonth, rtcYear, rtcCentury, rtcRegC, rtcRegD:
		// Read-only here: see the type comment.
	case rtcRegA:
		r.cmos[rtcRegA] = v & 0x7f // UIP is read-only
	default:
		r.cmos[reg] = v
	}
}
