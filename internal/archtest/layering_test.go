package archtest

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDependenciesPointOneWay keeps the package graph one-way: vmm/ is the
// wiring and imports the devices and building blocks, so nothing outside
// vmm/ (except the CLI and the tests, which drive the VM) may import a
// vmm/... package; the job pipeline that drives it (vmm/jobrun) is wiring
// too and lives under vmm/. A device that needs
// something from vmm/ means that thing belongs in a leaf package.
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

// TestBuildingBlocksImportNothingOfTheProject: a package whose row in
// docs/architecture.md's table says it imports nothing ("—") imports no
// package of the module in its own code (its tests may), and one that says
// "the standard library only" imports nothing beyond it and
// golang.org/x/sys either: such a building block is usable by host and
// guest code alike, and the row stays true.
func TestBuildingBlocksImportNothingOfTheProject(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	require.NoError(t, err)
	none, stdlibOnly := map[string]bool{}, map[string]bool{}
	for _, row := range strings.Split(string(doc), "\n") {
		cols := strings.Split(row, "|")
		if !strings.HasPrefix(row, "| `") || len(cols) < 4 {
			continue
		}
		imports := strings.TrimSpace(cols[len(cols)-2])
		if !strings.HasPrefix(imports, "—") {
			continue
		}
		for _, m := range regexp.MustCompile("`([a-z0-9_./]+)`").FindAllStringSubmatch(cols[1], -1) {
			none[module+"/"+m[1]] = true
			stdlibOnly[module+"/"+m[1]] = strings.Contains(imports, "the standard library only")
		}
	}
	require.True(t, stdlibOnly[module+"/gpudriver"], "gpudriver's row says it imports the standard library only")
	out, err := exec.Command("go", "list", "-tags", "integration", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, module+"/...").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, _ := strings.Cut(line, "|")
		if !none[pkg] {
			continue
		}
		for _, imp := range strings.Fields(imports) {
			first, _, _ := strings.Cut(imp, "/")
			thirdParty := strings.Contains(first, ".") && !strings.HasPrefix(imp, "golang.org/x/sys/")
			if strings.HasPrefix(imp, module+"/") || (stdlibOnly[pkg] && thirdParty) {
				bad = append(bad, pkg+" imports "+imp)
			}
		}
	}
	require.Empty(t, bad, "docs/architecture.md says these packages import none of it: move the code or correct the row")
}
