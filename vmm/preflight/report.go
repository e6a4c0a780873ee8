// Package preflight holds the host checks behind `hpcvmm check` and the start
// of `hpcvmm run`: KVM, IOMMU and interrupt remapping, each passthrough
// device (driver, IOMMU group, reset, BARs vs the guest address space,
// SR-IOV), an NVIDIA GPU's host driver and GSP firmware for jobs
// (Request.GPUDriver), the NUMA node's CPUs and hugepages, and RLIMIT_MEMLOCK. Every
// check returns pass, warn or fail and, for a problem, the exact command or
// sysfs write that fixes it. All host facts come from package host, so the
// checks run unchanged against the live host, the real-host capture and
// synthetic trees; what needs a device opened (KVM's capabilities, a VFIO
// group the process may be refused: Request.KVMCheck, Request.GroupOpen)
// is plugged in by the caller on the live host.
package preflight

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Status is a check's outcome.
type Status int

// Outcomes, in increasing severity.
const (
	// Pass: nothing to do.
	Pass Status = iota
	// Warn: the VM can start but something is suboptimal or unknown.
	Warn
	// Fail: the VM cannot start (or passthrough cannot work) until fixed.
	Fail
)

// String is the table spelling: PASS, WARN, FAIL.
func (s Status) String() string {
	switch s {
	case Pass:
		return "PASS"
	case Warn:
		return "WARN"
	case Fail:
		return "FAIL"
	}
	return fmt.Sprintf("Status(%d)", int(s))
}

// MarshalText renders the status in JSON as "pass", "warn" or "fail".
func (s Status) MarshalText() ([]byte, error) {
	return []byte(strings.ToLower(s.String())), nil
}

// UnmarshalText parses "pass", "warn" or "fail" (any case).
func (s *Status) UnmarshalText(b []byte) error {
	switch strings.ToLower(string(b)) {
	case "pass":
		*s = Pass
	case "warn":
		*s = Warn
	case "fail":
		*s = Fail
	default:
		return fmt.Errorf("preflight: status %q: want pass, warn or fail", b)
	}
	return nil
}

// Result is one check's outcome.
type Result struct {
	// Name is the check, e.g. "driver", "hugepages".
	Name string `json:"name"`
	// Subject is what was checked: "host", a BDF, "node 1".
	Subject string `json:"subject"`
	// Status is pass, warn or fail.
	Status Status `json:"status"`
	// Detail says what was found.
	Detail string `json:"detail"`
	// Fix is the exact command or sysfs write that resolves a problem;
	// empty for a pass.
	Fix string `json:"fix,omitempty"`
}

// Report is the outcome of Run.
type Report struct {
	// Node is the chosen NUMA node, -1 if none could be chosen.
	Node int `json:"node"`
	// NodeReason says why that node was chosen.
	NodeReason string `json:"node_reason,omitempty"`
	// Results are in check order: host, devices, node.
	Results []Result `json:"results"`
}

// OK reports whether no check failed, i.e. the VM could start.
func (r Report) OK() bool {
	for _, x := range r.Results {
		if x.Status == Fail {
			return false
		}
	}
	return true
}

// Failures returns the failed results, for `hpcvmm run` to print when it
// refuses to start.
func (r Report) Failures() []Result {
	var out []Result
	for _, x := range r.Results {
		if x.Status == Fail {
			out = append(out, x)
		}
	}
	return out
}

// Counts returns how many results have each status.
func (r Report) Counts() (pass, warn, fail int) {
	for _, x := range r.Results {
		switch x.Status {
		case Pass:
			pass++
		case Warn:
			warn++
		case Fail:
			fail++
		}
	}
	return
}

// WriteTable writes an aligned table, one row per result, with a "fix:"
// line under every warning and failure that has one, and a summary line.
func (r Report) WriteTable(w io.Writer) error {
	nameW, subjW := len("CHECK"), len("SUBJECT")
	for _, x := range r.Results {
		nameW = max(nameW, len(x.Name))
		subjW = max(subjW, len(x.Subject))
	}
	var b strings.Builder
	indent := strings.Repeat(" ", 6+nameW+2+subjW+2)
	fmt.Fprintf(&b, "%-4s  %-*s  %-*s  %s\n", "", nameW, "CHECK", subjW, "SUBJECT", "DETAIL")
	for _, x := range r.Results {
		fmt.Fprintf(&b, "%-4s  %-*s  %-*s  %s\n", x.Status, nameW, x.Name, subjW, x.Subject, x.Detail)
		if x.Fix != "" && x.Status != Pass {
			fmt.Fprintf(&b, "%sfix: %s\n", indent, x.Fix)
		}
	}
	p, wn, f := r.Counts()
	verdict := "the VM can start"
	if f > 0 {
		verdict = "the VM cannot start"
	}
	fmt.Fprintf(&b, "\n%d passed, %d warnings, %d failed: %s\n", p, wn, f, verdict)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON object with an "ok" field.
func (r Report) WriteJSON(w io.Writer) error {
	type out struct {
		OK bool `json:"ok"`
		Report
	}
	res := r.Results
	if res == nil {
		res = []Result{}
	}
	r.Results = res
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	// Fix commands contain ">" and "&&"; keep them readable.
	enc.SetEscapeHTML(false)
	return enc.Encode(out{OK: r.OK(), Report: r})
}

// count is n and noun, plural unless n is 1: "1 vCPU", "2 vCPUs".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
