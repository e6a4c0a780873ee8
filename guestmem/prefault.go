package guestmem

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// cpuSetSize is the number of CPUs a unix.CPUSet can name.
const cpuSetSize = 1024

// prefaultChunk is the unit of work handed to a prefault worker when pages
// are small: one madvise call, whose own cost (microseconds) is small beside
// the kernel's clearing of 16 MiB (about 5 ms per worker with 16 workers on
// the 16-core device machine), and small enough that the last chunks leave
// no worker idle for long. On that machine (16 workers, 2 MiB pages, 16 GiB)
// 2, 16, 64 and 256 MiB chunks all ran at 48.5-52.5 GiB/s, within the noise:
// chunking is not what limits prefault there (docs/prefault.md).
const prefaultChunk = 16 << 20

// progressInterval is how often progress lines are written; a variable so
// tests need not prefault for seconds to see them.
var progressInterval = time.Second

// populateWriteMissing is set once MADV_POPULATE_WRITE turned out to be
// unsupported (kernel < 5.14), so later chunks go straight to touching.
var populateWriteMissing atomic.Bool

// prefault faults in every page of data in parallel and returns the number
// of workers used. Faulting the pages here, rather than letting the guest
// fault them, moves the cost of clearing tens of GiB out of the job's run
// time and spreads it over many CPUs; pinning the workers to CPUs of the
// bound node keeps the clearing node-local.
func prefault(data []byte, page uint64, opts Options) (int, error) {
	total := uint64(len(data))
	chunk := uint64(prefaultChunk)
	if page > chunk {
		chunk = page
	}
	nchunks := (total + chunk - 1) / chunk
	workers := workerCount(opts, nchunks)

	var (
		next, done atomic.Uint64
		stop       atomic.Bool
	)
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		cpu := -1
		if len(opts.PrefaultCPUs) > 0 {
			cpu = opts.PrefaultCPUs[w]
		}
		go func() {
			errc <- prefaultWorker(data, page, chunk, cpu, &next, &done, &stop)
		}()
	}

	start := time.Now()
	var ticks <-chan time.Time
	if opts.Progress != nil {
		t := time.NewTicker(progressInterval)
		defer t.Stop()
		ticks = t.C
	}
	var first error
	for pending := workers; pending > 0; {
		select {
		case err := <-errc:
			pending--
			if err != nil && first == nil {
				first = err
				stop.Store(true) // the others finish their chunk and quit
			}
		case <-ticks:
			writeProgress(opts.Progress, "prefaulting guest RAM: %.1f/%.1f GiB (%.1f GiB/s)\n", done.Load(), total, time.Since(start))
		}
	}
	if first != nil {
		return workers, first
	}
	if elapsed := time.Since(start); opts.Progress != nil && elapsed > progressInterval {
		writeProgress(opts.Progress, "prefaulted guest RAM: %.1f/%.1f GiB (%.1f GiB/s)\n", total, total, elapsed)
	}
	return workers, nil
}

// workerCount applies the Options rules: Workers, else one per prefault
// CPU, else one per host CPU; never more than one per pinned CPU nor more
// than there are chunks.
func workerCount(opts Options, nchunks uint64) int {
	n := opts.Workers
	if n == 0 {
		n = len(opts.PrefaultCPUs)
		if n == 0 {
			n = runtime.NumCPU()
		}
	}
	if len(opts.PrefaultCPUs) > 0 && n > len(opts.PrefaultCPUs) {
		n = len(opts.PrefaultCPUs)
	}
	if uint64(n) > nchunks {
		n = int(nchunks)
	}
	return max(n, 1)
}

func writeProgress(w io.Writer, format string, done, total uint64, elapsed time.Duration) {
	const gib = 1 << 30
	rate := 0.0
	if s := elapsed.Seconds(); s > 0 {
		rate = float64(done) / gib / s
	}
	// Progress is advisory; a broken terminal must not fail the VM.
	_, _ = fmt.Fprintf(w, format, float64(done)/gib, float64(total)/gib, rate)
}

// prefaultWorker claims chunks until none are left or stop is set.
func prefaultWorker(data []byte, page, chunk uint64, cpu int, next, done *atomic.Uint64, stop *atomic.Bool) error {
	if cpu >= 0 {
		// The thread is never unlocked: when the goroutine returns, the
		// runtime destroys the thread instead of handing a thread with a
		// narrowed affinity mask to unrelated goroutines.
		runtime.LockOSThread()
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return fmt.Errorf("pin prefault worker to host CPU %d: %w (is the CPU online and in this process's cpuset?)", cpu, err)
		}
	}
	total := uint64(len(data))
	for !stop.Load() {
		off := (next.Add(1) - 1) * chunk
		if off >= total {
			return nil
		}
		end := min(off+chunk, total)
		if err := populate(data[off:end], page); err != nil {
			return fmt.Errorf("mapping offset %#x-%#x: %w", off, end, err)
		}
		done.Add(end - off)
	}
	return nil
}

// populate faults in every page of b for writing.
func populate(b []byte, page uint64) error {
	for !populateWriteMissing.Load() {
		err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
		switch {
		case err == nil:
			return nil
		case errors.Is(err, unix.EINTR):
			// Interrupted before finishing; the pages done so far
			// stay populated, so retrying is cheap.
		case errors.Is(err, unix.EINVAL):
			// b is page-aligned, so EINVAL means the advice itself is
			// unknown: a kernel older than 5.14.
			populateWriteMissing.Store(true)
		default:
			// EFAULT: a hugetlb page could not be allocated (e.g. the
			// bound node is short); ENOMEM: the host is out of memory.
			return fmt.Errorf("madvise(MADV_POPULATE_WRITE): %w", err)
		}
	}
	return touch(b, page)
}

// touch writes one byte per page. A hugetlb page that cannot be allocated
// raises SIGBUS; SetPanicOnFault turns that into a panic recovered here, so
// the failure is an error rather than a crash.
func touch(b []byte, page uint64) (err error) {
	var off uint64
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("touching the page at offset %#x failed (%v): the page could not be allocated (for hugepages: is the pool, or the bound node's share of it, short?)", off, r)
		}
	}()
	for ; off < uint64(len(b)); off += page {
		b[off] = 0 // a write, so the page is allocated rather than mapped to the zero page
	}
	return nil
}
