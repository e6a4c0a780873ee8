package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestGuestClockFromConsoleLines: a boot whose clock starts 3 s after
// launch, prints 20 lines stamped 0 before that, holds its first 100
// timed lines back until its console registers (one burst), then prints
// live lines that arrive up to 2 ms after they are printed, with its clock
// standing still for 1.5 s in the middle: the clock's start comes back
// within the lines' delay, the 1.5 s as lost, and the rate of the live
// stretch at the end as 1.
func TestGuestClockFromConsoleLines(t *testing.T) {
	const startMs, frozenMs = 3000.0, 1500.0
	var c lineClock
	feed := func(arrivalMs, guestMs float64) {
		c.write([]byte(fmt.Sprintf("\r[%12.6f] some kernel message\r\n", guestMs/1000)), time.Duration(arrivalMs*float64(time.Millisecond)))
	}
	for i := range 20 { // before the clock: stamped 0, arriving with the burst
		feed(startMs+1200+float64(i), 0)
	}
	for i := range 100 { // the backlog, printed between 0 and 1.2 s
		feed(startMs+1220+float64(i)*5, float64(i)*12)
	}
	for i := range 200 { // live, from guest 1.7 s to 5.7 s
		g := 1700 + float64(i)*20
		lag := 0.0
		if g > 3000 {
			lag = frozenMs // the clock stood still at guest 3 s
		}
		feed(startMs+g+lag+float64(i%3), g)
	}
	c.write([]byte("HPCVMM-GUEST-MARKER init-started\n[    5.8"), time.Hour) // no timestamp; a partial line
	require.Len(t, c.lines, 320)
	s, lost, r, ok := guestClock(c.lines)
	require.True(t, ok)
	assert.InDelta(t, startMs, s, 3)
	assert.InDelta(t, frozenMs, lost, 5)
	assert.InDelta(t, 1, r, 0.01)

	_, _, _, ok = guestClock(c.lines[:20])
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
