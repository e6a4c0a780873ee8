package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGuestClockFromConsoleLines: a boot whose clock starts 3 s after
// launch and runs at 0.8 of wall time, whose first 100 lines are held back
// until its console registers and then arrive in one burst, and whose
// remaining 200 lines arrive up to 2 ms after they are printed: the clock's
// start and rate come back within a few per cent.
func TestGuestClockFromConsoleLines(t *testing.T) {
	const startMs, rate = 3000.0, 0.8
	var c lineClock
	feed := func(arrivalMs, guestMs float64) {
		c.write([]byte(fmt.Sprintf("\r[%12.6f] some kernel message\r\n", guestMs/1000)), time.Duration(arrivalMs*float64(time.Millisecond)))
	}
	register := startMs + 1200/rate // guest 1.2 s: the console registers
	for i := range 100 {            // the backlog, printed between 0 and 1.2 s
		feed(register+float64(i)*5, float64(i)*12)
	}
	for i := range 200 { // live, from guest 1.7 s to 5.7 s
		g := 1700 + float64(i)*20
		feed(startMs+g/rate+float64(i%3), g)
	}
	c.write([]byte("HPCVMM-GUEST-MARKER init-started\n[    5.8"), time.Hour) // no timestamp; a partial line
	require.Len(t, c.lines, 300)
	s, r, ok := guestClock(c.lines)
	require.True(t, ok)
	assert.InDelta(t, startMs, s, 30)
	assert.InDelta(t, rate, r, 0.02)

	_, _, ok = guestClock(c.lines[:20])
	assert.False(t, ok, "too few lines")
}

func TestPrintkTimestamp(t *testing.T) {
	for in, want := range map[string]float64{"[    1.234567] x": 1234.567, "\r[0.000000] y": 0, "[ 12.5]": 12500} {
		g, ok := printkTimestampMs([]byte(in))
		assert.True(t, ok, in)
		assert.InDelta(t, want, g, 1e-6, in)
	}
	for _, in := range []string{"", "x [1.0]", "[abc] x", "[1.0"} {
		_, ok := printkTimestampMs([]byte(in))
		assert.False(t, ok, in)
	}
}
