package main

import (
	"bytes"
	"strconv"
	"time"
)

// A guest's uptime at /init says how long its clock has run, and launch
// time minus that uptime is the part of the launch before the clock
// started — if the guest clock keeps wall time. In the nested test bed it
// need not (L2's kvm-clock is derived from L1's emulated TSC), so the
// launch case also dates the guest's clock from the console itself: every
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

// guestClock estimates when the guest's clock started (ms since launch)
// and its rate against wall time, from the printk lines of one boot: a
// least-squares line through the last third of the lines, which the kernel
// prints once its console runs (the backlog burst comes first) and which
// therefore arrive as they are printed. ok is false with fewer than 10
// such lines or less than 500 ms between the first and the last.
func guestClock(lines []printkLine) (startMs, rate float64, ok bool) {
	live := lines[len(lines)*2/3:]
	if len(live) < 10 || live[len(live)-1].arrivalMs-live[0].arrivalMs < 500 {
		return 0, 0, false
	}
	var n, sa, sg, saa, sag float64
	for _, l := range live {
		n++
		sa += l.arrivalMs
		sg += l.guestMs
		saa += l.arrivalMs * l.arrivalMs
		sag += l.arrivalMs * l.guestMs
	}
	den := n*saa - sa*sa
	if den == 0 {
		return 0, 0, false
	}
	rate = (n*sag - sa*sg) / den
	if rate <= 0 {
		return 0, 0, false
	}
	intercept := (sg - rate*sa) / n
	return -intercept / rate, rate, true
}
