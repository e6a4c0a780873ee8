package acpi

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// headerLen is the size of the DefinitionBlock header iasl writes in front
// of the AML body of a testdata vector.
const headerLen = 36

// vectorBody returns the AML body of testdata/name.aml, the iasl-compiled
// form of testdata/name.asl.
func vectorBody(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".aml"))
	require.NoError(t, err)
	require.Greater(t, len(b), headerLen)
	return b[headerLen:]
}

// requireIASL returns the path of iasl. A missing iasl fails the test
// rather than skipping it: these checks are part of the suite, and CI runs
// tests/testbed-packages.sh, which installs acpica-tools.
func requireIASL(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("iasl")
	if err != nil {
		t.Fatalf("iasl not found (%v): run tests/testbed-packages.sh, which installs Debian's acpica-tools", err)
	}
	return p
}

// compileASL compiles src (an ASL file) with iasl -on (named references are
// kept as written, not shortened) into dir and returns the AML.
func compileASL(t *testing.T, iasl, dir, src string) []byte {
	t.Helper()
	base := filepath.Join(dir, filepath.Base(src[:len(src)-len(filepath.Ext(src))]))
	out, err := exec.Command(iasl, "-on", "-p", base, src).CombinedOutput()
	require.NoError(t, err, "iasl %s:\n%s", src, out)
	aml, err := os.ReadFile(base + ".aml")
	require.NoError(t, err)
	return aml
}

// mustEncode encodes terms or fails the test.
func mustEncode(t *testing.T, terms ...Term) []byte {
	t.Helper()
	b, err := Encode(terms...)
	require.NoError(t, err)
	return b
}
