// Package tests holds hpcvmm's integration scenarios (build tag
// integration): ordinary Go tests that run on real KVM, on the host or
// inside a nested L1 guest, through the harness in tests/harness.
//
//	bash tests/testbed-packages.sh                   # once: QEMU, kernel, busybox, ... (no service enabled)
//	go test -tags integration -timeout 30m ./tests/  # the suite
//
// See tests/harness/doc.go for HPCVMM_TEST_WHERE and the other knobs.
package tests
