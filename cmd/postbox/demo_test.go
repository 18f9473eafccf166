package main

import (
	"strings"
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
	// The partner's URL, changed by SQL mid-run, is where the next
	// postback goes.
	v1 := strings.Index(out, "partner ← POST /postback/v1")
	change := strings.Index(out, "changed affiliate's url by SQL")
	v2 := strings.Index(out, "partner ← POST /postback/v2")
	require.True(t, v1 >= 0 && v1 < change && change < v2, "v1 before the change, v2 after:\n%s", out)
	require.Equal(t, 1, strings.Count(out, "partner ← POST /postback/v2"), "one postback after the change")
	require.NotContains(t, out, "signature INVALID")
	require.Regexp(t, `Console: http://127\.0\.0\.1:\d+/  \(admin token for replay, pause and resume: [0-9a-f]{32}\)`, out)
	require.Contains(t, out, "postbox demo --keep")
}
