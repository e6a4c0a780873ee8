// Package acpi builds the ACPI tables of a VM for a firmware-less direct
// kernel boot: RSDP, XSDT, a hardware-reduced FADT, MADT, MCFG, SRAT, SLIT
// and a DSDT whose AML describes the PCIe host bridge, the legacy devices
// and a Generic Event Device with a power button, as Cloud Hypervisor and
// Firecracker do for their guests.
//
// It contains its own AML encoder (aml.go, resources.go) because no
// maintained Go library generates ACPI tables or AML: u-root's pkg/acpi only
// reads and writes raw tables. The encoder is checked byte for byte against
// AML compiled by ACPICA's iasl (testdata/*.asl) and every generated table
// is disassembled by iasl in the tests.
//
// References are to the ACPI Specification 6.5 unless a comment says
// otherwise. The package imports only the standard library.
package acpi
