package archtest

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeGoExampleIsCompiled: the README's Go code is the Example in
// vmm/example_test.go, which go test compiles: every line of the README's
// go block stands, in the same order, in that file (the README may leave
// out lines, such as the imports only the other examples need).
func TestReadmeGoExampleIsCompiled(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	example, err := os.ReadFile("../../vmm/example_test.go")
	require.NoError(t, err)
	text := string(readme)
	start := strings.Index(text, "```go\n")
	require.GreaterOrEqual(t, start, 0, "README.md has no go block")
	block := text[start+len("```go\n"):]
	block = block[:strings.Index(block, "```")]
	lines := strings.Split(string(example), "\n")
	i := 0
	for _, want := range strings.Split(block, "\n") {
		if strings.TrimSpace(want) == "" {
			continue
		}
		for i < len(lines) && lines[i] != want {
			i++
		}
		require.Less(t, i, len(lines), "README.md's Go line %q is not in vmm/example_test.go (in this order): keep the two equal", want)
		i++
	}
}
