package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/hpcvmm/hpcvmm/guestmem"
)

// PrefaultSpec is one guest RAM size and page size to prefault with each
// worker count.
type PrefaultSpec struct {
	Page    string `json:"page"` // 4K, 2M or 1G
	SizeMiB int    `json:"size_mib"`
	Workers []int  `json:"workers"`
}

func prefaultCase(page string, workers int) string {
	return fmt.Sprintf("%s/%s/workers=%d", casePrefault, page, workers)
}

// runHPCVMMPrefault prefaults guest RAM exactly as hpcvmm does (guestmem.New:
// memfd, reservation, parallel MADV_POPULATE_WRITE), with workers unpinned
// and no NUMA binding like QEMU's prealloc threads, and reports the prefault
// time guestmem measures.
func runHPCVMMPrefault(where string, spec PrefaultSpec, workers, rep int) Sample {
	s := newSample(prefaultCase(spec.Page, workers), vmmHPCVMM, where, rep)
	ps, err := guestmem.ParsePageSize(spec.Page)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	size := uint64(spec.SizeMiB) << 20
	start := time.Now()
	m, err := guestmem.New(guestmem.Options{Size: size, PageSize: ps, Node: -1, Workers: workers})
	if err != nil {
		s.Err = err.Error()
		return s
	}
	total := time.Since(start)
	d, w := m.PrefaultStats()
	if err := m.Close(); err != nil {
		s.Err = err.Error()
		return s
	}
	s.Metrics[mPrefaultMs] = ms(d)
	s.Metrics[mGiBps] = float64(size) / (1 << 30) / d.Seconds()
	s.Metrics[mSizeMiB] = float64(spec.SizeMiB)
	s.Info["workers_used"] = fmt.Sprint(w)
	s.Info["new_total"] = total.Round(time.Microsecond).String()
	return s
}

// qemuBackendArgs is QEMU with one memory backend equivalent to hpcvmm's
// guest RAM (a memfd, hugetlb of the page size, shared) and no machine, so
// that QEMU's start-up is the backend and little else. QMP on stdio tells
// when QEMU is ready: it answers only from its main loop, after every
// -object was created (and preallocated).
func qemuBackendArgs(qemu, accel string, spec PrefaultSpec, workers int, prealloc bool) []string {
	obj := fmt.Sprintf("memory-backend-memfd,id=ram,size=%dM,share=on", spec.SizeMiB)
	switch spec.Page {
	case "2M", "1G":
		obj += ",hugetlb=on,hugetlbsize=" + spec.Page
	}
	if prealloc {
		obj += fmt.Sprintf(",prealloc=on,prealloc-threads=%d", workers)
	} else {
		obj += ",prealloc=off"
	}
	return []string{qemu, "-accel", accel, "-M", "none", "-nodefaults", "-no-user-config", "-display", "none",
		"-object", obj, "-qmp", "stdio"}
}

// qemuReady runs QEMU with argv until it answers QMP and returns the time
// from launch to that answer; then it asks QEMU to quit.
func qemuReady(ctx context.Context, argv []string, timeout time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	// Queued before QEMU is ready; read only once its main loop runs.
	_, _ = io.WriteString(stdin, `{"execute":"qmp_capabilities"}`+"\n")
	var ready time.Duration
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		if strings.Contains(sc.Text(), `"return"`) {
			ready = time.Since(start)
			_, _ = io.WriteString(stdin, `{"execute":"quit"}`+"\n")
			break
		}
	}
	_ = stdin.Close()
	go func() { _, _ = io.Copy(io.Discard, stdout) }()
	werr := cmd.Wait()
	if ready == 0 {
		return 0, fmt.Errorf("%s: no QMP answer (%v): %s", strings.Join(argv, " "), werr, tail(stderr.String(), 400))
	}
	return ready, nil
}

// runQEMUPrefault measures QEMU's preallocation of the same backend as the
// difference between two launches, prealloc=off then prealloc=on, back to
// back so both see the same load: QEMU does not time its prealloc itself.
func runQEMUPrefault(ctx context.Context, where, qemu, accel string, spec PrefaultSpec, workers, rep int) Sample {
	s := newSample(prefaultCase(spec.Page, workers), vmmQEMU, where, rep)
	off := qemuBackendArgs(qemu, accel, spec, workers, false)
	on := qemuBackendArgs(qemu, accel, spec, workers, true)
	s.Info["argv"] = strings.Join(on, " ")
	tOff, err := qemuReady(ctx, off, 2*time.Minute)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	tOn, err := qemuReady(ctx, on, 5*time.Minute)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Metrics[mReadyBaselineMs] = ms(tOff)
	s.Metrics[mReadyPreallocMs] = ms(tOn)
	d := tOn - tOff
	if d <= 0 {
		s.Err = fmt.Sprintf("prealloc=on was not slower than prealloc=off (%v vs %v): noise larger than the prefault", tOn, tOff)
		return s
	}
	s.Metrics[mPrefaultMs] = ms(d)
	s.Metrics[mGiBps] = float64(spec.SizeMiB) / 1024 / d.Seconds()
	s.Metrics[mSizeMiB] = float64(spec.SizeMiB)
	return s
}
