package guestmem

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseSize parses a byte size with an optional binary suffix: K, M, G or T
// (optionally followed by "i" and/or "B"), case-insensitive, e.g. "512M",
// "20G", "1GiB", "4096". Errors name the input.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(strings.ToUpper(s))
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
	if err != nil || t == "" {
		return 0, fmt.Errorf("size %q: want a number with an optional K, M, G or T suffix, e.g. 512M or 20G", s)
	}
	if shift > 0 && v > (^uint64(0))>>shift {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v << shift, nil
}

// FormatSizeApprox renders a byte count for people, in its largest unit:
// exactly when the unit divides it ("128G"), else with one decimal
// ("3.5G" where FormatSize says "3661852K"). For reports; a size the user
// is to type back (a flag's value) needs FormatSize's exact form.
func FormatSizeApprox(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v >= 1<<u.shift {
			if v%(1<<u.shift) == 0 {
				return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
			}
			return fmt.Sprintf("%.1f%s", float64(v)/float64(uint64(1)<<u.shift), u.suffix)
		}
	}
	return fmt.Sprintf("%d", v)
}

// FormatSize renders a byte count with the largest binary suffix that
// divides it exactly, e.g. 2G, 1536M, 4097.
func FormatSize(v uint64) string {
	for _, u := range []struct {
		shift  uint
		suffix string
	}{{40, "T"}, {30, "G"}, {20, "M"}, {10, "K"}} {
		if v != 0 && v%(1<<u.shift) == 0 {
			return fmt.Sprintf("%d%s", v>>u.shift, u.suffix)
		}
	}
	return fmt.Sprintf("%d", v)
}
