package outbox_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// trimmedLines joins s's lines with their indentation trimmed and blank
// lines left out: a snippet compares with an example whatever its tabs.
func trimmedLines(s string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestDocsGoSnippetsAreExamples: every ```go block of the README and
// docs/ is, line for line, part of an Example function of the repository
// (an example_test.go file), so it compiles with go vet and go test, and
// a changed API breaks the build, not the docs.
func TestDocsGoSnippetsAreExamples(t *testing.T) {
	t.Parallel()
	var examples []string
	require.NoError(t, filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != ".." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.Name() == "example_test.go" {
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			examples = append(examples, trimmedLines(string(b)))
		}
		return nil
	}))
	require.NotEmpty(t, examples)

	docs, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	docs = append(docs, "../README.md")
	found := 0
	for _, path := range docs {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		blocks := strings.Split(string(b), "```go\n")
		for _, blk := range blocks[1:] {
			end := strings.Index(blk, "```")
			require.GreaterOrEqual(t, end, 0, "%s: a go block ends", path)
			snippet := trimmedLines(blk[:end])
			in := false
			for _, ex := range examples {
				in = in || strings.Contains(ex, snippet)
			}
			require.True(t, in, "%s: this Go snippet is in no Example function (an example_test.go); add it to one:\n%s", path, blk[:end])
			found++
		}
	}
	require.GreaterOrEqual(t, found, 3, "the docs' Go snippets were found")
}

// TestDocsNameOnlyOutboxIdentifiersThatExist: every outbox.Name the
// README and docs/ mention, in prose or code, is an exported name of
// package outbox.
func TestDocsNameOnlyOutboxIdentifiersThatExist(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	exported := map[string]bool{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil && d.Name.IsExported() {
					exported[d.Name.Name] = true
				}
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						exported[s.Name.Name] = s.Name.IsExported()
					case *ast.ValueSpec:
						for _, n := range s.Names {
							exported[n.Name] = n.IsExported()
						}
					}
				}
			}
		}
	}
	require.True(t, exported["Insert"], "package outbox was read")
	docs, err := filepath.Glob("../docs/*.md")
	require.NoError(t, err)
	docs = append(docs, "../README.md")
	for _, path := range docs {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, m := range regexp.MustCompile(`\boutbox\.([A-Z][A-Za-z0-9]*)`).FindAllStringSubmatch(string(b), -1) {
			require.True(t, exported[m[1]], "%s names outbox.%s, which package outbox does not export", path, m[1])
		}
	}
}
