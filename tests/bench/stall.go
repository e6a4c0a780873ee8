package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"
)

// stallReport describes a VMM whose guest stopped making progress while
// the VMM kept running, so a run that failed that way says where it was
// stuck: every thread's state, kernel wait channel and current system call
// (a vCPU thread in ioctl 0xae80 is in KVM_RUN, one in futex waits on the
// VMM), which KVM counters still move over two seconds (exits and
// injections moving: the guest runs; only halt counters: it waits for an
// interrupt; nothing: the vCPU is not entering the guest), and, for
// hpcvmm, the Go runtime's goroutine dump that SIGQUIT prints to stderr
// (the process exits). errTail returns the VMM's stderr so far.
func stallReport(vmm string, pid int, exited <-chan struct{}, errTail func() string) string {
	var b strings.Builder
	b.WriteString("threads:")
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, t := range tasks {
		comm := readTrim(filepath.Join(t, "comm"))
		wchan := readTrim(filepath.Join(t, "wchan"))
		sys := readTrim(filepath.Join(t, "syscall"))
		// stat's fields after the command (which may hold spaces):
		// state is the 3rd field, the CPU last run on the 39th.
		state, cpu := "?", "?"
		if stat := readTrim(filepath.Join(t, "stat")); strings.LastIndexByte(stat, ')') > 0 {
			f := strings.Fields(stat[strings.LastIndexByte(stat, ')')+1:])
			if len(f) > 36 {
				state, cpu = f[0], f[36]
			}
		}
		if f := strings.Fields(sys); len(f) > 2 {
			sys = strings.Join(f[:3], " ") // number, first two arguments
		}
		fmt.Fprintf(&b, " [%s %s %s cpu=%s wchan=%s syscall=%s]", filepath.Base(t), comm, state, cpu, wchan, sys)
	}
	// Local timer interrupts per CPU: a CPU whose count stops has lost
	// its timer (docs/testbed.md), and whatever is pinned there stops too.
	locBefore := timerInterrupts()
	before, err := readKVMStats(kvmDebugfs, "/proc", pid)
	time.Sleep(2 * time.Second)
	after, err2 := readKVMStats(kvmDebugfs, "/proc", pid)
	fmt.Fprintf(&b, "; local timer interrupts per CPU: %s, 2 s later %s", locBefore, timerInterrupts())
	if err == nil && err2 == nil {
		var moved []string
		for k, v := range after {
			if d := v - before[k]; d != 0 {
				moved = append(moved, fmt.Sprintf("%s=%g", k, d))
			}
		}
		sort.Strings(moved)
		fmt.Fprintf(&b, "; KVM counters that moved in 2 s: %s", strings.Join(moved, " "))
	}
	if vmm != vmmHPCVMM && vmm != vmmHPCVMMGuestKernel {
		return b.String()
	}
	_ = syscall.Kill(pid, syscall.SIGQUIT)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
	fmt.Fprintf(&b, "; stderr after SIGQUIT (goroutine dump): %s", tail(errTail(), 12000))
	return b.String()
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(b))
}

// timerInterrupts returns the per-CPU counts of /proc/interrupts' LOC line.
func timerInterrupts() string {
	b, _ := os.ReadFile("/proc/interrupts")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[0] == "LOC:" {
			var counts []string
			for _, x := range f[1:] {
				if x[0] < '0' || x[0] > '9' {
					break
				}
				counts = append(counts, x)
			}
			return strings.Join(counts, "/")
		}
	}
	return "?"
}
