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
	return Violation{PID: pid, Comm: fields["comm"], Syscall: nr, Name: Name(nr), Killed: fields["sig"] == "31"}, true
}
