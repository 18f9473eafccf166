package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
	"github.com/postbox-relay/postbox/relay/config"
	"github.com/postbox-relay/postbox/relay/ops"
	"github.com/postbox-relay/postbox/relay/pgtest"
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

// verifyWithNode verifies a signed request with the npm standardwebhooks
// library under secret; it reports whether it verified.
func verifyWithNode(t *testing.T, secret, id string, ts int64, sig string, body []byte) bool {
	t.Helper()
	dir := filepath.Join("..", "..", "examples", "node-receiver")
	node, err := exec.LookPath("node")
	if err == nil {
		_, err = os.Stat(filepath.Join(dir, "node_modules", "standardwebhooks"))
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node and standardwebhooks: %v (.ci/run installs them)", err)
		}
		t.Skipf("node and standardwebhooks: %v (cd examples/node-receiver && npm ci)", err)
	}
	const script = `const { Webhook } = require("standardwebhooks");
const [secret, id, ts, sig, body] = process.argv.slice(1);
try {
  new Webhook(secret).verify(body, { "webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig });
  console.log("verified");
} catch (err) {
  console.log("rejected: " + err.message);
}`
	cmd := exec.Command(node, "-e", script, secret, id, strconv.FormatInt(ts, 10), sig, string(body))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return strings.TrimSpace(string(out)) == "verified"
}

// TestSecretRotationByVersion: a table endpoint whose secret_version is
// raised signs with the new version's secret and, until
// previous_secret_until, the previous one's; postbox secret show prints
// both, and the npm standardwebhooks library verifies a delivery with
// either. After the overlap only the new one signs and verifies.
func TestSecretRotationByVersion(t *testing.T) {
	t.Parallel()
	master := outbox.NewSecret()
	dbURL := pgtest.NewDatabase(t)
	cfgPath := writeConfig(t, dbURL, "signing:\n  secrets: ["+master+"]\n")
	code, out, errOut := postbox(t, "migrate", "--config", cfgPath)
	require.Equal(t, exitOK, code, out+errOut)
	ep := func(args ...string) {
		t.Helper()
		code, _, errOut := postbox(t, append(append([]string{"endpoints"}, args...), "--config", cfgPath)...)
		require.Equal(t, exitOK, code, errOut)
	}
	m, err := outbox.ParseSecret(master)
	require.NoError(t, err)
	v1, v2 := outbox.DeriveSecret(m, "aff-7").Reveal(), outbox.DeriveSecret(m, "aff-7/2").Reveal()

	// Version 1 is the secret signing.per_endpoint: derived gives the name.
	ep("add", "aff-7", "--url", "https://aff.example/pb")
	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "aff-7", "--config", cfgPath)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, v1+"\n", out)
	require.Contains(t, errOut, "signs with its secret derived for version 1\n")

	// A delivery as the relay signs it: the table endpoint resolved from
	// its row, signed with config.SigningSecrets.
	signed := func() (string, int64, string, []byte) {
		t.Helper()
		cfg, err := config.Load(cfgPath, nil)
		require.NoError(t, err)
		pool := newPool(t, dbURL)
		tes, err := ops.TableEndpoints(context.Background(), pool, "aff-7")
		require.NoError(t, err)
		require.Len(t, tes, 1)
		cfg.EndpointTable = config.NewEndpointTable()
		cfg.EndpointTable.Apply(tes[0])
		id, ts, body := "msg_"+strconv.FormatInt(time.Now().UnixNano(), 36), time.Now().Unix(), []byte(`{"click_id":"c1","payout":"12.50"}`)
		return id, ts, outbox.SignatureHeader(cfg.SigningSecrets(cfg.Endpoint("aff-7")), id, ts, body), body
	}

	ep("set", "aff-7", "--secret-version", "2", "--previous-secret-until", "1h")
	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "aff-7", "--config", cfgPath)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, v2+"\n"+v1+"\n", out, "the new version, then the previous during the overlap")
	require.Contains(t, errOut, "derived for version 2, and version 1's (the previous, listed after it) until")
	id, ts, sig, body := signed()
	require.Len(t, strings.Fields(sig), 2, "signed with both during the overlap")
	for _, s := range strings.Fields(out) {
		require.True(t, verifyWithNode(t, s, id, ts, sig, body), "each printed secret verifies")
	}
	require.False(t, verifyWithNode(t, outbox.NewSecret(), id, ts, sig, body), "another secret does not")

	// After the overlap, the previous version signs no more.
	ep("set", "aff-7", "--previous-secret-until", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))
	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "aff-7", "--config", cfgPath)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, v2+"\n", out)
	id, ts, sig, body = signed()
	require.True(t, verifyWithNode(t, v2, id, ts, sig, body))
	require.False(t, verifyWithNode(t, v1, id, ts, sig, body), "the previous version is retired")

	// The file's endpoint of the same name wins, as it does in the relay.
	ep("add", "filed", "--url", "https://other.example/")
	cfgFile := writeConfig(t, dbURL, "signing:\n  secrets: ["+master+"]\nendpoints:\n  filed:\n    url: https://filed.example/\n")
	code, out, errOut = postbox(t, "secret", "show", "--endpoint", "filed", "--config", cfgFile)
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, master+"\n", out)
	require.NotContains(t, errOut, "postbox.endpoints")
}
