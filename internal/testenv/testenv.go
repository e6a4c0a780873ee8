// Package testenv holds what tests across the module share about their
// environment: the one rule for a test whose resource (a usable /dev/kvm,
// root, a tool) is missing, the host-resource snapshots, and LockedBuffer
// (output a goroutine writes while the test reads it), the child runs
// of tests under a seccomp filter (seccompchild.go), and CopyTree (a
// fixture tree for a test to change). It imports nothing
// from the project, so any package's tests (uapi's included) may use it.
package testenv

import (
	"fmt"
	"os"
	"testing"
)

// RequireIntegrationEnv is the variable CI sets to 1 (.ci/run) so that no
// skipped test counts as a pass.
const RequireIntegrationEnv = "HPCVMM_REQUIRE_INTEGRATION"

// RequireIntegration reports whether this run must not skip: CI asked for
// every resource to be present.
func RequireIntegration() bool { return os.Getenv(RequireIntegrationEnv) == "1" }

// SkipOrFail skips the test with the reason, or fails it when
// HPCVMM_REQUIRE_INTEGRATION=1: a missing resource is then a failure, not
// a pass.
func SkipOrFail(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if RequireIntegration() {
		t.Fatalf("%s (a failure, not a skip, because %s=1)", msg, RequireIntegrationEnv)
	}
	t.Skip(msg)
}
