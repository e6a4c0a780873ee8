package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var updateCLIDoc = flag.Bool("update-cli-doc", false, "rewrite docs/cli.md from the commands' --help")

// cliDocPath is the CLI reference, generated from the binary's own help.
const cliDocPath = "../../docs/cli.md"

// TestCLIDocIsCurrent keeps docs/cli.md equal to what `hpcvmm --help` and
// every command's --help print, so the reference never drifts from the
// binary. After changing a flag or a help text:
//
//	go test ./cmd/hpcvmm -run TestCLIDocIsCurrent -update-cli-doc
func TestCLIDocIsCurrent(t *testing.T) {
	var b strings.Builder
	b.WriteString("# hpcvmm command-line reference\n\n" +
		"Generated from the binary's own help by `go test ./cmd/hpcvmm -run TestCLIDocIsCurrent -update-cli-doc`;\n" +
		"the test fails when a flag or help text changes and this file does not. `hpcvmm COMMAND --help` prints the same.\n")
	for _, cmd := range []string{"", "run", "check", "devices", "bind", "unbind", "version"} {
		args := []string{"--help"}
		if cmd != "" {
			args = []string{cmd, "--help"}
		}
		rc, out, errs := hpcvmm(args...)
		require.Equal(t, 0, rc, "%q: %s", args, errs)
		fmt.Fprintf(&b, "\n## `hpcvmm %s`\n\n```\n%s```\n", strings.Join(args, " "), out)
	}
	if *updateCLIDoc {
		require.NoError(t, os.WriteFile(cliDocPath, []byte(b.String()), 0o644))
		return
	}
	have, err := os.ReadFile(cliDocPath)
	require.NoError(t, err, "docs/cli.md: create it with go test ./cmd/hpcvmm -run TestCLIDocIsCurrent -update-cli-doc")
	require.Equal(t, b.String(), string(have),
		"docs/cli.md is not the binary's help: go test ./cmd/hpcvmm -run TestCLIDocIsCurrent -update-cli-doc")
}
