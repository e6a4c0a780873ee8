package acpi

// AML data objects: names, integers, strings, buffers, EISA IDs and UUIDs.

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Path is a reference to a named object, as a TermArg or SuperName:
// `\_SB.PWRB`, `^CDW1`, `CDW1`. It encodes as a NameString.
type Path string

// Integer is an AML integer constant. It encodes in the smallest form, as
// iasl's integer optimization does (§20.2.3): Zero, One and Ones for 0, 1
// and all-ones, else ByteConst, WordConst, DWordConst or QWordConst. Ones is
// 64-bit all-ones, correct in tables of revision 2 or more (integers are 64
// bits wide, §19.6.28), which is what this package builds.
type Integer uint64

// ASL's integer constant names.
const (
	Zero Integer = 0
	One  Integer = 1
	Ones Integer = ^Integer(0)
)

// String is an AML string constant: ASCII characters 0x01-0x7f, NUL
// terminated (§20.2.3).
type String string

// Buffer is an AML buffer initialized with its bytes: BufferOp PkgLength
// BufferSize ByteList (§19.6.10), the size being an Integer.
type Buffer []byte

// EISAID returns the compressed EISA ID of a 7-character PNP ID such as
// "PNP0A08" (§19.6.35): three letters of 5 bits each and four hex digits,
// stored big endian, so PNP0A08 is 0x080ad041 as an integer.
func EISAID(id string) (Integer, error) {
	if len(id) != 7 {
		return 0, fmt.Errorf("acpi: EISA ID %q is not 7 characters", id)
	}
	var v uint32
	for i := range 3 {
		c := id[i]
		if c < 'A' || c > 'Z' {
			return 0, fmt.Errorf("acpi: EISA ID %q: %q is not an upper-case letter", id, c)
		}
		v = v<<5 | uint32(c-'@')
	}
	for i := 3; i < 7; i++ {
		c := id[i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, fmt.Errorf("acpi: EISA ID %q: %q is not an upper-case hex digit", id, c)
		}
		v = v<<4 | uint32(d)
	}
	// v holds the 32 bits in reading order (MSB first); the AML integer is
	// those bytes little endian.
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return Integer(binary.LittleEndian.Uint32(b[:])), nil
}

// eisaID is EISAID for the package's own constant IDs; a malformed one is
// reported when the term is encoded.
func eisaID(id string) Term {
	v, err := EISAID(id)
	if err != nil {
		return errTerm{err}
	}
	return v
}

// errTerm defers a constructor's error to encoding time.
type errTerm struct{ err error }

// UUID returns the 16-byte buffer of ASL's ToUUID (§19.6.142) for
// "aabbccdd-eeff-gghh-iijj-kkllmmnnoopp": the first three groups little
// endian, the last two in order.
func UUID(s string) Term {
	b, err := parseUUID(s)
	if err != nil {
		return errTerm{err}
	}
	return Buffer(b)
}

func parseUUID(s string) ([]byte, error) {
	groups := strings.Split(s, "-")
	lens := []int{8, 4, 4, 4, 12}
	if len(groups) != len(lens) {
		return nil, fmt.Errorf("acpi: UUID %q: want 5 dash-separated groups", s)
	}
	var out []byte
	for i, g := range groups {
		if len(g) != lens[i] {
			return nil, fmt.Errorf("acpi: UUID %q: group %d is not %d hex digits", s, i+1, lens[i])
		}
		var raw []byte
		for j := 0; j < len(g); j += 2 {
			hi, ok1 := hexNibble(g[j])
			lo, ok2 := hexNibble(g[j+1])
			if !ok1 || !ok2 {
				return nil, fmt.Errorf("acpi: UUID %q: %q is not hex", s, g)
			}
			raw = append(raw, hi<<4|lo)
		}
		if i < 3 { // time_low, time_mid, time_hi_and_version: little endian
			for l, r := 0, len(raw)-1; l < r; l, r = l+1, r-1 {
				raw[l], raw[r] = raw[r], raw[l]
			}
		}
		out = append(out, raw...)
	}
	return out, nil
}

func hexNibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
