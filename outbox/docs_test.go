package outbox_test

import (
	"io/fs"
	"os"
	"path/filepath"
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
