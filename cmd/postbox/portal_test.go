package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/relay/pgtest"
)

// TestPortalLinkAndRevoke: postbox portal link prints a link under
// portal.public_url (the token on standard output only), --json its id
// and expiry; revoke bumps the endpoint's portal version; without a key
// to sign with, link refuses.
func TestPortalLinkAndRevoke(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	cfg := writeConfig(t, dbURL, `portal:
  public_url: https://partners.example.com/
  key: portal-key-0123456789-0123456789-abcdef
endpoints:
  shop:
    url: https://shop.example/hooks
`)
	var stdout, stderr bytes.Buffer
	require.Equal(t, exitOK, run([]string{"migrate", "--config", cfg}, &stdout, &stderr), stderr.String())

	stdout.Reset()
	stderr.Reset()
	require.Equal(t, exitOK, run([]string{"portal", "link", "--endpoint", "shop", "--ttl", "2d", "--config", cfg}, &stdout, &stderr), stderr.String())
	link := strings.TrimSpace(stdout.String())
	require.True(t, strings.HasPrefix(link, "https://partners.example.com/portal/link/pbl1."), link)
	token := strings.TrimPrefix(link, "https://partners.example.com/portal/link/")
	require.NotContains(t, stderr.String(), token, "the token is on standard output only")
	require.Contains(t, stderr.String(), "portal link l-")

	stdout.Reset()
	require.Equal(t, exitOK, run([]string{"portal", "link", "--endpoint", "shop", "--json", "--tz", "Europe/Malta", "--config", cfg}, &stdout, &stderr))
	var m map[string]any
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &m))
	require.Contains(t, m["url"], "/portal/link/pbl1.")
	require.Contains(t, m["link_id"], "l-")
	require.NotEmpty(t, m["expires"])

	stdout.Reset()
	require.Equal(t, exitOK, run([]string{"portal", "revoke", "--endpoint", "shop", "--config", cfg}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "portal version now 1")
	pool := newPool(t, dbURL)
	require.Equal(t, 1, queryInt(t, pool, `SELECT version FROM postbox.portal_versions WHERE endpoint = 'shop'`))

	stderr.Reset()
	require.Equal(t, exitUsage, run([]string{"portal", "link", "--endpoint", "shop", "--ttl", "-1h", "--config", cfg}, &stdout, &stderr))
	require.Equal(t, exitFailure, run([]string{"portal", "link", "--endpoint", "shop", "--tz", "Mars/Olympus", "--config", cfg}, &stdout, &stderr))
	noKey := writeConfig(t, dbURL, "")
	stderr.Reset()
	require.Equal(t, exitUsage, run([]string{"portal", "link", "--endpoint", "shop", "--config", noKey}, &stdout, &stderr))
	require.Contains(t, stderr.String(), "no key to sign portal links")
	require.Equal(t, exitUsage, run([]string{"portal"}, &stdout, &stderr))
}
