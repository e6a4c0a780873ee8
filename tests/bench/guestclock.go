package main

import (
	"bytes"
	"strconv"
	"time"
)

// A guest's uptime at /init says how long its clock has run, and launch
// time minus that uptime is the part of the launch before the clock
// started — if the guest's clock counted all the wall time since. In the
// nested test bed it does not (an earlyprintk boot on 2026-11-24 showed
// printk timestamps standing still for about 1.5 s early in boot, at one
// value across a dozen lines, while no timer tick ran), so the launch case
// also dates the guest's clock from the console itself: every
// printk line carries the guest's timestamp, and the suite notes when each
// line arrived. Lines the kernel printed before its console existed arrive
// late, in one burst when the console registers; lines printed afterwards
// arrive as they are printed.

// printkLine is one console line with a printk timestamp: when it arrived
// (ms since launch) and the guest clock it carries (ms).
type printkLine struct {
	arrivalMs, guestMs float64
}

// lineClock collects printk lines as they arrive on a console.
type lineClock struct {
	partial bytes.Buffer
	lines   []printkLine
}

// maxClockLines bounds what one boot's console keeps (a boot to /init
// prints about 300 lines).
const maxClockLines = 5000

// write notes the lines p completes, arrived at now (since launch).
func (c *lineClock) write(p []byte, sinceLaunch time.Duration) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			c.partial.Write(p)
			return
		}
		c.partial.Write(p[:i])
		if g, ok := printkTimestampMs(c.partial.Bytes()); ok && len(c.lines) < maxClockLines {
			c.lines = append(c.lines, printkLine{arrivalMs: float64(sinceLaunch.Microseconds()) / 1000, guestMs: g})
		}
		c.partial.Reset()
		p = p[i+1:]
	}
}

// printkTimestampMs parses the "[    1.234567] " prefix of a printk line.
func printkTimestampMs(line []byte) (float64, bool) {
	line = bytes.TrimLeft(line, "\r")
	if len(line) < 3 || line[0] != '[' {
		return 0, false
	}
	end := bytes.IndexByte(line, ']')
	if end < 0 {
		return 0, false
	}
	s, err := strconv.ParseFloat(string(bytes.TrimSpace(line[1:end])), 64)
	if err != nil {
		return 0, false
	}
	return s * 1000, true
}

// guestClock estimates when the guest's clock started (ms since launch),
// how much of wall time it has missed by the last line, and its rate over
// the last third of the lines.
//
// A line's arrival minus its timestamp is when the clock started, plus the
// line's delay in reaching the host, plus whatever wall time the guest's
// clock missed before the line was printed. Lines printed before the
// console existed arrive late (their offsets are large), and a guest's
// clock can stand still for a while (in the test bed, Linux's printk clock
// stays at one value for over a second early in boot while no timer tick
// runs, and the uptime clock starts on the jiffies clocksource), so the
// smallest offset among the lines with a non-zero timestamp (those printed
// before the clock ran carry zero) is the start. lostMs is the last line's
// offset less that: wall time the guest's clock did not count. ok is false
// with fewer than 10 lines or less than 500 ms between the first and the
// last of the last third.
func guestClock(lines []printkLine) (startMs, lostMs, rate float64, ok bool) {
	live := lines[len(lines)*2/3:]
	if len(live) < 10 || live[len(live)-1].arrivalMs-live[0].arrivalMs < 500 {
		return 0, 0, 0, false
	}
	startMs = -1
	for _, l := range lines {
		if off := l.arrivalMs - l.guestMs; l.guestMs > 0 && (startMs < 0 || off < startMs) {
			startMs = off
		}
	}
	last := lines[len(lines)-1]
	lostMs = last.arrivalMs - last.guestMs - startMs
	var n, sa, sg, saa, sag float64
	for _, l := range live {
		n++
		sa += l.arrivalMs
		sg += l.guestMs
		saa += l.arrivalMs * l.arrivalMs
		sag += l.arrivalMs * l.guestMs
	}
	den := n*saa - sa*sa
	if den == 0 || startMs < 0 {
		return 0, 0, 0, false
	}
	rate = (n*sag - sa*sg) / den
	return startMs, lostMs, rate, true
}
