package main

// Where a run's measurements go: memory, a record file, progress lines.

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"

	"github.com/hpcvmm/hpcvmm/tests/harness"
)

// memorySink collects the suite's output in a Report (host mode).
type memorySink struct {
	mu  sync.Mutex
	rep *Report
}

func (m *memorySink) env(e Env) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.rep.Host == nil {
		m.rep.Host = Env{}
	}
	for k, v := range e {
		if k == "where" {
			continue
		}
		m.rep.Host[k] = v
	}
}

func (m *memorySink) sample(s Sample) {
	m.mu.Lock()
	m.rep.Samples = append(m.rep.Samples, s)
	m.mu.Unlock()
	progress("%s", describeSample(s))
}

func (m *memorySink) progress(string) {}

func (m *memorySink) note(n string) {
	m.mu.Lock()
	m.rep.Notes = append(m.rep.Notes, n)
	m.mu.Unlock()
	progress("note: %s", n)
}

// recordSink writes the suite's output to L1's result port, one record per
// piece, and a one-line summary of each sample to the console.
type recordSink struct {
	f          *os.File
	n          int
	mu         sync.Mutex
	writeError error
}

func openRecordSink(path string) (*recordSink, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the result port %s: %w", path, err)
	}
	return &recordSink{f: f}, nil
}

func (r *recordSink) write(kind string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		b, _ = json.Marshal(fmt.Sprintf("unencodable %s: %v", kind, err))
		kind = "note"
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	key := fmt.Sprintf("%s/%04d", kind, r.n)
	val := string(b)
	if kind == "note" || kind == "progress" {
		_ = json.Unmarshal(b, &val) // plain text
	}
	line := harness.ResultPrefix + " " + harness.FormatFields(
		harness.Field{Key: "test", Value: benchTest}, harness.Field{Key: "key", Value: key}, harness.Field{Key: "value", Value: val}) + "\n"
	if _, err := r.f.WriteString(line); err != nil && r.writeError == nil {
		r.writeError = err
		fmt.Fprintln(os.Stderr, "bench: writing the result port:", err)
	}
}

func (r *recordSink) progress(p string) { r.write("progress", p) }

func (r *recordSink) env(e Env) { r.write("env", e) }

func (r *recordSink) note(n string) { r.write("note", n); fmt.Println("bench: note:", n) }

func (r *recordSink) sample(s Sample) { r.write("sample", s); fmt.Println("bench:", describeSample(s)) }

func (r *recordSink) done() { r.write("done", true) }

func (r *recordSink) close() { _ = r.f.Close() }

// describeSample is the one-line progress report of a sample.
func describeSample(s Sample) string {
	head := fmt.Sprintf("%s %s %s run %d:", s.Where, s.Case, s.VMM, s.Rep)
	if s.Err != "" {
		return head + " FAILED: " + tail(s.Err, 300)
	}
	var keys []string
	for k := range s.Metrics {
		if !strings.HasPrefix(k, "kvm.") && !strings.HasPrefix(k, "exit.") && !strings.HasPrefix(k, "xfer.") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString(head)
	for _, k := range keys {
		fmt.Fprintf(&b, " %s=%.4g", k, s.Metrics[k])
	}
	for _, k := range []string{"kvm.exits", "xfer.kvm.exits"} {
		if v, ok := s.Metrics[k]; ok {
			fmt.Fprintf(&b, " %s=%.0f", k, v)
		}
	}
	return b.String()
}

// progressWriter prefixes L1's console lines on stderr.
type progressWriter struct{}

func (progressWriter) Write(p []byte) (int, error) {
	for _, l := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		if strings.HasPrefix(l, "bench:") || strings.HasPrefix(l, "L1 /init") {
			fmt.Fprintln(os.Stderr, "  L1 | "+l)
		}
	}
	return len(p), nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
