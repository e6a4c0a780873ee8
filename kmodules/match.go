package kmodules

// Match reports whether s matches the shell glob pattern as fnmatch(3)
// with no flags does, which is how kmod matches a device's modalias
// against modules.alias: '*' matches any run of bytes ('/' included), '?'
// any one byte, "[...]" a class (ranges "a-z", negation with '!' or '^', a
// leading ']' literal; a '[' with no closing ']' is literal), and '\'
// quotes the next byte. path.Match is not this: its '*' stops at '/', it
// negates with '^' only and reports a malformed class as an error.
func Match(pattern, s string) bool {
	px, sx := 0, 0
	// Where to resume after a mismatch: just after the last '*', with it
	// matching one more byte of s.
	starP, starS := -1, 0
	for sx < len(s) || px < len(pattern) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				starP, starS = px, sx
				px++
				continue
			case '?':
				if sx < len(s) {
					px++
					sx++
					continue
				}
			case '[':
				if sx < len(s) {
					if ok, end, valid := matchClass(pattern, px, s[sx]); valid {
						if ok {
							px = end
							sx++
							continue
						}
						break
					}
				}
				if sx < len(s) && s[sx] == '[' { // no closing ']': a literal '['
					px++
					sx++
					continue
				}
			case '\\':
				lit := byte('\\')
				next := px + 1
				if px+1 < len(pattern) {
					lit, next = pattern[px+1], px+2
				}
				if sx < len(s) && s[sx] == lit {
					px = next
					sx++
					continue
				}
			default:
				if sx < len(s) && s[sx] == c {
					px++
					sx++
					continue
				}
			}
		}
		if starP >= 0 && starS < len(s) {
			starS++
			px, sx = starP+1, starS
			continue
		}
		return false
	}
	return true
}

// matchClass matches b against the class starting at pattern[start] ('[').
// valid is false when the class has no closing ']' (then '[' is literal);
// end is the index after the class.
func matchClass(pattern string, start int, b byte) (ok bool, end int, valid bool) {
	i := start + 1
	negate := false
	if i < len(pattern) && (pattern[i] == '!' || pattern[i] == '^') {
		negate = true
		i++
	}
	first := true
	for i < len(pattern) {
		c := pattern[i]
		if c == ']' && !first {
			return ok != negate, i + 1, true
		}
		first = false
		if c == '\\' && i+1 < len(pattern) {
			i++
			c = pattern[i]
		}
		lo, hi := c, c
		if i+2 < len(pattern) && pattern[i+1] == '-' && pattern[i+2] != ']' {
			hi = pattern[i+2]
			if hi == '\\' && i+3 < len(pattern) {
				i++
				hi = pattern[i+2]
			}
			i += 2
		}
		if lo <= b && b <= hi {
			ok = true
		}
		i++
	}
	return false, 0, false
}
