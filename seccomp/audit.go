package seccomp

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Violation is one syscall a filter refused (or, in Log mode, let through),
// as the kernel's audit line reports it: "audit: type=1326 ... pid=P
// comm="vcpu0" ... sig=31 ... syscall=N ...".
type Violation struct {
	PID     int
	Comm    string // the thread's name: "vcpu0" names the vCPU filter
	Syscall int
	Name    string // Name(Syscall)
	Killed  bool   // sig=31: the process was killed (Kill mode)
	// Seq is the kernel log record's sequence number (/dev/kmsg's second
	// field; 0 for a line without that prefix): pids are reused, so a
	// reader that wants one process's lines takes those after the
	// sequence number it saw before the process started (KernelLogSeq).
	Seq uint64
}

func (v Violation) String() string {
	what := "logged"
	if v.Killed {
		what = "killed the process (SIGSYS)"
	}
	rule := ""
	for _, r := range Rules() {
		if r.Name == v.Name {
			// The audit line has no arguments: say which form passes.
			rule = "; the process filter allows " + r.Name + " " + r.Allows
		}
	}
	return fmt.Sprintf("seccomp: %s (syscall %d) on thread %q of pid %d %s%s", v.Name, v.Syscall, v.Comm, v.PID, what, rule)
}

// KernelViolations reads the kernel log (/dev/kmsg, which needs
// CAP_SYSLOG) for the seccomp audit lines of process pid, or of every
// process when pid is 0: what a supervisor or a test reads after hpcvmm
// died of SIGSYS, since the dead process can log nothing itself.
func KernelViolations(pid int) ([]Violation, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("seccomp: read the kernel log: %w", err)
	}
	defer unix.Close(fd)
	var out []Violation
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue // records overwritten while reading: go on with the next
		}
		if errors.Is(err, unix.EAGAIN) || n <= 0 {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("seccomp: read /dev/kmsg: %w", err)
		}
		if v, ok := ParseAuditLine(string(bytes.TrimSpace(buf[:n]))); ok && (pid == 0 || v.PID == pid) {
			out = append(out, v)
		}
	}
}

// KernelLogSeq returns the sequence number of the kernel log's newest
// record (0 for an empty log): a reader of KernelViolations for a process
// started afterwards skips the records up to it.
func KernelLogSeq() (uint64, error) {
	fd, err := unix.Open("/dev/kmsg", unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("seccomp: read the kernel log: %w", err)
	}
	defer unix.Close(fd)
	var last uint64
	buf := make([]byte, 8192)
	for {
		n, err := unix.Read(fd, buf)
		if errors.Is(err, unix.EPIPE) {
			continue
		}
		if errors.Is(err, unix.EAGAIN) || n <= 0 {
			return last, nil
		}
		if err != nil {
			return last, fmt.Errorf("seccomp: read /dev/kmsg: %w", err)
		}
		if seq, ok := kmsgSeq(string(buf[:n])); ok {
			last = seq
		}
	}
}

// kmsgSeq is the sequence number of a /dev/kmsg record
// ("PRIO,SEQ,USEC,FLAGS;MESSAGE").
func kmsgSeq(rec string) (uint64, bool) {
	head, _, found := strings.Cut(rec, ";")
	if !found {
		return 0, false
	}
	f := strings.Split(head, ",")
	if len(f) < 2 {
		return 0, false
	}
	seq, err := strconv.ParseUint(f[1], 10, 64)
	return seq, err == nil
}

// ParseAuditLine parses one seccomp audit record (type=1326) from the
// kernel log; ok is false for any other line.
func ParseAuditLine(line string) (v Violation, ok bool) {
	if !strings.Contains(line, "type=1326") {
		return v, false
	}
	fields := map[string]string{}
	for _, f := range strings.Fields(line) {
		if k, val, found := strings.Cut(f, "="); found {
			fields[k] = strings.Trim(val, `"`)
		}
	}
	pid, err1 := strconv.Atoi(fields["pid"])
	nr, err2 := strconv.Atoi(fields["syscall"])
	if err1 != nil || err2 != nil {
		return v, false
	}
	seq, _ := kmsgSeq(line)
	return Violation{PID: pid, Comm: fields["comm"], Syscall: nr, Name: Name(nr), Killed: fields["sig"] == "31", Seq: seq}, true
}
