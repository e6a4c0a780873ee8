package archtest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDependenciesPointOneWay keeps the package graph one-way: vmm/ is the
// wiring and imports the devices and building blocks, so nothing outside
// vmm/ (except the CLI and the tests, which drive the VM) may import a
// vmm/... package. A device that needs something from vmm/ means that
// thing belongs in a leaf package.
func TestDependenciesPointOneWay(t *testing.T) {
	allowed := func(pkg string) bool {
		for _, p := range []string{"/vmm", "/cmd/", "/tests"} {
			if strings.HasPrefix(strings.TrimPrefix(pkg, module), p) {
				return true
			}
		}
		return false
	}
	var bad []string
	for _, line := range goList(t) {
		pkg, imports, _ := strings.Cut(line, "|")
		pkg, _, _ = strings.Cut(pkg, " ") // "p [p.test]" for test variants
		if allowed(pkg) {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			if imp == module+"/vmm" || strings.HasPrefix(imp, module+"/vmm/") {
				bad = append(bad, pkg+" imports "+imp)
			}
		}
	}
	require.Empty(t, bad, "packages outside vmm/, cmd/ and tests/ must not import vmm/...")
}
