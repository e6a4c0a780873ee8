package host

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// maxCPU bounds CPU numbers in a list so a corrupt file cannot make
// ParseCPUList allocate without limit (the kernel's NR_CPUS tops out at 8192).
const maxCPU = 1 << 16

// ParseCPUList parses the kernel's CPU list format ("0-3,8-11", "5", "" for
// none; ranges may carry a stride as "0-15:2" in newer kernels' cpulist
// parameters). The result is sorted and free of duplicates.
func ParseCPUList(s string) ([]int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return []int{}, nil
	}
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		stride := 1
		if i := strings.IndexByte(part, ':'); i >= 0 {
			n, err := strconv.Atoi(part[i+1:])
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("host: cpu list %q: bad stride in %q", s, part)
			}
			stride = n
			part = part[:i]
		}
		lo, hi := part, part
		if i := strings.IndexByte(part, '-'); i >= 0 {
			lo, hi = part[:i], part[i+1:]
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a || b >= maxCPU {
			return nil, fmt.Errorf("host: cpu list %q: bad range %q (want N or N-M with N <= M)", s, part)
		}
		for c := a; c <= b; c += stride {
			seen[c] = true
		}
	}
	out := make([]int, 0, len(seen))
	for c := range seen {
		out = append(out, c)
	}
	sort.Ints(out)
	return out, nil
}

// FormatCPUList renders CPUs in the kernel's compact list format
// ("0-3,8-11"). The input need not be sorted.
func FormatCPUList(cpus []int) string {
	c := append([]int(nil), cpus...)
	sort.Ints(c)
	var b strings.Builder
	for i := 0; i < len(c); {
		j := i
		for j+1 < len(c) && c[j+1] <= c[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if c[j] == c[i] {
			fmt.Fprintf(&b, "%d", c[i])
		} else {
			fmt.Fprintf(&b, "%d-%d", c[i], c[j])
		}
		i = j + 1
	}
	return b.String()
}
