package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
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

// AppendAML implements Term.
func (p Path) AppendAML(dst []byte) ([]byte, error) { return appendNameString(dst, string(p)) }

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

// AppendAML implements Term.
func (b Buffer) AppendAML(dst []byte) ([]byte, error) {
	body, _ := Integer(len(b)).AppendAML(nil)
	return appendPkg(dst, []byte{opBuffer}, append(body, b...))
}

func (e errTerm) AppendAML([]byte) ([]byte, error) { return nil, e.err }

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

func (o op) AppendAML(dst []byte) ([]byte, error) {
	return appendTerms(append(dst, o.code...), o.operands)
}

func (nullTarget) AppendAML(dst []byte) ([]byte, error) { return append(dst, opZero), nil }

// AppendAML implements Term.
func (l Local) AppendAML(dst []byte) ([]byte, error) {
	if l > 7 {
		return nil, fmt.Errorf("acpi: Local%d does not exist (Local0-Local7)", l)
	}
	return append(dst, opLocal0+byte(l)), nil
}

// AppendAML implements Term.
func (a Arg) AppendAML(dst []byte) ([]byte, error) {
	if a > 6 {
		return nil, fmt.Errorf("acpi: Arg%d does not exist (Arg0-Arg6)", a)
	}
	return append(dst, opArg0+byte(a)), nil
}

func (r operationRegion) AppendAML(dst []byte) ([]byte, error) {
	dst, err := appendNameString(append(dst, opExtPrefix, extOpRegion), r.name)
	if err != nil {
		return nil, err
	}
	return appendTerms(append(dst, byte(r.space)), []Term{r.offset, r.length})
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
