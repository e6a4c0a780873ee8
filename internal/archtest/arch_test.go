package archtest

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const module = "github.com/hpcvmm/hpcvmm"

// goList returns "importpath|imports" lines for every package of the
// module, with the integration tag and the test variants, so test-only
// imports count too.
func goList(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-tags", "integration", "-test",
		"-f", `{{.ImportPath}}|{{join .Imports " "}}`, module+"/...").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Greater(t, len(lines), 20, "go list saw too few packages to mean anything")
	return lines
}

// TestUnsafeOnlyInUapi: package uapi is the one place for unsafe (and the
// kernel's binary interfaces); everywhere else, code and tests alike, uses
// its typed helpers. A package that needs a pointer cast means uapi lacks a
// helper.
func TestUnsafeOnlyInUapi(t *testing.T) {
	var bad []string
	for _, line := range goList(t) {
		pkg, imports, _ := strings.Cut(line, "|")
		pkg, _, _ = strings.Cut(pkg, " ") // "p [p.test]" for test variants
		pkg = strings.TrimSuffix(pkg, "_test")
		if pkg == module+"/uapi" || strings.HasSuffix(pkg, ".test") {
			continue
		}
		if slices.Contains(strings.Fields(imports), "unsafe") && !slices.Contains(bad, pkg) {
			bad = append(bad, pkg)
		}
	}
	require.Empty(t, bad, "only package uapi may import unsafe (docs/architecture.md)")
}

// TestArchitectureTableListsEveryPackage: docs/architecture.md's package
// table names every package of the module (in backquotes, in the first
// column or, for a package's test helpers such as `host/hosttest`, in its
// row), and names no package that does not exist. "tests/cmd/..." covers
// the packages below tests/cmd.
func TestArchitectureTableListsEveryPackage(t *testing.T) {
	doc, err := os.ReadFile("../../docs/architecture.md")
	require.NoError(t, err)
	out, err := exec.Command("go", "list", "-tags", "integration", module+"/...").CombinedOutput()
	require.NoError(t, err, "go list: %s", out)
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		pkgs = append(pkgs, strings.TrimPrefix(strings.TrimPrefix(p, module), "/"))
	}

	// The table: from "## Packages" to the next section, its rows.
	text := string(doc)
	start := strings.Index(text, "## Packages")
	require.GreaterOrEqual(t, start, 0, "docs/architecture.md has no ## Packages section")
	section := text[start+len("## Packages"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	named := map[string]bool{}
	var listed []string // first-column names: each must exist
	quoted := regexp.MustCompile("`([a-z0-9_./]+)`")
	for _, row := range strings.Split(section, "\n") {
		if !strings.HasPrefix(row, "| `") {
			continue
		}
		cols := strings.Split(row, "|")
		for _, m := range quoted.FindAllStringSubmatch(cols[1], -1) {
			listed = append(listed, m[1])
			named[m[1]] = true
		}
		for _, m := range quoted.FindAllStringSubmatch(row, -1) {
			named[m[1]] = true
		}
	}
	require.Greater(t, len(listed), 20, "the package table has too few rows to mean anything")

	covered := func(p string) bool {
		if named[p] {
			return true
		}
		for n := range named {
			if base, ok := strings.CutSuffix(n, "/..."); ok && strings.HasPrefix(p, base+"/") {
				return true
			}
		}
		return false
	}
	var missing, stale []string
	for _, p := range pkgs {
		if !covered(p) {
			missing = append(missing, p)
		}
	}
	for _, n := range listed {
		base, wild := strings.CutSuffix(n, "/...")
		ok := false
		for _, p := range pkgs {
			ok = ok || p == n || (wild && strings.HasPrefix(p, base+"/"))
		}
		if !ok {
			stale = append(stale, n)
		}
	}
	require.Empty(t, missing, "packages missing from docs/architecture.md's package table: add a row (package, what it owns, what it imports)")
	require.Empty(t, stale, "docs/architecture.md's package table names packages that do not exist")
}
