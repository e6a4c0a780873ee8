package slurm

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// DefaultGresConf is where slurmd looks for gres.conf when SLURM_CONF does
// not say otherwise (Debian's and SchedMD's packages use /etc/slurm).
const DefaultGresConf = "/etc/slurm/gres.conf"

// GresConfPath returns the gres.conf slurmd of this node reads: beside
// slurm.conf, so in SLURM_CONF's directory when that is set, else
// DefaultGresConf.
func GresConfPath(getenv func(string) string) string {
	if c := getenv("SLURM_CONF"); c != "" {
		return filepath.Join(filepath.Dir(c), "gres.conf")
	}
	return DefaultGresConf
}

// Device is one device file of a GRES on this node, in gres.conf order.
type Device struct {
	// Name is the GRES name ("gpu", "nic").
	Name string
	// Type is the optional Type= ("a100"), "" when absent.
	Type string
	// File is the device file, ranges expanded ("/dev/vfio/12").
	File string
	// Index is the device's position among this node's devices of Name,
	// in file order: what SLURM_JOB_GPUS and scontrol's IDX count.
	Index int
	// DevNum is the number at the end of File, -1 when File ends in no
	// digit: what SLURM_JOB_NICS reports (after NICPrefix).
	DevNum int
	// Line is the gres.conf line the device was declared on.
	Line int
}

// CountOnly is a GRES line of this node with a Count= but no File=: Slurm
// can count it but hpcvmm cannot tell which device it is.
type CountOnly struct {
	Name  string
	Count uint64
	Line  int
}

// GresConf is the part of a gres.conf that applies to one node.
type GresConf struct {
	// Path is the file parsed, for messages.
	Path string
	// Node is the node name lines were matched against.
	Node string
	// Devices are the node's device files, in file order.
	Devices []Device
	// Counted are the node's lines without File=.
	Counted []CountOnly
}

// ReadGresConf parses the gres.conf at path for node (see ParseGresConf).
func ReadGresConf(path, node string) (*GresConf, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("slurm: gres.conf: %w", err)
	}
	defer f.Close()
	return ParseGresConf(path, f, node)
}

// maxExpand bounds a hostlist expansion, so a typo such as [0-99999999]
// is an error rather than an allocation of gigabytes.
const maxExpand = 65536

// ParseGresConf parses gres.conf text and keeps the lines that apply to
// node: lines without NodeName=, and lines whose NodeName= list (hostlist
// syntax, "n[1-4],gpu07") contains it. Keys are case-insensitive as in
// Slurm; '#' starts a comment; a line ending in '\' continues on the next.
// Global lines (AutoDetect=... alone) carry no device and are skipped; an
// Include directive is refused, since hpcvmm would have to resolve it as
// slurmd does.
func ParseGresConf(path string, r io.Reader, node string) (*GresConf, error) {
	gc := &GresConf{Path: path, Node: node}
	next := map[string]int{} // next index per GRES name
	sc := bufio.NewScanner(r)
	lineNo, start := 0, 0
	var pending strings.Builder
	for sc.Scan() {
		lineNo++
		text := sc.Text()
		if i := strings.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		text = strings.TrimSpace(text)
		if pending.Len() == 0 {
			start = lineNo
		}
		if strings.HasSuffix(text, `\`) {
			pending.WriteString(strings.TrimSuffix(text, `\`) + " ")
			continue
		}
		pending.WriteString(text)
		line := strings.TrimSpace(pending.String())
		pending.Reset()
		if line == "" {
			continue
		}
		if err := gc.parseLine(line, start, node, next); err != nil {
			return nil, fmt.Errorf("slurm: %s line %d: %w", path, start, err)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("slurm: read %s: %w", path, err)
	}
	return gc, nil
}

func (gc *GresConf) parseLine(line string, lineNo int, node string, next map[string]int) error {
	fields := strings.Fields(line)
	if strings.EqualFold(fields[0], "include") {
		return fmt.Errorf("%q: Include is not supported by hpcvmm; put the node's Name= lines in this file", line)
	}
	kv := map[string]string{}
	for _, f := range fields {
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("%q: want Key=Value pairs (Name=gpu File=/dev/vfio/12)", f)
		}
		k = strings.ToLower(k)
		if _, dup := kv[k]; dup {
			return fmt.Errorf("%s= given twice", k)
		}
		kv[k] = v
	}
	if nn, ok := kv["nodename"]; ok {
		nodes, err := ExpandHostlist(nn)
		if err != nil {
			return fmt.Errorf("NodeName=%s: %w", nn, err)
		}
		if !contains(nodes, node) {
			return nil
		}
	}
	name, ok := kv["name"]
	if !ok {
		return nil // global settings (AutoDetect=...), no device
	}
	if name == "" {
		return fmt.Errorf("empty Name=")
	}
	var count uint64
	if c, ok := kv["count"]; ok {
		n, err := parseCount(c)
		if err != nil {
			return fmt.Errorf("count=%s (Count=): %w", c, err)
		}
		count = n
	}
	file, hasFile := kv["file"]
	if !hasFile {
		if mf, ok := kv["multiplefiles"]; ok {
			return fmt.Errorf("gres %s: MultipleFiles=%s: one GRES with several files is not a device hpcvmm can pass through; give each VFIO group its own File=", name, mf)
		}
		gc.Counted = append(gc.Counted, CountOnly{Name: name, Count: count, Line: lineNo})
		return nil
	}
	files, err := ExpandHostlist(file)
	if err != nil {
		return fmt.Errorf("file %s (File=): %w", file, err)
	}
	if count != 0 && count != uint64(len(files)) {
		return fmt.Errorf("gres %s: Count=%d but File=%s names %d files (Slurm refuses this too)", name, count, file, len(files))
	}
	for _, f := range files {
		gc.Devices = append(gc.Devices, Device{
			Name: name, Type: kv["type"], File: f, Index: next[name], DevNum: trailingNumber(f), Line: lineNo,
		})
		next[name]++
	}
	return nil
}

// parseCount parses Count=: a number with an optional K, M or G suffix
// (powers of 1024, as Slurm reads it).
func parseCount(s string) (uint64, error) {
	mult := uint64(1)
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		mult = 1 << 10
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		mult = 1 << 20
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		mult = 1 << 30
	}
	if mult != 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want a number, optionally with K, M or G")
	}
	return n * mult, nil
}

// trailingNumber returns the number at the end of s (Slurm's dev_num), -1
// when s ends in no digit.
func trailingNumber(s string) int {
	i := len(s)
	for i > 0 && s[i-1] >= '0' && s[i-1] <= '9' {
		i--
	}
	if i == len(s) {
		return -1
	}
	n, err := strconv.Atoi(s[i:])
	if err != nil {
		return -1
	}
	return n
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// ExpandHostlist expands Slurm's hostlist syntax, used by NodeName= and
// File=: comma-separated names, each with bracketed lists of numbers and
// ranges that keep their zero padding: "n[01-03,7]" is n01 n02 n03 n7 and
// "/dev/vfio/[12-15]" is /dev/vfio/12 ... /dev/vfio/15. Several brackets
// in one name multiply out.
func ExpandHostlist(s string) ([]string, error) {
	var out []string
	for _, part := range splitTopLevel(s) {
		if part == "" {
			return nil, fmt.Errorf("%q: empty name in the list", s)
		}
		names, err := expandOne(part)
		if err != nil {
			return nil, err
		}
		out = append(out, names...)
		if len(out) > maxExpand {
			return nil, fmt.Errorf("%q: expands to more than %d names", s, maxExpand)
		}
	}
	return out, nil
}

// splitTopLevel splits at commas outside brackets.
func splitTopLevel(s string) []string {
	var parts []string
	depth, last := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[last:i])
				last = i + 1
			}
		}
	}
	return append(parts, s[last:])
}

func expandOne(s string) ([]string, error) {
	open := strings.IndexByte(s, '[')
	if open < 0 {
		if strings.ContainsRune(s, ']') {
			return nil, fmt.Errorf("%q: ']' without '['", s)
		}
		return []string{s}, nil
	}
	end := strings.IndexByte(s[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", s)
	}
	end += open
	prefix, body := s[:open], s[open+1:end]
	if strings.ContainsRune(body, '[') {
		return nil, fmt.Errorf("%q: nested brackets", s)
	}
	rest, err := expandOne(s[end+1:])
	if err != nil {
		return nil, err
	}
	var nums []string
	for _, r := range strings.Split(body, ",") {
		lo, hi, isRange := strings.Cut(r, "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if lo == "" || err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("%q: [%s]: want numbers and ranges such as [0-3,7]", s, body)
		}
		if b-a >= maxExpand {
			return nil, fmt.Errorf("%q: range %s expands to more than %d names", s, r, maxExpand)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo) // zero padding kept: [01-10]
		}
		for n := a; n <= b; n++ {
			nums = append(nums, fmt.Sprintf("%0*d", width, n))
		}
	}
	var out []string
	for _, n := range nums {
		for _, r := range rest {
			out = append(out, prefix+n+r)
			if len(out) > maxExpand {
				return nil, fmt.Errorf("%q: expands to more than %d names", s, maxExpand)
			}
		}
	}
	return out, nil
}

// ParseIndexList parses the lists Slurm puts in SLURM_JOB_GPUS,
// SLURM_STEP_NICS and scontrol's IDX: comma-separated numbers, ranges
// allowed ("0,2-3").
func ParseIndexList(s string) ([]int, error) {
	var out []int
	for _, r := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(r), "-")
		a, err1 := strconv.Atoi(lo)
		b := a
		var err2 error
		if isRange {
			b, err2 = strconv.Atoi(hi)
		}
		if err1 != nil || err2 != nil || a < 0 || b < a || b-a >= maxExpand {
			return nil, fmt.Errorf("%q: want numbers such as 0,2-3", s)
		}
		for n := a; n <= b; n++ {
			out = append(out, n)
		}
	}
	return out, nil
}
