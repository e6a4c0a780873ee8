package harness

import (
	"bufio"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
)

// Line prefixes of the machine-readable channels.
const (
	// ResultPrefix starts every record on L1's result serial port, e.g.
	//	hpcvmm-result test=TestBootStockKernel status=pass
	//	hpcvmm-result test=TestBootStockKernel/cpus=4 key=cpus_online value=4
	//	hpcvmm-result l1=exit code=0
	ResultPrefix = "hpcvmm-result"
	// GuestPrefix starts the observation lines the L2 guest's /init prints on
	// its console, e.g. "hpcvmm-guest cpus_online=4".
	GuestPrefix = "hpcvmm-guest"
)

// Test statuses in result records.
const (
	StatusRun  = "run" // the test started; a later record gives the outcome
	StatusPass = "pass"
	StatusFail = "fail"
	StatusSkip = "skip"
)

// Field is one key=value pair of a record line.
type Field struct{ Key, Value string }

// FormatFields renders fields as "k=v k2=v2". Values that are empty or
// contain spaces, quotes, '=' or non-printable characters are Go-quoted so
// every record stays on one line and parses back exactly.
func FormatFields(fields ...Field) string {
	var b strings.Builder
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(f.Key)
		b.WriteByte('=')
		b.WriteString(quoteIfNeeded(f.Value))
	}
	return b.String()
}

func quoteIfNeeded(v string) string {
	if v == "" {
		return `""`
	}
	for _, r := range v {
		if r <= ' ' || r == '"' || r == '=' || r == '\\' || r >= 0x7f {
			return strconv.Quote(v)
		}
	}
	return v
}

// ParseFields parses "k=v k2="quoted v" ..." as written by FormatFields.
// Keys are non-empty and contain no '=' or spaces.
func ParseFields(s string) ([]Field, error) {
	var out []Field
	s = strings.TrimSpace(s)
	for s != "" {
		eq := strings.IndexByte(s, '=')
		sp := strings.IndexByte(s, ' ')
		if eq <= 0 || (sp >= 0 && sp < eq) {
			return nil, fmt.Errorf("record field %q: want key=value", firstWord(s))
		}
		key := s[:eq]
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, fmt.Errorf("record field %s: bad quoted value %q: %w", key, firstWord(s), err)
			}
			val, _ = strconv.Unquote(q)
			s = s[len(q):]
			if s != "" && s[0] != ' ' {
				return nil, fmt.Errorf("record field %s: junk after quoted value: %q", key, firstWord(s))
			}
		} else {
			end := strings.IndexByte(s, ' ')
			if end < 0 {
				end = len(s)
			}
			val = s[:end]
			s = s[end:]
		}
		out = append(out, Field{key, val})
		s = strings.TrimLeft(s, " ")
	}
	return out, nil
}

func firstWord(s string) string {
	if i := strings.IndexByte(s, ' '); i >= 0 {
		return s[:i]
	}
	return s
}

// ParsePrefixed parses a line "PREFIX k=v ..." (surrounding whitespace and a
// trailing carriage return from a tty are ignored). ok is false when the
// line does not start with prefix.
func ParsePrefixed(line, prefix string) (fields []Field, ok bool, err error) {
	line = strings.TrimSpace(line)
	rest, found := strings.CutPrefix(line, prefix)
	if !found || (rest != "" && rest[0] != ' ') {
		return nil, false, nil
	}
	fields, err = ParseFields(rest)
	return fields, true, err
}

// TestResult is what the result port said about one test (or subtest).
type TestResult struct {
	Name   string
	Status string // last status seen: StatusRun, StatusPass, StatusFail, StatusSkip, or "" if only values were recorded
	Reason string // skip/fail reason given by the harness, if any
	// Values holds Env.Record observations, in Keys order.
	Values map[string]string
	Keys   []string
}

// Results is the parsed content of L1's result port.
type Results struct {
	Tests map[string]*TestResult
	// L1 holds the /init's own records, keyed by event (l1=EVENT).
	L1 map[string]map[string]string
	// Malformed lists lines that started with ResultPrefix but did not parse.
	Malformed []string
	// LastStarted is the last test that reported StatusRun.
	LastStarted string
}

// Test returns the result for name, creating it if needed.
func (r *Results) test(name string) *TestResult {
	tr := r.Tests[name]
	if tr == nil {
		tr = &TestResult{Name: name, Values: map[string]string{}}
		r.Tests[name] = tr
	}
	return tr
}

// Children returns the recorded subtests directly or indirectly below name,
// sorted.
func (r *Results) Children(name string) []*TestResult {
	var out []*TestResult
	for n, tr := range r.Tests {
		if strings.HasPrefix(n, name+"/") {
			out = append(out, tr)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// ParseResults reads result records from r. Lines without ResultPrefix are
// ignored (the port is dedicated, but a tty may add blank lines).
func ParseResults(rd io.Reader) (*Results, error) {
	res := &Results{Tests: map[string]*TestResult{}, L1: map[string]map[string]string{}}
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		fields, ok, err := ParsePrefixed(sc.Text(), ResultPrefix)
		if !ok {
			continue
		}
		if err != nil || len(fields) == 0 {
			res.Malformed = append(res.Malformed, sc.Text())
			continue
		}
		m := map[string]string{}
		for _, f := range fields[1:] {
			m[f.Key] = f.Value
		}
		switch fields[0].Key {
		case "test":
			tr := res.test(fields[0].Value)
			if st, ok := m["status"]; ok {
				tr.Status = st
				if st == StatusRun {
					res.LastStarted = tr.Name
				}
				if reason, ok := m["reason"]; ok {
					tr.Reason = reason
				}
			}
			if k, ok := m["key"]; ok {
				if _, seen := tr.Values[k]; !seen {
					tr.Keys = append(tr.Keys, k)
				}
				tr.Values[k] = m["value"]
			}
		case "l1":
			res.L1[fields[0].Value] = m
		default:
			res.Malformed = append(res.Malformed, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return res, fmt.Errorf("reading result records: %w", err)
	}
	return res, nil
}

// ParseGuestResults collects the "hpcvmm-guest k=v ..." lines of an L2
// console into one map; a later value for the same key wins. Lines that do
// not parse are returned in bad so a test can report them.
func ParseGuestResults(console string) (vals map[string]string, bad []string) {
	vals = map[string]string{}
	for _, line := range strings.Split(console, "\n") {
		fields, ok, err := ParsePrefixed(line, GuestPrefix)
		if !ok {
			continue
		}
		if err != nil {
			bad = append(bad, line)
			continue
		}
		for _, f := range fields {
			vals[f.Key] = f.Value
		}
	}
	return vals, bad
}

// TestBlock extracts the `go test -v` output of top-level test name from a
// console log: from its "=== RUN   name" line to its "--- STATUS: name" line,
// or to the end of the log when the test never finished. Empty if the test
// never started.
func TestBlock(console, name string) string {
	lines := strings.Split(console, "\n")
	start := -1
	for i, l := range lines {
		l = strings.TrimRight(l, "\r")
		if start < 0 {
			if l == "=== RUN   "+name {
				start = i
			}
			continue
		}
		for _, st := range []string{"PASS", "FAIL", "SKIP"} {
			if strings.HasPrefix(l, "--- "+st+": "+name+" (") {
				return strings.Join(lines[start:i+1], "\n")
			}
		}
	}
	if start < 0 {
		return ""
	}
	return strings.Join(lines[start:], "\n")
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// stages lists the L1 /init records seen, in boot order, for hang reports.
func (r *Results) stages() string {
	var seen []string
	for _, st := range []string{"started", "kvm", "setup", "exit", "abort"} {
		if r.L1[st] != nil {
			seen = append(seen, st)
		}
	}
	if len(seen) == 0 {
		return "none (the kernel never ran /init?)"
	}
	return strings.Join(seen, ", ")
}
