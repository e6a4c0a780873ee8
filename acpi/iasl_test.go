package acpi

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIASLVectorsCurrent recompiles every testdata/*.asl and checks the
// committed .aml matches, so a vector edited without recompiling is caught.
// The header's checksum and compiler revision (bytes 9 and 32-35) may
// differ between iasl releases and are not compared.
func TestIASLVectorsCurrent(t *testing.T) {
	iasl := requireIASL(t)
	srcs, err := filepath.Glob(filepath.Join("testdata", "*.asl"))
	require.NoError(t, err)
	require.NotEmpty(t, srcs)
	dir := t.TempDir()
	for _, src := range srcs {
		fresh := compileASL(t, iasl, dir, src)
		committed, err := os.ReadFile(src[:len(src)-len(".asl")] + ".aml")
		require.NoError(t, err, "%s has no compiled .aml next to it", src)
		require.Equal(t, len(fresh), len(committed), "%s: committed .aml is stale; recompile with iasl -on", src)
		for _, b := range [][]byte{fresh, committed} {
			b[9] = 0
			copy(b[32:36], []byte{0, 0, 0, 0})
		}
		assert.Equal(t, fresh, committed, "%s: committed .aml is stale; recompile with iasl -on", src)
	}
}

// TestIASLDisassemblesTables writes every table of every platform variant
// to a file, disassembles them with iasl -d and requires a clean run: exit
// status 0 and no error, warning, invalid or unknown in iasl's output or the
// disassembly. The DSDT's disassembly is then recompiled (iasl -on) and
// must reproduce the generated AML byte for byte.
func TestIASLDisassemblesTables(t *testing.T) {
	iasl := requireIASL(t)
	bad := regexp.MustCompile(`(?i)\b(error|warning|invalid|unknown|incorrect)`)
	for name, p := range platformVariants() {
		t.Run(name, func(t *testing.T) {
			ts, err := Build(p, testBase)
			require.NoError(t, err)
			dir := t.TempDir()
			args := []string{"-d"}
			for _, tb := range ts.Tables {
				if tb.Signature == "RSD PTR " {
					continue // not a table iasl disassembles
				}
				f := filepath.Join(dir, strings.ToLower(tb.Signature)+".dat")
				require.NoError(t, os.WriteFile(f, tb.Data, 0o644))
				args = append(args, f)
			}
			out, err := exec.Command(iasl, args...).CombinedOutput()
			require.NoError(t, err, "iasl -d:\n%s", out)
			assert.Empty(t, bad.FindAllString(string(out), -1), "iasl -d output:\n%s", out)
			for _, f := range args[1:] {
				dsl, err := os.ReadFile(strings.TrimSuffix(f, ".dat") + ".dsl")
				require.NoError(t, err)
				for _, line := range strings.Split(string(dsl), "\n") {
					assert.False(t, bad.MatchString(line), "%s: %s", filepath.Base(f), line)
				}
			}
			dsdt, _ := ts.Find("DSDT")
			aml := compileASL(t, iasl, dir, filepath.Join(dir, "dsdt.dsl"))
			assert.True(t, bytes.Equal(dsdt.Data[HeaderLen:], aml[HeaderLen:]), "recompiled DSDT differs")
		})
	}
}
