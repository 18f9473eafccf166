package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
)

// postbox secret show prints what a partner verifies with: its derived
// secrets under each master (newest first), its own, or the shared ones
// with a warning.
func TestSecretShow(t *testing.T) {
	t.Parallel()
	current, previous, own := outbox.NewSecret(), outbox.NewSecret(), outbox.NewSecret()
	write := func(perEndpoint string) string {
		path := filepath.Join(t.TempDir(), "postbox.yaml")
		cfg := "database_url: postgres://x@localhost/db\nsigning:\n  secrets: [" + current + ", " + previous + "]\n" + perEndpoint +
			"endpoints:\n  a:\n    url: https://a.example\n  b:\n    url: https://b.example\n    secrets: [" + own + "]\n"
		require.NoError(t, os.WriteFile(path, []byte(cfg), 0o600))
		return path
	}
	derived := write("  per_endpoint: derived\n")
	code, out, errOut := postbox(t, "secret", "show", "--endpoint", "a", "--config", derived)
	require.Equal(t, 0, code, errOut)
	lines := strings.Fields(out)
	require.Len(t, lines, 2, "one per master during a rotation")
	for i, m := range []string{current, previous} {
		master, err := outbox.ParseSecret(m)
		require.NoError(t, err)
		require.Equal(t, outbox.DeriveSecret(master, "a").Reveal(), lines[i])
	}
	require.Contains(t, errOut, "derived for it alone")
	require.NotContains(t, out, current)

	code, out, _ = postbox(t, "secret", "show", "--endpoint", "b", "--config", derived)
	require.Equal(t, 0, code)
	require.Equal(t, own+"\n", out)

	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "a", "--config", write(""))
	require.Equal(t, 0, code)
	require.Equal(t, current+"\n"+previous+"\n", out)
	require.Contains(t, errOut, "could forge deliveries to the others")

	// A name no endpoint has (a misspelling, or a row-URL endpoint's):
	// its derived secret, with a warning; a configured one has none.
	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "nosuch", "--config", derived)
	require.Equal(t, 0, code, errOut)
	master, err := outbox.ParseSecret(current)
	require.NoError(t, err)
	require.Equal(t, outbox.DeriveSecret(master, "nosuch").Reveal(), strings.Fields(out)[0])
	require.Contains(t, errOut, "warning: no endpoint nosuch is configured")
	_, _, errOut = postbox(t, "secret", "show", "--endpoint", "a", "--config", derived)
	require.NotContains(t, errOut, "is configured")

	code, _, errOut = postbox(t, "secret", "show", "--config", derived)
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "--endpoint NAME")
}
