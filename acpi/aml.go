package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// AML opcodes (ACPI 6.5 §20.3, AML Byte Stream Byte Values).
const (
	opZero           = 0x00
	opOne            = 0x01
	opName           = 0x08
	opBytePrefix     = 0x0a
	opWordPrefix     = 0x0b
	opDWordPrefix    = 0x0c
	opStringPrefix   = 0x0d
	opQWordPrefix    = 0x0e
	opScope          = 0x10
	opBuffer         = 0x11
	opPackage        = 0x12
	opVarPackage     = 0x13
	opMethod         = 0x14
	opDualNamePrefix = 0x2e
	opMultiNamePfx   = 0x2f
	opExtPrefix      = 0x5b
	opRootChar       = 0x5c
	opParentPrefix   = 0x5e
	opLocal0         = 0x60
	opArg0           = 0x68
	opStore          = 0x70
	opAnd            = 0x7b
	opOr             = 0x7d
	opNotify         = 0x86
	opCreateDWord    = 0x8a
	opLAnd           = 0x90
	opLOr            = 0x91
	opLNot           = 0x92
	opLEqual         = 0x93
	opIf             = 0xa0
	opElse           = 0xa1
	opReturn         = 0xa4
	opOnes           = 0xff

	extOpRegion = 0x80 // after opExtPrefix
	extField    = 0x81
	extDevice   = 0x82
)

// Term is one piece of AML: a named object, a statement or an expression.
// AppendAML appends the term's encoding to dst; it fails on a malformed
// name, string or argument, so a bad definition is reported instead of
// producing AML that the guest's interpreter rejects.
type Term interface {
	AppendAML(dst []byte) ([]byte, error)
}

// Encode returns the concatenated AML of terms: a TermList, the body of a
// DSDT or SSDT.
func Encode(terms ...Term) ([]byte, error) {
	return appendTerms(nil, terms)
}

func appendTerms(dst []byte, terms []Term) ([]byte, error) {
	var err error
	for _, t := range terms {
		if t == nil {
			return nil, errors.New("acpi: nil AML term")
		}
		if dst, err = t.AppendAML(dst); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

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

// Path is a reference to a named object, as a TermArg or SuperName:
// `\_SB.PWRB`, `^CDW1`, `CDW1`. It encodes as a NameString.
type Path string

// AppendAML implements Term.
func (p Path) AppendAML(dst []byte) ([]byte, error) { return appendNameString(dst, string(p)) }

// Integer is an AML integer constant. It encodes in the smallest form, as
// iasl's integer optimization does (§20.2.3): Zero, One and Ones for 0, 1
// and all-ones, else ByteConst, WordConst, DWordConst or QWordConst. Ones is
// 64-bit all-ones, correct in tables of revision 2 or more (integers are 64
// bits wide, §19.6.28), which is what this package builds.
type Integer uint64

// AppendAML implements Term.
func (v Integer) AppendAML(dst []byte) ([]byte, error) {
	switch {
	case v == 0:
		return append(dst, opZero), nil
	case v == 1:
		return append(dst, opOne), nil
	case v == ^Integer(0):
		return append(dst, opOnes), nil
	case v <= 0xff:
		return append(dst, opBytePrefix, byte(v)), nil
	case v <= 0xffff:
		return binary.LittleEndian.AppendUint16(append(dst, opWordPrefix), uint16(v)), nil
	case v <= 0xffffffff:
		return binary.LittleEndian.AppendUint32(append(dst, opDWordPrefix), uint32(v)), nil
	}
	return binary.LittleEndian.AppendUint64(append(dst, opQWordPrefix), uint64(v)), nil
}

// ASL's integer constant names.
const (
	Zero Integer = 0
	One  Integer = 1
	Ones Integer = ^Integer(0)
)

// String is an AML string constant: ASCII characters 0x01-0x7f, NUL
// terminated (§20.2.3).
type String string

// AppendAML implements Term.
func (s String) AppendAML(dst []byte) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 || s[i] > 0x7f {
			return nil, fmt.Errorf("acpi: AML string %q: byte %#x is not ASCII 0x01-0x7f", string(s), s[i])
		}
	}
	dst = append(append(dst, opStringPrefix), s...)
	return append(dst, 0), nil
}

// Buffer is an AML buffer initialized with its bytes: BufferOp PkgLength
// BufferSize ByteList (§19.6.10), the size being an Integer.
type Buffer []byte

// AppendAML implements Term.
func (b Buffer) AppendAML(dst []byte) ([]byte, error) {
	body, _ := Integer(len(b)).AppendAML(nil)
	return appendPkg(dst, []byte{opBuffer}, append(body, b...))
}

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

func (e errTerm) AppendAML([]byte) ([]byte, error) { return nil, e.err }

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

// named is NameOp NameString DataRefObject.
type named struct {
	path  string
	value Term
}

// Name declares a named object holding value (§19.6.90).
func Name(path string, value Term) Term { return named{path, value} }

func (n named) AppendAML(dst []byte) ([]byte, error) {
	dst, err := appendNameString(append(dst, opName), n.path)
	if err != nil {
		return nil, err
	}
	return appendTerms(dst, []Term{n.value})
}

// container is the shared shape of Scope, Device, If and Else: opcode,
// PkgLength, an optional NameString or predicate, a TermList.
type container struct {
	op    []byte
	path  string // NameString after PkgLength; "" for If/Else
	pred  Term   // If's predicate
	terms []Term
}

func (c container) AppendAML(dst []byte) ([]byte, error) {
	var body []byte
	var err error
	if c.path != "" {
		if body, err = appendNameString(body, c.path); err != nil {
			return nil, err
		}
	}
	if c.pred != nil {
		if body, err = c.pred.AppendAML(body); err != nil {
			return nil, err
		}
	}
	if body, err = appendTerms(body, c.terms); err != nil {
		return nil, err
	}
	return appendPkg(dst, c.op, body)
}

// Scope opens an existing namespace scope and adds terms to it (§19.6.122).
func Scope(path string, terms ...Term) Term {
	return container{op: []byte{opScope}, path: path, terms: terms}
}

// Device declares a device object holding terms (§19.6.31).
func Device(path string, terms ...Term) Term {
	return container{op: []byte{opExtPrefix, extDevice}, path: path, terms: terms}
}

// If runs terms when pred is non-zero (§19.6.60). An Else term right after
// it in the same TermList is its else branch.
func If(pred Term, terms ...Term) Term {
	if pred == nil {
		return errTerm{errors.New("acpi: If without predicate")}
	}
	return container{op: []byte{opIf}, pred: pred, terms: terms}
}

// Else is the branch taken when the If right before it is not (§19.6.40).
func Else(terms ...Term) Term { return container{op: []byte{opElse}, terms: terms} }

// method is MethodOp PkgLength NameString MethodFlags TermList.
type method struct {
	path       string
	args       int
	serialized bool
	terms      []Term
}

// Method declares a control method with args arguments (0-7) (§19.6.85).
// serialized makes the interpreter run one invocation at a time, needed when
// the method creates named objects; its sync level is 0.
func Method(path string, args int, serialized bool, terms ...Term) Term {
	return method{path, args, serialized, terms}
}

func (m method) AppendAML(dst []byte) ([]byte, error) {
	if m.args < 0 || m.args > 7 {
		return nil, fmt.Errorf("acpi: method %s: %d arguments, want 0-7", m.path, m.args)
	}
	body, err := appendNameString(nil, m.path)
	if err != nil {
		return nil, err
	}
	flags := byte(m.args) // bits 0-2 ArgCount, bit 3 SerializeFlag, 4-7 SyncLevel
	if m.serialized {
		flags |= 1 << 3
	}
	if body, err = appendTerms(append(body, flags), m.terms); err != nil {
		return nil, err
	}
	return appendPkg(dst, []byte{opMethod}, body)
}

// pkg is a Package (NumElements as a byte) or, beyond 255 elements, a
// VarPackage whose count is a TermArg, as iasl chooses (§19.6.102).
type pkg []Term

// Package is a fixed list of data objects (§19.6.102).
func Package(elems ...Term) Term { return pkg(elems) }

func (p pkg) AppendAML(dst []byte) ([]byte, error) {
	var body []byte
	op := byte(opPackage)
	if len(p) <= 255 {
		body = append(body, byte(len(p)))
	} else {
		op = opVarPackage
		body, _ = Integer(len(p)).AppendAML(body)
	}
	body, err := appendTerms(body, p)
	if err != nil {
		return nil, err
	}
	return appendPkg(dst, []byte{op}, body)
}

// op is a fixed-operand statement or expression: opcode then operands.
type op struct {
	code     []byte
	operands []Term
}

func (o op) AppendAML(dst []byte) ([]byte, error) {
	return appendTerms(append(dst, o.code...), o.operands)
}

// target returns t, or NullName when the result is not stored (the
// Target production accepts NullName, §20.2.5.4).
func target(t Term) Term {
	if t == nil {
		return nullTarget{}
	}
	return t
}

// nullTarget encodes as NullName, a single zero byte.
type nullTarget struct{}

func (nullTarget) AppendAML(dst []byte) ([]byte, error) { return append(dst, opZero), nil }

// Return returns v from the method (§19.6.120).
func Return(v Term) Term { return op{[]byte{opReturn}, []Term{v}} }

// Store copies src into dst (§19.6.132).
func Store(src, dst Term) Term { return op{[]byte{opStore}, []Term{src, dst}} }

// Notify sends value to the device obj's notify handlers (§19.6.94), e.g.
// 0x80 to a power button: "button pressed".
func Notify(obj, value Term) Term { return op{[]byte{opNotify}, []Term{obj, value}} }

// LEqual is a == b (§19.6.73).
func LEqual(a, b Term) Term { return op{[]byte{opLEqual}, []Term{a, b}} }

// LNot is !a (§19.6.78).
func LNot(a Term) Term { return op{[]byte{opLNot}, []Term{a}} }

// LNotEqual is a != b, encoded as LNot(LEqual(a, b)) as iasl does (§19.6.79).
func LNotEqual(a, b Term) Term { return LNot(LEqual(a, b)) }

// LAnd is a && b (§19.6.70).
func LAnd(a, b Term) Term { return op{[]byte{opLAnd}, []Term{a, b}} }

// LOr is a || b (§19.6.80).
func LOr(a, b Term) Term { return op{[]byte{opLOr}, []Term{a, b}} }

// And is a & b, stored into target unless target is nil (§19.6.5).
func And(a, b, tgt Term) Term { return op{[]byte{opAnd}, []Term{a, b, target(tgt)}} }

// Or is a | b, stored into target unless target is nil (§19.6.101).
func Or(a, b, tgt Term) Term { return op{[]byte{opOr}, []Term{a, b, target(tgt)}} }

// CreateDWordField names the 32-bit field of buffer buf at byte offset
// index (§19.6.20), how _OSC reads and writes its capabilities buffer.
func CreateDWordField(buf, index Term, name string) Term {
	if err := checkNameSeg(name); err != nil {
		return errTerm{fmt.Errorf("acpi: CreateDWordField: %w", err)}
	}
	return op{[]byte{opCreateDWord}, []Term{buf, index, Path(name)}}
}

// Local is a method's local variable Local0-Local7 (§19.6.71).
type Local uint8

// AppendAML implements Term.
func (l Local) AppendAML(dst []byte) ([]byte, error) {
	if l > 7 {
		return nil, fmt.Errorf("acpi: Local%d does not exist (Local0-Local7)", l)
	}
	return append(dst, opLocal0+byte(l)), nil
}

// Arg is a method's argument Arg0-Arg6 (§19.6.8).
type Arg uint8

// AppendAML implements Term.
func (a Arg) AppendAML(dst []byte) ([]byte, error) {
	if a > 6 {
		return nil, fmt.Errorf("acpi: Arg%d does not exist (Arg0-Arg6)", a)
	}
	return append(dst, opArg0+byte(a)), nil
}

// RegionSpace is an OperationRegion's address space (§19.6.100).
type RegionSpace uint8

// Region spaces used by this package.
const (
	SystemMemory RegionSpace = 0x00
	SystemIO     RegionSpace = 0x01
	PCIConfig    RegionSpace = 0x02
)

// operationRegion is ExtOpPrefix OpRegionOp NameString RegionSpace
// RegionOffset RegionLen.
type operationRegion struct {
	name           string
	space          RegionSpace
	offset, length Term
}

// OperationRegion declares a region of length bytes at offset in space
// (§19.6.100), which Field then divides into named registers.
func OperationRegion(name string, space RegionSpace, offset, length Term) Term {
	return operationRegion{name, space, offset, length}
}

func (r operationRegion) AppendAML(dst []byte) ([]byte, error) {
	dst, err := appendNameString(append(dst, opExtPrefix, extOpRegion), r.name)
	if err != nil {
		return nil, err
	}
	return appendTerms(append(dst, byte(r.space)), []Term{r.offset, r.length})
}

// FieldAccess is a Field's AccessType, FieldFlags bits 0-3 (§19.6.48).
type FieldAccess uint8

// Field access types.
const (
	AnyAcc   FieldAccess = 0
	ByteAcc  FieldAccess = 1
	WordAcc  FieldAccess = 2
	DWordAcc FieldAccess = 3
	QWordAcc FieldAccess = 4
)

// FieldUpdate is a Field's UpdateRule, FieldFlags bits 5-6 (§19.6.48): what
// the bits of an access outside the written field get.
type FieldUpdate uint8

// Field update rules.
const (
	Preserve     FieldUpdate = 0
	WriteAsOnes  FieldUpdate = 1
	WriteAsZeros FieldUpdate = 2
)

// FieldUnit is one element of a Field: Bits bits named Name or, with an
// empty Name, skipped (ASL's Offset and unnamed entries compile to such a
// ReservedField, §20.2.5.2).
type FieldUnit struct {
	Name string
	Bits int
}

// field is ExtOpPrefix FieldOp PkgLength NameString FieldFlags FieldList.
type field struct {
	region string
	access FieldAccess
	lock   bool
	update FieldUpdate
	units  []FieldUnit
}

// Field divides the OperationRegion region into named units (§19.6.48).
// lock takes the global lock around accesses.
func Field(region string, access FieldAccess, lock bool, update FieldUpdate, units ...FieldUnit) Term {
	return field{region, access, lock, update, units}
}

func (f field) AppendAML(dst []byte) ([]byte, error) {
	if f.access > QWordAcc || f.update > WriteAsZeros {
		return nil, fmt.Errorf("acpi: field of %s: access %d / update rule %d out of range", f.region, f.access, f.update)
	}
	body, err := appendNameString(nil, f.region)
	if err != nil {
		return nil, err
	}
	flags := byte(f.access) | byte(f.update)<<5
	if f.lock {
		flags |= 1 << 4
	}
	body = append(body, flags)
	for _, u := range f.units {
		if u.Bits <= 0 {
			return nil, fmt.Errorf("acpi: field %s of %s: %d bits", u.Name, f.region, u.Bits)
		}
		if u.Name == "" {
			body = append(body, 0x00) // ReservedField
		} else {
			if err := checkNameSeg(u.Name); err != nil {
				return nil, fmt.Errorf("acpi: field of %s: %w", f.region, err)
			}
			body = appendNameString4(body, u.Name)
		}
		if body, err = appendFieldLength(body, u.Bits); err != nil {
			return nil, err
		}
	}
	return appendPkg(dst, []byte{opExtPrefix, extField}, body)
}

// appendNameString4 appends a validated NameSeg padded to 4 characters.
func appendNameString4(dst []byte, seg string) []byte {
	dst = append(dst, seg...)
	for i := len(seg); i < 4; i++ {
		dst = append(dst, '_')
	}
	return dst
}
