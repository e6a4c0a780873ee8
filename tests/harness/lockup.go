package harness

import (
	"io"
	"os"
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

// watchSoftLockup calls kill and returns true when L1's console at path
// reports a soft lockup of at least limit, or returns false when stop is
// closed first. Nested KVM under TCG sometimes freezes L1 for good with
// every CPU in a soft lockup; the kernel says so on the console long
// before a silent result port would, and a lockup of a minute or more
// does not end while the host is otherwise usable.
func watchSoftLockup(path string, limit time.Duration, stop <-chan struct{}, kill func()) bool {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	var offset int64
	var carry []byte // the unterminated end of the last read, so no report is cut in two
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-stop:
			return false
		case <-tick.C:
		}
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		for {
			n, err := f.ReadAt(buf, offset)
			offset += int64(n)
			chunk := append(carry, buf[:n]...)
			if longestSoftLockup(chunk) >= limit {
				f.Close()
				kill()
				return true
			}
			carry = append(carry[:0], chunk[max(0, len(chunk)-128):]...)
			if err == io.EOF || n == 0 || err != nil {
				break
			}
		}
		f.Close()
	}
}
