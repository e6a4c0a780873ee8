package platform

import (
	"log/slog"
	"sync"
	"time"
)

// DefaultRefusalInterval is how often Refusals logs one kind of refusal at
// most: often enough that an operator sees a misbehaving guest at once and
// sees it still going, rarely enough that a guest repeating the access in a
// loop cannot fill the log (one line per kind per interval however fast
// the guest goes).
const DefaultRefusalInterval = 10 * time.Second

// maxRefusalKinds bounds the kinds Refusals remembers: kinds come from
// hpcvmm's own code (a device name), but a bound keeps a bug there from
// becoming a guest-driven leak.
const maxRefusalKinds = 256

// Refusals is the log sink for what devices report with no caller to
// return it to, chiefly guest actions they refused (a BAR programmed over
// RAM or another BAR, an MSI-X message outside the interrupt window, a
// virtqueue chain that loops or leaves RAM): everything a guest controls is
// untrusted, so a device refuses and carries on, and the guest may repeat
// the action as fast as it likes. Per kind, the first refusal is logged at once and later ones
// only after Interval has passed since that kind's last line, carrying how
// many were suppressed in between; Flush logs what is still suppressed
// (the VM's end). Safe for concurrent use.
type Refusals struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu sync.Mutex
	// +checklocks:mu
	kinds map[string]*refusalKind
}

type refusalKind struct {
	last       time.Time // when the last line was logged
	suppressed uint64    // refusals since the last line
	total      uint64
}

// NewRefusals returns a sink logging at warning level to log (nil
// discards), at most one line per kind per interval (0 means
// DefaultRefusalInterval).
func NewRefusals(log *slog.Logger, interval time.Duration) *Refusals {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if interval <= 0 {
		interval = DefaultRefusalInterval
	}
	return &Refusals{log: log, interval: interval, now: time.Now, kinds: map[string]*refusalKind{}}
}

// SetClock replaces the time source (tests).
func (r *Refusals) SetClock(now func() time.Time) {
	r.mu.Lock()
	r.now = now
	r.mu.Unlock()
}

// Refuse records one refusal of kind (the device or mechanism, e.g.
// "pci", "virtio-net tap0") with the error that says what was refused, and
// logs it unless kind was logged less than an interval ago. It reports
// whether it logged.
func (r *Refusals) Refuse(kind string, err error) bool {
	r.mu.Lock()
	k := r.kinds[kind]
	if k == nil {
		if len(r.kinds) >= maxRefusalKinds {
			kind = "other"
			if k = r.kinds[kind]; k == nil {
				k = &refusalKind{}
				r.kinds[kind] = k
			}
		} else {
			k = &refusalKind{}
			r.kinds[kind] = k
		}
	}
	k.total++
	now := r.now()
	if k.total > 1 && now.Sub(k.last) < r.interval {
		k.suppressed++
		r.mu.Unlock()
		return false
	}
	suppressed := k.suppressed
	k.suppressed, k.last = 0, now
	r.mu.Unlock()
	r.log.Warn("device error", "kind", kind, "err", err, "suppressed_since_last", suppressed)
	return true
}

// Count returns how many refusals of kind were recorded in all.
func (r *Refusals) Count(kind string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if k := r.kinds[kind]; k != nil {
		return k.total
	}
	return 0
}

// Flush logs, per kind with refusals not yet logged, how many there were,
// so the total is in the log when the VM ends.
func (r *Refusals) Flush() {
	r.mu.Lock()
	type line struct {
		kind       string
		suppressed uint64
		total      uint64
	}
	var lines []line
	for kind, k := range r.kinds {
		if k.suppressed > 0 {
			lines = append(lines, line{kind, k.suppressed, k.total})
			k.suppressed = 0
		}
	}
	r.mu.Unlock()
	for _, l := range lines {
		r.log.Warn("device errors not logged", "kind", l.kind, "suppressed", l.suppressed, "total", l.total)
	}
}
