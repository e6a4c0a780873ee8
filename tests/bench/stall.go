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
		state := ""
		if f := strings.Fields(readTrim(filepath.Join(t, "stat"))); len(f) > 2 {
			state = f[2]
		}
		if f := strings.Fields(sys); len(f) > 2 {
			sys = strings.Join(f[:3], " ") // number, first two arguments
		}
		fmt.Fprintf(&b, " [%s %s %s wchan=%s syscall=%s]", filepath.Base(t), comm, state, wchan, sys)
	}
	before, err := readKVMStats(kvmDebugfs, "/proc", pid)
	time.Sleep(2 * time.Second)
	after, err2 := readKVMStats(kvmDebugfs, "/proc", pid)
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
	if vmm != vmmHPCVMM {
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
