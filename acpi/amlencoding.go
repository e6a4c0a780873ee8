package acpi

// AML encoding: PkgLength and NameString (§20.2.4, §20.2.2).

import (
	"fmt"
	"strings"
)

// maxPkgLength is the largest PkgLength: 4 bits in the lead byte plus three
// follow bytes (§20.2.4).
const maxPkgLength = 1<<28 - 1

// appendPkgLength appends PkgLength for a body of n bytes. The encoded value
// counts the PkgLength bytes themselves (§20.2.4), so the size class is
// chosen for n plus the encoding's own length: 1 byte up to 63 in total, 2
// bytes up to 0xfff, 3 up to 0xfffff, 4 up to 0xfffffff.
func appendPkgLength(dst []byte, n int) ([]byte, error) {
	for k := 1; k <= 4; k++ {
		if n+k <= pkgLengthMax[k] {
			return appendPkgLengthBytes(dst, n+k, k), nil
		}
	}
	return nil, fmt.Errorf("acpi: AML package of %d bytes exceeds the 28-bit PkgLength", n)
}

// pkgLengthMax[k] is the largest value a k-byte PkgLength holds.
var pkgLengthMax = [5]int{0, 0x3f, 0xfff, 0xfffff, 0xfffffff}

// appendPkgLengthBytes writes v as a k-byte PkgLength: a single byte holds
// 6 bits; otherwise the lead byte holds the follow-byte count in bits 6-7
// and the low nibble of v, each follow byte 8 more bits.
func appendPkgLengthBytes(dst []byte, v, k int) []byte {
	if k == 1 {
		return append(dst, byte(v))
	}
	dst = append(dst, byte(k-1)<<6|byte(v&0xf))
	for i := 1; i < k; i++ {
		dst = append(dst, byte(v>>(4+8*(i-1))))
	}
	return dst
}

// appendFieldLength appends a field element's bit count. It has the
// PkgLength format but, unlike a package's, does not count its own bytes
// (ACPICA's parser reads it with AcpiPsGetNextPackageLength as is).
func appendFieldLength(dst []byte, bits int) ([]byte, error) {
	for k := 1; k <= 4; k++ {
		if bits <= pkgLengthMax[k] {
			return appendPkgLengthBytes(dst, bits, k), nil
		}
	}
	return nil, fmt.Errorf("acpi: field of %d bits exceeds the 28-bit length", bits)
}

// appendPkg appends head, PkgLength and body: the layout of every
// length-prefixed AML object (Scope, Device, Method, If, Package, ...).
func appendPkg(dst []byte, head []byte, body []byte) ([]byte, error) {
	dst = append(dst, head...)
	dst, err := appendPkgLength(dst, len(body))
	if err != nil {
		return nil, err
	}
	return append(dst, body...), nil
}

// appendNameString encodes an ASL path (§20.2.2): an optional root '\' or
// parent prefixes '^', then NameSegs separated by '.'. Each segment is 1-4
// characters, a leading letter or '_' then letters, digits or '_', padded to
// 4 with '_' as iasl does. One segment is written bare, two behind
// DualNamePrefix, more behind MultiNamePrefix and a count; none (a bare "\")
// is NullName.
func appendNameString(dst []byte, path string) ([]byte, error) {
	rest := path
	switch {
	case strings.HasPrefix(rest, `\`):
		dst = append(dst, opRootChar)
		rest = rest[1:]
	default:
		for strings.HasPrefix(rest, "^") {
			dst = append(dst, opParentPrefix)
			rest = rest[1:]
		}
	}
	if rest == "" {
		if path == "" || path[0] == '^' {
			return nil, fmt.Errorf("acpi: AML name %q has no name segment", path)
		}
		return append(dst, opZero), nil // NullName
	}
	segs := strings.Split(rest, ".")
	switch {
	case len(segs) == 2:
		dst = append(dst, opDualNamePrefix)
	case len(segs) > 2:
		if len(segs) > 255 {
			return nil, fmt.Errorf("acpi: AML name %q has more than 255 segments", path)
		}
		dst = append(dst, opMultiNamePfx, byte(len(segs)))
	}
	for _, s := range segs {
		if err := checkNameSeg(s); err != nil {
			return nil, fmt.Errorf("acpi: AML name %q: %w", path, err)
		}
		dst = append(dst, s...)
		for i := len(s); i < 4; i++ {
			dst = append(dst, '_')
		}
	}
	return dst, nil
}

// checkNameSeg validates one NameSeg: LeadNameChar then NameChars (§20.2.2).
// Lower case is refused: the namespace is upper case and iasl would
// silently convert it.
func checkNameSeg(s string) error {
	if len(s) == 0 || len(s) > 4 {
		return fmt.Errorf("segment %q is not 1-4 characters", s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		ok := c >= 'A' && c <= 'Z' || c == '_' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			return fmt.Errorf("segment %q: character %q not allowed", s, c)
		}
	}
	return nil
}

// appendNameString4 appends a validated NameSeg padded to 4 characters.
func appendNameString4(dst []byte, seg string) []byte {
	dst = append(dst, seg...)
	for i := len(seg); i < 4; i++ {
		dst = append(dst, '_')
	}
	return dst
}
