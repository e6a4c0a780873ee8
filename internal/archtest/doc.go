// Package archtest holds the tests that keep the module's structure what
// docs/architecture.md says it is: dependencies point one way (nothing
// outside vmm/, cmd/ and tests/ imports vmm/...), unsafe is imported only
// in uapi, and the architecture document's package table names every
// package and no package that is gone; no production file or function is
// over the size limits (size_test.go); every relative link of README.md
// and docs/*.md resolves. It has no code of its own.
package archtest
