package archtest

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Size limits of production code (every non-test .go file outside tests/,
// testdata/ and dot directories): a file over maxFileLines mixes concerns
// and wants splitting by them; a function over maxFuncLines wants its
// steps named as functions, unless its doc comment says why it is better
// whole, in the words "over 100 lines because" (or "since", "as", or a
// colon) and the reason.
const (
	maxFileLines = 600
	maxFuncLines = 100
)

// sizeReason is the doc-comment phrase that lets a function run over
// maxFuncLines: the length and, after it, the reason.
var sizeReason = regexp.MustCompile(`(?is)\bover 100 lines(:| because| since| as)\s*\S`)

// oversize returns the files of root over maxFileLines ("path") and the
// functions over maxFuncLines without a reason in their doc comment
// ("path Func" or "path Recv.Func"), paths relative to root.
func oversize(t *testing.T, root string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (name == "testdata" || rel == "tests" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return err
		}
		if n := fset.File(f.Pos()).LineCount(); n > maxFileLines {
			t.Logf("%s: %d lines (limit %d)", rel, n, maxFileLines)
			found = append(found, rel)
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			n := fset.Position(fn.End()).Line - fset.Position(fn.Pos()).Line + 1
			if n <= maxFuncLines || sizeReason.MatchString(fn.Doc.Text()) {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil && len(fn.Recv.List) == 1 {
				name = recvName(fn.Recv.List[0].Type) + "." + name
			}
			t.Logf("%s %s: %d lines (limit %d) and no reason in its doc comment", rel, name, n, maxFuncLines)
			found = append(found, rel+" "+name)
		}
		return nil
	})
	require.NoError(t, err)
	return found
}

// recvName is a method receiver's type name without pointer or type
// parameters.
func recvName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.IndexListExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return "?"
}

// TestSizeLimits: no production file over 600 lines and no function over
// 100 without a reason in its doc comment. Issue 24's exceptions are gone
// (split or given their reason); nothing may become one.
func TestSizeLimits(t *testing.T) {
	found := oversize(t, "../..")
	require.Empty(t, found, "over the size limits (docs/architecture.md): split the file by concern, or the function into named steps; a function better whole says why in its doc comment (\"over 100 lines because ...\")")
}

// TestSizeLimitsSeeViolations runs the check over testdata/size, where a
// file and functions break the rule on purpose, so TestSizeLimits cannot
// pass by seeing nothing.
func TestSizeLimitsSeeViolations(t *testing.T) {
	found := oversize(t, "testdata/size")
	require.ElementsMatch(t, []string{"long.go", "long.go longFunc", "long.go T.longMethod"}, found)
}
