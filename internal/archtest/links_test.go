package archtest

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestDocLinksResolve: every relative link in README.md and docs/*.md
// names a file or directory of the repository, so moving or renaming a
// document (or a script the docs point to) cannot leave a dead link.
func TestDocLinksResolve(t *testing.T) {
	docs, err := filepath.Glob("../../docs/*.md")
	require.NoError(t, err)
	docs = append(docs, "../../README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, m := range link.FindAllStringSubmatch(string(text), -1) {
			target, _, _ := strings.Cut(m[1], "#")
			if target == "" || strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			_, err := os.Stat(filepath.Join(filepath.Dir(doc), target))
			assert.NoError(t, err, "%s links to %s", strings.TrimPrefix(doc, "../../"), m[1])
		}
	}
	require.Greater(t, checked, 5, "too few links found to mean anything")
}
