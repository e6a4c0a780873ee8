package ninep

import (
	"fmt"
	"io"
	"sort"
	"sync"
	"time"
)

// RateLimiter writes refusals to a log, one line per kind per interval:
// the first of a kind at once, later ones counted, the count written with
// the next line of that kind after the interval or by Flush. A guest that
// loops on a refused request costs the host one line per interval.
type RateLimiter struct {
	mu       sync.Mutex
	w        io.Writer
	interval time.Duration
	now      func() time.Time
	kinds    map[string]*kindState
}

type kindState struct {
	last       time.Time
	suppressed int
}

// maxKinds bounds the kinds a RateLimiter remembers; the kinds are the
// server's own fixed strings, so this is a guard, not a limit met.
const maxKinds = 256

// NewRateLimiter returns a limiter writing to w, at most one line per kind
// per interval.
func NewRateLimiter(w io.Writer, interval time.Duration) *RateLimiter {
	return &RateLimiter{w: w, interval: interval, now: time.Now, kinds: map[string]*kindState{}}
}

// Report records one refusal of kind what.
func (r *RateLimiter) Report(what string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	k, ok := r.kinds[what]
	if !ok {
		if len(r.kinds) >= maxKinds {
			what = "other refusals"
			if k, ok = r.kinds[what]; ok {
				r.count(what, k, now)
				return
			}
		}
		r.kinds[what] = &kindState{last: now}
		fmt.Fprintf(r.w, "hpcvmm-9p: refused: %s\n", what)
		return
	}
	r.count(what, k, now)
}

func (r *RateLimiter) count(what string, k *kindState, now time.Time) {
	if now.Sub(k.last) < r.interval {
		k.suppressed++
		return
	}
	if k.suppressed > 0 {
		fmt.Fprintf(r.w, "hpcvmm-9p: refused: %s (and %d more since the last line)\n", what, k.suppressed)
	} else {
		fmt.Fprintf(r.w, "hpcvmm-9p: refused: %s\n", what)
	}
	k.last, k.suppressed = now, 0
}

// Flush writes the counts not yet written, in the kinds' order.
func (r *RateLimiter) Flush() {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.kinds))
	for n, k := range r.kinds {
		if k.suppressed > 0 {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(r.w, "hpcvmm-9p: refused: %s %d more times\n", n, r.kinds[n].suppressed)
		r.kinds[n].suppressed = 0
	}
}
