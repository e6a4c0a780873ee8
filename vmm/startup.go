package vmm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// timeline runs New's setup steps and records when each started and how
// long it took, relative to the process start: `--log-level debug` shows
// every step as it ends and the whole timeline once the VM is built, so the
// time to the first KVM_RUN can be set against its parts (prefault, KVM
// setup, VFIO open and reset, DMA mapping, kernel loading).
//
// Steps that do not depend on each other run concurrently (concurrently);
// a step that needs another's result part-way waits on that step's gate.
// Every step stores what it acquires in the VM before it can fail, so
// New's unwinding (VM.Close) releases it whichever step failed and
// whichever others were still running: concurrently returns only once
// every step has returned.
type timeline struct {
	start time.Time
	log   *slog.Logger
	mu    sync.Mutex
	// +checklocks:mu
	spans []stepSpan
}

// stepSpan is one finished step.
type stepSpan struct {
	name     string
	at, took time.Duration // start relative to the process start, duration
}

// run runs one step on the calling goroutine and records it.
func (t *timeline) run(name string, f func() error) error {
	s := time.Now()
	err := f()
	t.add(name, s, time.Since(s), err)
	return err
}

// mark records a step that ran inline from s until now.
func (t *timeline) mark(name string, s time.Time) { t.add(name, s, time.Since(s), nil) }

func (t *timeline) add(name string, s time.Time, took time.Duration, err error) {
	sp := stepSpan{name: name, at: s.Sub(t.start), took: took}
	t.mu.Lock()
	t.spans = append(t.spans, sp)
	t.mu.Unlock()
	t.log.Debug("setup step", "step", name, "at", sp.at.Round(time.Microsecond), "took", took.Round(time.Microsecond),
		"ok", err == nil)
}

// concurrently runs each branch (a sequence of steps) on its own
// goroutine and returns once all have returned: the failures joined,
// without the branches that only gave up because a step they waited for
// failed (errDependencyFailed).
func (t *timeline) concurrently(branches ...func() error) error {
	errs := make([]error, len(branches))
	var wg sync.WaitGroup
	for i, b := range branches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b()
		}()
	}
	wg.Wait()
	var out []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, errDependencyFailed) {
			out = append(out, err)
		}
	}
	if len(out) == 0 {
		// Only dependency failures cannot happen (some step failed
		// first), but never turn a failure into success.
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	return errors.Join(out...)
}

// summary logs the timeline at debug level: every step by start time, the
// sum of their durations (what a serial start-up would take), the longest
// step (the floor for an overlapped one) and the time since the process
// started.
func (t *timeline) summary() {
	if !t.log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	t.mu.Lock()
	spans := slices.Clone(t.spans)
	t.mu.Unlock()
	slices.SortStableFunc(spans, func(a, b stepSpan) int { return int(a.at - b.at) })
	var sum time.Duration
	var longest stepSpan
	for _, s := range spans {
		sum += s.took
		if s.took > longest.took {
			longest = s
		}
	}
	line := ""
	for i, s := range spans {
		if i > 0 {
			line += "; "
		}
		line += fmt.Sprintf("%s @%v +%v", s.name, s.at.Round(time.Microsecond), s.took.Round(time.Microsecond))
	}
	t.log.Debug("start-up timeline", "steps", len(spans), "sum_of_steps", sum.Round(time.Microsecond),
		"longest_step", longest.name, "longest", longest.took.Round(time.Microsecond),
		"elapsed", time.Since(t.start).Round(time.Microsecond), "timeline", line)
}

// errDependencyFailed is what a step returns when a step it waits for
// failed: that step's error is the one New reports.
var errDependencyFailed = errors.New("not done: a step it needs failed")

// gate lets a concurrent step wait for another one part-way (DMA mapping
// waits for guest RAM).
type gate struct {
	done chan struct{}
	err  error // written before done is closed
}

func newGate() *gate { return &gate{done: make(chan struct{})} }

// open records the outcome of the step others wait for and releases them.
// The step calls it exactly once, on every path (defer).
func (g *gate) open(err error) {
	g.err = err
	close(g.done)
}

// wait blocks until the step finished and returns errDependencyFailed
// when it failed.
func (g *gate) wait() error {
	<-g.done
	if g.err != nil {
		return errDependencyFailed
	}
	return nil
}
