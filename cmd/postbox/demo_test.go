package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDemoEndsWithTheConsole: the demo runs end to end and ends by
// printing the console's address and the admin token its actions need.
func TestDemoEndsWithTheConsole(t *testing.T) {
	t.Parallel()
	code, out, errOut := postbox(t, "demo")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	require.Contains(t, out, "all deliveries settled")
	require.Regexp(t, `Console: http://127\.0\.0\.1:\d+/  \(admin token for replay, pause and resume: [0-9a-f]{32}\)`, out)
	require.Contains(t, out, "postbox demo --keep")
}
