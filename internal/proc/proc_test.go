package proc

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestStatFieldsStartAfterTheLastParenthesis: a command name may hold
// spaces and parentheses, so the fields are counted from the file's last
// ')'; a file without one is refused, not misread.
func TestStatFieldsStartAfterTheLastParenthesis(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "stat")
	require.NoError(t, os.WriteFile(path, []byte("4242 (a) S (b)) T 1 4242 4242 0 -1\n"), 0o600))
	f, err := StatFields(path)
	require.NoError(t, err)
	require.Equal(t, []string{"T", "1", "4242", "4242", "0", "-1"}, f, "field 3, the state, at index 0")

	require.NoError(t, os.WriteFile(path, []byte("4242 no name\n"), 0o600))
	_, err = StatFields(path)
	require.ErrorContains(t, err, "no command name")

	_, err = StatFields(filepath.Join(dir, "gone"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
