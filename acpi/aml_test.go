package acpi

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// termsVector builds testdata/terms.asl with the Go API.
func termsVector(t *testing.T) []Term {
	pnp0a08, err := EISAID("PNP0A08")
	require.NoError(t, err)
	pnp0c0c, err := EISAID("PNP0C0C")
	require.NoError(t, err)
	ints := []uint64{0, 1, 2, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000,
		0xfffffffffffffffe, 0xffffffffffffffff}
	var terms []Term
	for i, v := range ints {
		terms = append(terms, Name(seqName("I", i), Integer(v)))
	}
	terms = append(terms,
		Name("S000", String("")),
		Name("S001", String("ACPI0013")),
		Name("B000", Buffer{0x01}),
		Name("B001", Buffer{0x00, 0x01, 0x02, 0xff}),
		Name("E000", pnp0a08),
		Name("E001", pnp0c0c),
		Name("U000", UUID("33db4d5b-1ff7-401c-9657-7441c03dd766")),
		Name(`\P001`, Package(Package(One, String("x")), Zero)),
		Scope(`\_SB`,
			Name("P002", Package(Path("PCI0.S08"), Path("PCI0.S08.P000"))),
			Device("PCI0",
				Name("_HID", pnp0a08),
				Device("S08",
					Name("_ADR", Integer(0x00080000)),
					Name("P000", Package(Path(`\_SB`), Path(`\_SB.PCI0`), Path(`\_SB.PCI0.S08`),
						Path("^^PCI0"), Path("^S08"), Path("^S08.P000"), Path(`\`))),
				),
				Method("M000", 0, false, Return(Zero)),
				Method("M001", 7, true,
					Store(Arg(0), Local(0)),
					Store(Arg(6), Local(7)),
					Store(Local(7), Local(1)),
					If(LEqual(Local(0), Integer(5)), Notify(Path(`\_SB.PCI0`), Integer(0x80))),
					Else(Return(One)),
					If(LNotEqual(Arg(1), One), Or(Local(1), Integer(8), Local(1))),
					If(LAnd(LOr(Arg(2), Arg(3)), LNot(Arg(4))), Return(And(Arg(5), Integer(4), nil))),
					Return(Arg(1)),
				),
				Method("_OSC", 4, false,
					CreateDWordField(Arg(3), Zero, "CDW1"),
					CreateDWordField(Arg(3), Integer(8), "CDW3"),
					Return(Arg(3)),
				),
			),
		),
		Scope(`\`,
			OperationRegion("GDST", SystemMemory, Integer(0xfed00000), Integer(4)),
			Field("GDST", DWordAcc, false, WriteAsZeros, FieldUnit{"GDAT", 32}),
			OperationRegion("PRT0", SystemMemory, Integer(0xfeb00000), Integer(0x1000)),
			Field("PRT0", ByteAcc, true, Preserve,
				FieldUnit{"A", 1}, FieldUnit{"", 6}, FieldUnit{"BB", 1},
				FieldUnit{"", 8}, // Offset (0x02)
				FieldUnit{"CCCC", 64}, FieldUnit{"DDDD", 4096},
				FieldUnit{"", (0x400 - 522) * 8}, // Offset (0x400)
				FieldUnit{"EEEE", 8}),
		),
	)
	return terms
}

// seqName is prefix followed by i in three digits: I000, I001, ...
func seqName(prefix string, i int) string {
	const digits = "0123456789"
	return prefix + string([]byte{digits[i/100%10], digits[i/10%10], digits[i%10]})
}

func TestAMLTermsMatchIASL(t *testing.T) {
	assert.Equal(t, vectorBody(t, "terms"), mustEncode(t, termsVector(t)...))
}

func TestAMLErrors(t *testing.T) {
	bad := map[string]Term{
		"long segment":      Name("TOOLONG", Zero),
		"lower case":        Name("abcd", Zero),
		"leading digit":     Name("1ABC", Zero),
		"empty segment":     Path(`\_SB..X`),
		"lone caret":        Path("^"),
		"empty path":        Path(""),
		"string NUL":        String("a\x00b"),
		"string non-ASCII":  String("é"),
		"method args":       Method("M000", 8, false),
		"local":             Local(8),
		"arg":               Arg(7),
		"bad UUID":          UUID("33db4d5b-1ff7-401c-9657-7441c03dd76"),
		"bad UUID hex":      UUID("33db4d5b-1ff7-401c-9657-7441c03dd76g"),
		"nil predicate":     If(nil),
		"nil term":          Scope(`\_SB`, nil),
		"field zero bits":   Field("REG0", ByteAcc, false, Preserve, FieldUnit{"A", 0}),
		"field access":      Field("REG0", 9, false, Preserve),
		"field name":        Field("REG0", ByteAcc, false, Preserve, FieldUnit{"abc", 1}),
		"create field name": CreateDWordField(Arg(3), Zero, "cdw1"),
		"nested error":      Device("DEV0", Method("_STA", 0, false, Return(Local(9)))),
	}
	for name, term := range bad {
		_, err := Encode(term)
		assert.Error(t, err, name)
	}
	for _, id := range []string{"PNP0A0", "pnp0A08", "PNP0A0G", "PNP0a08"} {
		_, err := EISAID(id)
		assert.Error(t, err, id)
	}
}

func TestNameStringForms(t *testing.T) {
	cases := map[string][]byte{
		`\`:             {0x5c, 0x00},
		`_SB`:           []byte("_SB_"),
		`\_SB.PCI0`:     append([]byte{0x5c, 0x2e}, "_SB_PCI0"...),
		`_SB_.PCI0.S08`: append([]byte{0x2f, 3}, "_SB_PCI0S08_"...),
		`^^A`:           append([]byte{0x5e, 0x5e}, "A___"...),
	}
	for path, want := range cases {
		got, err := Path(path).AppendAML(nil)
		require.NoError(t, err, path)
		assert.Equal(t, want, got, path)
	}
}
