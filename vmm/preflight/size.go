package preflight

import (
	"fmt"
	"strconv"
	"strings"
)

// Page sizes a Request may ask for.
const (
	Page4K = 4 << 10
	Page2M = 2 << 20
	Page1G = 1 << 30
)

// ParseSize parses a byte count with an optional binary suffix K, M, G or T
// (case-insensitive, optionally followed by "iB" or "B"): "512M", "20G",
// "1GiB", "4096". Errors name the input and show the expected form.
func ParseSize(s string) (uint64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(t, "B")
	t = strings.TrimSuffix(t, "I")
	shift := 0
	if n := len(t); n > 0 {
		switch t[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift != 0 {
			t = t[:n-1]
		}
	}
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix, e.g. 512M or 20G", s)
	}
	if shift > 0 && v > ^uint64(0)>>shift {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v << shift, nil
}

// ParsePageSize parses a --hugepages value: "1G", "2M", or "none"/"4K" for
// ordinary pages. It returns the page size in bytes.
func ParsePageSize(s string) (uint64, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "none", "off", "no":
		return Page4K, nil
	}
	v, err := ParseSize(s)
	if err == nil && (v == Page1G || v == Page2M || v == Page4K) {
		return v, nil
	}
	return 0, fmt.Errorf("page size %q: want 1G, 2M or none", s)
}

// FormatSize renders a byte count with the largest binary suffix that
// divides it exactly: 1G, 1536M, 4097.
func FormatSize(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
		}
	}
	return strconv.FormatUint(v, 10)
}
