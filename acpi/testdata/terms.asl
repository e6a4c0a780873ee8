/*
 * AML term vectors for acpi's encoder: aml_test.go builds the same
 * definitions with the Go API and compares the bytes after the header.
 * Compile: iasl -on terms.asl (-on keeps name paths as written).
 */
DefinitionBlock ("", "DSDT", 2, "HPCVMM", "TERMS", 1)
{
    /* Integers at every encoding boundary. */
    Name (I000, 0)
    Name (I001, 1)
    Name (I002, 2)
    Name (I003, 0xFF)
    Name (I004, 0x100)
    Name (I005, 0xFFFF)
    Name (I006, 0x10000)
    Name (I007, 0xFFFFFFFF)
    Name (I008, 0x100000000)
    Name (I009, 0xFFFFFFFFFFFFFFFE)
    Name (I010, 0xFFFFFFFFFFFFFFFF)
    /* Strings, buffers, EISA IDs, UUIDs. */
    Name (S000, "")
    Name (S001, "ACPI0013")
    Name (B000, Buffer () {0x01})
    Name (B001, Buffer () {0x00, 0x01, 0x02, 0xFF})
    Name (E000, EisaId ("PNP0A08"))
    Name (E001, EisaId ("PNP0C0C"))
    Name (U000, ToUUID ("33db4d5b-1ff7-401c-9657-7441c03dd766"))
    /* Name paths: root, parent prefixes, dual and multi segment, padding. */
    Name (\P001, Package () {Package () {One, "x"}, Zero})
    Scope (\_SB)
    {
        Name (P002, Package () {PCI0.S08, PCI0.S08.P000})
        Device (PCI0)
        {
            Name (_HID, EisaId ("PNP0A08"))
            Device (S08)
            {
                Name (_ADR, 0x00080000)
                Name (P000, Package () {\_SB, \_SB.PCI0, \_SB.PCI0.S08, ^^PCI0, ^S08, ^S08.P000, \})
            }
            Method (M000, 0, NotSerialized)
            {
                Return (Zero)
            }
            Method (M001, 7, Serialized)
            {
                Store (Arg0, Local0)
                Store (Arg6, Local7)
                Store (Local7, Local1)
                If (LEqual (Local0, 0x05))
                {
                    Notify (\_SB.PCI0, 0x80)
                }
                Else
                {
                    Return (One)
                }
                If (LNotEqual (Arg1, One))
                {
                    Or (Local1, 0x08, Local1)
                }
                If (LAnd (LOr (Arg2, Arg3), LNot (Arg4)))
                {
                    Return (And (Arg5, 0x04))
                }
                Return (Arg1)
            }
            Method (_OSC, 4, NotSerialized)
            {
                CreateDWordField (Arg3, Zero, CDW1)
                CreateDWordField (Arg3, 0x08, CDW3)
                Return (Arg3)
            }
        }
    }
    Scope (\)
    {
        OperationRegion (GDST, SystemMemory, 0xFED00000, 0x04)
        Field (GDST, DWordAcc, NoLock, WriteAsZeros)
        {
            GDAT,   32
        }
        OperationRegion (PRT0, SystemMemory, 0xFEB00000, 0x1000)
        Field (PRT0, ByteAcc, Lock, Preserve)
        {
            A,   1,
            ,   6,
            BB,   1,
            Offset (0x02),
            CCCC,   64,
            DDDD,   4096,
            Offset (0x400),
            EEEE,   8
        }
    }
}
