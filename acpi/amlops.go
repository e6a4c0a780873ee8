package acpi

// AML statements, expressions, locals and arguments, operation regions and fields.

import (
	"fmt"
)

// op is a fixed-operand statement or expression: opcode then operands.
type op struct {
	code     []byte
	operands []Term
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

// Arg is a method's argument Arg0-Arg6 (§19.6.8).
type Arg uint8

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
