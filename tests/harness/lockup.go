package harness

import (
	"regexp"
	"strconv"
	"time"
)

// softLockupRe matches the kernel watchdog's report of a CPU that has not
// scheduled for a while, e.g. "watchdog: BUG: soft lockup - CPU#1 stuck
// for 48s! [kthreadd:2]".
var softLockupRe = regexp.MustCompile(`soft lockup - CPU#\d+ stuck for (\d+)s!`)

// longestSoftLockup is the longest stall a soft-lockup report in b names.
func longestSoftLockup(b []byte) time.Duration {
	var longest time.Duration
	for _, m := range softLockupRe.FindAllSubmatch(b, -1) {
		if s, err := strconv.Atoi(string(m[1])); err == nil {
			longest = max(longest, time.Duration(s)*time.Second)
		}
	}
	return longest
}

// watchSoftLockup follows L1's console at path until stop is closed and
// calls kill once a soft-lockup report of at least limit appears; it
// reports whether it did. Nested KVM under TCG sometimes freezes L1 for
// good with every CPU in a soft lockup; the kernel says so on the console
// long before a silent result port would, and a lockup of a minute or more
// does not end while the host is otherwise usable.
func watchSoftLockup(path string, limit time.Duration, stop <-chan struct{}, kill func()) bool {
	w := &lockupWatch{limit: limit, kill: kill}
	followFile(path, w, stop)
	return w.fired
}

// lockupWatch receives the console line by line from followFile (one
// goroutine, so fired needs no lock) and calls kill at the first report
// of a soft lockup of limit or more.
type lockupWatch struct {
	limit time.Duration
	kill  func()
	fired bool
}

func (w *lockupWatch) Write(line []byte) (int, error) {
	if !w.fired && longestSoftLockup(line) >= w.limit {
		w.fired = true
		w.kill()
	}
	return len(line), nil
}
