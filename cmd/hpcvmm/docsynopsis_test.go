package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// helpSynopses are each command's synopses as --help prints them, the
// continuation lines of one joined, by its first words ("hpcvmm run").
func helpSynopses(t *testing.T) map[string][]string {
	out := map[string][]string{}
	for _, cmd := range []string{"run", "check", "devices", "bind", "unbind", "version"} {
		_, help, _ := hpcvmm(cmd, "--help")
		var cur []string
		for _, line := range strings.Split(strings.TrimPrefix(help, "usage: "), "\n") {
			if strings.TrimSpace(line) == "" {
				break
			}
			if strings.HasPrefix(strings.TrimSpace(line), "hpcvmm ") && cur != nil {
				out["hpcvmm "+cmd] = append(out["hpcvmm "+cmd], strings.Join(cur, " "))
				cur = nil
			}
			cur = append(cur, strings.TrimSpace(line))
		}
		out["hpcvmm "+cmd] = append(out["hpcvmm "+cmd], strings.Join(cur, " "))
	}
	return out
}

var (
	// A fenced block that starts with a synopsis: "hpcvmm CMD [...".
	docBlock = regexp.MustCompile("(?m)^```\\n(hpcvmm [a-z]+ [^\\n]*[\\[][^`]*)```")
	// A table cell that is one: "| `hpcvmm CMD [...]` |".
	docCell = regexp.MustCompile("(?m)^\\| `(hpcvmm [a-z]+[^`]*\\[[^`]*)` \\|")
	// A flag table row with a default column: "| `--flag` | default | ...".
	docDefault = regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)` \\| ([^|]*(?:\\\\\\|[^|]*)*) \\| ")
	// A line that spells --net's value out, as docs/jobs.md does.
	docNet = regexp.MustCompile(`(?m)^--net tap=NAME\S*$`)
)

// collapse joins words with one space: synopses compare as words.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// docMismatches lists where doc (a Markdown text) says otherwise than
// --help: a synopsis in a fenced block or a table cell that is none of its
// command's, a default in a flag table that is not hpcvmm run's, a --net
// spelled with other keys than run's synopsis.
func docMismatches(doc string, synopses map[string][]string, run *pflag.FlagSet) []string {
	var bad []string
	check := func(where, syn string) {
		syn = collapse(strings.ReplaceAll(syn, `\|`, "|"))
		name := strings.Join(strings.Fields(syn)[:2], " ")
		want, ok := synopses[name]
		if !ok {
			bad = append(bad, fmt.Sprintf("%s %q: no such command", where, syn))
			return
		}
		for _, w := range want {
			if syn == w {
				return
			}
		}
		bad = append(bad, fmt.Sprintf("%s %q is not %s's synopsis (--help: %q)", where, syn, name, want))
	}
	for _, m := range docBlock.FindAllStringSubmatch(doc, -1) {
		check("block", m[1])
	}
	for _, m := range docCell.FindAllStringSubmatch(doc, -1) {
		check("table cell", m[1])
	}
	for _, m := range docDefault.FindAllStringSubmatch(doc, -1) {
		f := run.Lookup(m[1])
		if f == nil {
			continue // another command's flag table
		}
		switch f.DefValue {
		case "", "false", "[]", "0":
			continue // --help shows no default
		}
		if cell := strings.ReplaceAll(m[2], "`", ""); !strings.Contains(cell, f.DefValue) {
			bad = append(bad, fmt.Sprintf("--%s: the docs' default %q, --help's %q", m[1], strings.TrimSpace(m[2]), f.DefValue))
		}
	}
	runSyn := strings.Join(strings.Fields(synopses["hpcvmm run"][0]), "")
	for _, m := range docNet.FindAllString(doc, -1) {
		if !strings.Contains(runSyn, "["+strings.Join(strings.Fields(m), "")+"]...") {
			bad = append(bad, fmt.Sprintf("%q is not the --net of hpcvmm run's synopsis", m))
		}
	}
	return bad
}

// TestDocsAgreeWithHelp: the synopses, flag defaults and --net spelling
// in README.md, docs/running.md and docs/jobs.md are the binary's (issue
// 35: --kernel said required where a job defaults it, --net lacked
// bridge, ip and gw). The table's wrong docs show the check fails.
func TestDocsAgreeWithHelp(t *testing.T) {
	synopses := helpSynopses(t)
	c, _ := newRunCommand()
	for _, file := range []string{"../../README.md", "../../docs/running.md", "../../docs/jobs.md"} {
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		assert.Empty(t, docMismatches(string(b), synopses, c.fs), file)
	}
	running, err := os.ReadFile("../../docs/running.md")
	require.NoError(t, err)
	require.Len(t, docBlock.FindAllString(string(running), -1), 1, "docs/running.md's run synopsis is checked")
	require.Len(t, docCell.FindAllString(string(running), -1), 4, "docs/running.md's command table is checked")
	require.NotEmpty(t, docDefault.FindAllString(string(running), -1), "docs/running.md's defaults are checked")
	for _, tc := range []struct {
		doc  string
		want string // in the mismatch; "" for none
	}{
		{"```\n" + strings.ReplaceAll(synopses["hpcvmm run"][0], "] [", "]\n       [") + "\n```\n", ""},
		{"```\nhpcvmm run --kernel FILE [--initrd FILE] [--cmdline TEXT] [--cpus N]\n```\n", "is not hpcvmm run's synopsis"},
		{"| `hpcvmm check [--gpu BDF]... [--json]` | checks |\n", "is not hpcvmm check's synopsis"},
		{"| `hpcvmm bind [--state-dir DIR] [--gpu BDF\\|slurm]... [--vf BDF\\|slurm[,IB-OPTIONS]]... [BDF...]` | binds |\n", ""},
		{"| `hpcvmm frob [--x]` | x |\n", "no such command"},
		{"| `--cpus` | 1 | vCPUs |\n| `--shutdown-timeout` | 30s | x |\n", ""},
		{"| `--cpus` | 2 | vCPUs |\n", `--cpus: the docs' default "2", --help's "1"`},
		{"| `--seccomp` | off | x |\n", `--help's "on"`},
		{"--net tap=NAME[,mac=MAC][,queues=N][,vhost=on|off]\n", "is not the --net"},
	} {
		got := docMismatches(tc.doc, synopses, c.fs)
		if tc.want == "" {
			assert.Empty(t, got, tc.doc)
			continue
		}
		if assert.Len(t, got, 1, tc.doc) {
			assert.Contains(t, got[0], tc.want)
		}
	}
}
