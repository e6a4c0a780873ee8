package acpi

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countingBuffer returns n bytes 0, 1, 2, ... modulo 256.
func countingBuffer(n int) Buffer {
	b := make(Buffer, n)
	for i := range b {
		b[i] = byte(i)
	}
	return b
}

// pkgLengthVector builds testdata/pkglength.asl with the Go API.
func pkgLengthVector() []Term {
	var terms []Term
	for i, n := range []int{60, 61, 62, 0xffa, 0xffb, 0xffc} {
		terms = append(terms, Name(seqName("L", i), countingBuffer(n)))
	}
	zeros := make([]Term, 256)
	for i := range zeros {
		zeros[i] = Zero
	}
	ones := make([]Term, 255)
	for i := range ones {
		ones[i] = One
	}
	return append(terms, Name("VP00", Package(zeros...)), Name("P255", Package(ones...)))
}

func TestPkgLengthMatchesIASL(t *testing.T) {
	assert.Equal(t, vectorBody(t, "pkglength"), mustEncode(t, pkgLengthVector()...))
}

// TestPkgLengthEncoding checks every size class boundary against the
// encoding worked out from §20.2.4 by hand, up to the 28-bit limit.
func TestPkgLengthEncoding(t *testing.T) {
	cases := []struct {
		body int
		want []byte
	}{
		{0, []byte{0x01}},
		{62, []byte{0x3f}},
		{63, []byte{0x41, 0x04}},          // 65
		{0xffd, []byte{0x4f, 0xff}},       // 0xfff
		{0xffe, []byte{0x81, 0x00, 0x01}}, // 0x1001
		{0xffffc, []byte{0x8f, 0xff, 0xff}},
		{0xffffd, []byte{0xc1, 0x00, 0x00, 0x01}}, // 0x100001
		{maxPkgLength - 4, []byte{0xcf, 0xff, 0xff, 0xff}},
	}
	for _, c := range cases {
		got, err := appendPkgLength(nil, c.body)
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "body %#x", c.body)
	}
	_, err := appendPkgLength(nil, maxPkgLength-3)
	assert.Error(t, err)
}

// megabyteScope is a Scope (\_SB) whose body is exactly body bytes, made of
// Names holding strings of at most 4000 characters (iasl's string literals
// stop at 4096), as Go terms and as ASL.
func megabyteScope(body int) (Term, string) {
	var terms []Term
	var asl strings.Builder
	asl.WriteString(`DefinitionBlock ("", "DSDT", 2, "HPCVMM", "BIG", 1) { Scope (\_SB) {` + "\n")
	rem := body - 5 // \_SB_
	for i := 0; rem > 0; i++ {
		n := min(4000, rem-7) // NameOp, NameSeg, StringPrefix, NUL
		if left := rem - (n + 7); left > 0 && left < 8 {
			n -= 8
		}
		s := strings.Repeat("a", n)
		name := seqName("S", i)
		terms = append(terms, Name(name, String(s)))
		asl.WriteString("Name (" + name + `, "` + s + "\")\n")
		rem -= n + 7
	}
	asl.WriteString("}}\n")
	return Scope(`\_SB`, terms...), asl.String()
}

// TestIASLPkgLengthMegabyte compiles, at test time, scopes across the
// 3/4-byte PkgLength boundary near 1 MiB: too large to commit as vectors.
func TestIASLPkgLengthMegabyte(t *testing.T) {
	iasl := requireIASL(t)
	dir := t.TempDir()
	for _, body := range []int{0xffffc, 0xffffd} {
		term, asl := megabyteScope(body)
		src := filepath.Join(dir, "big.asl")
		require.NoError(t, os.WriteFile(src, []byte(asl), 0o644))
		want := compileASL(t, iasl, dir, src)[headerLen:]
		got := mustEncode(t, term)
		require.Equal(t, len(want), len(got), "body %#x", body)
		assert.True(t, string(want) == string(got), "body %#x: AML differs from iasl's", body)
	}
}
