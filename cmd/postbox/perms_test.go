package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/postbox-relay/postbox/outbox"
)

// TestRunWarnsOfSecretsReadableByOthers: `postbox run` names, at start, the
// configuration file and each secrets file that group or others may read,
// with the chmod that fixes it; a file kept to its owner is not named.
func TestRunWarnsOfSecretsReadableByOthers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
		require.NoError(t, os.Chmod(p, mode)) // past the umask
		return p
	}
	shared := write("shared.secrets", outbox.NewSecret()+"\n", 0o640)
	own := write("partner.secrets", outbox.NewSecret()+"\n", 0o600)
	other := write("other.secrets", outbox.NewSecret()+"\n", 0o604)
	tlsKey := write("admin.key", "a key\n", 0o640) // only its mode is read: admin_listen is off
	// The database is unreachable: the warnings come before the relay
	// waits for it.
	cfg := write("postbox.yaml", "database_url: postgres://postbox@127.0.0.1:1/app?connect_timeout=1\nadmin_listen: \"\"\n"+
		"admin_tls_cert: "+filepath.Join(dir, "admin.crt")+"\nadmin_tls_key: "+tlsKey+"\n"+
		"signing:\n  secrets_file: "+shared+"\nendpoints:\n  partner:\n    url: https://partner.example/hook\n    secrets_file: "+own+"\n"+
		"  other:\n    url: https://other.example/hook\n    secrets_file: "+other+"\n", 0o644)

	p := startPostbox(t, nil, "run", "--config", cfg)
	for _, f := range []string{cfg, shared, other, tlsKey} {
		p.waitLog(t, 30*time.Second, "chmod 600 "+f)
	}
	p.kill(t)
	out := p.out.String()
	require.NotContains(t, out, own, "a file only its owner reads is not named")
	require.Contains(t, out, `"mode":"0640"`)
	require.Contains(t, out, `"mode":"0644"`)
	for _, line := range strings.Split(out, "\n") {
		require.NotContains(t, line, "whsec_", "no secret in the log")
	}
}
