package vmmtest

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/hpcvmm/hpcvmm/internal/testenv"
	"github.com/hpcvmm/hpcvmm/vmm"
)

// SoakOptions shapes a soak.
type SoakOptions struct {
	// Cycles is the number of measured create/run/destroy cycles.
	Cycles int
	// Warmup cycles run before the first snapshot: the first VM of a
	// process opens what the runtime keeps for good (the netpoller's epoll
	// fd, its eventfd, threads), which is not a leak.
	Warmup int
	// Watch is the host state compared beyond the process's own.
	Watch testenv.Watch
	// Check judges each run's guest output; nil accepts any complete run.
	Check func(GuestReport) error
	// RunTimeout bounds each Run (default one minute).
	RunTimeout time.Duration
	// Every, when positive, snapshots after every Every-th cycle too, for
	// the peaks in SoakResult (a leak shows as growth long before the end).
	Every int
}

// SoakResult is what a soak measured.
type SoakResult struct {
	Cycles        int
	Before, After testenv.Resources
	// MaxFDs, MaxMaps and MaxHeap are the highest values seen in the
	// intermediate snapshots (SoakOptions.Every) and the final one.
	MaxFDs, MaxMaps int
	MaxHeap         uint64
	// Elapsed is the measured cycles' wall time.
	Elapsed time.Duration
	// Last is the last cycle's guest report.
	Last GuestReport
}

// Soak creates, runs and closes a VM from cfg Cycles times (after Warmup
// untimed ones), each time checking that the guest ran to its end, and
// snapshots the process's resources before the first measured cycle and
// after the last (see testenv.Leaks to compare them). cfg.Kernel is typically
// Kernel's guest; cfg.Stdout is replaced. It stops at the first cycle that
// fails, naming it. Call it on a locked OS thread when cfg creates TAPs, so
// Links is the namespace they are created in.
func Soak(cfg vmm.Config, o SoakOptions) (SoakResult, error) {
	if o.RunTimeout == 0 {
		o.RunTimeout = time.Minute
	}
	var res SoakResult
	var out bytes.Buffer
	cfg.Stdout = &out
	cycle := func(i int) error {
		out.Reset()
		vm, err := vmm.New(cfg)
		if err != nil {
			return fmt.Errorf("cycle %d: vmm.New: %w", i, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), o.RunTimeout)
		runErr := vm.Run(ctx)
		cancel()
		closeErr := vm.Close()
		if runErr != nil {
			return fmt.Errorf("cycle %d: Run: %w (guest output %q)", i, runErr, out.Bytes())
		}
		if closeErr != nil {
			return fmt.Errorf("cycle %d: Close: %w", i, closeErr)
		}
		g, err := ParseGuestOutput(out.Bytes())
		if err != nil {
			return fmt.Errorf("cycle %d: %w", i, err)
		}
		if o.Check != nil {
			if err := o.Check(g); err != nil {
				return fmt.Errorf("cycle %d: %w", i, err)
			}
		}
		res.Last = g
		return nil
	}
	for i := 0; i < o.Warmup; i++ {
		if err := cycle(-o.Warmup + i); err != nil {
			return res, fmt.Errorf("warm-up %w", err)
		}
	}
	var err error
	if res.Before, err = testenv.Snapshot(o.Watch); err != nil {
		return res, err
	}
	peak := func(r testenv.Resources) {
		res.MaxFDs = max(res.MaxFDs, len(r.FDs))
		res.MaxMaps = max(res.MaxMaps, r.Maps)
		res.MaxHeap = max(res.MaxHeap, r.HeapAlloc)
	}
	start := time.Now()
	for i := 0; i < o.Cycles; i++ {
		if err := cycle(i); err != nil {
			return res, err
		}
		res.Cycles++
		if o.Every > 0 && (i+1)%o.Every == 0 && i+1 < o.Cycles {
			r, err := testenv.Snapshot(o.Watch)
			if err != nil {
				return res, err
			}
			peak(r)
		}
	}
	res.Elapsed = time.Since(start)
	// Device workers and vCPU goroutines end shortly after Close returns.
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if res.After, err = testenv.Snapshot(o.Watch); err != nil {
			return res, err
		}
		if res.After.Goroutines <= res.Before.Goroutines || time.Now().After(deadline) {
			break
		}
	}
	peak(res.After)
	return res, nil
}
