package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// The virtio-console case: tests/guest/init's "console" scenario says
// "HPCVMM-HVC0 ready" on /dev/hvc0, waits for one line from the host, echoes
// it, then writes a file of random bytes (4 MiB, hpcvmm.console_mib) framed by begin and end
// markers to hvc0 and reports its SHA-256 and the seconds the write took on
// the UART.
const (
	caseConsole = "console"

	hvcReady  = "HPCVMM-HVC0 ready"
	blobBegin = "HPCVMM-BLOB-BEGIN\n"
	blobEnd   = "HPCVMM-BLOB-END\n"
	guestDone = "HPCVMM-GUEST-MARKER done"

	// 4 MiB: enough for thousands of notifications and interrupts (the
	// exit counts are what the case compares), and at the ~0.25 MiB/s of
	// nested emulation a 16 MiB run took over a minute per VMM.
	consoleCmdline = "console=ttyS0 reboot=k panic=-1 hpcvmm.scenario=console hpcvmm.console_mib=4"
)

// Metrics of the console case; KVM's counters over the transfer are
// "xfer.kvm.NAME" as in the network case.
const (
	mConsoleGuestMiBps = "console_guest_mib_per_s" // the guest's timing of its write
	mConsoleHostMiBps  = "console_host_mib_per_s"  // begin marker to end marker arriving on the host side
	mConsoleBytes      = "console_bytes"           // bytes between the markers, checked against the guest's sum
)

// consoleVMMs are the VMMs of the console case: q35 because the L2
// initramfs has virtio_pci but not virtio_mmio, which microvm's virtio
// devices would need; gokvm has no virtio-console.
var consoleVMMs = []string{vmmHPCVMM, vmmQEMUQ35}

// consoleArgv is the command line of one console run: the launch case's
// guest (same RAM backing) with a virtio console. hpcvmm's goes to its
// stdout and comes from its stdin, shared with the UART's output. QEMU's
// goes to the file base.out and comes from the FIFO base.in: QEMU's
// virtconsole drops what its chardev does not take at once (flush_buf in
// hw/char/virtio-console.c does not throttle console ports): through a
// FIFO, 8% of the 16 MiB were lost in a trial run (QEMU under TCG on the
// development host). A file never refuses a write. QEMU 7.2's -chardev
// file has no input path (only QMP's chardev-add has), so QEMU starts
// paused (-S) with QMP on base.qmp, and qemuAddConsole plugs the console
// in before the guest runs.
func consoleArgv(cfg Config, vmm, base string) ([]string, error) {
	c := cfg
	c.Cmdline = consoleCmdline
	argv, err := launchArgv(c, vmm)
	if err != nil {
		return nil, err
	}
	switch vmm {
	case vmmHPCVMM:
		for i := range argv[:len(argv)-1] {
			if argv[i] == "--console" {
				argv[i+1] = "virtio"
				return argv, nil
			}
		}
		return nil, fmt.Errorf("no --console flag in %q", strings.Join(argv, " "))
	case vmmQEMUQ35:
		return append(argv, "-S", "-qmp", "unix:"+base+".qmp,server=on,wait=off",
			"-device", "virtio-serial-pci,id=vser0"), nil
	}
	return nil, fmt.Errorf("no console case for %s", vmm)
}

// runConsole boots the guest with a virtio console, lets it send its blob
// and reports the throughput, the KVM exits during the transfer and
// whether every byte arrived. Long on purpose: one transfer, step by step.
func runConsole(ctx context.Context, cfg Config, vmm string, rep int) Sample {
	s := newSample(caseConsole, vmm, cfg.Where, rep)
	ctx, cancel := context.WithTimeout(ctx, cfg.ConsoleLimit)
	defer cancel()

	// hpcvmm: hvc0 and the UART share stdout, one stream; QEMU: the UART
	// on stdout, hvc0 in a file.
	serial := newStream(guestDone, hvcReady, blobBegin, blobEnd)
	con := serial
	var fifoIn *os.File
	var base string
	if vmm != vmmHPCVMM {
		serial = newStream(guestDone)
		dir, err := os.MkdirTemp("", "bench-console-")
		if err != nil {
			s.Err = err.Error()
			return s
		}
		defer os.RemoveAll(dir)
		base = filepath.Join(dir, "c0")
		con = newStream(hvcReady, blobBegin, blobEnd)
		var out *os.File
		fifoIn, out, err = openConsoleFiles(base)
		if err != nil {
			s.Err = err.Error()
			return s
		}
		defer fifoIn.Close()
		stop := make(chan struct{})
		tailed := make(chan struct{})
		go func() { followFile(out, con, stop); close(tailed) }()
		defer func() { close(stop); <-tailed; out.Close() }()
	}
	argv, err := consoleArgv(cfg, vmm, base)
	if err != nil {
		s.Err = err.Error()
		return s
	}
	s.Info["argv"] = strings.Join(argv, " ")
	cmd := exec.Command(argv[0], argv[1:]...)
	stderr := newStream()
	cmd.Stdout, cmd.Stderr = serial, stderr
	p, err := startVMM(cmd, func(t time.Time) { serial.setStart(t); con.setStart(t) })
	if err != nil {
		s.Err = err.Error()
		return s
	}
	defer p.stdin.Close()
	defer stopVMM(cmd, vmm, p.exited)
	start, exited, pid := p.start, p.exited, cmd.Process.Pid
	input := io.Writer(p.stdin)
	if fifoIn != nil {
		input = fifoIn
	}
	fail := func(format string, a ...any) Sample {
		s.Err = fmt.Sprintf(format, a...) + fmt.Sprintf(" after %v; console tail: %q; stderr tail: %q",
			time.Since(start).Round(time.Millisecond), tail(serial.textOutside(), 400), tail(stderr.textOutside(), 300))
		if strings.Contains(s.Err, "(stuck)") {
			select {
			case <-exited:
			default:
				s.Info["stall"] = stallReport(vmm, pid, exited, stderr.textOutside)
			}
		}
		return s
	}
	if vmm != vmmHPCVMM {
		if err := qemuAddConsole(ctx, base, exited); err != nil {
			return fail("adding the console over QMP: %v", err)
		}
	}

	// Boot: the guest's ready line on hvc0. A console silent for VMStall
	// is a stuck guest, as in the launch case.
	if why := waitStream(ctx, con.mark(hvcReady), exited, serial, cfg.VMStall); why != "" {
		return fail("no %q on the virtio console: %s", hvcReady, why)
	}
	// The guest now waits for the host's line: nothing runs in it, and
	// the exits from here to the end marker are the transfer's.
	before, kerr := readKVMStats(kvmDebugfs, "/proc", pid)
	if _, err := io.WriteString(input, "bench-go-ahead\n"); err != nil {
		return fail("writing the go-ahead line: %v", err)
	}
	if why := waitStream(ctx, con.mark(blobEnd), exited, con, cfg.VMStall); why != "" {
		return fail("no end marker on the virtio console: %s", why)
	}
	after, kerr2 := readKVMStats(kvmDebugfs, "/proc", pid)
	if kerr == nil && kerr2 == nil {
		for k, v := range after {
			s.Metrics["xfer.kvm."+k] = v - before[k]
		}
	} else {
		s.Info["kvm_stats_error"] = fmt.Sprint(kerr, kerr2)
	}
	// The guest's sum and timing follow on the UART.
	if why := waitStream(ctx, serial.mark(guestDone), exited, serial, cfg.VMStall); why != "" {
		return fail("no done marker after the transfer: %s", why)
	}
	g, _ := harness.ParseGuestResults(serial.textOutside())
	blob, err := con.between(blobBegin, blobEnd)
	if err != nil {
		return fail("%v", err)
	}
	sum := sha256.Sum256(blob)
	if want := g["blob_bytes"]; want != strconv.Itoa(len(blob)) {
		return fail("%d bytes arrived between the markers, the guest sent %q", len(blob), want)
	}
	if got := hex.EncodeToString(sum[:]); got != g["blob_sha256"] {
		return fail("SHA-256 of the %d bytes that arrived %s, the guest's %q", len(blob), got, g["blob_sha256"])
	}
	mib := float64(len(blob)) / (1 << 20)
	s.Metrics[mConsoleBytes] = float64(len(blob))
	if sec, err := strconv.ParseFloat(g["blob_seconds"], 64); err == nil && sec > 0 {
		s.Metrics[mConsoleGuestMiBps] = mib / sec
	} else {
		return fail("no transfer time from the guest (blob_seconds=%q)", g["blob_seconds"])
	}
	if d := con.mark(blobEnd).when().Sub(con.mark(blobBegin).when()); d > 0 {
		s.Metrics[mConsoleHostMiBps] = mib / d.Seconds()
	}
	s.Info["blob_sha256"] = g["blob_sha256"]
	return s
}

// runConsoles measures the console case ConsoleReps times per VMM,
// interleaved. A VMM that failed maxFailures runs is not run again.
func runConsoles(ctx context.Context, cfg Config, out sink) {
	failures := map[string]int{}
	for _, v := range consoleVMMs {
		failures[v] = cfg.FailedRuns[caseConsole+"|"+v]
	}
	for rep := 1; rep <= cfg.ConsoleReps; rep++ {
		for _, v := range consoleVMMs {
			if failures[v] >= maxFailures || cfg.done(caseConsole, v, rep) {
				continue
			}
			if ctx.Err() != nil {
				out.note("virtio-console: stopped: time budget")
				return
			}
			out.progress(fmt.Sprintf("console %s run %d", v, rep))
			s := runConsole(ctx, cfg, v, rep)
			if ctx.Err() != nil && s.Err != "" {
				out.note(fmt.Sprintf("virtio-console %s: run %d cut short by the time budget; not counted", v, rep))
				return
			}
			out.sample(s)
			if s.Err != "" {
				failures[v]++
				out.note(fmt.Sprintf("virtio-console %s: run %d failed: %s", v, rep, s.Err))
			}
		}
	}
}

// openConsoleFiles makes QEMU's console chardev files: the FIFO base.in,
// which QEMU reads and the suite writes, opened read-write so that neither
// side's open blocks; and the empty file base.out, which QEMU writes (it
// opens it with O_TRUNC: the same inode) and the suite follows.
func openConsoleFiles(base string) (in, out *os.File, err error) {
	if err := syscall.Mkfifo(base+".in", 0o600); err != nil {
		return nil, nil, fmt.Errorf("mkfifo %s.in: %w", base, err)
	}
	if in, err = os.OpenFile(base+".in", os.O_RDWR, 0); err != nil {
		return nil, nil, err
	}
	if out, err = os.OpenFile(base+".out", os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
		in.Close()
		return nil, nil, err
	}
	return in, out, nil
}

// qemuAddConsole connects to the QMP socket of a QEMU started by
// consoleArgv, adds the chardev (output base.out, input base.in) and the
// virtconsole on it, and lets the paused guest run. The console is port 0
// of the virtio-serial device, the guest's hvc0, as with -device at start.
func qemuAddConsole(ctx context.Context, base string, exited <-chan struct{}) error {
	var c net.Conn
	for {
		var err error
		if c, err = net.Dial("unix", base+".qmp"); err == nil {
			break
		}
		select {
		case <-exited:
			return fmt.Errorf("QEMU exited before its QMP socket took a connection: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("QMP socket %s.qmp: %w", base, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	chardev, err := json.Marshal(map[string]any{"id": "c0", "backend": map[string]any{"type": "file",
		"data": map[string]any{"in": base + ".in", "out": base + ".out"}}})
	if err != nil {
		return err
	}
	return qmpExchange(c, []string{
		`{"execute":"qmp_capabilities"}`,
		`{"execute":"chardev-add","arguments":` + string(chardev) + `}`,
		`{"execute":"device_add","arguments":{"driver":"virtconsole","chardev":"c0","bus":"vser0.0","id":"con0"}}`,
		`{"execute":"cont"}`,
	})
}

// qmpExchange sends each command in turn and waits for its answer; an
// error answer ends the exchange. Greeting and events are skipped.
func qmpExchange(rw io.ReadWriter, cmds []string) error {
	sc := bufio.NewScanner(rw)
	for _, cmd := range cmds {
		if _, err := io.WriteString(rw, cmd+"\n"); err != nil {
			return err
		}
		for {
			if !sc.Scan() {
				return fmt.Errorf("no answer to %s: %v", cmd, sc.Err())
			}
			var m map[string]json.RawMessage
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			if e, ok := m["error"]; ok {
				return fmt.Errorf("%s: %s", cmd, e)
			}
			if _, ok := m["return"]; ok {
				break
			}
		}
	}
	return nil
}

// followFile copies what is appended to f into w until stop closes, then
// what is left: a regular file has no readiness to wait for, so it polls
// every followPoll at its end.
func followFile(f *os.File, w io.Writer, stop <-chan struct{}) {
	buf := make([]byte, 256<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			_, _ = w.Write(buf[:n])
			continue
		}
		if err != nil && err != io.EOF {
			return
		}
		select {
		case <-stop:
			for {
				n, _ := f.Read(buf)
				if n <= 0 {
					return
				}
				_, _ = w.Write(buf[:n])
			}
		case <-time.After(followPoll):
		}
	}
}

// followPoll is followFile's polling interval: far below the transfer's
// seconds, far above the cost of a read at the end of a file.
const followPoll = 5 * time.Millisecond

// waitStream waits for m, and gives up when the VMM exits, when quiet has
// written nothing for stall, or when ctx ends; it returns why it gave up,
// or "".
func waitStream(ctx context.Context, m *streamMark, exited <-chan struct{}, quiet *stream, stall time.Duration) string {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-m.hit:
			return ""
		case <-exited:
			select {
			case <-m.hit: // it came with the VMM's last output
				return ""
			default:
			}
			return "the VMM exited"
		case <-ctx.Done():
			return fmt.Sprintf("time limit (%v)", ctx.Err())
		case <-tick.C:
			if q := quiet.silentFor(); stall > 0 && q > stall {
				return fmt.Sprintf("output silent for %v (stuck)", q.Round(time.Second))
			}
		}
	}
}

// stream is an io.Writer that keeps what a VMM writes to one output and
// notes when each of some markers first arrives. It looks for a marker only
// in the new bytes and the marker's length before them, so a 16 MiB stream
// is scanned once.
type stream struct {
	mu    sync.Mutex
	buf   []byte
	start time.Time
	last  time.Time
	marks []*streamMark
}

// streamMark is one marker of a stream: hit closes when it first arrives,
// at its offset in the stream.
type streamMark struct {
	pat string
	hit chan struct{}
	mu  sync.Mutex
	at  time.Time
	off int
}

func (m *streamMark) when() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.at
}

func newStream(marks ...string) *stream {
	s := &stream{}
	for _, p := range marks {
		s.marks = append(s.marks, &streamMark{pat: p, hit: make(chan struct{}), off: -1})
	}
	return s
}

func (s *stream) setStart(t time.Time) {
	s.mu.Lock()
	s.start = t
	s.mu.Unlock()
}

// mark returns the marker pat; it must be one newStream was given.
func (s *stream) mark(pat string) *streamMark {
	for _, m := range s.marks {
		if m.pat == pat {
			return m
		}
	}
	panic("bench: stream has no marker " + strconv.Quote(pat))
}

func (s *stream) Write(p []byte) (int, error) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.last = now
	old := len(s.buf)
	s.buf = append(s.buf, p...)
	for _, m := range s.marks {
		if m.off >= 0 {
			continue
		}
		from := max(0, old-len(m.pat)+1)
		if i := bytes.Index(s.buf[from:], []byte(m.pat)); i >= 0 {
			m.mu.Lock()
			m.off, m.at = from+i, now
			m.mu.Unlock()
			close(m.hit)
		}
	}
	return len(p), nil
}

func (s *stream) silentFor() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.last
	if last.IsZero() {
		last = s.start
	}
	return time.Since(last)
}

// between returns the bytes after the first begin marker and before the
// first end marker after it.
func (s *stream) between(begin, end string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return framed(s.buf, begin, end)
}

// framed is between's search, on a byte slice.
func framed(buf []byte, begin, end string) ([]byte, error) {
	b := bytes.Index(buf, []byte(begin))
	if b < 0 {
		return nil, fmt.Errorf("no %q in the console output", strings.TrimSpace(begin))
	}
	rest := buf[b+len(begin):]
	e := bytes.Index(rest, []byte(end))
	if e < 0 {
		return nil, fmt.Errorf("no %q after %q in the console output", strings.TrimSpace(end), strings.TrimSpace(begin))
	}
	return rest[:e], nil
}

// textOutside is the stream without a framed blob in it: the UART's lines
// (and hvc0's markers) for result parsing and error messages, without
// megabytes of random bytes.
func (s *stream) textOutside() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(cutFramed(s.buf, blobBegin, blobEnd))
}

// cutFramed returns buf with the bytes between begin and end (markers
// kept) removed; a blob still arriving is cut to the end of buf.
func cutFramed(buf []byte, begin, end string) []byte {
	b := bytes.Index(buf, []byte(begin))
	if b < 0 {
		return buf
	}
	head := buf[:b+len(begin)]
	rest := buf[b+len(begin):]
	e := bytes.Index(rest, []byte(end))
	if e < 0 {
		return append(head[:len(head):len(head)], "[blob still arriving]\n"...)
	}
	return append(head[:len(head):len(head)], rest[e:]...)
}

var _ io.Writer = (*stream)(nil)

// consoleRows renders the console table's rows: throughput, then every
// exit counter of the transfer, hpcvmm against QEMU q35.
func consoleRows(ix statIndex, where string) string {
	var b strings.Builder
	row := func(label, metric string, prec int) {
		h, hok := ix.get(where, caseConsole, vmmHPCVMM, metric)
		q, qok := ix.get(where, caseConsole, vmmQEMUQ35, metric)
		if !hok && !qok {
			return
		}
		r := ""
		if hok && qok {
			r = fmtRatio(ratio(h.Median, q.Median))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", label,
			medianCell(ix, where, caseConsole, vmmHPCVMM, h, hok, prec), medianCell(ix, where, caseConsole, vmmQEMUQ35, q, qok, prec), r)
	}
	row("throughput, timed by the guest (MiB/s)", mConsoleGuestMiBps, 2)
	row("throughput, begin → end marker arriving on the host side (MiB/s)", mConsoleHostMiBps, 2)
	if b.Len() == 0 {
		return ""
	}
	var runs []string
	for _, v := range consoleVMMs {
		failed, ok := ix.failures(where, caseConsole, v)
		runs = append(runs, fmt.Sprintf("%d/%d", ok, ok+failed))
	}
	fmt.Fprintf(&b, "| runs with every byte checked (ok/attempted) | %s | %s | |\n", runs[0], runs[1])
	for _, c := range exitCounters {
		row("KVM "+c, "xfer.kvm."+c, 0)
	}
	return b.String()
}

// renderConsole is the console section of the report, or "" when the case
// did not run.
func renderConsole(rep *Report, ix statIndex, where, whereText string) string {
	rows := consoleRows(ix, where)
	if rows == "" {
		return ""
	}
	size := "4 MiB"
	if st, ok := ix.get(where, caseConsole, vmmHPCVMM, mConsoleBytes); ok {
		size = fmt.Sprintf("%.0f MiB", st.Median/(1<<20))
	}
	return fmt.Sprintf("\n**virtio-console transfer** (%s of random bytes written by the guest's `cat` to /dev/hvc0 (raw tty) and delivered to the host side; "+
		"hpcvmm `--console virtio` → its stdout, a pipe (shared with the UART); QEMU `-M q35 -device virtio-serial-pci` with a virtconsole on a `file` chardev → a file, followed by the suite every 5 ms "+
		"(a pipe would lose data: QEMU's virtconsole drops the bytes its chardev refuses; chardev and virtconsole added over QMP before the guest runs, as QEMU 7.2's -chardev file has no input); "+
		"count and SHA-256 checked on the host side; %s; median (min–max); higher throughput is better, ratio > 1: hpcvmm faster; for the exit counts lower is better). "+
		"Exits: KVM's per-VM counters from the host's go-ahead line (the guest idle, waiting for it) to the end marker's arrival. Guest RAM as in the launch case.\n\n"+
		"| | hpcvmm | QEMU q35 | hpcvmm/QEMU |\n| --- | ---: | ---: | ---: |\n%s", size, whereText, rows)
}
